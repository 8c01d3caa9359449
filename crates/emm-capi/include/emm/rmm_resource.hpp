/* emm as an RMM memory resource: a header-only adaptor over emm's C ABI (emm.h).
 *
 *   #include <emm/rmm_resource.hpp>
 *   #include <rmm/mr/per_device_resource.hpp>
 *
 *   emm::rmm_resource mr{};                     // the current device's manager
 *   rmm::mr::set_current_device_resource(mr);   // rmm::device_buffer, device_uvector, ... use emm
 *
 * The class satisfies CCCL's memory-resource concepts as RMM 26.x uses them
 * (cuda::mr::resource_with<emm::rmm_resource, cuda::mr::device_accessible>):
 * stream-ordered allocate(stream, bytes, alignment) / deallocate(stream, ptr, bytes,
 * alignment), allocate_sync / deallocate_sync, ==, and the device_accessible
 * property. It needs RMM (26.x; CCCL 3.3 or newer, as RMM itself) and links with
 * -lemm_capi and RMM's -lrmm (RMM's exception types live there).
 *
 * Ownership: a resource holds one emm handle (emm_manager*) of one device, shared by
 * its copies (a std::shared_ptr): copying is a reference count, and the handle is
 * destroyed with the last copy. An emm handle frees on destruction whatever was
 * allocated through it and not freed yet, and memory is freed through the handle
 * that allocated it, so copies compare equal (memory of one may be given to the
 * other) exactly when they share the handle. Every handle of a device serves the
 * same manager (the process's, shared with emm's Python, PyTorch and CuPy users).
 *
 * Errors: out of memory throws rmm::out_of_memory, every other failure of
 * allocation rmm::bad_alloc (both std::bad_alloc), with emm's message; an
 * alignment above 256 bytes, or not a power of two, throws rmm::bad_alloc naming
 * both (wrap the resource in rmm::mr::aligned_resource_adaptor for larger ones);
 * failing to create a handle throws rmm::logic_error. deallocate is noexcept as the
 * concept requires: a failure (a pointer emm did not hand out through this handle)
 * is written to stderr and counted (failed_deallocations()).
 *
 * Streams: cudaStream_t{nullptr} means the default stream of the CUDA runtime: the
 * legacy default stream, or the per-thread one when the translation unit is built
 * with --default-stream per-thread (CUDA_API_PER_THREAD_DEFAULT_STREAM); the
 * adaptor passes emm that stream by its explicit handle.
 */
#ifndef EMM_RMM_RESOURCE_HPP
#define EMM_RMM_RESOURCE_HPP

#include "../emm.h"

#if !defined(__has_include)
#error "emm/rmm_resource.hpp needs a compiler with __has_include (C++17)"
#endif
#if !__has_include(<rmm/error.hpp>)
#error "emm/rmm_resource.hpp is an adaptor for RMM and needs RMM's headers: add -I<librmm>/include and -I<librmm>/include/rapids (for the librmm wheel, <site-packages>/librmm/include[/rapids]) and RMM's dependency rapids_logger's include directory"
#endif

#include <rmm/error.hpp>
#include <rmm/process_is_exiting.hpp>

#include <cuda/memory_resource>
#include <cuda/stream_ref>
#include <cuda/version>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#if CCCL_MAJOR_VERSION < 3 || (CCCL_MAJOR_VERSION == 3 && CCCL_MINOR_VERSION < 3)
#error "emm/rmm_resource.hpp needs CCCL 3.3 or newer (the memory-resource concept of RMM 26.x: allocate(stream, bytes, alignment), allocate_sync); put RMM's bundled CCCL (<librmm>/include/rapids) before the CUDA toolkit's"
#endif

namespace emm {

/** A device memory resource of RMM (and CCCL) over one emm manager handle. */
class rmm_resource {
 public:
  /** The alignment every emm allocation has at least (emm's manager contract:
   *  at least 256 bytes, as cuMemAlloc). Larger alignments are refused. */
  static constexpr std::size_t guaranteed_alignment = 256;

