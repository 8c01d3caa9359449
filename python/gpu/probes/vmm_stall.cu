// Do the virtual-memory calls of a pool's moves slow the kernels that run on
// the device meanwhile, on other memory? The pool maps a free piece's memory
// again elsewhere (cuMemMap of its handle, cuMemSetAccess) and later unmaps the
// old address (cuMemUnmap, on a helper thread by default) while a training
// step's kernels run. The host side of those calls was timed before
// (`vmm_busy.cu`, `benchmarks/vmm_moves.cu`); this times the device side: the
// kernels' own time, by CUDA events, while a helper thread does nothing, or
// moves 2 MiB pieces back and forth between two reservations (map, access,
// unmap of the old mapping), or only maps and unmaps aliases with no access
// call, or only creates and releases handles. Rounds alternate the modes.
//
// Two kernels, each on a 4 GiB cudaMalloc buffer: a streaming copy (1 GiB in,
// 1 GiB out) and a gather of random 4-byte words over the whole buffer (every
// access a new page: the one most exposed to the GPU's address translation).
//
//   nvcc -O2 -std=c++17 -o vs vmm_stall.cu -lcuda -lpthread && ./vs [rounds] [kernels]
#include "vmm_setup.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

static const size_t PAGE = 2u << 20;
static const int PIECES = 256;  // 512 MiB moved back and forth

__global__ void stream_copy(const float4* in, float4* out, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    out[i] = in[i];
}

__global__ void gather(const unsigned* buf, size_t words, unsigned* out, size_t n,
                       unsigned seed) {
  unsigned acc = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    unsigned x = (unsigned)i * 2654435761u ^ seed;
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    acc += buf[(size_t)x % words];
  }
  if (acc == 0xffffffffu) out[0] = acc;
}

enum Mode { IDLE, MOVES, ALIAS, CREATE };
static const char* NAMES[] = {"idle", "moves", "alias", "create"};

static std::atomic<int> mode{IDLE};
static std::atomic<bool> quit{false};
static std::atomic<long> calls{0};

// The helper thread: in MOVES, each piece's memory is mapped at the other
// reservation, given access, and unmapped where it was (a move, as the pool's
// growth and its helper's unmap make one); in ALIAS, a second mapping of a
// piece made and unmapped without an access call; in CREATE, a handle created
// and released. Counts the pieces handled.
static void helper(Vmm v) {
  CK(cuCtxSetCurrent(v.ctx));
  const VmmDesc& d = v.mem;
  CUdeviceptr r[2];
  for (auto& x : r) CK(cuMemAddressReserve(&x, PIECES * PAGE, 0, 0, 0));
  std::vector<CUmemGenericAllocationHandle> h(PIECES);
  for (int i = 0; i < PIECES; i++) {
    CK(cuMemCreate(&h[i], PAGE, &d.prop, 0));
    CK(cuMemMap(r[0] + i * PAGE, PAGE, 0, h[i], 0));
  }
  CK(cuMemSetAccess(r[0], PIECES * PAGE, &d.desc, 1));
  int at = 0;  // the reservation the pieces are mapped at
  int i = 0;  // the next piece to move
  int j = 0;  // the next piece to alias
  while (!quit.load()) {
    switch (mode.load()) {
      case IDLE:
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        continue;
      case MOVES: {
        CUdeviceptr dst = r[1 - at] + i * PAGE, src = r[at] + i * PAGE;
        CK(cuMemMap(dst, PAGE, 0, h[i], 0));
        CK(cuMemSetAccess(dst, PAGE, &d.desc, 1));
        CK(cuMemUnmap(src, PAGE));
        if (++i == PIECES) {
          i = 0;
          at = 1 - at;
        }
        break;
      }
      case ALIAS: {
        // Piece `j` mapped again where it is not (pieces below `i` moved).
        CUdeviceptr dst = r[j < i ? at : 1 - at] + j * PAGE;
        CK(cuMemMap(dst, PAGE, 0, h[j], 0));
        CK(cuMemUnmap(dst, PAGE));
        j = (j + 1) % PIECES;
        break;
      }
      case CREATE: {
        CUmemGenericAllocationHandle x;
        CK(cuMemCreate(&x, PAGE, &d.prop, 0));
        CK(cuMemRelease(x));
        break;
      }
    }
    calls.fetch_add(1);
  }
  // (Pieces below `i` moved to the other reservation already.)
  for (int j = 0; j < PIECES; j++) CK(cuMemUnmap(r[j < i ? 1 - at : at] + j * PAGE, PAGE));
  for (auto& x : h) CK(cuMemRelease(x));
  for (auto& x : r) CK(cuMemAddressFree(x, PIECES * PAGE));
}

int main(int argc, char** argv) {
  int rounds = argc > 1 ? std::atoi(argv[1]) : 4;
  int kernels = argc > 2 ? std::atoi(argv[2]) : 400;
  Vmm v = vmm_device0();

  const size_t bytes = 4ull << 30;
  void *a, *b;
  RK(cudaMalloc(&a, bytes));
  RK(cudaMalloc(&b, bytes));
  RK(cudaMemset(a, 1, bytes));
  unsigned* sink;
  RK(cudaMalloc(&sink, 4));
  cudaStream_t s;
  RK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::vector<cudaEvent_t> ev(kernels + 1);
  for (auto& e : ev) RK(cudaEventCreate(&e));
  std::thread t(helper, v);

  const size_t copy_n = (1ull << 30) / sizeof(float4);
  const size_t gather_n = 64ull << 20;  // 64 Mi random words a kernel
  std::printf("%-7s %-6s %5s %10s %10s %10s %10s %9s\n", "round", "mode", "kind", "mean_us",
              "p50_us", "p90_us", "max_us", "calls/s");
  for (int round = 1; round <= rounds; round++) {
    for (int kind = 0; kind < 2; kind++) {
      for (int m : {IDLE, MOVES, ALIAS, CREATE}) {
        mode.store(m);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        long c0 = calls.load();
        auto w0 = std::chrono::steady_clock::now();
        RK(cudaEventRecord(ev[0], s));
        for (int k = 0; k < kernels; k++) {
          if (kind == 0)
            stream_copy<<<1320, 512, 0, s>>>((const float4*)a, (float4*)b, copy_n);
          else
            gather<<<1320, 512, 0, s>>>((const unsigned*)a, bytes / 4, sink, gather_n,
                                        (unsigned)(round * 7919 + k));
          RK(cudaEventRecord(ev[k + 1], s));
        }
        RK(cudaStreamSynchronize(s));
        double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
        long done = calls.load() - c0;
        mode.store(IDLE);
        std::vector<float> ms(kernels);
        for (int k = 0; k < kernels; k++) RK(cudaEventElapsedTime(&ms[k], ev[k], ev[k + 1]));
        double mean = 0;
        for (float x : ms) mean += x;
        mean /= kernels;
        std::sort(ms.begin(), ms.end());
        std::printf("%-7d %-6s %5s %10.1f %10.1f %10.1f %10.1f %9.0f\n", round, NAMES[m],
                    kind == 0 ? "copy" : "gath", mean * 1e3, ms[kernels / 2] * 1e3,
                    ms[kernels * 9 / 10] * 1e3, ms.back() * 1e3, done / wall);
        std::fflush(stdout);
      }
    }
  }
  quit.store(true);
  t.join();
  std::printf("OK\n");
  return 0;
}
