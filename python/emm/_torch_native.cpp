// emm's allocator object for PyTorch: PyTorch's pluggable CUDA allocator without
// its per-call bookkeeping.
//
// `torch.cuda.memory.CUDAPluggableAllocator` wraps a pair of C functions in an
// object that, on every allocation, inserts the address into a hash map of its own
// under a process-wide mutex (one heap node per tensor), and on every free looks
// it up, erases it and calls through a std::function. emm keeps its own table of
// live allocations, so that map only repeats it. This subclass overrides the two
// calls a tensor's storage goes through (`allocate` and the deleter of the DataPtr
// it returns) and the raw path (`raw_alloc`, `raw_alloc_with_stream`,
// `raw_delete`, which `torch.cuda.caching_allocator_alloc` and NCCL use), so that
// every address the object hands out is in emm's table alone and any of its
// deleters frees any of them. It also answers what PyTorch's pluggable allocator
// refuses or drops: `torch.cuda.memory_stats()` and the figures built on it
// (`memory_allocated`, `max_memory_reserved`, `memory_summary`, ...), the peak and
// accumulated resets, `empty_cache()`, cuDNN's `cacheInfo`, and `recordStream`
// from C++ (NCCL's process group, `Tensor.record_stream`), each through emm's
// `emm_torch_*` functions. CUDA graph capture gets a private pool of emm's for
// each of PyTorch's pool ids (`beginAllocateToPool`, `endAllocateToPool`,
// `releasePool`): the allocations PyTorch's filter picks during a capture come
// from it, so the memory a graph was captured with stays the graph's.
// `torch.cuda.MemPool` goes the same way (`createOrIncrefPool`,
// `getPoolUseCount`; `use_mem_pool` routes the calling thread's allocations to
// the pool): `MemPool()` gets a private emm pool whose memory goes back once the
// pool dies and nothing in it lives; `MemPool(allocator=X)` keeps X's memory:
// the allocations routed to it are X's `raw_alloc_with_stream`, freed by X's
// `raw_delete`, as PyTorch's own allocator takes such a pool's memory from X.
//
// `emm.torch` compiles this file against the PyTorch it runs with (g++, PyTorch's
// headers and libraries; no ninja), caches the library, and loads it with ctypes.
// emm's functions are handed in as addresses, so the library does not link emm.

#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <sys/types.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace {

// The signatures of include/emm.h's functions the object calls
// (python/tests/test_torch_native.py checks that they agree).
using AllocFn = void* (*)(ssize_t size, int device, void* stream);
using ReleaseFn = int (*)(void* ptr, int device);
using LastErrorFn = size_t (*)(char* buf, size_t len);
using LastErrorCodeFn = int (*)();
using RecordStreamFn = int (*)(void* ptr, int device, void* stream);
using MemoryStatsFn = int (*)(int device, const char* const* keys, uint64_t* values, size_t n, size_t* found);
using ResetPeakStatsFn = int (*)(int device);
using EmptyCacheFn = int (*)(int device, size_t* released);
using CacheInfoFn = int (*)(int device, size_t* largest);
using GraphPoolFn = int (*)(int device, uint64_t pool_a, uint64_t pool_b);
using GraphAllocFn = void* (*)(ssize_t size, int device, void* stream, uint64_t pool_a, uint64_t pool_b);
using GraphLiveFn = int (*)(int device, uint64_t pool_a, uint64_t pool_b, void** ptrs, size_t n, size_t* count);

// include/emm.h's emm_graph_pool_info (python/tests/test_torch_native.py checks
// the fields).
struct emm_graph_pool_info {
  size_t uses;
  size_t live_bytes;
  size_t live_blocks;
  size_t reserved_bytes;
  size_t segments;
  size_t peak_live_bytes;
  size_t peak_reserved_bytes;
};
using GraphInfoFn = int (*)(int device, uint64_t pool_a, uint64_t pool_b, struct emm_graph_pool_info* out);

// The addresses of emm's functions, in the order python/emm/_torch_native.py's
// `Functions` lists them (the test checks that too).
struct EmmFunctions {
  AllocFn alloc;
  ReleaseFn release;
  LastErrorFn last_error;
  LastErrorCodeFn last_error_code;
  RecordStreamFn record_stream;
  MemoryStatsFn memory_stats;
  ResetPeakStatsFn reset_peak_stats;
  EmptyCacheFn empty_cache;
  CacheInfoFn cache_info;
  GraphPoolFn graph_pool_begin;
  GraphPoolFn graph_pool_end;
  GraphPoolFn graph_pool_release;
  GraphAllocFn graph_pool_alloc;
  GraphLiveFn graph_pool_live;
  GraphPoolFn graph_pool_create;
  GraphInfoFn graph_pool_info;
};

// emm_status's EMM_OK and EMM_ERR_OUT_OF_MEMORY.
constexpr int kOk = 0;
constexpr int kOutOfMemory = 2;

