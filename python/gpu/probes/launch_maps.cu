// Does a kernel launch cost more on the host when the context holds many VMM mappings?
#include "vmm_setup.h"

#include <chrono>
#include <cstdio>
#include <vector>
__global__ void noop(int* p) { if (p && threadIdx.x == 1024) *p = 1; }
static double launches(CUstream s, int n) {
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; i++) noop<<<1, 32, 0, (cudaStream_t)s>>>(nullptr);
  auto t1 = std::chrono::steady_clock::now();
  CK(cuStreamSynchronize(s));
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / n;
}
static void report(const char* what, CUstream s) {
  double best = 1e9, worst = 0;
  for (int r = 0; r < 7; r++) { double x = launches(s, 20000); best = x < best ? x : best; worst = x > worst ? x : worst; }
  printf("%-44s launch %.3f-%.3f us\n", what, best, worst);
}
int main() {
  Vmm v = vmm_device0();
  CUstream s;
  CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  report("nothing allocated", s);
  size_t page = 2 << 20;
  CUdeviceptr base;
  CK(cuMemAddressReserve(&base, (size_t)8192 * page, 0, 0, 0));
  int mapped = 0;
  for (int target : {256, 1024, 4096, 8192}) {
    for (; mapped < target; mapped++) {
      CUmemGenericAllocationHandle h;
      CK(cuMemCreate(&h, page, &v.mem.prop, 0));
      CK(cuMemMap(base + mapped * page, page, 0, h, 0));
      CK(cuMemRelease(h));  // the mapping keeps the memory
      CK(cuMemSetAccess(base + mapped * page, page, &v.mem.desc, 1));
    }
    char what[64];
    snprintf(what, sizeof what, "%d VMM pages of 2 MiB mapped one by one", mapped);
    report(what, s);
  }
  std::vector<CUdeviceptr> ps(200);
  for (auto& p : ps) CK(cuMemAlloc(&p, 20 << 20));
  report("and 200 cuMemAlloc of 20 MiB", s);
  return 0;
}
