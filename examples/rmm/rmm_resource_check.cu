// emm as RMM's memory resource, from C++: emm::rmm_resource (emm/rmm_resource.hpp) set
// as RMM's current device resource; rmm::device_buffer and rmm::device_uvector on a
// stream, written by a kernel and read back; RMM's statistics_resource_adaptor over
// emm checked against emm's own statistics; alignment, out of memory, copies, threads;
// everything freed and emm's allocated bytes back where they started. Ends with a
// timing of an allocate+free pair through emm's adaptor beside RMM's own resources.
//
// Build and run on a GPU machine: python/gpu/checks/rmm_check.sh (it unpacks RMM's wheels
// and shows the nvcc line). Prints one line per check and "rmm_resource_check: OK"
// (exit 0) or "rmm_resource_check: FAILED (n)" (exit 1).
#include <emm/rmm_resource.hpp>

#include <rmm/aligned.hpp>
#include <rmm/cuda_stream.hpp>
#include <rmm/device_buffer.hpp>
#include <rmm/device_uvector.hpp>
#include <rmm/error.hpp>
#include <rmm/mr/aligned_resource_adaptor.hpp>
#include <rmm/mr/cuda_async_memory_resource.hpp>
#include <rmm/mr/cuda_memory_resource.hpp>
#include <rmm/mr/per_device_resource.hpp>
#include <rmm/mr/pool_memory_resource.hpp>
#include <rmm/mr/statistics_resource_adaptor.hpp>
#include <rmm/resource_ref.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

static int failures = 0;

static void report(bool ok, const std::string& what)
{
  std::printf("%s: %s\n", ok ? "PASS" : "FAIL", what.c_str());
  std::fflush(stdout);
  if (!ok) { ++failures; }
}

// The condition is evaluated before the description (which may read what it wrote).
#define CHECK(cond, what)      \
  do {                         \
    bool const check_ok_ = (cond); \
    report(check_ok_, (what)); \
  } while (0)

static void cuda_ok(cudaError_t e, const char* what)
{
  if (e != cudaSuccess) {
    std::printf("FAIL: %s: %s\n", what, cudaGetErrorString(e));
    ++failures;
  }
}

__global__ void fill(std::uint32_t* p, std::size_t n, std::uint32_t base)
{
  std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) { p[i] = base + static_cast<std::uint32_t>(i) * 2654435761u; }
}

// Fills n words on `stream` with a kernel, reads them back, compares.
static bool round_trip(void* dev, std::size_t n, std::uint32_t base, cuda::stream_ref stream)
{
  if (n == 0) { return true; }
  fill<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream.get()>>>(static_cast<std::uint32_t*>(dev), n, base);
  std::vector<std::uint32_t> host(n);
  cuda_ok(cudaMemcpyAsync(host.data(), dev, n * 4, cudaMemcpyDeviceToHost, stream.get()), "cudaMemcpyAsync");
  cuda_ok(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize");
  for (std::size_t i = 0; i < n; ++i) {
    if (host[i] != base + static_cast<std::uint32_t>(i) * 2654435761u) { return false; }
  }
  return true;
}

static std::uint64_t allocated(emm::rmm_resource const& mr) { return mr.stats().allocated_bytes; }

template <class F>
static bool throws_with(F f, const char* type, std::string& message)
{
  try {
    f();
  } catch (rmm::out_of_memory const& e) {
    message = e.what();
    return std::string{type} == "out_of_memory";
  } catch (rmm::bad_alloc const& e) {
    message = e.what();
    return std::string{type} == "bad_alloc";
  } catch (std::exception const& e) {
    message = std::string{"unexpected exception: "} + e.what();
    return false;
  }
  message = "nothing thrown";
  return false;
}

// ns per allocate+deallocate pair of `bytes` on `stream`, best of `rounds` rounds.
template <class R>
static std::vector<double> time_pairs(R& mr, std::size_t bytes, cuda::stream_ref stream, int pairs, int rounds)
{
  std::vector<double> out;
  std::size_t const a = rmm::CUDA_ALLOCATION_ALIGNMENT;
  for (int w = 0; w < 100; ++w) { mr.deallocate(stream, mr.allocate(stream, bytes, a), bytes, a); }
  for (int r = 0; r < rounds; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < pairs; ++i) { mr.deallocate(stream, mr.allocate(stream, bytes, a), bytes, a); }
    auto t1 = std::chrono::steady_clock::now();
    out.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / pairs);
  }
  std::sort(out.begin(), out.end());
  return out;
}