  /** A handle on the manager of the current CUDA device (cudaGetDevice), the one
   *  EMM_MEMORY_MANAGER or emm_configure chose, else "pool". Throws
   *  rmm::logic_error when the device cannot be read or emm refuses the handle. */
  rmm_resource() : rmm_resource{current_device()} {}

  /** A handle on the manager of CUDA device `device`. `name`: "pool", "default"
   *  or "hostonly"; nullptr: EMM_MEMORY_MANAGER, else the one configured
   *  (emm_configure), else "pool". Throws rmm::logic_error when emm refuses the
   *  handle (an unknown manager, another manager already serving memory, no such
   *  device). */
  explicit rmm_resource(int device, const char* name = nullptr)
    : state_{std::make_shared<state>(create(device, name), device)}
  {
  }

  /** Takes ownership of `handle` (from emm_manager_create for `device`): destroyed
   *  with the last copy. Throws rmm::logic_error for a null handle. */
  static rmm_resource adopt(emm_manager* handle, int device)
  {
    if (handle == nullptr) { throw rmm::logic_error("emm::rmm_resource::adopt: the handle is null"); }
    return rmm_resource{std::make_shared<state>(handle, device)};
  }

  /** The current CUDA device (cudaGetDevice); throws rmm::logic_error on failure. */
  static int current_device()
  {
    int device    = -1;
    cudaError_t e = cudaGetDevice(&device);
    if (e != cudaSuccess) {
      throw rmm::logic_error(std::string{"emm::rmm_resource: reading the current CUDA device failed: "} +
                             cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
    }
    return device;
  }

  rmm_resource(rmm_resource const&)            = default;  ///< shares the handle
  rmm_resource(rmm_resource&&) noexcept        = default;  ///< moves the handle
  rmm_resource& operator=(rmm_resource const&) = default;  ///< shares the handle
  rmm_resource& operator=(rmm_resource&&) noexcept = default;  ///< moves the handle
  ~rmm_resource()                              = default;  ///< the last copy destroys the handle

  /** `bytes` of device memory usable on `stream` in stream order, aligned to
   *  `alignment` (a power of two, at most 256). bytes == 0 returns nullptr.
   *  Throws rmm::out_of_memory (out of memory) or rmm::bad_alloc (anything else). */
  [[nodiscard]] void* allocate(cuda::stream_ref stream,
                               std::size_t bytes,
                               std::size_t alignment = guaranteed_alignment) const
  {
    check_alignment(bytes, alignment);
    std::uint64_t ptr = 0;
    emm_status s      = emm_alloc(live_handle("allocate"), bytes, cu_stream(stream), &ptr);
    if (s != EMM_OK) { throw_failure(s, "allocate", bytes); }
    return reinterpret_cast<void*>(static_cast<std::uintptr_t>(ptr));
  }

  /** Frees `ptr` (from allocate or allocate_sync of this resource or a copy)
   *  ordered on `stream`: later work on `stream` may reuse it at once, other streams
   *  once that point of `stream` is reached. `bytes` and `alignment` are not needed
   *  by emm. A failure is written to stderr and counted (failed_deallocations()). */
  void deallocate(cuda::stream_ref stream,
                  void* ptr,
                  std::size_t bytes,
                  std::size_t alignment = guaranteed_alignment) const noexcept
  {
    (void)alignment;
    release(cu_stream(stream), ptr, bytes);
  }

  /** allocate on the default stream, then waits for that stream: the memory is
   *  usable on any stream when this returns (as RMM's own resources do). */
  [[nodiscard]] void* allocate_sync(std::size_t bytes, std::size_t alignment = guaranteed_alignment) const
  {
    cuda::stream_ref stream{cudaStream_t{nullptr}};
    void* ptr = allocate(stream, bytes, alignment);
    cudaError_t e = cudaStreamSynchronize(cudaStream_t{nullptr});
    if (e != cudaSuccess) {
      release(cu_stream(stream), ptr, bytes);
      throw rmm::bad_alloc(std::string{"emm::rmm_resource::allocate_sync: synchronizing the default stream after allocating "} +
                           std::to_string(bytes) + " bytes failed: " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
    }
    return ptr;
  }

  /** deallocate ordered on the default stream. */
  void deallocate_sync(void* ptr, std::size_t bytes, std::size_t alignment = guaranteed_alignment) const noexcept
  {
    deallocate(cuda::stream_ref{cudaStream_t{nullptr}}, ptr, bytes, alignment);
  }

  /** Equal when both share one handle: memory from one may be freed by the other. */
  [[nodiscard]] bool operator==(rmm_resource const& other) const noexcept { return state_ == other.state_; }
  /** Not equal: see operator==. */
  [[nodiscard]] bool operator!=(rmm_resource const& other) const noexcept { return !(*this == other); }

  /** The memory is device accessible (the property RMM's resource refs ask for). */
  friend constexpr void get_property(rmm_resource const&, cuda::mr::device_accessible) noexcept {}

  /** The emm handle (for emm.h's other functions: emm_get_stats, emm_trim, ...);
   *  it stays owned by the resource. nullptr for a moved-from resource. */
  [[nodiscard]] emm_manager* handle() const noexcept { return state_ ? state_->handle : nullptr; }
  /** The CUDA device of the handle (-1 for a moved-from resource). */
  [[nodiscard]] int device() const noexcept { return state_ ? state_->device : -1; }
  /** The manager's name ("pool", "default", "hostonly"); nullptr for a moved-from
   *  resource. */
  [[nodiscard]] const char* manager_name() const noexcept { return emm_manager_name(handle()); }
  /** Deallocations that failed (and were reported on stderr), over all copies. */
  [[nodiscard]] std::uint64_t failed_deallocations() const noexcept
  {
    return state_ ? state_->failed_frees.load(std::memory_order_relaxed) : 0;
  }

  /** The manager's statistics (emm_get_stats): the whole manager of the device,
   *  every emm user's allocations included. Throws rmm::logic_error on failure. */
  [[nodiscard]] emm_stats stats() const
  {
    emm_stats out{};
    emm_status s = emm_get_stats(live_handle("stats"), &out);
    if (s != EMM_OK) { throw rmm::logic_error("emm::rmm_resource::stats: emm_get_stats failed: " + last_error(s)); }
    return out;
  }

 private:
  struct state {
    emm_manager* handle;
    int device;
    std::atomic<std::uint64_t> failed_frees{0};
    state(emm_manager* h, int d) noexcept : handle{h}, device{d} {}
    state(state const&)            = delete;
    state& operator=(state const&) = delete;
    // At process exit (RMM's per-device map going away) the handle is left to the
    // process's end, as RMM's own resources leave theirs: the driver may be past use.
    ~state()
    {
      if (!rmm::process_is_exiting()) { emm_manager_destroy(handle); }
    }
  };

  explicit rmm_resource(std::shared_ptr<state> s) noexcept : state_{std::move(s)} {}

  static char const* status_name(emm_status s) noexcept
  {
    switch (s) {
      case EMM_OK: return "EMM_OK";
      case EMM_ERR_INVALID_ARGUMENT: return "EMM_ERR_INVALID_ARGUMENT";
      case EMM_ERR_OUT_OF_MEMORY: return "EMM_ERR_OUT_OF_MEMORY";
      case EMM_ERR_DRIVER: return "EMM_ERR_DRIVER";
      case EMM_ERR_UNSUPPORTED: return "EMM_ERR_UNSUPPORTED";
      case EMM_ERR_UNKNOWN_MANAGER: return "EMM_ERR_UNKNOWN_MANAGER";
      case EMM_ERR_IPC: return "EMM_ERR_IPC";
      case EMM_ERR_ALREADY_IN_USE: return "EMM_ERR_ALREADY_IN_USE";
      case EMM_ERR_PANIC: return "EMM_ERR_PANIC";
      case EMM_ERR_OTHER: return "EMM_ERR_OTHER";
      case EMM_ERR_INTERNAL: return "EMM_ERR_INTERNAL";
      case EMM_ERR_FORKED: return "EMM_ERR_FORKED";
      default: return "EMM_ERR_?";
    }
  }

  // "EMM_ERR_...: <the calling thread's last emm message>".
  static std::string last_error(emm_status s)
  {
    char buf[1024];
    std::size_t n = emm_last_error(buf, sizeof buf);
    std::string msg{buf};
    if (n >= sizeof buf) { msg += "..."; }
    return std::string{status_name(s)} + " (" + std::to_string(s) + "): " + msg;
  }



  static emm_manager* create(int device, const char* name)
  {
    emm_manager* h = nullptr;
    emm_status s   = emm_manager_create(name, device, &h);
    if (s != EMM_OK) {
      throw rmm::logic_error(std::string{"emm::rmm_resource: emm_manager_create(\""} + (name ? name : "<default>") +
                             "\", device " + std::to_string(device) + ") failed: " + last_error(s));
    }
    return h;
  }

  // The stream emm gets: the runtime's default stream (null) by its explicit handle,
  // since a null stream means "the allocation's own stream" to emm_free.
  static void* cu_stream(cuda::stream_ref stream) noexcept
  {
    void* s = static_cast<void*>(stream.get());
    if (s != nullptr) { return s; }
#if defined(CUDA_API_PER_THREAD_DEFAULT_STREAM)
    return static_cast<void*>(cudaStreamPerThread);
#else
    return static_cast<void*>(cudaStreamLegacy);
#endif
  }

  emm_manager* live_handle(char const* what) const
  {
    if (!state_) {
      throw rmm::logic_error(std::string{"emm::rmm_resource::"} + what + ": this resource was moved from");
    }
    return state_->handle;
  }

  static void check_alignment(std::size_t bytes, std::size_t alignment)
  {
    bool pow2 = alignment != 0 && (alignment & (alignment - 1)) == 0;
    if (!pow2 || alignment > guaranteed_alignment) {
      throw rmm::bad_alloc("emm::rmm_resource::allocate: " + std::to_string(bytes) + " bytes aligned to " +
                           std::to_string(alignment) + " bytes asked; emm aligns to " +
                           std::to_string(guaranteed_alignment) +
                           " bytes and takes alignments that are powers of two up to that "
                           "(rmm::mr::aligned_resource_adaptor over this resource serves larger ones)");
    }
  }

  [[noreturn]] static void throw_failure(emm_status s, char const* what, std::size_t bytes)
  {
    std::string msg = std::string{"emm::rmm_resource::"} + what + " of " + std::to_string(bytes) +
                      " bytes failed: " + last_error(s);
    if (s == EMM_ERR_OUT_OF_MEMORY) { throw rmm::out_of_memory(msg); }
    throw rmm::bad_alloc(msg);
  }

  void release(void* stream, void* ptr, std::size_t bytes) const noexcept
  {
    if (ptr == nullptr) { return; }
    if (!state_) {
      std::fprintf(stderr, "emm::rmm_resource::deallocate: %p (%zu bytes) given to a moved-from resource; not freed\n",
                   ptr, bytes);
      return;
    }
    emm_status s = emm_free(state_->handle, static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(ptr)), stream);
    if (s != EMM_OK) {
      state_->failed_frees.fetch_add(1, std::memory_order_relaxed);
      char buf[512];
      emm_last_error(buf, sizeof buf);
      std::fprintf(stderr, "emm::rmm_resource::deallocate: freeing %p (%zu bytes) failed: %s (%d): %s\n", ptr, bytes,
                   status_name(s), s, buf);
    }
  }

  std::shared_ptr<state> state_;
};

static_assert(cuda::mr::synchronous_resource_with<rmm_resource, cuda::mr::device_accessible>,
              "emm::rmm_resource must satisfy cuda::mr::synchronous_resource_with<device_accessible>");
static_assert(cuda::mr::resource_with<rmm_resource, cuda::mr::device_accessible>,
              "emm::rmm_resource must satisfy cuda::mr::resource_with<device_accessible>");

}  // namespace emm

#endif  // EMM_RMM_RESOURCE_HPP