// Set once, by the first emm_torch_native_install, before PyTorch can call the
// allocator object.
EmmFunctions g_emm{};

std::string last_error() {
  std::array<char, 2048> buf{};
  g_emm.last_error(buf.data(), buf.size());
  buf.back() = '\0';
  return std::string(buf.data());
}

using CUDAAllocator = c10::cuda::CUDACachingAllocator::CUDAAllocator;

// Pools made with `MemPool(allocator=X)`: their memory is X's, and none of it goes
// back to X while the pool is in use. A CUDA graph may have been captured with
// the pool (its replays write into every block handed out during the capture,
// freed or not), and a free during a capture must not call into X (a free on a
// capturing stream invalidates the capture). So a freed block stays in its pool:
// later allocations of the same size on the same stream take it again (stream
// order makes that safe, as in emm's own private pools); a block also used on
// another stream (recordStream) is only kept. When the pool's last use is
// released, its blocks go back to X after the device is synchronized, at once if
// no capture or `use_mem_pool` routes allocations, else at the next release or
// `torch.cuda.empty_cache()` when none does.
struct ForeignPools {
  using Key = std::tuple<int, uint64_t, uint64_t>;
  // A block X made for a pool, live or kept.
  struct Block {
    std::shared_ptr<CUDAAllocator> owner;
    Key pool;
    size_t size;
    cudaStream_t stream;
    // Used on another stream too (recordStream): kept, never taken again.
    bool shared;
  };
  struct Pool {
    std::shared_ptr<CUDAAllocator> allocator;
    // Freed blocks that may be taken again, by stream and size.
    std::multimap<std::pair<cudaStream_t, size_t>, void*> reusable;
    // Freed blocks kept until the pool is released.
    std::vector<void*> kept;
  };
  std::mutex mutex;
  std::map<Key, Pool> pools;
  std::unordered_map<void*, Block> blocks;  // every block X made: live or kept
  std::unordered_map<void*, bool> live;  // the live ones (value unused)
  // Blocks of released pools waiting to go back to X (device, address).
  std::vector<std::pair<int, void*>> doomed;
  // live.size(), read without the lock on every raw free.
  std::atomic<std::size_t> live_count{0};
  // Captures and `use_mem_pool`s routing allocations now (any pool).
  std::atomic<std::size_t> routes_open{0};
};
// Never destroyed: a free at exit must not find it gone.
ForeignPools& g_foreign = *new ForeignPools();

ForeignPools::Key pool_key(c10::DeviceIndex device, c10::cuda::MempoolId_t id) {
  return {static_cast<int>(device), id.first, id.second};
}

// Whether pool `id` on `device` was made with an allocator of its own.
bool is_foreign_pool(c10::DeviceIndex device, c10::cuda::MempoolId_t id) {
  const std::lock_guard<std::mutex> lock(g_foreign.mutex);
  return g_foreign.pools.count(pool_key(device, id)) != 0;
}

// A block of `size` bytes ordered on `stream` from the pool `id` made with an
// allocator of its own: a kept block of that size and stream, else a new one
// of X's; throws when X has none.
void* foreign_alloc(
    c10::DeviceIndex device,
    c10::cuda::MempoolId_t id,
    size_t size,
    cudaStream_t stream) {
  const ForeignPools::Key key = pool_key(device, id);
  std::shared_ptr<CUDAAllocator> x;
  {
    const std::lock_guard<std::mutex> lock(g_foreign.mutex);
    const auto p = g_foreign.pools.find(key);
    if (p == g_foreign.pools.end()) {
      return nullptr;  // released meanwhile: not routed
    }
    const auto kept = p->second.reusable.find({stream, size});
    if (kept != p->second.reusable.end()) {
      void* ptr = kept->second;
      p->second.reusable.erase(kept);
      g_foreign.live[ptr] = true;
      g_foreign.live_count.store(g_foreign.live.size(), std::memory_order_release);
      return ptr;
    }
    x = p->second.allocator;
  }
  // X is called without the lock (it may allocate through this object), in
  // CUDA's relaxed capture mode (a capture may be routing to the pool; PyTorch's
  // own allocator calls a pool's allocator the same way), the mode restored.
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  C10_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
  void* ptr = nullptr;
  try {
    ptr = x->raw_alloc_with_stream(size, stream);
  } catch (...) {
    (void)cudaThreadExchangeStreamCaptureMode(&mode);
    throw;
  }
  C10_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
  if (ptr == nullptr) {
    if (size == 0) {
      return nullptr;
    }
    C10_THROW_ERROR(
        OutOfMemoryError,
        "the allocator of the MemPool in use returned no memory for " +
            std::to_string(size) + " bytes on CUDA device " +
            std::to_string(static_cast<int>(device)));
  }
  const std::lock_guard<std::mutex> lock(g_foreign.mutex);
  g_foreign.blocks[ptr] = ForeignPools::Block{x, key, size, stream, false};
  g_foreign.live[ptr] = true;
  g_foreign.live_count.store(g_foreign.live.size(), std::memory_order_release);
  return ptr;
}

