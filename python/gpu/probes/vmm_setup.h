// What the VMM probes set up first: device 0's primary context, current, and
// the descriptors they create and map pieces with (pinned device memory of
// that device, read-write access from it).
#pragma once
#include "check.h"

// How pieces are created (pinned memory of one device) and the access granted
// to their mappings (read-write from that device).
struct VmmDesc {
  CUmemAllocationProp prop;
  CUmemAccessDesc desc;
};

// The descriptors for pieces of device `dev`'s memory.
inline VmmDesc vmm_desc(CUdevice dev) {
  VmmDesc d{};
  d.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  d.prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.prop.location.id = dev;
  d.desc.location = d.prop.location;
  d.desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return d;
}

// Device 0's primary context and the descriptors for pieces of its memory.
struct Vmm {
  CUcontext ctx;
  VmmDesc mem;
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
  v.mem = vmm_desc(dev);
  return v;
}
