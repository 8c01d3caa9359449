// What moving a piece of emm's expandable segment costs the driver, and whether that
// cost can leave the allocating thread. A move maps a piece's memory at a new
// address (cuMemMap), grants access there (cuMemSetAccess), and later unmaps the old
// address (cuMemUnmap). Three measurements, each on 2 MiB pieces:
//
//   batch:  per piece, and batched over a contiguous run of pieces (one
//           cuMemSetAccess, one cuMemUnmap over the run): does batching save time?
//   busy:   per piece while the GPU runs kernels, against an idle GPU.
//   helper: a thread launching tiny kernels while a helper thread moves pieces,
//           against an idle helper (alternated): do the helper's driver calls
//           slow the launching thread?
//   scale:  per piece with 0 to 14,336 other 2 MiB handles mapped (or the same
//           bytes in 64 MiB handles), alone and with peer access to the other
//           GPUs enabled: does the cost grow with the mappings a process holds?
//           (VMM_MOVES_ONLY=scale runs only this one.)
//   threads: a run of pieces moved (cuMemMap and cuMemSetAccess at a second
//           reservation, then cuMemUnmap of the first) by 1, 2, 4 or 8 threads
//           at once, each a contiguous share of the run: do a process's
//           threads move pieces in parallel, or does the driver serialize them?
//           (VMM_MOVES_ONLY=threads runs only this one.)
//
// VMM_MOVES_ONLY=batch runs only the first; with VMM_MOVES_POLL=1 a second
// thread polls a stream (cuStreamQuery, as PyTorch's NCCL watchdog polls
// events) all the while: does another thread's driver traffic slow the calls?
// Several such processes at once, one per GPU (VMM_MOVES_AT=<unix seconds>
// makes each start its measurement then), ask the same of other processes.
//
// Build and run on a GPU machine (docs/benchmarks.md, twenty-ninth session):
//   nvcc -O2 -std=c++17 python/gpu/benchmarks/vmm_moves.cu -lcuda -lpthread -o vmm_moves && ./vmm_moves
#include "../probes/vmm_setup.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

static const size_t kPage = 2ul << 20;
// Device 0's primary context and the descriptors of its pieces (vmm_setup.h),
// set once in main before any thread starts.
static Vmm g_vmm;

static double now_ns() {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}

// n pieces of 2 MiB mapped (with access) at a fresh reservation `*a`; `*b` is a
// second reservation of the same size to move them to.
static void make_pieces(int n, CUdeviceptr* a, CUdeviceptr* b, std::vector<CUmemGenericAllocationHandle>* h) {
  CK(cuMemAddressReserve(a, kPage * n, 0, 0, 0));
  CK(cuMemAddressReserve(b, kPage * n, 0, 0, 0));
  h->resize(n);
  for (int i = 0; i < n; i++) {
    CK(cuMemCreate(&(*h)[i], kPage, &g_vmm.mem.prop, 0));
    CK(cuMemMap(*a + i * kPage, kPage, 0, (*h)[i], 0));
  }
  CK(cuMemSetAccess(*a, kPage * n, &g_vmm.mem.desc, 1));
}

static void batch() {
  int counts[] = {64, 256, 1024};
  for (int rep = 0; rep < 2; rep++) {
    for (int n : counts) {
      CUdeviceptr a, b;
      std::vector<CUmemGenericAllocationHandle> h;
      make_pieces(n, &a, &b, &h);
      CK(cuMemsetD8(a, 1, kPage * n));
      CK(cuCtxSynchronize());
      double t0 = now_ns();
      for (int i = 0; i < n; i++) CK(cuMemMap(b + i * kPage, kPage, 0, h[i], 0));
      double tm = now_ns() - t0;
      t0 = now_ns();
      for (int i = 0; i < n; i++) CK(cuMemSetAccess(b + i * kPage, kPage, &g_vmm.mem.desc, 1));
      double ta = now_ns() - t0;
      t0 = now_ns();
      for (int i = 0; i < n; i++) CK(cuMemUnmap(a + i * kPage, kPage));
      double tu = now_ns() - t0;
      // Back to `a`, batched: one cuMemSetAccess and one cuMemUnmap over the run.
      t0 = now_ns();
      for (int i = 0; i < n; i++) CK(cuMemMap(a + i * kPage, kPage, 0, h[i], 0));
      double bm = now_ns() - t0;
      t0 = now_ns();
      CK(cuMemSetAccess(a, kPage * n, &g_vmm.mem.desc, 1));
      double ba = now_ns() - t0;
      t0 = now_ns();
      CK(cuMemUnmap(b, kPage * n));
      double bu = now_ns() - t0;
      printf("batch  n=%5d | per piece: map %.2f us, setAccess %.2f us, unmap %.2f us | batched: map %.2f us each, one setAccess %.2f us each, one unmap %.2f us each\n",
             n, tm / 1e3 / n, ta / 1e3 / n, tu / 1e3 / n, bm / 1e3 / n, ba / 1e3 / n, bu / 1e3 / n);
      CK(cuMemUnmap(a, kPage * n));
      for (int i = 0; i < n; i++) CK(cuMemRelease(h[i]));
      CK(cuMemAddressFree(a, kPage * n));
      CK(cuMemAddressFree(b, kPage * n));
    }
  }
}