// Notes that the live block `ptr` of a pool's own allocator is used on another
// stream; whether it is one.
bool foreign_record_stream(void* ptr, cudaStream_t stream) {
  const std::lock_guard<std::mutex> lock(g_foreign.mutex);
  const auto b = g_foreign.blocks.find(ptr);
  if (b == g_foreign.blocks.end() || g_foreign.live.count(ptr) == 0) {
    return false;
  }
  if (stream != b->second.stream) {
    b->second.shared = true;
  }
  return true;
}

// Gives the doomed blocks back to their allocators, after synchronizing each
// device they lie on, when no capture or `use_mem_pool` routes allocations (a
// synchronization would invalidate a capture); else they wait for a later call.
// Never throws: it runs from releasePool, which PyTorch calls in destructors.
void flush_doomed() noexcept {
  std::vector<std::pair<int, void*>> doomed;
  std::vector<std::shared_ptr<CUDAAllocator>> owners;
  {
    const std::lock_guard<std::mutex> lock(g_foreign.mutex);
    if (g_foreign.doomed.empty() ||
        g_foreign.routes_open.load(std::memory_order_acquire) != 0) {
      return;
    }
    doomed.swap(g_foreign.doomed);
    for (const auto& d : doomed) {
      const auto b = g_foreign.blocks.find(d.second);
      owners.push_back(b == g_foreign.blocks.end() ? nullptr : b->second.owner);
      if (b != g_foreign.blocks.end()) {
        g_foreign.blocks.erase(b);
      }
    }
  }
  try {
    std::vector<int> synced;
    for (std::size_t i = 0; i < doomed.size(); ++i) {
      const int device = doomed[i].first;
      if (std::find(synced.begin(), synced.end(), device) == synced.end()) {
        const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
        C10_CUDA_CHECK(cudaDeviceSynchronize());
        synced.push_back(device);
      }
      if (owners[i] != nullptr) {
        owners[i]->raw_delete(doomed[i].second);
      }
    }
  } catch (const std::exception& e) {
    // What was not given back stays X's until the process ends.
    std::fprintf(stderr, "emm: giving a MemPool's memory back to its allocator failed: %s\n", e.what());
  }
}

// The free of `ptr` if a pool's own allocator made it (see ForeignPools);
// whether it did.
bool release_foreign_if_known(void* ptr) {
  {
    const std::lock_guard<std::mutex> lock(g_foreign.mutex);
    if (g_foreign.live.erase(ptr) == 0) {
      return false;
    }
    g_foreign.live_count.store(g_foreign.live.size(), std::memory_order_release);
    const ForeignPools::Block& b = g_foreign.blocks.at(ptr);
    const auto p = g_foreign.pools.find(b.pool);
    if (p == g_foreign.pools.end()) {
      // Its pool was released: back to X once the device is synchronized.
      g_foreign.doomed.emplace_back(std::get<0>(b.pool), ptr);
    } else if (b.shared) {
      p->second.kept.push_back(ptr);
    } else {
      p->second.reusable.emplace(std::make_pair(b.stream, b.size), ptr);
      return true;
    }
  }
  flush_doomed();
  return true;
}

// The deleter of tensors a pool's own allocator made.
void release_foreign(void* ptr) {
  release_foreign_if_known(ptr);
}

// The last use of pool `id` was released: its kept blocks are doomed (see
// ForeignPools). Nothing for a pool without an allocator of its own.
void release_foreign_pool(c10::DeviceIndex device, c10::cuda::MempoolId_t id) noexcept {
  {
    const std::lock_guard<std::mutex> lock(g_foreign.mutex);
    const auto p = g_foreign.pools.find(pool_key(device, id));
    if (p == g_foreign.pools.end()) {
      return;
    }
    for (const auto& r : p->second.reusable) {
      g_foreign.doomed.emplace_back(static_cast<int>(device), r.second);
    }
    for (void* k : p->second.kept) {
      g_foreign.doomed.emplace_back(static_cast<int>(device), k);
    }
    // Live blocks keep X (their Block) and are doomed when freed.
    g_foreign.pools.erase(p);
  }
  flush_doomed();
}

// A DataPtr's deleter receives only the address, so each device gets a deleter of
// its own (the device is a template argument); emm then looks the address up in
// that device's table alone. Devices past the table, and `raw_deleter()`, use the
// one that looks in every device's table (device -1).
constexpr int kDevices = 64;

template <int D>
void release_on(void* ptr) {
  g_emm.release(ptr, D);
}

void release_any(void* ptr) {
  if (g_foreign.live_count.load(std::memory_order_acquire) != 0 &&
      release_foreign_if_known(ptr)) {
    return;
  }
  g_emm.release(ptr, -1);
}

