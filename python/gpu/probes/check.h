// The probes' error checks: a failed CUDA driver call (CK) or runtime call (RK)
// prints the call, the driver's message and the line, and ends the probe.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CK(x)                                                              \
  do {                                                                     \
    CUresult r_ = (x);                                                     \
    if (r_ != CUDA_SUCCESS) {                                              \
      const char* s_ = nullptr;                                            \
      cuGetErrorString(r_, &s_);                                           \
      std::fprintf(stderr, "%s failed: %s (line %d)\n", #x, s_, __LINE__); \
      std::exit(1);                                                        \
    }                                                                      \
  } while (0)

#define RK(x)                                                                       \
  do {                                                                              \
    cudaError_t e_ = (x);                                                           \
    if (e_ != cudaSuccess) {                                                        \
      std::fprintf(stderr, "%s failed: %s (line %d)\n", #x, cudaGetErrorString(e_), \
                   __LINE__);                                                       \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)
