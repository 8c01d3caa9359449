// The least a caching allocator behind PyTorch's CUDAPluggableAllocator can do: a
// baseline for train_bench.py's `pluggable-floor` variant, not an allocator to use.
//
// Blocks are cached by (stream, size rounded to 512 bytes) and never split, merged
// or given back (except all of them once, when cudaMalloc fails). On the bucketed
// training shapes every step after warmup is served from the lists. What a step
// costs through this library beyond PyTorch's own allocator is what PyTorch's
// pluggable path costs any allocator (its wrapper's lock and address map, the calls
// through std::function); what emm's step costs beyond this one is emm's own.
//
// Built on the GPU machine by train_rounds.py (g++ against the CUDA runtime).
#include <cuda_runtime_api.h>
#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace {

struct Key {
  cudaStream_t stream;
  size_t size;
  bool operator==(const Key &o) const { return stream == o.stream && size == o.size; }
};

struct KeyHash {
  size_t operator()(const Key &k) const {
    return std::hash<uintptr_t>()(reinterpret_cast<uintptr_t>(k.stream)) * 31 + std::hash<size_t>()(k.size);
  }
};

std::mutex lock;
std::unordered_map<Key, std::vector<void *>, KeyHash> cache;
std::atomic<size_t> reserved{0}, peak_reserved{0}, live{0}, peak_live{0}, driver_allocs{0};

size_t rounded(ssize_t size) { return (static_cast<size_t>(size) + 511) / 512 * 512; }

void raise_peak(std::atomic<size_t> &peak, size_t now) {
  size_t p = peak.load();
  while (now > p && !peak.compare_exchange_weak(p, now)) {
  }
}

// Gives every cached block back (only when cudaMalloc failed).
void release_all() {
  cudaDeviceSynchronize();
  for (auto &entry : cache) {
    for (void *p : entry.second) {
      cudaFree(p);
      reserved -= entry.first.size;
    }
    entry.second.clear();
  }
}

}  // namespace

extern "C" {

void *floor_alloc(ssize_t size, int device, cudaStream_t stream) {
  (void)device;  // one device per process in train_bench.py
  if (size <= 0) return nullptr;  // as PyTorch's own allocator does for empty tensors
  size_t n = rounded(size);
  {
    std::lock_guard<std::mutex> g(lock);
    auto it = cache.find(Key{stream, n});
    if (it != cache.end() && !it->second.empty()) {
      void *p = it->second.back();
      it->second.pop_back();
      raise_peak(peak_live, live += n);
      return p;
    }
  }
  void *p = nullptr;
  if (cudaMalloc(&p, n) != cudaSuccess) {
    cudaGetLastError();
    std::lock_guard<std::mutex> g(lock);
    release_all();
    if (cudaMalloc(&p, n) != cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
  }
  driver_allocs++;
  raise_peak(peak_reserved, reserved += n);
  raise_peak(peak_live, live += n);
  return p;
}

void floor_free(void *ptr, ssize_t size, int device, cudaStream_t stream) {
  (void)device;
  if (ptr == nullptr) return;
  size_t n = rounded(size);
  live -= n;
  std::lock_guard<std::mutex> g(lock);
  cache[Key{stream, n}].push_back(ptr);
}

// Peak reserved and peak live bytes, and cudaMalloc calls, for the RESULT line.
void floor_stats(size_t *peak_res, size_t *peak_lv, size_t *allocs) {
  *peak_res = peak_reserved.load();
  *peak_lv = peak_live.load();
  *allocs = driver_allocs.load();
}
}