template <std::size_t... I>
constexpr std::array<c10::DeleterFnPtr, sizeof...(I)> deleters(
    std::index_sequence<I...> /*unused*/) {
  return {&release_on<static_cast<int>(I)>...};
}

constexpr std::array<c10::DeleterFnPtr, kDevices> kRelease =
    deleters(std::make_index_sequence<kDevices>{});

using Pluggable = torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator;

// Throws c10::OutOfMemoryError (torch.OutOfMemoryError) when emm's last
// allocation ran out of memory and c10::Error for any other failure, with emm's
// reason. (PyTorch's own pluggable allocator hands out a tensor at address 0
// instead.) The message is put together without iostreams: c10::str's stream,
// instantiated in this library, crashed against the libstdc++ PyTorch's wheel
// runs with.
[[noreturn]] void throw_alloc_failure(size_t size, c10::DeviceIndex device) {
  const bool oom = g_emm.last_error_code() == kOutOfMemory;
  const std::string message = "emm could not allocate " +
      std::to_string(size) + " bytes on CUDA device " +
      std::to_string(static_cast<int>(device)) + ": " + last_error();
  if (oom) {
    C10_THROW_ERROR(OutOfMemoryError, message);
  }
  C10_THROW_ERROR(Error, message);
}

// emm's allocation of `size` bytes on `device` ordered on `stream`, from the
// process's manager; throws as throw_alloc_failure says.
void* checked_alloc(size_t size, c10::DeviceIndex device, cudaStream_t stream) {
  void* ptr = g_emm.alloc(static_cast<ssize_t>(size), device, stream);
  if (ptr == nullptr && size != 0) {
    throw_alloc_failure(size, device);
  }
  return ptr;
}

// Throws c10::Error with emm's reason when an emm function other than an
// allocation failed.
void check(int status, const char* what) {
  if (status != kOk) {
    C10_THROW_ERROR(Error, std::string(what) + ": " + last_error());
  }
}

// PyTorch's statistics type (c10::CachingDeviceAllocator::DeviceStats since
// PyTorch 2.6 or so, c10::cuda::CUDACachingAllocator::DeviceStats before), as the
// base class returns it.
using DeviceStats =
    decltype(std::declval<Pluggable&>().getDeviceStats(c10::DeviceIndex{0}));
using StatArray = decltype(DeviceStats::allocated_bytes);
using Stat = typename StatArray::value_type;

// memory_stats names: the arrays of DeviceStats (emm keeps the "all" entry of
// each, the aggregate: index 0), each with four fields, then the single counters.
constexpr std::array<const char*, 9> kArrayNames = {
    "allocation", "segment", "active", "inactive_split", "allocated_bytes",
    "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes"};
constexpr std::array<StatArray DeviceStats::*, 9> kArrays = {
    &DeviceStats::allocation, &DeviceStats::segment, &DeviceStats::active,
    &DeviceStats::inactive_split, &DeviceStats::allocated_bytes,
    &DeviceStats::reserved_bytes, &DeviceStats::active_bytes,
    &DeviceStats::inactive_split_bytes, &DeviceStats::requested_bytes};
constexpr std::array<const char*, 4> kFieldNames = {
    "current", "peak", "allocated", "freed"};
constexpr std::array<int64_t Stat::*, 4> kFields = {
    &Stat::current, &Stat::peak, &Stat::allocated, &Stat::freed};
constexpr std::array<const char*, 5> kCounterNames = {
    "num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc",
    "num_device_free"};
constexpr std::array<int64_t DeviceStats::*, 5> kCounters = {
    &DeviceStats::num_alloc_retries, &DeviceStats::num_ooms,
    &DeviceStats::num_sync_all_streams, &DeviceStats::num_device_alloc,
    &DeviceStats::num_device_free};
constexpr std::size_t kStatFields = kArrays.size() * kFields.size();
constexpr std::size_t kNames = kStatFields + kCounters.size();

// Whether name i is an accumulated count, which resetAccumulatedStats zeroes:
// the "allocated" and "freed" fields, and every single counter.
constexpr bool accumulated(std::size_t i) {
  return i >= kStatFields || i % kFields.size() >= 2;
}

// The names as emm's emm_torch_memory_stats takes them ("allocation.all.current",
// ..., "num_device_free"), made once.
const std::array<std::string, kNames>& stat_names() {
  static const std::array<std::string, kNames> names = [] {
    std::array<std::string, kNames> out;
    for (std::size_t a = 0; a < kArrays.size(); ++a) {
      for (std::size_t f = 0; f < kFields.size(); ++f) {
        out[a * kFields.size() + f] =
            std::string(kArrayNames[a]) + ".all." + kFieldNames[f];
      }
    }
    for (std::size_t c = 0; c < kCounters.size(); ++c) {
      out[kStatFields + c] = kCounterNames[c];
    }
    return out;
  }();
  return names;
}

