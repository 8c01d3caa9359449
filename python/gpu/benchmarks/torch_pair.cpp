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
// `torch_pair trace VARIANT TRACE.csv [PASSES]`: the requests of a recorded
// trace (op,id,size,stream; `emm replay`'s format) made and dropped as DataPtrs
// of VARIANT, PASSES times (default 20) with no cache emptied between: each
// stream of the trace a stream of PyTorch's pool (stream 0 the default stream),
// made current before its requests; allocations the trace never frees and made
// in its first half are made once and kept, as `emm replay` keeps them; the
// rest still live at a pass's end are dropped then. Prints, for each pass, the
// host nanoseconds a call (allocations and frees) and, where the allocator
// answers, its peak reserved bytes and device allocations so far: what the
// allocator costs the host for a real job's requests once its cache is warm
// (PYTORCH_CUDA_ALLOC_CONF applies to native). No kernel runs, so nothing waits
// on the device.
//
// Median of 7 repetitions of 200,000 pairs, in ns. Build and run:
// python/gpu/benchmarks/torch_pair.sh (GPU machine).
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <c10/cuda/CUDAStream.h>

#include <dlfcn.h>
#include <sys/types.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

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


// emm's allocator object made PyTorch's current allocator, as emm.torch.install()
// does: the functions' table filled from the linked libemm_capi by name.
static bool install_emm_object() {
  static const char *const names[] = {
      "emm_torch_alloc", "emm_torch_release", "emm_last_error", "emm_last_error_code",
      "emm_torch_record_stream", "emm_torch_memory_stats", "emm_torch_reset_peak_stats",
      "emm_torch_empty_cache", "emm_torch_cache_info", "emm_torch_graph_pool_begin",
      "emm_torch_graph_pool_end", "emm_torch_graph_pool_release", "emm_torch_graph_pool_alloc",
      "emm_torch_graph_pool_live", "emm_torch_graph_pool_create", "emm_torch_graph_pool_info"};
  static_assert(sizeof(names) / sizeof(names[0]) * sizeof(void *) == sizeof(EmmFunctions),
                "one name for each of EmmFunctions' fields");
  void *table[sizeof(names) / sizeof(names[0])];
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
    table[i] = dlsym(RTLD_DEFAULT, names[i]);
    if (!table[i]) {
      fprintf(stderr, "libemm_capi has no %s\n", names[i]);
      return false;
    }
  }
  EmmFunctions fns;
  std::memcpy(&fns, table, sizeof fns);
  char err[512] = {0};
  if (emm_torch_native_install(&fns, sizeof fns, err, sizeof err) != 0) {
    fprintf(stderr, "emm_torch_native_install: %s\n", err);
    return false;
  }
  return true;
}

static bool use_variant(const char *variant) {
  if (std::strcmp(variant, "pluggable-emm") == 0) {
    torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(
        torch::cuda::CUDAPluggableAllocator::createCustomAllocator(
            [](size_t n, int dev, cudaStream_t s) { return emm_torch_alloc((ssize_t)n, dev, s); },
            [](void *p, size_t n, int dev, cudaStream_t s) { emm_torch_free(p, (ssize_t)n, dev, s); }));
  } else if (std::strcmp(variant, "emm-object") == 0) {
    if (!install_emm_object()) return false;
  } else if (std::strcmp(variant, "native") != 0) {
    fprintf(stderr, "unknown variant %s (native, pluggable-emm, emm-object)\n", variant);
    return false;
  }
  Alloc *a = c10::cuda::CUDACachingAllocator::get();
  if (!a->initialized()) a->init(c10::cuda::device_count());
  return true;
}

static int tensor_main(const char *variant) {
  if (!use_variant(variant)) return 2;
  Alloc *a = c10::cuda::CUDACachingAllocator::get();
  const size_t sizes[] = {512, 1 << 20, 64 << 20};
  printf("tensor %-15s (%s)", variant, a->name().c_str());
  for (size_t b : sizes) printf("  %zu: %6.1f", b, tensor_ns(b));
  printf("  ns/pair\n");
  return 0;
}

