// What one allocation and free through PyTorch's allocator interface costs.
//
// `torch_pair`: in one process, alternated in rounds so that every variant sees
// the same machine state: the native caching allocator, a CUDAPluggableAllocator
// over emm (emm_torch_alloc/emm_torch_free), a CUDAPluggableAllocator over
// do-nothing functions (the wrapper's own cost), and emm's two functions called
// directly. raw_alloc + raw_delete pairs on the current stream.
//
// `torch_pair tensor VARIANT`: VARIANT made PyTorch's current allocator (native,
// pluggable-emm, or emm-object: emm's own allocator object, python/emm/
// _torch_native.cpp, what emm.torch.install() sets up by default), then
// allocate + drop pairs of the DataPtr it returns: what a tensor's storage costs
// (a DataPtr's deleter reaches its allocator through PyTorch's current one, so
// one variant per process).
//
// Median of 7 repetitions of 200,000 pairs, in ns. Build and run:
// python/gpu/benchmarks/torch_pair.sh (GPU machine).
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <sys/types.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include <cstring>

// emm's allocator object, the very source emm.torch builds
// (emm_torch_native_install).
#include "../../emm/_torch_native.cpp"

extern "C" {
void *emm_torch_alloc(ssize_t size, int device, void *stream);
void emm_torch_free(void *ptr, ssize_t size, int device, void *stream);
int emm_torch_release(void *ptr, int device);
size_t emm_last_error(char *buf, size_t len);
int emm_last_error_code(void);
}

using Clock = std::chrono::steady_clock;
using Alloc = c10::cuda::CUDACachingAllocator::CUDAAllocator;

// emm's two C functions called directly, without PyTorch's wrapper.
static double direct_ns(size_t bytes) {
  auto pair = [&] { emm_torch_free(emm_torch_alloc((ssize_t)bytes, 0, nullptr), (ssize_t)bytes, 0, nullptr); };
  for (int i = 0; i < 100; i++) pair();
  std::vector<double> v;
  for (int r = 0; r < 7; r++) {
    const int n = 200000;
    auto t = Clock::now();
    for (int i = 0; i < n; i++) pair();
    v.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t).count() / n);
  }
  std::sort(v.begin(), v.end());
  return v[3];
}

static double pair_ns(Alloc *a, size_t bytes) {
  for (int i = 0; i < 100; i++) a->raw_delete(a->raw_alloc(bytes));
  std::vector<double> v;
  for (int r = 0; r < 7; r++) {
    const int n = 200000;
    auto t = Clock::now();
    for (int i = 0; i < n; i++) a->raw_delete(a->raw_alloc(bytes));
    v.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t).count() / n);
  }
  std::sort(v.begin(), v.end());
  return v[3];
}

// Allocate + drop pairs of the current allocator's DataPtrs.
static double tensor_ns(size_t bytes) {
  Alloc *a = c10::cuda::CUDACachingAllocator::get();
  for (int i = 0; i < 100; i++) (void)a->allocate(bytes);
  std::vector<double> v;
  for (int r = 0; r < 7; r++) {
    const int n = 200000;
    auto t = Clock::now();
    for (int i = 0; i < n; i++) (void)a->allocate(bytes);
    v.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t).count() / n);
  }
  std::sort(v.begin(), v.end());
  return v[3];
}

static int tensor_main(const char *variant) {
  if (std::strcmp(variant, "pluggable-emm") == 0) {
    torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(
        torch::cuda::CUDAPluggableAllocator::createCustomAllocator(
            [](size_t n, int dev, cudaStream_t s) { return emm_torch_alloc((ssize_t)n, dev, s); },
            [](void *p, size_t n, int dev, cudaStream_t s) { emm_torch_free(p, (ssize_t)n, dev, s); }));
  } else if (std::strcmp(variant, "emm-object") == 0) {
    char err[512] = {0};
    if (emm_torch_native_install((void *)&emm_torch_alloc, (void *)&emm_torch_release,
                                 (void *)&emm_last_error, (void *)&emm_last_error_code, err,
                                 sizeof err) != 0) {
      fprintf(stderr, "emm_torch_native_install: %s\n", err);
      return 1;
    }
  } else if (std::strcmp(variant, "native") != 0) {
    fprintf(stderr, "unknown variant %s (native, pluggable-emm, emm-object)\n", variant);
    return 2;
  }
  Alloc *a = c10::cuda::CUDACachingAllocator::get();
  if (!a->initialized()) a->init(c10::cuda::device_count());
  const size_t sizes[] = {512, 1 << 20, 64 << 20};
  printf("tensor %-15s (%s)", variant, a->name().c_str());
  for (size_t b : sizes) printf("  %zu: %6.1f", b, tensor_ns(b));
  printf("  ns/pair\n");
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 3 && std::strcmp(argv[1], "tensor") == 0) return tensor_main(argv[2]);
  Alloc *native = c10::cuda::CUDACachingAllocator::get();
  native->init(c10::cuda::device_count());
  auto emm = torch::cuda::CUDAPluggableAllocator::createCustomAllocator(
      [](size_t n, int dev, cudaStream_t s) { return emm_torch_alloc((ssize_t)n, dev, s); },
      [](void *p, size_t n, int dev, cudaStream_t s) { emm_torch_free(p, (ssize_t)n, dev, s); });
  static char fake;
  auto null = torch::cuda::CUDAPluggableAllocator::createCustomAllocator(
      [](size_t, int, cudaStream_t) -> void * { return &fake; },
      [](void *, size_t, int, cudaStream_t) {});
  emm->init(c10::cuda::device_count());
  null->init(c10::cuda::device_count());
  const size_t sizes[] = {512, 1 << 20, 64 << 20};
  struct { const char *name; Alloc *a; } vs[] = {
      {"torch-native", native}, {"pluggable-emm", emm.get()}, {"pluggable-null", null.get()}};
  for (int round = 1; round <= 5; round++) {
    for (auto &v : vs) {
      printf("round %d %-15s", round, v.name);
      for (size_t b : sizes) printf("  %zu: %6.1f", b, pair_ns(v.a, b));
      printf("  ns/pair\n");
      fflush(stdout);
    }
    printf("round %d %-15s", round, "emm-direct");
    for (size_t b : sizes) printf("  %zu: %6.1f", b, direct_ns(b));
    printf("  ns/pair\n");
    fflush(stdout);
  }
  return 0;
}
