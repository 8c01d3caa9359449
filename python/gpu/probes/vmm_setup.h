// What the vmm_* probes set up first: device 0's primary context, current, and
// the descriptors they create and map 2 MiB pieces with (pinned device memory
// of that device, read-write access from it).
#pragma once
#include "check.h"

struct Vmm {
  CUcontext ctx;
  CUmemAllocationProp prop;
  CUmemAccessDesc desc;
};

// Makes device 0's primary context current; returns it and the descriptors.
inline Vmm vmm_device0() {
  Vmm v{};
  CK(cuInit(0));
  RK(cudaSetDevice(0));
  RK(cudaFree(nullptr));  // the primary context, current
  CK(cuCtxGetCurrent(&v.ctx));
  CUdevice dev;
  CK(cuCtxGetDevice(&dev));
  v.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  v.prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  v.prop.location.id = dev;
  v.desc.location = v.prop.location;
  v.desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return v;
}
