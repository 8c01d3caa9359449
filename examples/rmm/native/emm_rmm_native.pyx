# cython: language_level=3
# distutils: language = c++
"""emm as an RMM memory resource with no Python on the allocation path: a Cython
subclass of RMM's ``DeviceMemoryResource`` that holds ``emm::rmm_resource`` (the
header-only C++ adaptor, emm/rmm_resource.hpp) and hands RMM a reference to it.

A prototype, built by examples/rmm/native/build.sh against the RMM wheel it runs
with: it compiles against RMM's .pxd files and headers (RMM's C++ ABI namespace,
e.g. rmm::_RMM_26_10, and the layout of ``DeviceMemoryResource``), so it must be
rebuilt for every RMM minor version. ``emm.rmm`` (callbacks, no compiler) needs no
such rebuild.
"""
from cython.operator cimport dereference as deref
from libcpp.memory cimport unique_ptr
from libcpp.optional cimport optional

from rmm.librmm.memory_resource cimport device_async_resource_ref
from rmm.pylibrmm.memory_resource cimport DeviceMemoryResource


cdef extern from "emm/rmm_resource.hpp" namespace "emm" nogil:
    cdef cppclass rmm_resource:
        rmm_resource(int device, const char* name) except +
        int device()
        const char* manager_name()


cdef extern from * nogil:
    # RMM's own helper (declared in rmm/librmm/memory_resource.pxd for its
    # resources): a C++ template, so it takes emm's resource as well.
    optional[device_async_resource_ref] emm_make_ref "make_device_async_resource_ref"(
        rmm_resource&) except +


cdef class EmmMemoryResource(DeviceMemoryResource):
    """RMM device memory resource over emm's manager of ``device`` (``name``:
    "pool", "default", "hostonly"; None: EMM_MEMORY_MANAGER, else "pool")."""

    cdef unique_ptr[rmm_resource] c_obj

    def __cinit__(self, int device=0, name=None):
        cdef bytes encoded = name.encode() if name is not None else None
        cdef const char* c_name = NULL
        if encoded is not None:
            c_name = encoded
        self.c_obj.reset(new rmm_resource(device, c_name))
        self.c_ref = emm_make_ref(deref(self.c_obj))

    @property
    def device(self):
        """The CUDA device of emm's handle."""
        return deref(self.c_obj).device()

    @property
    def manager_name(self):
        """The name of emm's manager ("pool", "default", "hostonly")."""
        return deref(self.c_obj).manager_name().decode()