struct Request {
  bool alloc;
  long id;
  size_t size;
  long stream;
};

static int trace_main(const char *variant, const char *file, int passes) {
  std::ifstream in(file);
  if (!in) {
    fprintf(stderr, "cannot read %s\n", file);
    return 2;
  }
  std::vector<Request> reqs;
  std::string line;
  std::getline(in, line);  // the header
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::stringstream fields(line);
    std::string op, id, size, stream;
    std::getline(fields, op, ',');
    std::getline(fields, id, ',');
    std::getline(fields, size, ',');
    std::getline(fields, stream, ',');
    reqs.push_back({op == "a", std::stol(id), (size_t)std::stoull(size), stream.empty() ? 0 : std::stol(stream)});
  }
  // Allocations never freed, by request index; those of the first half are kept.
  std::unordered_map<long, size_t> unfreed;
  for (size_t k = 0; k < reqs.size(); k++) {
    if (reqs[k].alloc) unfreed[reqs[k].id] = k;
    else unfreed.erase(reqs[k].id);
  }
  std::unordered_set<size_t> kept;
  for (auto &e : unfreed)
    if (e.second < reqs.size() / 2) kept.insert(e.second);
  if (!use_variant(variant)) return 2;
  Alloc *a = c10::cuda::CUDACachingAllocator::get();
  std::unordered_map<long, c10::cuda::CUDAStream> streams;
  auto stream_of = [&](long s) {
    auto it = streams.find(s);
    if (it == streams.end())
      it = streams.emplace(s, s == 0 ? c10::cuda::getDefaultCUDAStream() : c10::cuda::getStreamFromPool()).first;
    return it->second;
  };
  std::vector<c10::DataPtr> held;
  std::unordered_map<long, c10::DataPtr> live;
  live.reserve(reqs.size());
  for (auto &r : reqs) stream_of(r.stream);  // every stream made before the first pass
  long current = -1;
  for (int p = 1; p <= passes; p++) {
    size_t calls = 0;
    auto t = Clock::now();
    for (size_t k = 0; k < reqs.size(); k++) {
      const Request &r = reqs[k];
      if (r.alloc) {
        if (p > 1 && kept.count(k)) continue;
        if (r.stream != current) {
          c10::cuda::setCurrentCUDAStream(streams.at(r.stream));
          current = r.stream;
        }
        c10::DataPtr d = a->allocate(r.size);
        calls++;
        if (kept.count(k)) held.push_back(std::move(d));
        else live[r.id] = std::move(d);
      } else {
        auto it = live.find(r.id);
        if (it == live.end()) continue;
        bool real = it->second.get() != nullptr;
        live.erase(it);  // drops the DataPtr: its deleter frees
        calls += real;
      }
    }
    calls += live.size();
    live.clear();
    double ns = std::chrono::duration<double, std::nano>(Clock::now() - t).count();
    printf("trace %s variant=%s pass=%d calls=%zu ns_per_call=%.1f ms=%.2f", file, variant, p, calls,
           ns / std::max<size_t>(calls, 1), ns / 1e6);
    try {
      auto st = a->getDeviceStats(0);
      printf(" peak_reserved=%lld device_allocs=%lld", (long long)st.reserved_bytes[0].peak,
             (long long)st.num_device_alloc);
    } catch (const std::exception &) {
    }
    printf("\n");
    fflush(stdout);
  }
  c10::cuda::setCurrentCUDAStream(c10::cuda::getDefaultCUDAStream());
  held.clear();
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 3 && std::strcmp(argv[1], "tensor") == 0) return tensor_main(argv[2]);
  if ((argc == 4 || argc == 5) && std::strcmp(argv[1], "trace") == 0)
    return trace_main(argv[2], argv[3], argc == 5 ? std::max(1, atoi(argv[4])) : 20);
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
