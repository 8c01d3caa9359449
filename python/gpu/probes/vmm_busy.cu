// Do the virtual-memory calls emm's pool makes while growing (cuMemCreate,
// cuMemMap, cuMemSetAccess, cuMemUnmap) wait for work the device is running on
// other memory? The pool moves pieces and unmaps old mappings while a training
// step's kernels are queued; if a call waits for the device to go idle, the host
// stalls for as long as the queued work lasts.
//
// For each call: its host time with the device idle, then while a kernel that
// spins for about SPIN_MS on an unrelated buffer runs on a created stream (the
// call is made right after the launch; the kernel's own time is printed too).
// A call that takes about SPIN_MS while busy waits for the device.
//
//   nvcc -O2 -o vb vmm_busy.cu -lcuda && ./vb
#include "vmm_setup.h"

#include <chrono>
#include <cstdio>
#include <vector>

using Clock = std::chrono::steady_clock;
static double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

static const double SPIN_MS = 200.0;
static const size_t PAGE = 2u << 20;
static const int PIECES = 64;

__global__ void spin(long long cycles, int* sink) {
  long long start = clock64();
  while (clock64() - start < cycles) {
  }
  *sink = 1;
}

struct Times {
  double create, map, access, unmap;
};

// PIECES pieces created, mapped at one range, given access, unmapped; the host
// time of each step (all pieces).
static Times cycle(const VmmDesc& d) {
  Times t{};
  CUdeviceptr base = 0;
  CK(cuMemAddressReserve(&base, PIECES * PAGE, 0, 0, 0));
  std::vector<CUmemGenericAllocationHandle> h(PIECES);
  auto s = Clock::now();
  for (auto& x : h) CK(cuMemCreate(&x, PAGE, &d.prop, 0));
  t.create = ms_since(s);
  s = Clock::now();
  for (int i = 0; i < PIECES; i++) CK(cuMemMap(base + i * PAGE, PAGE, 0, h[i], 0));
  t.map = ms_since(s);
  s = Clock::now();
  CK(cuMemSetAccess(base, PIECES * PAGE, &d.desc, 1));
  t.access = ms_since(s);
  s = Clock::now();
  for (int i = 0; i < PIECES; i++) CK(cuMemUnmap(base + i * PAGE, PAGE));
  t.unmap = ms_since(s);
  for (auto& x : h) CK(cuMemRelease(x));
  CK(cuMemAddressFree(base, PIECES * PAGE));
  return t;
}

int main() {
  const VmmDesc d = vmm_device0().mem;
  int clock_khz = 0;
  RK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  long long cycles = static_cast<long long>(SPIN_MS * clock_khz);
  int* sink = nullptr;
  RK(cudaMalloc(&sink, sizeof(int)));
  cudaStream_t stream;
  RK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cycle(d);  // warm the calls up
  for (int round = 0; round < 3; round++) {
    Times idle = cycle(d);
    cudaEvent_t a, b;
    RK(cudaEventCreate(&a));
    RK(cudaEventCreate(&b));
    RK(cudaEventRecord(a, stream));
    spin<<<1, 1, 0, stream>>>(cycles, sink);
    RK(cudaEventRecord(b, stream));
    Times busy = cycle(d);
    auto s = Clock::now();
    RK(cudaStreamSynchronize(stream));
    double left = ms_since(s);
    float kernel = 0;
    RK(cudaEventElapsedTime(&kernel, a, b));
    std::printf(
        "round %d, %d pieces of 2 MiB: idle create %.2f map %.2f access %.2f unmap %.2f ms | "
        "busy create %.2f map %.2f access %.2f unmap %.2f ms | kernel %.1f ms, %.1f ms of it left after the calls\n",
        round, PIECES, idle.create, idle.map, idle.access, idle.unmap, busy.create, busy.map,
        busy.access, busy.unmap, kernel, left);
  }
  std::printf("vmm_busy: done\n");
  return 0;
}
