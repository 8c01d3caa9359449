// emm/rmm_resource.hpp without a GPU: compiled by the host compiler against RMM's
// headers and run over emm-standin (EMM_CUDA_DRIVER; device memory is host memory).
// Covers what needs no CUDA runtime: the concepts, allocation and free through the
// adaptor and through RMM (any_resource, per-device map, statistics and aligned
// adaptors), emm's statistics, alignment and out-of-memory errors, copies, moved-from
// resources, a failing free, and allocate_sync's failure path (the runtime finds no
// driver here). Built and run by examples/rmm/host_check.sh.
#include <emm/rmm_resource.hpp>

#include <rmm/aligned.hpp>
#include <rmm/cuda_device.hpp>
#include <rmm/error.hpp>
#include <rmm/mr/aligned_resource_adaptor.hpp>
#include <rmm/mr/per_device_resource.hpp>
#include <rmm/mr/statistics_resource_adaptor.hpp>
#include <rmm/resource_ref.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

static_assert(cuda::mr::synchronous_resource_with<emm::rmm_resource, cuda::mr::device_accessible>);
static_assert(cuda::mr::resource_with<emm::rmm_resource, cuda::mr::device_accessible>);
static_assert(!cuda::mr::resource_with<emm::rmm_resource, cuda::mr::host_accessible>);
static_assert(std::is_nothrow_move_constructible_v<emm::rmm_resource>);
static_assert(std::is_copy_constructible_v<emm::rmm_resource>);
static_assert(std::is_constructible_v<rmm::device_async_resource_ref, emm::rmm_resource&>);

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

template <class E, class F>
static bool throws(F f, std::string& message)
{
  try {
    f();
  } catch (E const& e) {
    message = e.what();
    return true;
  } catch (std::exception const& e) {
    message = std::string{"another exception: "} + e.what();
    return false;
  }
  message = "nothing thrown";
  return false;
}