// Moves pieces [lo, hi) of `h` from `a` to `b` (map, grant access) in this thread.
static void move_share(CUdeviceptr b, const std::vector<CUmemGenericAllocationHandle>* h, int lo, int hi) {
  CK(cuCtxSetCurrent(g_vmm.ctx));
  for (int i = lo; i < hi; i++) {
    CK(cuMemMap(b + i * kPage, kPage, 0, (*h)[i], 0));
    CK(cuMemSetAccess(b + i * kPage, kPage, &g_vmm.mem.desc, 1));
  }
}

static void unmap_share(CUdeviceptr a, int lo, int hi) {
  CK(cuCtxSetCurrent(g_vmm.ctx));
  for (int i = lo; i < hi; i++) CK(cuMemUnmap(a + i * kPage, kPage));
}

static void threads() {
  int counts[] = {256, 1024};
  int widths[] = {1, 2, 4, 8, 1};
  for (int rep = 0; rep < 2; rep++) {
    for (int n : counts) {
      for (int t : widths) {
        CUdeviceptr a, b;
        std::vector<CUmemGenericAllocationHandle> h;
        make_pieces(n, &a, &b, &h);
        CK(cuCtxSynchronize());
        std::vector<std::thread> ts;
        double t0 = now_ns();
        for (int k = 0; k < t; k++) ts.emplace_back(move_share, b, &h, n * k / t, n * (k + 1) / t);
        for (auto& x : ts) x.join();
        double tm = now_ns() - t0;
        ts.clear();
        t0 = now_ns();
        for (int k = 0; k < t; k++) ts.emplace_back(unmap_share, a, n * k / t, n * (k + 1) / t);
        for (auto& x : ts) x.join();
        double tu = now_ns() - t0;
        // The moved pieces hold what was written before the move.
        CK(cuMemsetD8(b, 7, kPage * n));
        CK(cuCtxSynchronize());
        printf("threads n=%5d t=%d | wall per piece: map+setAccess %.2f us, unmap %.2f us\n", n, t,
               tm / 1e3 / n, tu / 1e3 / n);
        CK(cuMemUnmap(b, kPage * n));
        for (int i = 0; i < n; i++) CK(cuMemRelease(h[i]));
        CK(cuMemAddressFree(a, kPage * n));
        CK(cuMemAddressFree(b, kPage * n));
      }
    }
  }
}

__global__ void spin(float* p, long n) {
  float x = p[threadIdx.x];
  for (long i = 0; i < n; i++) x = x * 0.999f + 1.f;
  p[threadIdx.x] = x;
}

__global__ void tiny(float* p) {
  if (threadIdx.x == 0) p[0] += 1.f;
}

static void busy(float* d, cudaStream_t s) {
  const int n = 256;
  CUdeviceptr a, b;
  std::vector<CUmemGenericAllocationHandle> h;
  make_pieces(n, &a, &b, &h);
  CUdeviceptr src = a, dst = b;
  for (int round = 0; round < 6; round++) {
    bool gpu_busy = round % 2;
    if (gpu_busy)
      for (int k = 0; k < 400; k++) spin<<<132 * 4, 256, 0, s>>>(d, 20000);
    double tm = 0, ta = 0, tu = 0;
    for (int i = 0; i < n; i++) {
      double t0 = now_ns();
      CK(cuMemMap(dst + i * kPage, kPage, 0, h[i], 0));
      double t1 = now_ns();
      CK(cuMemSetAccess(dst + i * kPage, kPage, &g_vmm.mem.desc, 1));
      double t2 = now_ns();
      CK(cuMemUnmap(src + i * kPage, kPage));
      double t3 = now_ns();
      tm += t1 - t0;
      ta += t2 - t1;
      tu += t3 - t2;
    }
    bool still = cudaStreamQuery(s) == cudaErrorNotReady;
    printf("busy   GPU %s: per piece map %.2f us, setAccess %.2f us, unmap %.2f us (GPU still busy after: %s)\n",
           gpu_busy ? "busy" : "idle", tm / 1e3 / n, ta / 1e3 / n, tu / 1e3 / n, still ? "yes" : "no");
    cudaStreamSynchronize(s);
    std::swap(src, dst);
  }
  CK(cuMemUnmap(src, kPage * n));
  for (int i = 0; i < n; i++) CK(cuMemRelease(h[i]));
  CK(cuMemAddressFree(a, kPage * n));
  CK(cuMemAddressFree(b, kPage * n));
}

