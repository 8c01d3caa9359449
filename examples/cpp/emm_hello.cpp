// emm from plain C++, with no CUDA toolkit: libemm_capi loads the CUDA driver at
// run time, so this compiles and links anywhere and runs where a driver is.
//
// It opens the process's manager for device 0, allocates and frees device memory
// of several sizes on the default stream, prints the statistics and the manager's
// counters, and gives cached memory back.
//
// Build against an installed emm (`cargo xtask install --prefix DIR`):
//   make PKG_CONFIG_PATH=DIR/lib/pkgconfig          (Makefile: pkg-config)
//   cmake -S . -B build -DCMAKE_PREFIX_PATH=DIR && cmake --build build
//                                                   (CMakeLists.txt: find_package)
// Run: emm_hello [manager]   (pool, default or hostonly; none: emm's choice, which
// EMM_MEMORY_MANAGER may set)
//
// Exit status: 0 done; 1 another failure; 2 usage; 3 no usable CUDA driver (emm's
// EMM_ERR_DRIVER, with its message on standard error: e.g. "no CUDA driver could
// be loaded; tried libcuda.so.1 (...)").
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "emm.h"

namespace {

constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;
constexpr int kExitNoDriver = 3;

// The message of the calling thread's last failure.
std::string last_error() {
    const size_t n = emm_last_error(nullptr, 0);
    std::string s(n + 1, '\0');
    emm_last_error(&s[0], s.size());
    s.resize(n);
    return s;
}

// A failed emm call: what was called, its status and emm's message.
struct Failure {
    const char *call;
    emm_status code;
    std::string message;
};

void check(emm_status s, const char *call) {
    if (s != EMM_OK) throw Failure{call, s, last_error()};
}

// One manager handle, released at scope exit (with anything it still holds).
class Manager {
  public:
    explicit Manager(const char *name) { check(emm_manager_create(name, 0, &m_), "emm_manager_create"); }
    ~Manager() { emm_manager_destroy(m_); }
    Manager(const Manager &) = delete;
    Manager &operator=(const Manager &) = delete;
    emm_manager *get() const { return m_; }

  private:
    emm_manager *m_ = nullptr;
};

unsigned long long ull(uint64_t v) { return static_cast<unsigned long long>(v); }

int run(const char *name) {
    std::printf("emm C ABI: header %d, library %d\n", EMM_ABI_VERSION, emm_abi_version());
    if (emm_abi_version() / 10000 != EMM_ABI_VERSION / 10000 || emm_abi_version() < EMM_ABI_VERSION) {
        std::fprintf(stderr, "emm_hello: the library's C ABI (%d) is older than the header's (%d)\n",
                     emm_abi_version(), EMM_ABI_VERSION);
        return kExitFailure;
    }
    Manager m(name);
    std::printf("manager: %s\n", emm_manager_name(m.get()));

    size_t free_bytes = 0, total_bytes = 0;
    check(emm_memory_info(m.get(), &free_bytes, &total_bytes), "emm_memory_info");
    std::printf("device 0: %zu of %zu bytes free\n", free_bytes, total_bytes);

    // Ten rounds of allocations from 256 bytes to 4 MiB, freed in reverse order
    // (NULL stream: the legacy default stream).
    const size_t sizes[] = {256, 4096, 65536, 1 << 20, 3 << 20, 4 << 20};
    for (int round = 0; round < 10; ++round) {
        std::vector<uint64_t> live;
        for (size_t size : sizes) {
            uint64_t p = 0;
            check(emm_alloc(m.get(), size, nullptr, &p), "emm_alloc");
            if (p == 0) throw Failure{"emm_alloc", EMM_ERR_INTERNAL, "a null pointer for a non-empty request"};
            live.push_back(p);
        }
        for (auto it = live.rbegin(); it != live.rend(); ++it) check(emm_free(m.get(), *it, nullptr), "emm_free");
    }

    emm_stats st;
    std::memset(&st, 0, sizeof st);
    check(emm_get_stats(m.get(), &st), "emm_get_stats");
    std::printf("allocations %llu, from the driver %llu; peak allocated %llu bytes, reserved %llu (peak %llu)\n",
                ull(st.allocations), ull(st.upstream_allocs), ull(st.allocated_bytes_peak),
                ull(st.reserved_bytes), ull(st.reserved_bytes_peak));
    if (st.allocated_bytes != 0) throw Failure{"emm_get_stats", EMM_ERR_INTERNAL, "bytes still allocated after every free"};

    size_t len = 0;
    check(emm_manager_report(m.get(), nullptr, 0, &len), "emm_manager_report");
    std::string report(len + 1, '\0');
    check(emm_manager_report(m.get(), &report[0], report.size(), nullptr), "emm_manager_report");
    report.resize(len);
    std::printf("counters: %s\n", report.c_str());

    size_t released = 0;
    check(emm_trim(m.get(), &released), "emm_trim");
    std::printf("trim gave back %zu bytes\nemm_hello: done\n", released);
    return 0;
}

}  // namespace

int main(int argc, char **argv) {
    if (argc > 2 || (argc == 2 && (std::strcmp(argv[1], "-h") == 0 || std::strcmp(argv[1], "--help") == 0))) {
        std::fprintf(stderr, "usage: %s [pool|default|hostonly]\n", argv[0]);
        return kExitUsage;
    }
    try {
        return run(argc == 2 ? argv[1] : nullptr);
    } catch (const Failure &f) {
        std::fflush(stdout);
        std::fprintf(stderr, "emm_hello: %s failed (%d): %s\n", f.call, f.code, f.message.c_str());
        return f.code == EMM_ERR_DRIVER ? kExitNoDriver : kExitFailure;
    }
}