int main()
{
  constexpr std::size_t A = rmm::CUDA_ALLOCATION_ALIGNMENT;
  cuda::stream_ref stream{cudaStream_t{nullptr}};
  std::string msg;

  CHECK(throws<rmm::logic_error>([] { emm::rmm_resource r{0, "no-such-manager"}; }, msg) &&
          msg.find("no-such-manager") != std::string::npos,
        "an unknown manager is refused: " + msg);

  emm::rmm_resource mr{0, nullptr};
  CHECK(mr.handle() != nullptr && mr.device() == 0 && std::strcmp(mr.manager_name(), "pool") == 0,
        std::string{"a handle on device 0's manager: "} + mr.manager_name());
  std::uint64_t const base = mr.stats().allocated_bytes;

  // The adaptor itself: sizes, alignment, data, statistics.
  {
    std::vector<std::size_t> sizes{1, 255, 256, 4097, 1 << 20, (3 << 20) + 5};
    std::vector<void*> ptrs;
    std::uint64_t const n0 = mr.stats().allocations;
    std::size_t sum = 0;
    for (auto s : sizes) {
      void* p = mr.allocate(stream, s, A);
      std::memset(p, 0x5A, s);  // host memory on the stand-in
      ptrs.push_back(p);
      sum += s;
    }
    bool aligned = true;
    for (void* p : ptrs) { aligned = aligned && reinterpret_cast<std::uintptr_t>(p) % 256 == 0; }
    CHECK(aligned, "every allocation is 256-byte aligned");
    emm_stats st = mr.stats();
    CHECK(st.allocations - n0 == sizes.size() && st.allocated_bytes - base >= sum &&
            st.allocated_bytes - base <= sum + 512 * sizes.size(),
          "emm counts them: " + std::to_string(st.allocated_bytes - base) + " bytes for " + std::to_string(sum) +
            " asked");
    for (std::size_t i = 0; i < ptrs.size(); ++i) { mr.deallocate(stream, ptrs[i], sizes[i], A); }
    CHECK(mr.stats().allocated_bytes == base, "all freed");
    CHECK(mr.allocate(stream, 0, A) == nullptr, "0 bytes: nullptr");
    mr.deallocate(stream, nullptr, 0, A);
    void* p = mr.allocate(stream, 100, 1);
    mr.deallocate(stream, p, 100, 1);
    CHECK(p != nullptr && mr.failed_deallocations() == 0, "alignment 1 served");
  }

  CHECK(throws<rmm::bad_alloc>([&] { (void)mr.allocate(stream, 1000, 512); }, msg) &&
          msg.find("512") != std::string::npos && msg.find("aligned_resource_adaptor") != std::string::npos,
        "alignment 512 refused: " + msg);
  CHECK(throws<rmm::bad_alloc>([&] { (void)mr.allocate(stream, 1000, 0); }, msg), "alignment 0 refused");
  CHECK(throws<rmm::bad_alloc>([&] { (void)mr.allocate(stream, 1000, 96); }, msg), "alignment 96 refused");
  CHECK(throws<rmm::out_of_memory>([&] { (void)mr.allocate(stream, std::size_t{1} << 50, A); }, msg) &&
          msg.find("EMM_ERR_OUT_OF_MEMORY") != std::string::npos && msg.find("1024.0 TiB") != std::string::npos,
        "1 PiB: rmm::out_of_memory: " + msg);

  // Through RMM: the per-device map, resource refs, any_resource.
  {
    auto previous = rmm::mr::set_per_device_resource(rmm::cuda_device_id{0}, mr);
    auto ref      = rmm::mr::get_per_device_resource_ref(rmm::cuda_device_id{0});
    std::uint64_t const n0 = mr.stats().allocations;
    void* p = ref.allocate(stream, 1000, A);
    CHECK(mr.stats().allocations - n0 == 1, "RMM's per-device resource allocates through emm");
    ref.deallocate(stream, p, 1000, A);
    cuda::mr::any_resource<cuda::mr::device_accessible> a{mr}, b{mr};
    CHECK(a == b, "two any_resources over copies of one resource are equal");
    cuda::mr::any_resource<cuda::mr::device_accessible> other{emm::rmm_resource{0, nullptr}};
    CHECK(!(a == other), "over another handle they are not");
    rmm::mr::set_per_device_resource(rmm::cuda_device_id{0}, std::move(previous));
    CHECK(mr.stats().allocated_bytes == base, "freed through RMM");
  }

  // RMM's statistics adaptor over emm.
  {
    rmm::mr::statistics_resource_adaptor stats{mr};
    std::vector<std::size_t> sizes{10, 5000, 1 << 21};
    std::vector<void*> ptrs;
    for (auto s : sizes) { ptrs.push_back(stats.allocate(stream, s, A)); }
    auto bytes = stats.get_bytes_counter();
    auto count = stats.get_allocations_counter();
    std::uint64_t const emm_bytes = mr.stats().allocated_bytes - base;
    CHECK(bytes.value == 10 + 5000 + (1 << 21) && count.value == 3, "RMM's statistics count the requests");
    CHECK(emm_bytes >= static_cast<std::uint64_t>(bytes.value) &&
            emm_bytes <= static_cast<std::uint64_t>(bytes.value) + 3 * 512,
          "emm's allocated bytes are RMM's, rounded: " + std::to_string(emm_bytes));
    for (std::size_t i = 0; i < ptrs.size(); ++i) { stats.deallocate(stream, ptrs[i], sizes[i], A); }
    bytes = stats.get_bytes_counter();
    CHECK(bytes.value == 0 && bytes.peak == 10 + 5000 + (1 << 21) && mr.stats().allocated_bytes == base,
          "after the frees: RMM's current 0, emm's allocated back to " + std::to_string(base));
  }

  // RMM's aligned adaptor over emm serves larger alignments.
  {
    rmm::mr::aligned_resource_adaptor aligned{mr, 8192};
    void* p = aligned.allocate(stream, 100000, 8192);
    CHECK(reinterpret_cast<std::uintptr_t>(p) % 8192 == 0, "aligned_resource_adaptor over emm: 8192-aligned");
    aligned.deallocate(stream, p, 100000, 8192);
    CHECK(mr.stats().allocated_bytes == base, "and freed");
  }

  // Copies share the handle; another handle refuses the memory; moved-from resources.
  {
    emm::rmm_resource copy = mr;
    CHECK(copy == mr && copy.handle() == mr.handle(), "a copy shares the handle");
    void* p = mr.allocate(stream, 4096, A);
    copy.deallocate(stream, p, 4096, A);
    CHECK(copy.failed_deallocations() == 0 && mr.stats().allocated_bytes == base, "freed through the copy");
    emm::rmm_resource other{0, nullptr};
    void* q = mr.allocate(stream, 4096, A);
    std::printf("  (a message on stderr about freeing %p is expected)\n", q);
    other.deallocate(stream, q, 4096, A);
    CHECK(other != mr && other.failed_deallocations() == 1, "another handle refuses it, reports and counts");
    mr.deallocate(stream, q, 4096, A);
    emm::rmm_resource moved{std::move(copy)};
    CHECK(moved == mr && copy.handle() == nullptr && copy.device() == -1 && copy.manager_name() == nullptr,  // NOLINT
          "a moved-from resource holds nothing");
    CHECK(throws<rmm::logic_error>([&] { (void)copy.allocate(stream, 16, A); }, msg),  // NOLINT
          "and refuses to allocate: " + msg);
    copy.deallocate(stream, q, 4096, A);  // NOLINT: reported on stderr, nothing freed
    copy = mr;                            // assignable again
    CHECK(copy == mr, "a moved-from resource can be assigned");
  }

  // A handle created elsewhere and adopted.
  {
    emm_manager* h = nullptr;
    CHECK(emm_manager_create(nullptr, 0, &h) == EMM_OK, "emm_manager_create");
    auto adopted = emm::rmm_resource::adopt(h, 0);
    void* p      = adopted.allocate(stream, 64, A);
    adopted.deallocate(stream, p, 64, A);
    CHECK(adopted.handle() == h && adopted != mr, "adopt() owns the handle it is given");
    CHECK(throws<rmm::logic_error>([] { (void)emm::rmm_resource::adopt(nullptr, 0); }, msg), "adopt(nullptr) refused");
  }

  // Without a CUDA runtime the synchronous path fails cleanly: nothing is leaked.
  {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      CHECK(throws<rmm::bad_alloc>([&] { (void)mr.allocate_sync(4096, A); }, msg) &&
              msg.find("synchroniz") != std::string::npos,
            "allocate_sync: the failed synchronization is rmm::bad_alloc: " + msg);
      CHECK(mr.stats().allocated_bytes == base, "and the allocation was freed");
      CHECK(throws<rmm::logic_error>([] { emm::rmm_resource r{}; }, msg),
            "the current-device constructor needs the runtime: " + msg);
    } else {
      void* p = mr.allocate_sync(4096, A);
      mr.deallocate_sync(p, 4096, A);
      CHECK(mr.stats().allocated_bytes == base, "allocate_sync / deallocate_sync");
    }
  }

  CHECK(mr.stats().allocated_bytes == base, "emm's allocated bytes back to " + std::to_string(base) + " at the end");
  std::printf("host_check: %s\n", failures == 0 ? "OK" : "FAILED");
  return failures == 0 ? 0 : 1;
}
