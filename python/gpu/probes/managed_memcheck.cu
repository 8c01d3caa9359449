// Does memcheck follow cuMemAllocManaged memory a kernel writes and the host reads?
#include <cuda.h>
#include <cstdio>
__global__ void saxpy(float* y, const float* x, float a, unsigned n) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
int main(int argc, char** argv) {
  unsigned flags = argc > 1 ? CU_MEM_ATTACH_HOST : CU_MEM_ATTACH_GLOBAL;
  cuInit(0); CUdevice d; cuDeviceGet(&d, 0); CUcontext c; cuDevicePrimaryCtxRetain(&c, d); cuCtxSetCurrent(c);
  unsigned n = 1000003; CUdeviceptr x, y;
  printf("alloc x %d\n", cuMemAllocManaged(&x, n * 4, flags));
  printf("alloc y %d\n", cuMemAllocManaged(&y, n * 4, flags));
  float* hx = (float*)x; float* hy = (float*)y;
  for (unsigned i = 0; i < n; i++) { hx[i] = i * 0.25f; hy[i] = 1.0f - i; }
  saxpy<<<(n + 255) / 256, 256>>>(hy, hx, 3.0f, n);
  printf("sync %d\n", (int)cudaDeviceSynchronize());
  unsigned bad = 0; for (unsigned i = 0; i < n; i++) bad += hy[i] != 3.0f * (i * 0.25f) + (1.0f - i);
  printf("flags %u bad %u\n", flags, bad);
  cuMemFree(x); cuMemFree(y); return 0;
}
