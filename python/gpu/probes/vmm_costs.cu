// What the driver's virtual-memory calls cost on this GPU, and whether many
// mappings slow the calls a training step makes (a device-to-device copy, a
// kernel launch). emm's pool moves free 2 MiB pieces of its expandable segment by
// mapping their memory again at the segment's end (cuMemMap of an existing
// handle, then one cuMemSetAccess over the range); the old addresses are unmapped
// once the work queued on them is done. This times, for N pieces:
//   create   cuMemCreate of each piece
//   map      cuMemMap of each at a fresh range, and the one cuMemSetAccess
//   alias    the same memory mapped again at a second range, and its access
//   unmap    cuMemUnmap of each piece of the second range, then of the whole range in one call
// then, with 0, 1k, 4k and 8k extra 2 MiB mappings alive, the host time of a
// 1 MiB cudaMemcpyAsync between two of them and of an empty kernel's launch.
//
//   nvcc -O2 -o /tmp/vmm_costs vmm_costs.cu -lcuda && /tmp/vmm_costs
#include "vmm_setup.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

using Clock = std::chrono::steady_clock;
static double us_since(Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
}

__global__ void empty() {}

static const size_t PAGE = 2u << 20;

struct Range {
  CUdeviceptr base = 0;
  size_t size = 0;
  std::vector<CUmemGenericAllocationHandle> handles;
};

// `n` pieces of `piece` bytes created and mapped at a fresh reservation;
// prints the per-piece times when `label` is set.
static Range make(const VmmDesc& d, size_t n, size_t piece, const char* label) {
  Range r;
  r.size = n * piece;
  CK(cuMemAddressReserve(&r.base, r.size, 0, 0, 0));
  auto t = Clock::now();
  for (size_t i = 0; i < n; i++) {
    CUmemGenericAllocationHandle h;
    CK(cuMemCreate(&h, piece, &d.prop, 0));
    r.handles.push_back(h);
  }
  double create = us_since(t);
  t = Clock::now();
  for (size_t i = 0; i < n; i++) CK(cuMemMap(r.base + i * piece, piece, 0, r.handles[i], 0));
  double map = us_since(t);
  t = Clock::now();
  CK(cuMemSetAccess(r.base, r.size, &d.desc, 1));
  double access = us_since(t);
  if (label)
    std::printf("%-8s %5zu pieces of %2zu MiB: create %7.1f us/piece, map %6.1f us/piece, access %8.1f us (one call)\n",
                label, n, piece >> 20, create / n, map / n, access);
  return r;
}

int main() {
  const VmmDesc d = vmm_device0().mem;
  cudaStream_t s;
  cudaStreamCreate(&s);
  empty<<<1, 1, 0, s>>>();
  cudaStreamSynchronize(s);

  for (size_t piece : {PAGE, 8 * PAGE}) {
    for (size_t n : {64, 256}) {
      if (piece * n > (size_t(8) << 30)) continue;
      Range a = make(d, n, piece, "fresh");
      // The same memory again at a second range: what a move does.
      CUdeviceptr b;
      CK(cuMemAddressReserve(&b, a.size, 0, 0, 0));
      auto t = Clock::now();
      for (size_t i = 0; i < n; i++) CK(cuMemMap(b + i * piece, piece, 0, a.handles[i], 0));
      double map = us_since(t);
      t = Clock::now();
      CK(cuMemSetAccess(b, a.size, &d.desc, 1));
      double access = us_since(t);
      t = Clock::now();
      for (size_t i = 0; i < n; i++) CK(cuMemUnmap(b + i * piece, piece));
      double unmap = us_since(t);
      std::printf("alias    %5zu pieces of %2zu MiB: map %6.1f us/piece, access %8.1f us (one call), unmap %6.1f us/piece\n",
                  n, piece >> 20, map / n, access, unmap / n);
      // A move as the pool makes it, access per piece instead of once: for comparison.
      t = Clock::now();
      for (size_t i = 0; i < n; i++) {
        CK(cuMemMap(b + i * piece, piece, 0, a.handles[i], 0));
        CK(cuMemSetAccess(b + i * piece, piece, &d.desc, 1));
      }
      std::printf("alias    %5zu pieces of %2zu MiB, access per piece: %6.1f us/piece\n", n, piece >> 20,
                  us_since(t) / n);
      // The whole range of n mappings in one cuMemUnmap call: allowed, and cheaper?
      t = Clock::now();
      CUresult whole = cuMemUnmap(b, a.size);
      double one = us_since(t);
      if (whole == CUDA_SUCCESS) {
        std::printf("unmap    %5zu pieces of %2zu MiB in one call: %8.1f us (%6.1f us/piece)\n", n, piece >> 20,
                    one, one / n);
      } else {
        const char* msg = nullptr;
        cuGetErrorString(whole, &msg);
        std::printf("unmap    %5zu pieces of %2zu MiB in one call: refused (%s)\n", n, piece >> 20, msg ? msg : "?");
        for (size_t i = 0; i < n; i++) CK(cuMemUnmap(b + i * piece, piece));
      }
      CK(cuMemAddressFree(b, a.size));
      for (size_t i = 0; i < n; i++) CK(cuMemUnmap(a.base + i * piece, piece));
      for (auto h : a.handles) CK(cuMemRelease(h));
      CK(cuMemAddressFree(a.base, a.size));
    }
  }

  // Calls a step makes, with more and more mappings alive.
  Range pair = make(d, 2, PAGE, nullptr);
  std::vector<Range> extra;
  size_t alive = 0;
  for (size_t target : {0, 1024, 4096, 8192}) {
    while (alive < target) {
      extra.push_back(make(d, 256, PAGE, nullptr));
      alive += 256;
    }
    std::vector<double> copy, launch;
    for (int round = 0; round < 5; round++) {
      cudaStreamSynchronize(s);
      auto t = Clock::now();
      for (int i = 0; i < 200; i++)
        cudaMemcpyAsync((void*)(pair.base + PAGE), (void*)pair.base, 1 << 20, cudaMemcpyDeviceToDevice, s);
      copy.push_back(us_since(t) / 200);
      cudaStreamSynchronize(s);
      t = Clock::now();
      for (int i = 0; i < 200; i++) empty<<<1, 1, 0, s>>>();
      launch.push_back(us_since(t) / 200);
      cudaStreamSynchronize(s);
    }
    std::sort(copy.begin(), copy.end());
    std::sort(launch.begin(), launch.end());
    std::printf("with %5zu extra mappings: cudaMemcpyAsync 1 MiB DtoD %.2f us, launch %.2f us (median of 5 x 200)\n",
                alive, copy[2], launch[2]);
  }
  cudaError_t e = cudaGetLastError();
  std::printf("%s\n", e == cudaSuccess ? "vmm_costs: OK" : cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : 1;
}
