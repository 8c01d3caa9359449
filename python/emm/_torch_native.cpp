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
// deleters frees any of them; everything else (the stream and graph hooks) stays
// PyTorch's.
//
// `emm.torch` compiles this file against the PyTorch it runs with (g++, PyTorch's
// headers and libraries; no ninja), caches the library, and loads it with ctypes.
// emm's functions are handed in as addresses, so the library does not link emm.

#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <sys/types.h>

#include <array>
#include <cstddef>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <utility>

namespace {

// The signatures of include/emm.h's emm_torch_alloc, emm_torch_release,
// emm_last_error and emm_last_error_code (python/tests/test_torch_native.py checks
// that they agree).
using AllocFn = void* (*)(ssize_t size, int device, void* stream);
using ReleaseFn = int (*)(void* ptr, int device);
using LastErrorFn = size_t (*)(char* buf, size_t len);
using LastErrorCodeFn = int (*)();

// emm_status's EMM_ERR_OUT_OF_MEMORY.
constexpr int kOutOfMemory = 2;

// Set once, by the first emm_torch_native_install, before PyTorch can call the
// allocator object.
AllocFn g_alloc = nullptr;
ReleaseFn g_release = nullptr;
LastErrorFn g_last_error = nullptr;
LastErrorCodeFn g_last_error_code = nullptr;

std::string last_error() {
  std::array<char, 2048> buf{};
  g_last_error(buf.data(), buf.size());
  buf.back() = '\0';
  return std::string(buf.data());
}

// A DataPtr's deleter receives only the address, so each device gets a deleter of
// its own (the device is a template argument); emm then looks the address up in
// that device's table alone. Devices past the table, and `raw_deleter()`, use the
// one that looks in every device's table (device -1).
constexpr int kDevices = 64;

template <int D>
void release_on(void* ptr) {
  g_release(ptr, D);
}

void release_any(void* ptr) {
  g_release(ptr, -1);
}

template <std::size_t... I>
constexpr std::array<c10::DeleterFnPtr, sizeof...(I)> deleters(
    std::index_sequence<I...> /*unused*/) {
  return {&release_on<static_cast<int>(I)>...};
}

constexpr std::array<c10::DeleterFnPtr, kDevices> kRelease =
    deleters(std::make_index_sequence<kDevices>{});

using Pluggable = torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator;

// emm's allocation of `size` bytes on `device` ordered on `stream`; throws
// c10::OutOfMemoryError (torch.OutOfMemoryError) when memory ran out and
// c10::Error for any other failure, with emm's reason.
void* checked_alloc(size_t size, c10::DeviceIndex device, cudaStream_t stream) {
  void* ptr = g_alloc(static_cast<ssize_t>(size), device, stream);
  if (ptr == nullptr && size != 0) {
    // (PyTorch's own pluggable allocator hands out a tensor at address 0
    // here.) The message is put together without iostreams: c10::str's
    // stream, instantiated in this library, crashed against the libstdc++
    // PyTorch's wheel runs with.
    const bool oom = g_last_error_code() == kOutOfMemory;
    const std::string message = "emm could not allocate " +
        std::to_string(size) + " bytes on CUDA device " +
        std::to_string(static_cast<int>(device)) + ": " + last_error();
    if (oom) {
      C10_THROW_ERROR(OutOfMemoryError, message);
    }
    C10_THROW_ERROR(Error, message);
  }
  return ptr;
}

struct EmmAllocator final : Pluggable {
  using Pluggable::Pluggable;

  c10::DataPtr allocate(size_t size) override {
    const c10::DeviceIndex device = c10::cuda::current_device();
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
    void* ptr = checked_alloc(size, device, stream);
    const c10::DeleterFnPtr deleter =
        device >= 0 && device < kDevices ? kRelease[device] : &release_any;
    return {ptr, ptr, deleter, c10::Device(c10::DeviceType::CUDA, device)};
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return &release_any;
  }

  void* raw_alloc(size_t nbytes) override {
    const c10::DeviceIndex device = c10::cuda::current_device();
    return checked_alloc(
        nbytes, device, c10::cuda::getCurrentCUDAStream(device).stream());
  }

  void* raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override {
    return checked_alloc(nbytes, c10::cuda::current_device(), stream);
  }

  void raw_delete(void* ptr) override {
    release_any(ptr);
  }
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
// handed out memory). 0 on success; 1 with the reason in `err` when an address
// is null or the library was installed already; 2 when PyTorch refused.
extern "C" int emm_torch_native_install(
    void* alloc,
    void* release,
    void* last_error_fn,
    void* last_error_code_fn,
    char* err,
    size_t len) {
  if (alloc == nullptr || release == nullptr || last_error_fn == nullptr ||
      last_error_code_fn == nullptr) {
    copy_message("emm_torch_native_install: a function address is null", err, len);
    return 1;
  }
  if (g_alloc != nullptr) {
    copy_message("emm_torch_native_install: installed already", err, len);
    return 1;
  }
  g_alloc = reinterpret_cast<AllocFn>(alloc);
  g_release = reinterpret_cast<ReleaseFn>(release);
  g_last_error = reinterpret_cast<LastErrorFn>(last_error_fn);
  g_last_error_code = reinterpret_cast<LastErrorCodeFn>(last_error_code_fn);
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
  g_alloc = nullptr;
  return 2;
}
