// The allocator's share of real training steps, in one process: replays traces
// recorded from PyTorch training on an H200 (crates/emm-cli/traces/*_h200.csv, the
// exact sequence of allocations and frees PyTorch made) through
//   torch-native    PyTorch's caching allocator (raw_alloc / raw_delete),
//   pluggable-emm   a CUDAPluggableAllocator over emm_torch_alloc/emm_torch_free
//                   (what emm.torch.install() gives PyTorch),
//   pluggable-null  a CUDAPluggableAllocator over functions that do nothing (the
//                   wrapper's own cost, plus this harness),
//   emm-direct      emm's two functions called directly.
// Each variant first replays the trace once untimed (its pool grows, as in warmup
// steps); then rounds alternate the variants, one timed replay each, order rotated.
// Prints ns per request (allocation or free): median and range over the rounds.
// trace_hooks.sh runs one process per trace, so every allocator starts each trace
// empty.
// Build and run: python/gpu/benchmarks/trace_hooks.sh [TRACE.csv ...] (GPU machine).
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <sys/types.h>

#include <algorithm>
#include <cstdint>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

extern "C" {
void *emm_torch_alloc(ssize_t size, int device, void *stream);
void emm_torch_free(void *ptr, ssize_t size, int device, void *stream);
}

using Clock = std::chrono::steady_clock;
using Alloc = c10::cuda::CUDACachingAllocator::CUDAAllocator;
struct Op {
  bool alloc;
  long id;
  size_t size;
};
struct Variant {
  const char *name;
  std::function<void *(size_t)> alloc;
  std::function<void(void *, size_t)> free;
  std::vector<double> ns;
};

static std::vector<Op> load(const char *path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);  // header: op,id,size,stream
  std::vector<Op> ops;
  while (std::getline(in, line)) {
    std::stringstream ss(line);
    std::string f[4];
    for (auto &x : f) std::getline(ss, x, ',');
    if (f[0].empty() || (f[0][0] != 'a' && f[0][0] != 'f')) continue;
    ops.push_back({f[0][0] == 'a', std::stol(f[1]), (size_t)std::stoull(f[2])});
  }
  return ops;
}

// One replay of the trace; ns per request, or -1 when an allocation failed.
static double replay(Variant &v, const std::vector<Op> &ops) {
  std::unordered_map<long, std::pair<void *, size_t>> live;
  live.reserve(ops.size());
  bool failed = false;
  auto t = Clock::now();
  for (const Op &o : ops) {
    if (o.alloc) {
      void *p = v.alloc(o.size);
      if (!p && o.size) failed = true;
      live[o.id] = {p, o.size};
    } else {
      auto it = live.find(o.id);
      if (it == live.end()) continue;
      if (it->second.first) v.free(it->second.first, it->second.second);
      live.erase(it);
    }
  }
  double ns = std::chrono::duration<double, std::nano>(Clock::now() - t).count() / ops.size();
  for (auto &kv : live)
    if (kv.second.first) v.free(kv.second.first, kv.second.second);
  return failed ? -1 : ns;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s TRACE.csv [TRACE.csv ...]\n", argv[0]);
    return 2;
  }
  Alloc *native = c10::cuda::CUDACachingAllocator::get();
  native->init(c10::cuda::device_count());
  auto emm = torch::cuda::CUDAPluggableAllocator::createCustomAllocator(
      [](size_t n, int dev, cudaStream_t s) { return emm_torch_alloc((ssize_t)n, dev, s); },
      [](void *p, size_t n, int dev, cudaStream_t s) { emm_torch_free(p, (ssize_t)n, dev, s); });
  // Distinct made-up addresses (the wrapper keys its bookkeeping by address and
  // never touches the memory).
  static uintptr_t next_fake = 0x10000;
  auto null = torch::cuda::CUDAPluggableAllocator::createCustomAllocator(
      [](size_t, int, cudaStream_t) -> void * { return reinterpret_cast<void *>(next_fake += 512); },
      [](void *, size_t, int, cudaStream_t) {});
  emm->init(c10::cuda::device_count());
  null->init(c10::cuda::device_count());
  const int rounds = 8;  // a multiple of the variant count: each leads a round equally often
  for (int t = 1; t < argc; t++) {
    std::vector<Op> ops = load(argv[t]);
    std::vector<Variant> vs = {
        {"torch-native", [&](size_t n) { return native->raw_alloc(n); }, [&](void *p, size_t) { native->raw_delete(p); }, {}},
        {"pluggable-emm", [&](size_t n) { return emm->raw_alloc(n); }, [&](void *p, size_t) { emm->raw_delete(p); }, {}},
        {"pluggable-null", [&](size_t n) { return null->raw_alloc(n); }, [&](void *p, size_t) { null->raw_delete(p); }, {}},
        {"emm-direct", [](size_t n) { return emm_torch_alloc((ssize_t)n, 0, nullptr); },
         [](void *p, size_t n) { emm_torch_free(p, (ssize_t)n, 0, nullptr); }, {}},
    };
    for (auto &v : vs) replay(v, ops);  // warmup: each pool grows to the trace's needs
    for (int r = 0; r < rounds; r++)
      for (size_t k = 0; k < vs.size(); k++) {
        Variant &v = vs[(k + r) % vs.size()];
        v.ns.push_back(replay(v, ops));
      }
    printf("%s: %zu requests, %d rounds, ns per request (median; min-max)\n", argv[t], ops.size(), rounds);
    for (auto &v : vs) {
      std::vector<double> s;
      for (double x : v.ns)
        if (x >= 0) s.push_back(x);  // -1: an allocation failed in that replay
      std::sort(s.begin(), s.end());
      if (s.empty()) {
        printf("  %-15s every replay had a failed allocation\n", v.name);
        continue;
      }
      printf("  %-15s %7.1f  (%.1f-%.1f)%s\n", v.name, s[s.size() / 2], s.front(), s.back(),
             s.size() < v.ns.size() ? "  (some replays had a failed allocation; not counted)" : "");
    }
    fflush(stdout);
    native->emptyCache();
  }
  return 0;
}