using StatValues = std::array<uint64_t, kNames>;

// emm's counters of `device`, in stat_names() order (0 where emm keeps none).
StatValues read_stats(c10::DeviceIndex device) {
  static const std::array<const char*, kNames> keys = [] {
    std::array<const char*, kNames> out{};
    for (std::size_t i = 0; i < kNames; ++i) {
      out[i] = stat_names()[i].c_str();
    }
    return out;
  }();
  StatValues values{};
  check(
      g_emm.memory_stats(device, keys.data(), values.data(), kNames, nullptr),
      "emm's memory statistics");
  return values;
}

int64_t as_stat(uint64_t v) {
  return v > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX
                                                : static_cast<int64_t>(v);
}

// Gives every device's idle memory back (emm keeps none of PyTorch's memory
// pools, so a pool named by PyTorch changes nothing).
void empty_all() {
  check(g_emm.empty_cache(-1, nullptr), "emm could not empty its cache");
}

// Whether the base class's emptyCache takes a memory pool (PyTorch 2.8 and later),
// told from its signature.
template <class A, class = void>
struct EmptyCacheTakesPool : std::false_type {};
template <class A>
struct EmptyCacheTakesPool<
    A,
    std::void_t<decltype(std::declval<A&>().emptyCache(
        std::declval<c10::cuda::MempoolId_t>()))>> : std::true_type {};

template <class Base>
struct EmptyCacheWithPool : Base {
  using Base::Base;
  // `torch.cuda.empty_cache()` names no pool ({0, 0}): everything idle goes
  // back. A private pool's own (a dying MemPool asks after releasing it) went
  // back at its release already, as far as nothing in it lives; the rest goes at
  // the next empty_cache.
  void emptyCache(c10::cuda::MempoolId_t mempool_id) override {
    if (mempool_id.first == 0 && mempool_id.second == 0) {
      empty_all();
    }
    flush_doomed();
  }
};

template <class Base>
struct EmptyCacheWithoutPool : Base {
  using Base::Base;
  void emptyCache() override {
    empty_all();
    flush_doomed();
  }
};

// The pluggable allocator with emptyCache overridden in the form it has.
using WithEmptyCache = std::conditional_t<
    EmptyCacheTakesPool<Pluggable>::value,
    EmptyCacheWithPool<Pluggable>,
    EmptyCacheWithoutPool<Pluggable>>;

// `torch.cuda.MemPool(allocator=X)` hands X in as a std::shared_ptr (newer
// PyTorch) or a raw pointer (older: the Python MemPool keeps X alive); either
// becomes a shared_ptr here.
std::shared_ptr<CUDAAllocator> shared_of(std::shared_ptr<CUDAAllocator> a) {
  return a;
}
std::shared_ptr<CUDAAllocator> shared_of(CUDAAllocator* a) {
  return a == nullptr ? nullptr
                      : std::shared_ptr<CUDAAllocator>(a, [](CUDAAllocator*) {});
}

// `MemPool()` and `MemPool(allocator=X)`: one more use of the private pool `id`,
// made if new; X, if given, makes the pool's memory.
void create_pool(
    c10::DeviceIndex device,
    c10::cuda::MempoolId_t id,
    std::shared_ptr<CUDAAllocator> allocator) {
  check(
      g_emm.graph_pool_create(device, id.first, id.second),
      "emm could not make a private memory pool");
  if (allocator != nullptr) {
    const std::lock_guard<std::mutex> lock(g_foreign.mutex);
    auto& pool = g_foreign.pools[pool_key(device, id)];
    if (pool.allocator == nullptr) {
      pool.allocator = std::move(allocator);
    }
  }
}

// The uses of pool `id` not yet released (0 for a pool not in use).
int pool_use_count(c10::DeviceIndex device, c10::cuda::MempoolId_t id) {
  emm_graph_pool_info info{};
  check(
      g_emm.graph_pool_info(device, id.first, id.second, &info),
      "emm could not read a private memory pool");
  return info.uses > static_cast<size_t>(INT32_MAX) ? INT32_MAX
                                                     : static_cast<int>(info.uses);
}

// The type of createOrIncrefPool's allocator parameter, from its signature.
template <class F>
struct PoolAllocatorArg;
template <class C, class R, class A, class B, class X>
struct PoolAllocatorArg<R (C::*)(A, B, X)> {
  using type = X;
};

// PyTorch before MemPool: nothing to override.
template <class Base, class = void>
struct WithMemPools : Base {
  using Base::Base;
};

