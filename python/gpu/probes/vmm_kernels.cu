// Whether kernels run slower on memory mapped through the driver's virtual-memory
// calls than on cudaMalloc's, and whether the size of the physical pieces behind a
// range matters. Both allocators that map memory this way (PyTorch's expandable
// segments and emm's pool) lost 0.05-0.15 ms a step to PyTorch's default allocator
// in GPT-2 inference steps where the GPU, not the host, was the bottleneck (runs
// 99 and 105, docs/benchmarks.md); this asks whether the memory itself is why.
//
// One buffer of SIZE bytes (default 4 GiB) is made four ways:
//   malloc   cudaMalloc
//   one      one cuMemCreate handle of SIZE, mapped once
//   p16      16 MiB handles mapped side by side (emm's fresh pieces)
//   p2       2 MiB handles mapped side by side (emm's moved pieces, the granularity)
// and three kernels run over each, in interleaved rounds, timed with events:
//   stream   y = x + 1 over the whole buffer (half read, half written)
//   gather   4-byte loads at pseudo-random offsets across the whole buffer (every
//            load a likely TLB miss: what page size and piece layout decide)
//   window   the same gather inside a sliding 64 MiB window (TLB-friendly)
// Prints the median and the spread of each kernel's time per layout, and each
// layout's median over malloc's.
//
//   nvcc -O2 -o /tmp/vmm_kernels vmm_kernels.cu -lcuda && /tmp/vmm_kernels [GiB] [rounds]
#include "vmm_setup.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

__global__ void add_one(const float* x, float* y, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    y[i] = x[i] + 1.0f;
}

// Each thread makes `loads` dependent-free loads at hashed offsets in
// [base, base + span) (in floats), the window sliding with the block index.
__global__ void gather(const float* x, size_t n, size_t span, int loads, float* out) {
  size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  size_t base = span >= n ? 0 : (blockIdx.x * (span / 16)) % (n - span);
  float acc = 0.0f;
  unsigned long long h = t * 0x9E3779B97F4A7C15ull + 1;
  for (int k = 0; k < loads; ++k) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    acc += x[base + h % span];
  }
  if (acc == -1.0f) out[0] = acc;  // keeps the loads; never true for these data
}

struct Layout {
  std::string name;
  CUdeviceptr ptr = 0;
  size_t size = 0;
  std::vector<CUmemGenericAllocationHandle> handles;
  bool vmm = false;
};

static Layout make_malloc(size_t size) {
  Layout l{"malloc"};
  void* p = nullptr;
  RK(cudaMalloc(&p, size));
  l.ptr = (CUdeviceptr)p;
  l.size = size;
  return l;
}

static Layout make_vmm(const char* name, size_t size, size_t piece, int dev) {
  Layout l{name};
  l.size = size;
  l.vmm = true;
  VmmDesc d = vmm_desc(dev);
  CK(cuMemAddressReserve(&l.ptr, size, 0, 0, 0));
  for (size_t off = 0; off < size; off += piece) {
    CUmemGenericAllocationHandle h;
    CK(cuMemCreate(&h, piece, &d.prop, 0));
    CK(cuMemMap(l.ptr + off, piece, 0, h, 0));
    l.handles.push_back(h);
  }
  CK(cuMemSetAccess(l.ptr, size, &d.desc, 1));
  return l;
}

static void destroy(Layout& l) {
  if (!l.vmm) {
    RK(cudaFree((void*)l.ptr));
    return;
  }
  CK(cuMemUnmap(l.ptr, l.size));
  for (auto h : l.handles) CK(cuMemRelease(h));
  CK(cuMemAddressFree(l.ptr, l.size));
}

static float time_ms(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  RK(cudaEventElapsedTime(&ms, a, b));
  return ms;
}

int main(int argc, char** argv) {
  size_t gib = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 4;
  int rounds = argc > 2 ? std::atoi(argv[2]) : 15;
  size_t size = gib << 30;
  int dev = 0;
  RK(cudaSetDevice(dev));
  RK(cudaFree(nullptr));
  cudaDeviceProp p;
  RK(cudaGetDeviceProperties(&p, dev));
  int drv = 0;
  RK(cudaDriverGetVersion(&drv));
  std::printf("%s, driver API %d, %zu GiB buffers, %d interleaved rounds\n", p.name, drv, gib, rounds);

  std::vector<Layout> layouts;
  layouts.push_back(make_malloc(size));
  layouts.push_back(make_vmm("one", size, size, dev));
  layouts.push_back(make_vmm("p16", size, 16 << 20, dev));
  layouts.push_back(make_vmm("p2", size, 2 << 20, dev));
  float* out = nullptr;
  RK(cudaMalloc(&out, 4));
  for (auto& l : layouts) RK(cudaMemset((void*)l.ptr, 0, l.size));
  RK(cudaDeviceSynchronize());

  const char* kernels[] = {"stream", "gather", "window"};
  // times[kernel][layout] = one time per round
  std::vector<std::vector<std::vector<float>>> times(3, std::vector<std::vector<float>>(layouts.size()));
  cudaEvent_t a, b;
  RK(cudaEventCreate(&a));
  RK(cudaEventCreate(&b));
  size_t n = size / sizeof(float);
  int sms = p.multiProcessorCount;
  auto run = [&](int k, const Layout& l) {
    const float* x = (const float*)l.ptr;
    switch (k) {
      case 0:
        add_one<<<sms * 8, 256>>>(x, (float*)l.ptr + n / 2, n / 2);
        break;
      case 1:
        gather<<<sms * 16, 256>>>(x, n, n, 64, out);
        break;
      default:
        gather<<<sms * 16, 256>>>(x, n, (64u << 20) / sizeof(float), 64, out);
        break;
    }
  };
  for (int r = -2; r < rounds; ++r) {  // two warm-up rounds
    for (int k = 0; k < 3; ++k) {
      for (size_t li = 0; li < layouts.size(); ++li) {
        // Rotate the order each round so no layout always runs first.
        size_t i = (li + (r < 0 ? 0 : r)) % layouts.size();
        RK(cudaEventRecord(a));
        for (int rep = 0; rep < 5; ++rep) run(k, layouts[i]);
        RK(cudaEventRecord(b));
        RK(cudaEventSynchronize(b));
        if (r >= 0) times[k][i].push_back(time_ms(a, b) / 5);
      }
    }
  }
  RK(cudaGetLastError());
  for (int k = 0; k < 3; ++k) {
    std::vector<float> med(layouts.size());
    for (size_t i = 0; i < layouts.size(); ++i) {
      auto v = times[k][i];
      std::sort(v.begin(), v.end());
      med[i] = v[v.size() / 2];
    }
    for (size_t i = 0; i < layouts.size(); ++i) {
      auto v = times[k][i];
      std::sort(v.begin(), v.end());
      std::printf("%-7s %-7s median %8.3f ms  (min %8.3f, max %8.3f)  %.4fx malloc\n", kernels[k],
                  layouts[i].name.c_str(), med[i], v.front(), v.back(), med[i] / med[0]);
    }
  }
  for (auto& l : layouts) destroy(l);
  return 0;
}