// Per-piece cost of moving 256 pieces while `background` other handles stay
// mapped (2 MiB each, or `big` MiB each for the same bytes): does the driver's
// cost grow with the mappings a process holds? A training process holds
// thousands (26 GiB of 2 MiB pieces is 13,000).
static void scale_one(int background, size_t handle, const char* label) {
  const int n = 256;
  int nb = (int)((size_t)background * kPage / handle);
  CUdeviceptr bg = 0;
  std::vector<CUmemGenericAllocationHandle> bh(nb);
  if (nb > 0) {
    CK(cuMemAddressReserve(&bg, handle * nb, 0, 0, 0));
    for (int i = 0; i < nb; i++) {
      CK(cuMemCreate(&bh[i], handle, &g_vmm.mem.prop, 0));
      CK(cuMemMap(bg + i * handle, handle, 0, bh[i], 0));
      CK(cuMemSetAccess(bg + i * handle, handle, &g_vmm.mem.desc, 1));
    }
  }
  CUdeviceptr a, b;
  std::vector<CUmemGenericAllocationHandle> h;
  make_pieces(n, &a, &b, &h);
  CUdeviceptr src = a, dst = b;
  for (int rep = 0; rep < 2; rep++) {
    double tm = 0, ta = 0, tu = 0;
    for (int i = 0; i < n; i++) {
      double t0 = now_ns();
      CK(cuMemMap(dst + i * kPage, kPage, 0, h[i], 0));
      double t1 = now_ns();
      CK(cuMemSetAccess(dst + i * kPage, kPage, &g_vmm.mem.desc, 1));
      double t2 = now_ns();
      CK(cuMemUnmap(src + i * kPage, kPage));
      double t3 = now_ns();
      tm += t1 - t0;
      ta += t2 - t1;
      tu += t3 - t2;
    }
    printf("scale  %-7s %6d other handles of %3zu MiB (%5.1f GiB): per piece map %.2f us, setAccess %.2f us, unmap %.2f us\n",
           label, nb, handle >> 20, (double)nb * handle / (1ul << 30), tm / 1e3 / n, ta / 1e3 / n, tu / 1e3 / n);
    std::swap(src, dst);
  }
  CK(cuMemUnmap(src, kPage * n));
  for (int i = 0; i < n; i++) CK(cuMemRelease(h[i]));
  CK(cuMemAddressFree(a, kPage * n));
  CK(cuMemAddressFree(b, kPage * n));
  if (nb > 0) {
    CK(cuMemUnmap(bg, handle * nb));
    for (int i = 0; i < nb; i++) CK(cuMemRelease(bh[i]));
    CK(cuMemAddressFree(bg, handle * nb));
  }
}

static void scale(const char* label) {
  for (int background : {0, 2048, 8192, 14336}) scale_one(background, kPage, label);
  scale_one(14336, 64ul << 20, label);
}

static std::atomic<int> g_stop{0};
static std::atomic<long> g_moves{0};
static std::atomic<long> g_polls{0};

// Polls an idle stream until told to stop.
static void* poller(void*) {
  CK(cuCtxSetCurrent(g_vmm.ctx));
  CUstream st;
  CK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
  while (!g_stop.load()) {
    cuStreamQuery(st);
    g_polls++;
  }
  CK(cuStreamDestroy(st));
  return nullptr;
}