template <class Base>
struct WithMemPools<
    Base,
    std::void_t<
        decltype(&Base::createOrIncrefPool),
        decltype(&Base::getPoolUseCount)>> : Base {
  using Base::Base;
  using AllocatorArg =
      typename PoolAllocatorArg<decltype(&Base::createOrIncrefPool)>::type;

  void createOrIncrefPool(
      c10::DeviceIndex device,
      c10::cuda::MempoolId_t mempool_id,
      AllocatorArg allocator) override {
    create_pool(device, mempool_id, shared_of(allocator));
  }

  int getPoolUseCount(
      c10::DeviceIndex device,
      c10::cuda::MempoolId_t mempool_id) override {
    return pool_use_count(device, mempool_id);
  }
};

// `MemPool`'s destructor calls setUseOnOOM(device, id, false) whatever the pool
// was made with, so the object answers it: false is what emm does anyway (a
// pool's free blocks are its own); true (`MemPool(use_on_oom=True)`: lend the
// pool's free blocks when the process's memory runs out) is refused with the
// reason.
template <class Base, class = void>
struct WithUseOnOOM : Base {
  using Base::Base;
};

template <class Base>
struct WithUseOnOOM<
    Base,
    std::void_t<decltype(std::declval<Base&>().setUseOnOOM(
        c10::DeviceIndex{0}, c10::cuda::MempoolId_t{}, false))>> : Base {
  using Base::Base;
  void setUseOnOOM(
      c10::DeviceIndex /*device*/,
      c10::cuda::MempoolId_t /*mempool_id*/,
      bool use_on_oom) override {
    if (use_on_oom) {
      C10_THROW_ERROR(
          Error,
          "emm's allocator object does not lend a MemPool's free blocks when "
          "memory runs out (MemPool(use_on_oom=True)); make the pool without it");
    }
  }
};

// `MemPool(no_split=True)` (hand out a pool's cached pieces whole) is refused
// with the reason: emm's private pools cut blocks from their segments.
template <class Base, class = void>
struct WithNoSplit : Base {
  using Base::Base;
};

template <class Base>
struct WithNoSplit<
    Base,
    std::void_t<decltype(std::declval<Base&>().setNoSplit(
        c10::DeviceIndex{0}, c10::cuda::MempoolId_t{}))>> : Base {
  using Base::Base;
  void setNoSplit(
      c10::DeviceIndex /*device*/,
      c10::cuda::MempoolId_t /*mempool_id*/) override {
    C10_THROW_ERROR(
        Error,
        "emm's allocator object does not keep a MemPool's blocks unsplit "
        "(MemPool(no_split=True)); make the pool without it");
  }
};

using WithPools = WithNoSplit<WithUseOnOOM<WithMemPools<WithEmptyCache>>>;

struct EmmAllocator final : WithPools {
  using WithPools::WithPools;

  c10::DataPtr allocate(size_t size) override {
    const c10::DeviceIndex device = c10::cuda::current_device();
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
    const Routed r = routed_alloc(size, device, stream);
    const c10::DeleterFnPtr deleter = r.foreign
        ? &release_foreign
        : (device >= 0 && device < kDevices ? kRelease[device] : &release_any);
    return {r.ptr, r.ptr, deleter, c10::Device(c10::DeviceType::CUDA, device)};
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return &release_any;
  }

  void* raw_alloc(size_t nbytes) override {
    const c10::DeviceIndex device = c10::cuda::current_device();
    return routed_alloc(
               nbytes, device, c10::cuda::getCurrentCUDAStream(device).stream())
        .ptr;
  }

  void* raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override {
    return routed_alloc(nbytes, c10::cuda::current_device(), stream).ptr;
  }

  void raw_delete(void* ptr) override {
    release_any(ptr);
  }