static void print_timing(const char* name, std::vector<double> const& v)
{
  std::printf("  %-44s median %9.1f ns  (min %9.1f, max %9.1f; %zu rounds)\n", name, v[v.size() / 2], v.front(),
              v.back(), v.size());
}

int main()
{
  std::printf("RMM %s, CCCL %d.%d.%d, emm C ABI %d\n", RMM_VERSION, CCCL_MAJOR_VERSION, CCCL_MINOR_VERSION,
              CCCL_PATCH_VERSION, emm_abi_version());
  cuda_ok(cudaSetDevice(0), "cudaSetDevice(0)");

  emm::rmm_resource mr{};  // the current device's manager (pool unless EMM_MEMORY_MANAGER says otherwise)
  std::printf("manager: %s, device %d\n", mr.manager_name(), mr.device());
  std::uint64_t const base  = allocated(mr);
  std::uint64_t const base_n = mr.stats().allocations;

  rmm::cuda_stream stream_owner{rmm::cuda_stream::flags::non_blocking};
  cuda::stream_ref stream{stream_owner.value()};

  // 1. emm as the current device resource: device_buffer and device_uvector.
  auto previous = rmm::mr::set_current_device_resource(mr);
  {
    rmm::device_async_resource_ref current = rmm::mr::get_current_device_resource_ref();
    void* p = current.allocate(stream, 1000, rmm::CUDA_ALLOCATION_ALIGNMENT);
    CHECK(mr.stats().allocations - base_n == 1, "RMM's current device resource allocates through emm");
    current.deallocate(stream, p, 1000, rmm::CUDA_ALLOCATION_ALIGNMENT);
    std::size_t const n = (1 << 20) + 3;
    rmm::device_buffer buf(n * 4, stream);
    rmm::device_uvector<std::uint32_t> vec(n, stream);
    CHECK(mr.stats().allocations - base_n == 3, "device_buffer and device_uvector allocated through emm");
    CHECK(allocated(mr) - base >= 2 * n * 4, "emm counts their bytes (" + std::to_string(allocated(mr) - base) + ")");
    CHECK(reinterpret_cast<std::uintptr_t>(buf.data()) % 256 == 0 &&
            reinterpret_cast<std::uintptr_t>(vec.data()) % 256 == 0,
          "256-byte aligned");
    CHECK(round_trip(buf.data(), n, 7, stream), "device_buffer: kernel writes, host reads back");
    CHECK(round_trip(vec.data(), n, 11, stream), "device_uvector: kernel writes, host reads back");
    rmm::device_buffer copy(buf, stream);  // a copy allocates through the buffer's resource
    std::vector<std::uint32_t> host(n);
    cuda_ok(cudaMemcpyAsync(host.data(), copy.data(), n * 4, cudaMemcpyDeviceToHost, stream.get()), "copy back");
    cuda_ok(cudaStreamSynchronize(stream.get()), "sync");
    CHECK(host[n - 1] == 7 + static_cast<std::uint32_t>(n - 1) * 2654435761u, "device_buffer copy holds the data");
    rmm::device_buffer empty(0, stream);
    CHECK(empty.data() == nullptr && empty.size() == 0, "a zero-byte device_buffer owns nothing");
  }
  cuda_ok(cudaStreamSynchronize(stream.get()), "sync");
  CHECK(allocated(mr) == base, "freed: emm's allocated bytes back to " + std::to_string(base));

  // 2. RMM's statistics adaptor over emm, against emm's statistics.
  {
    rmm::mr::statistics_resource_adaptor stats{mr};
    rmm::mr::set_current_device_resource(stats);
    std::vector<std::size_t> sizes{1, 255, 256, 4097, 1 << 20, (3 << 20) + 5, 64 << 20};
    std::uint64_t const n0 = mr.stats().allocations;
    std::vector<rmm::device_buffer> bufs;
    std::size_t sum = 0;
    for (auto s : sizes) {
      bufs.emplace_back(s, stream);
      sum += s;
    }
    auto bytes = stats.get_bytes_counter();
    auto count = stats.get_allocations_counter();
    std::uint64_t const emm_bytes = allocated(mr) - base;
    std::uint64_t const emm_count = mr.stats().allocations - n0;
    std::printf("  RMM statistics: %lld bytes in %lld allocations; emm: %llu bytes (rounded), %llu allocations\n",
                static_cast<long long>(bytes.value), static_cast<long long>(count.value),
                static_cast<unsigned long long>(emm_bytes), static_cast<unsigned long long>(emm_count));
    CHECK(bytes.value == static_cast<std::int64_t>(sum) && count.value == static_cast<std::int64_t>(sizes.size()),
          "RMM's statistics adaptor counts every request");
    CHECK(emm_count == sizes.size(), "emm served each of them");
    CHECK(emm_bytes >= sum && emm_bytes <= sum + 512 * sizes.size(),
          "emm's allocated bytes are RMM's, each rounded up by less than 512");
    for (std::size_t i = 0; i < bufs.size(); ++i) {
      std::size_t words = sizes[i] / 4;
      if (!round_trip(bufs[i].data(), words, static_cast<std::uint32_t>(i), stream)) {
        CHECK(false, "round trip of " + std::to_string(sizes[i]) + " bytes");
      }
    }
    bufs.clear();
    cuda_ok(cudaStreamSynchronize(stream.get()), "sync");
    bytes = stats.get_bytes_counter();
    count = stats.get_allocations_counter();
    CHECK(bytes.value == 0 && count.value == 0 && bytes.peak == static_cast<std::int64_t>(sum) &&
            count.total == static_cast<std::int64_t>(sizes.size()),
          "after the frees: RMM's current 0, peak and total as allocated");
    CHECK(allocated(mr) == base, "after the frees: emm's allocated bytes back to " + std::to_string(base));
    rmm::mr::set_current_device_resource(mr);
  }

  // 3. Alignment: up to 256 served; larger refused with a message; aligned adaptor serves it.
  {
    std::string msg;
    void* p = mr.allocate(stream, 1000, 64);
    CHECK(p != nullptr && reinterpret_cast<std::uintptr_t>(p) % 256 == 0, "alignment 64 served (256-aligned)");
    mr.deallocate(stream, p, 1000, 64);
    CHECK(throws_with([&] { (void)mr.allocate(stream, 1000, 4096); }, "bad_alloc", msg) &&
            msg.find("4096") != std::string::npos,
          "alignment 4096 refused: " + msg);
    CHECK(throws_with([&] { (void)mr.allocate(stream, 1000, 48); }, "bad_alloc", msg), "alignment 48 refused: " + msg);
    rmm::mr::aligned_resource_adaptor aligned{mr, 4096};
    void* q = aligned.allocate(stream, 100000, 4096);
    CHECK(reinterpret_cast<std::uintptr_t>(q) % 4096 == 0, "aligned_resource_adaptor over emm serves 4096");
    aligned.deallocate(stream, q, 100000, 4096);
    cuda_ok(cudaStreamSynchronize(stream.get()), "sync");
    CHECK(allocated(mr) == base, "alignment checks freed everything");
  }

  // 4. Out of memory: rmm::out_of_memory with emm's message, directly and through RMM.
  {
    std::string msg;
    std::size_t const huge = std::size_t{1} << 50;
    CHECK(throws_with([&] { (void)mr.allocate(stream, huge); }, "out_of_memory", msg) &&
            msg.find("out of") != std::string::npos,
          "1 PiB: rmm::out_of_memory: " + msg);
    CHECK(throws_with([&] { rmm::device_buffer b(huge, stream); }, "out_of_memory", msg),
          "1 PiB device_buffer: rmm::out_of_memory");
    void* p = mr.allocate(stream, 4096);
    CHECK(p != nullptr, "emm serves again after out of memory");
    mr.deallocate(stream, p, 4096);
  }

  // 5. Copies share the handle; another handle is another resource; sync pair.
  {
    emm::rmm_resource copy = mr;
    emm::rmm_resource other{mr.device(), nullptr};
    CHECK(copy == mr && copy.handle() == mr.handle() && other != mr, "copies are equal, another handle is not");
    void* p = mr.allocate(stream, 4096);
    copy.deallocate(stream, p, 4096);
    CHECK(copy.failed_deallocations() == 0, "memory of one copy freed through another");
    void* q = mr.allocate(stream, 4096);
    std::printf("  (a message on stderr about freeing %p through another handle is expected)\n", q);
    other.deallocate(stream, q, 4096);
    CHECK(other.failed_deallocations() == 1 && mr.failed_deallocations() == 0,
          "freeing through another handle is refused, reported and counted");
    mr.deallocate(stream, q, 4096);
    CHECK(mr.failed_deallocations() == 0, "and the owner frees it");
    emm::rmm_resource moved = std::move(copy);
    std::string msg;
    bool threw = false;
    try {
      (void)copy.allocate(stream, 16);  // NOLINT(bugprone-use-after-move): on purpose
    } catch (rmm::logic_error const& e) {
      threw = true;
      msg   = e.what();
    }
    CHECK(threw && moved == mr, "a moved-from resource refuses to allocate: " + msg);
    void* s = mr.allocate_sync(1 << 20);
    CHECK(round_trip(s, (1 << 20) / 4, 3, stream), "allocate_sync memory is usable on another stream at once");
    mr.deallocate_sync(s, 1 << 20);
    cuda_ok(cudaDeviceSynchronize(), "sync");
    CHECK(allocated(mr) == base, "copies, handles and sync pair freed everything");
  }

  // 6. Threads: each on its own stream, device_buffers through the current resource.
  {
    std::vector<std::thread> threads;
    std::vector<int> bad(8, 0);
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([t, &bad] {
        cudaSetDevice(0);
        rmm::cuda_stream s{rmm::cuda_stream::flags::non_blocking};
        for (int i = 0; i < 2000; ++i) {
          std::size_t bytes = 256 + static_cast<std::size_t>((i * 7919 + t * 104729) % (1 << 20));
          rmm::device_buffer b(bytes, cuda::stream_ref{s.value()});
          if (b.data() == nullptr) { ++bad[t]; }
          if (i % 500 == 0 && !round_trip(b.data(), bytes / 4, static_cast<std::uint32_t>(i), cuda::stream_ref{s.value()})) {
            ++bad[t];
          }
        }
        s.synchronize();
      });
    }
    for (auto& th : threads) { th.join(); }
    int total_bad = 0;
    for (int b : bad) { total_bad += b; }
    CHECK(total_bad == 0, "8 threads x 2000 device_buffers on their own streams");
    cuda_ok(cudaDeviceSynchronize(), "sync");
    CHECK(allocated(mr) == base, "threads freed everything");
  }

  // 7. Timing: an allocate+free pair of 4 KiB on one stream, per resource (C++, no Python).
  {
    std::printf("allocate+deallocate pair, 4096 bytes, one stream, 20000 pairs per round:\n");
    int const pairs = 20000, rounds = 7;
    print_timing("emm::rmm_resource (emm's pool)", time_pairs(mr, 4096, stream, pairs, rounds));
    {
      cuda::mr::any_resource<cuda::mr::device_accessible> any{mr};
      print_timing("emm::rmm_resource through any_resource", time_pairs(any, 4096, stream, pairs, rounds));
    }
    {
      rmm::mr::cuda_async_memory_resource async{};
      print_timing("rmm::mr::cuda_async_memory_resource", time_pairs(async, 4096, stream, pairs, rounds));
    }
    {
      rmm::mr::pool_memory_resource pool{rmm::mr::cuda_memory_resource{}, std::size_t{1} << 30};
      print_timing("rmm::mr::pool_memory_resource over cudaMalloc", time_pairs(pool, 4096, stream, pairs, rounds));
    }
    {
      rmm::mr::cuda_memory_resource cuda{};
      print_timing("rmm::mr::cuda_memory_resource (cudaMalloc)", time_pairs(cuda, 4096, stream, 2000, rounds));
    }
    cuda_ok(cudaDeviceSynchronize(), "sync");
  }

  rmm::mr::set_current_device_resource(std::move(previous));
  cuda_ok(cudaStreamSynchronize(stream.get()), "sync");
  emm_stats st = mr.stats();
  std::printf("emm at the end: allocated %llu bytes, reserved %llu bytes, %llu allocations served\n",
              static_cast<unsigned long long>(st.allocated_bytes), static_cast<unsigned long long>(st.reserved_bytes),
              static_cast<unsigned long long>(st.allocations));
  CHECK(st.allocated_bytes == base, "emm's allocated bytes back to " + std::to_string(base) + " at the end");
  std::printf("rmm_resource_check: %s", failures == 0 ? "OK\n" : "FAILED");
  if (failures != 0) { std::printf(" (%d)\n", failures); }
  return failures == 0 ? 0 : 1;
}
