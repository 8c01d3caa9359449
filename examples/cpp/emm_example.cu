// emm from C++: allocate device memory through emm's C ABI on a CUDA stream, fill it
// with a kernel, check it on the host, look at the statistics, export an IPC handle,
// free and trim. Build (on a machine with nvcc) against an installed emm
// (`cargo xtask install --prefix DIR`), in examples/cpp:
//   make PKG_CONFIG_PATH=DIR/lib/pkgconfig cuda                      (pkg-config)
//   cmake -S . -B build -DCMAKE_PREFIX_PATH=DIR && cmake --build build (CMake)
// or by hand:
//   nvcc -O2 -std=c++17 emm_example.cu -IDIR/include -LDIR/lib -lemm_capi \
//        -Xlinker -rpath=DIR/lib -o emm_example
// (the program needs the library under its SONAME, libemm_capi.so.0.<minor>, which
// the install provides; a bare target/release is not enough to run it).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include "emm.h"

static void check(emm_status s, const char *what) {
    if (s != EMM_OK) {
        char msg[512];
        emm_last_error(msg, sizeof msg);
        std::fprintf(stderr, "%s failed (%d): %s\n", what, s, msg);
        std::exit(1);
    }
}

__global__ void iota(unsigned *p, size_t n, unsigned base) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) p[i] = base + (unsigned)i;
}

int main(int argc, char **argv) {
    const char *name = argc > 1 ? argv[1] : "pool";
    emm_manager *m = nullptr;
    check(emm_manager_create(name, 0, &m), "emm_manager_create");
    std::printf("manager: %s (ABI %d)\n", emm_manager_name(m), emm_abi_version());

    cudaStream_t stream;
    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    const size_t n = 1 << 20;
    int bad = 0;
    for (unsigned round = 0; round < 100; ++round) {
        uint64_t p = 0;
        check(emm_alloc(m, n * sizeof(unsigned), stream, &p), "emm_alloc");
        iota<<<(n + 255) / 256, 256, 0, stream>>>(reinterpret_cast<unsigned *>(p), n, round * 7);
        std::vector<unsigned> host(n);
        cudaMemcpyAsync(host.data(), reinterpret_cast<void *>(p), n * sizeof(unsigned), cudaMemcpyDeviceToHost, stream);
        cudaStreamSynchronize(stream);
        for (size_t i = 0; i < n; ++i) bad += host[i] != round * 7 + (unsigned)i;
        check(emm_free(m, p, stream), "emm_free");
    }
    emm_stats st;
    check(emm_get_stats(m, &st), "emm_get_stats");
    std::printf("after 100 rounds: allocations %llu, upstream allocations %llu, reserved %llu bytes\n",
                (unsigned long long)st.allocations, (unsigned long long)st.upstream_allocs,
                (unsigned long long)st.reserved_bytes);

    uint64_t p = 0;
    check(emm_alloc(m, 1 << 20, nullptr, &p), "emm_alloc (IPC)");
    size_t need = 0;
    emm_status ipc = emm_ipc_export(m, p, 4096, 8192, nullptr, 0, &need);
    std::printf("IPC export of a view: %s (%zu bytes)\n", ipc == EMM_OK ? "ok" : "unsupported by this manager", need);
    check(emm_free(m, p, nullptr), "emm_free (IPC)");

    uint64_t junk;
    emm_status s = emm_alloc(m, (size_t)1 << 50, stream, &junk);
    char msg[512];
    emm_last_error(msg, sizeof msg);
    std::printf("asking for 1 PiB: status %d: %s\n", s, msg);

    size_t released = 0, free_b = 0, total = 0;
    cudaStreamSynchronize(stream);
    check(emm_trim(m, &released), "emm_trim");
    check(emm_memory_info(m, &free_b, &total), "emm_memory_info");
    std::printf("trim released %zu bytes; device %zu of %zu bytes free\n", released, free_b, total);
    emm_manager_destroy(m);
    cudaStreamDestroy(stream);
    std::printf("%s\n", bad == 0 && s == EMM_ERR_OUT_OF_MEMORY ? "emm_example: OK" : "emm_example: FAILED");
    return bad == 0 && s == EMM_ERR_OUT_OF_MEMORY ? 0 : 1;
}