  // A tensor's memory is used on `stream` too: its free waits for the work
  // queued there (emm_torch_record_stream). Memory another allocator handed out
  // (a DataPtr with a deleter not of this object) is ignored, as PyTorch's own
  // allocator ignores it.
  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream)
      override {
    if (ptr.get() != nullptr && ptr.get_deleter() == &release_foreign) {
      foreign_record_stream(ptr.get(), stream.stream());
      return;
    }
    if (ptr.get() == nullptr || !is_ours(ptr.get_deleter())) {
      return;
    }
    check(
        g_emm.record_stream(ptr.get(), ptr.device().index(), stream.stream()),
        "emm could not record a tensor's use on another stream");
  }

  DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    StatValues values = read_stats(device);
    subtract_reset(device, values);
    DeviceStats stats;
    for (std::size_t a = 0; a < kArrays.size(); ++a) {
      // Index 0 is StatType::AGGREGATE, PyTorch's "all".
      Stat& stat = (stats.*kArrays[a])[0];
      for (std::size_t f = 0; f < kFields.size(); ++f) {
        stat.*kFields[f] = as_stat(values[a * kFields.size() + f]);
      }
    }
    for (std::size_t c = 0; c < kCounters.size(); ++c) {
      stats.*kCounters[c] = as_stat(values[kStatFields + c]);
    }
    return stats;
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    check(g_emm.reset_peak_stats(device), "emm could not reset its peaks");
  }

  // emm never resets its accumulated counts; from here on PyTorch is told this
  // device's as counted since this call (emm.torch.memory_stats() and emm's own
  // tools still count from the start).
  void resetAccumulatedStats(c10::DeviceIndex device) override {
    if (device < 0 || device >= kDevices) {
      return;
    }
    const StatValues now = read_stats(device);
    const std::lock_guard<std::mutex> lock(reset_mutex_);
    StatValues& base = reset_base_[device];
    for (std::size_t i = 0; i < kNames; ++i) {
      base[i] = accumulated(i) ? now[i] : 0;
    }
  }

  // A CUDA graph capture (PyTorch calls this before cudaStreamBeginCapture):
  // from here until endAllocateToPool, the allocations on `device` that
  // `filter` picks (those on a stream of the capture) come from emm's private
  // pool `mempool_id`, which keeps them for the graph's replays.
  void beginAllocateToPool(
      c10::DeviceIndex device,
      c10::cuda::MempoolId_t mempool_id,
      std::function<bool(cudaStream_t)> filter) override {
    check(
        g_emm.graph_pool_begin(device, mempool_id.first, mempool_id.second),
        "emm could not begin a private pool for a CUDA graph");
    const std::lock_guard<std::mutex> lock(routes_mutex_);
    routes_.push_back(Route{device, mempool_id, std::move(filter)});
    routing_.store(routes_.size(), std::memory_order_release);
    g_foreign.routes_open.store(routes_.size(), std::memory_order_release);
  }

  // After the capture ended: its allocations go to the process's manager again.
  void endAllocateToPool(
      c10::DeviceIndex device,
      c10::cuda::MempoolId_t mempool_id) override {
    {
      const std::lock_guard<std::mutex> lock(routes_mutex_);
      for (auto it = routes_.begin(); it != routes_.end(); ++it) {
        if (it->device == device && it->pool == mempool_id) {
          routes_.erase(it);
          break;
        }
      }
      routing_.store(routes_.size(), std::memory_order_release);
      g_foreign.routes_open.store(routes_.size(), std::memory_order_release);
    }
    check(
        g_emm.graph_pool_end(device, mempool_id.first, mempool_id.second),
        "emm could not end the routing of a CUDA graph's allocations");
  }

  // A graph captured with the pool was reset or destroyed. PyTorch calls this
  // from CUDAGraph's destructor, so it must not throw: a failure is in emm's log.
  void releasePool(
      c10::DeviceIndex device,
      c10::cuda::MempoolId_t mempool_id) override {
    g_emm.graph_pool_release(device, mempool_id.first, mempool_id.second);
    emm_graph_pool_info info{};
    if (g_emm.graph_pool_info(
            device, mempool_id.first, mempool_id.second, &info) == kOk &&
        info.uses == 0) {
      release_foreign_pool(device, mempool_id);
    } else {
      flush_doomed();  // blocks of pools released while routes were open
    }
  }

  // Whether the blocks of the graph pool handed out and not yet freed are
  // exactly `expected_live_allocations` (CUDA graph trees, torch.compile's
  // reduce-overhead mode, ask before reusing a pool).
  bool checkPoolLiveAllocations(
      c10::DeviceIndex device,
      c10::cuda::MempoolId_t mempool_id,
      const std::unordered_set<void*>& expected_live_allocations) override {
    size_t count = 0;
    check(
        g_emm.graph_pool_live(
            device, mempool_id.first, mempool_id.second, nullptr, 0, &count),
        "emm could not list a CUDA graph pool's live blocks");
    std::vector<void*> live(count);
    check(
        g_emm.graph_pool_live(
            device, mempool_id.first, mempool_id.second, live.data(),
            live.size(), &count),
        "emm could not list a CUDA graph pool's live blocks");
    if (count != live.size() || count != expected_live_allocations.size()) {
      return false;
    }
    for (void* p : live) {
      if (expected_live_allocations.count(p) == 0) {
        return false;
      }
    }
    return true;
  }

  void cacheInfo(c10::DeviceIndex device, size_t* largestBlock) override {
    check(
        g_emm.cache_info(device, largestBlock),
        "emm could not tell the largest block it can hand out");
  }

 private:
  // Where a capture's allocations go: PyTorch's filter picks them on `device`.
  struct Route {
    c10::DeviceIndex device;
    c10::cuda::MempoolId_t pool;
    std::function<bool(cudaStream_t)> filter;
  };

  // An address and whether a pool's own allocator made it.
  struct Routed {
    void* ptr;
    bool foreign;
  };

  // The allocation from the private pool a capture or `use_mem_pool` routes it
  // to (PyTorch's filter picks it on `device`): the pool's own allocator's when
  // it was made with one, else emm's pool's; else from the process's manager.
  Routed routed_alloc(
      size_t size,
      c10::DeviceIndex device,
      cudaStream_t stream) {
    if (routing_.load(std::memory_order_acquire) != 0) {
      bool found = false;
      c10::cuda::MempoolId_t pool{};
      {
        const std::lock_guard<std::mutex> lock(routes_mutex_);
        // The newest route first, as PyTorch's own allocator picks: the
        // innermost `use_mem_pool` wins.
        for (auto it = routes_.rbegin(); it != routes_.rend(); ++it) {
          if (it->device == device && it->filter(stream)) {
            pool = it->pool;
            found = true;
            break;
          }
        }
      }
      if (found) {
        // Neither call runs under routes_mutex_: a pool's allocator may
        // allocate through this object.
        if (is_foreign_pool(device, pool)) {
          void* ptr = foreign_alloc(device, pool, size, stream);
          if (ptr != nullptr || size == 0) {
            return {ptr, true};
          }
          // The pool was released meanwhile: emm's pool of that id, as below.
        }
        void* ptr = g_emm.graph_pool_alloc(
            static_cast<ssize_t>(size), device, stream, pool.first,
            pool.second);
        if (ptr == nullptr && size != 0) {
          throw_alloc_failure(size, device);
        }
        return {ptr, false};
      }
    }
    return {checked_alloc(size, device, stream), false};
  }

  static bool is_ours(c10::DeleterFnPtr deleter) {
    if (deleter == &release_any) {
      return true;
    }
    for (const c10::DeleterFnPtr d : kRelease) {
      if (d == deleter) {
        return true;
      }
    }
    return false;
  }

  void subtract_reset(c10::DeviceIndex device, StatValues& values) {
    if (device < 0 || device >= kDevices) {
      return;
    }
    const std::lock_guard<std::mutex> lock(reset_mutex_);
    const StatValues& base = reset_base_[device];
    for (std::size_t i = 0; i < kNames; ++i) {
      values[i] = values[i] > base[i] ? values[i] - base[i] : 0;
    }
  }

  // Each device's accumulated counts at its last resetAccumulatedStats.
  std::mutex reset_mutex_;
  std::array<StatValues, kDevices> reset_base_{};

  // The captures routing allocations now; routing_ is their count, read without
  // the lock on every allocation.
  std::mutex routes_mutex_;
  std::vector<Route> routes_;
  std::atomic<std::size_t> routing_{0};
};