// Moves 64 pieces back and forth between two reservations until told to stop.
static void* mover(void*) {
  CK(cuCtxSetCurrent(g_vmm.ctx));
  const int n = 64;
  CUdeviceptr a, b;
  std::vector<CUmemGenericAllocationHandle> h;
  make_pieces(n, &a, &b, &h);
  CUdeviceptr src = a, dst = b;
  int i = 0;
  while (!g_stop.load()) {
    CK(cuMemMap(dst + i * kPage, kPage, 0, h[i], 0));
    CK(cuMemSetAccess(dst + i * kPage, kPage, &g_vmm.mem.desc, 1));
    CK(cuMemUnmap(src + i * kPage, kPage));
    g_moves++;
    if (++i == n) {
      i = 0;
      std::swap(src, dst);
    }
  }
  // Pieces [0, i) are at dst, the rest at src.
  for (int k = 0; k < n; k++) CK(cuMemUnmap((k < i ? dst : src) + k * kPage, kPage));
  for (int k = 0; k < n; k++) CK(cuMemRelease(h[k]));
  CK(cuMemAddressFree(a, kPage * n));
  CK(cuMemAddressFree(b, kPage * n));
  return nullptr;
}

static void helper(float* d, cudaStream_t s) {
  for (int mode = 0; mode < 10; mode++) {
    bool moving = mode % 2;
    pthread_t th;
    g_moves = 0;
    g_stop = 0;
    if (moving) {
      pthread_create(&th, nullptr, mover, nullptr);
      while (g_moves.load() < 50) {
      }
    }
    std::vector<double> lat;
    lat.reserve(20000);
    double start = now_ns();
    for (int i = 0; i < 20000; i++) {
      double t0 = now_ns();
      tiny<<<1, 32, 0, s>>>(d);
      lat.push_back(now_ns() - t0);
      if (i % 64 == 63) cudaStreamSynchronize(s);
    }
    cudaStreamSynchronize(s);
    double total = now_ns() - start;
    long moved = g_moves.load();
    g_stop = 1;
    if (moving) pthread_join(th, nullptr);
    std::sort(lat.begin(), lat.end());
    printf("helper %-20s 20000 launches in %.1f ms; launch p50 %.2f us p90 %.2f p99 %.2f; pieces moved by the helper meanwhile %ld\n",
           moving ? "moving pieces:" : "idle:", total / 1e6, lat[10000] / 1e3, lat[18000] / 1e3, lat[19800] / 1e3, moved);
  }
}

int main() {
  g_vmm = vmm_device0();
  CUdevice dev;
  CK(cuCtxGetDevice(&dev));
  char name[256];
  CK(cuDeviceGetName(name, sizeof name, dev));
  int version = 0;
  CK(cuDriverGetVersion(&version));
  printf("device %s, driver API %d\n", name, version);
  float* d;
  cudaMalloc(&d, 1 << 20);
  cudaMemset(d, 0, 1 << 20);
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  for (int i = 0; i < 1000; i++) tiny<<<1, 32, 0, s>>>(d);
  cudaStreamSynchronize(s);
  const char* only = getenv("VMM_MOVES_ONLY");
  if (only && !strcmp(only, "threads")) {
    threads();
    return 0;
  }
  if (!only || !strcmp(only, "scale")) {
    scale("alone");
    // Peer access to the other GPUs, as NCCL's processes have it.
    int n = 0, peers = 0;
    CK(cuDeviceGetCount(&n));
    for (int i = 1; i < n; i++) {
      int can = 0;
      cudaDeviceCanAccessPeer(&can, 0, i);
      if (can && cudaDeviceEnablePeerAccess(i, 0) == cudaSuccess) peers++;
    }
    if (peers > 0) {
      char label[32];
      snprintf(label, sizeof label, "peers=%d", peers);
      scale(label);
    }
  }
  if (only && !strcmp(only, "scale")) return 0;
  if (only && !strcmp(only, "batch")) {
    // VMM_MOVES_AT=<unix seconds>: start then (processes started together).
    if (const char* at = getenv("VMM_MOVES_AT")) {
      while (time(nullptr) < atol(at)) usleep(1000);
    }
    const char* poll = getenv("VMM_MOVES_POLL");
    pthread_t t;
    bool polling = poll && !strcmp(poll, "1");
    if (polling) pthread_create(&t, nullptr, poller, nullptr);
    batch();
    if (polling) {
      g_stop = 1;
      pthread_join(t, nullptr);
      printf("poller: %ld stream queries meanwhile\n", g_polls.load());
    }
    return 0;
  }
  batch();
  busy(d, s);
  helper(d, s);
  return 0;
}