void copy_message(const char* what, char* err, size_t len) {
  if (err == nullptr || len == 0) {
    return;
  }
  std::strncpy(err, what, len - 1);
  err[len - 1] = '\0';
}

} // namespace

// Makes PyTorch's CUDA allocator emm's (PyTorch refuses once its allocator has
// handed out memory). `fns` holds emm's functions, `size` is the size of the
// struct the caller filled. 0 on success; 1 with the reason in `err` when the
// struct's size differs, an address is null or the library was installed
// already; 2 when PyTorch refused.
extern "C" int emm_torch_native_install(
    const EmmFunctions* fns,
    size_t size,
    char* err,
    size_t len) {
  if (fns == nullptr || size != sizeof(EmmFunctions)) {
    copy_message(
        "emm_torch_native_install: the functions' table is missing or of another size",
        err, len);
    return 1;
  }
  if (fns->alloc == nullptr || fns->release == nullptr ||
      fns->last_error == nullptr || fns->last_error_code == nullptr ||
      fns->record_stream == nullptr || fns->memory_stats == nullptr ||
      fns->reset_peak_stats == nullptr || fns->empty_cache == nullptr ||
      fns->cache_info == nullptr || fns->graph_pool_begin == nullptr ||
      fns->graph_pool_end == nullptr || fns->graph_pool_release == nullptr ||
      fns->graph_pool_alloc == nullptr || fns->graph_pool_live == nullptr ||
      fns->graph_pool_create == nullptr || fns->graph_pool_info == nullptr) {
    copy_message("emm_torch_native_install: a function address is null", err, len);
    return 1;
  }
  if (g_emm.alloc != nullptr) {
    copy_message("emm_torch_native_install: installed already", err, len);
    return 1;
  }
  g_emm = *fns;
  try {
    // The base class's own functions are never called: every path that
    // would reach them is overridden above.
    auto allocator = std::make_shared<EmmAllocator>(
        [](size_t size, int device, cudaStream_t stream) {
          return checked_alloc(size, static_cast<c10::DeviceIndex>(device), stream);
        },
        [](void* ptr, size_t /*size*/, int /*device*/, cudaStream_t /*stream*/) {
          release_any(ptr);
        });
    // The device count is not used by the base class; 0 keeps install from
    // starting CUDA (as PyTorch's own pluggable path does).
    allocator->init(0);
    torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(allocator);
    return 0;
  } catch (const std::exception& e) {
    copy_message(e.what(), err, len);
  } catch (...) {
    copy_message("emm_torch_native_install: an unknown C++ exception", err, len);
  }
  g_emm = EmmFunctions{};
  return 2;
}
