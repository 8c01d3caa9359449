/* emm: the C ABI. Link with -lemm_capi (libemm_capi.so, built by
 * `cargo build --release -p emm-capi`). Kept in step with crates/emm-capi/src/lib.rs
 * by a test.
 *
 * Conventions: every function returns an emm_status (EMM_OK == 0). After a failure,
 * emm_last_error() copies the message of the calling thread's last failure. Device
 * pointers are uint64_t; streams are CUstream / cudaStream_t passed as void*
 * (NULL: the legacy default stream). Handles for one device share its manager with
 * every other emm user in the process (Python, PyTorch). */
#ifndef EMM_H
#define EMM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef int emm_status;
enum {
    EMM_OK = 0,
    EMM_ERR_INVALID_ARGUMENT = 1,
    EMM_ERR_OUT_OF_MEMORY = 2,
    EMM_ERR_DRIVER = 3,
    EMM_ERR_UNSUPPORTED = 4,
    EMM_ERR_UNKNOWN_MANAGER = 5,
    EMM_ERR_IPC = 6,
    EMM_ERR_ALREADY_IN_USE = 7,
    EMM_ERR_PANIC = 8,
    EMM_ERR_OTHER = 9
};

typedef struct emm_manager emm_manager;

typedef struct emm_stats {
    uint64_t allocated_bytes;
    uint64_t allocated_bytes_peak;
    uint64_t reserved_bytes;
    uint64_t reserved_bytes_peak;
    uint64_t allocations;
    uint64_t upstream_allocs;
} emm_stats;

/* Version of this ABI: major * 10000 + minor * 100 + patch. */
int emm_abi_version(void);

/* The last failure on this thread: message (NUL-terminated, truncated to len;
 * returns the full length; buf may be NULL) and code. */
size_t emm_last_error(char *buf, size_t len);
emm_status emm_last_error_code(void);

/* Managers: name is "default", "pool" or "hostonly" (NULL: EMM_MEMORY_MANAGER, else
 * "default"). Choosing a different name after another manager served memory fails
 * with EMM_ERR_ALREADY_IN_USE. */
emm_status emm_manager_create(const char *name, int device, emm_manager **out);
void emm_manager_destroy(emm_manager *m);
const char *emm_manager_name(const emm_manager *m);

/* Device memory ordered on a stream; freed on `stream` (NULL: its own stream). */
emm_status emm_alloc(emm_manager *m, size_t size, void *stream, uint64_t *out_ptr);
/* emm_alloc returning the address: 0 when size is 0 (emm_last_error_code() is then
 * EMM_OK) or on failure (it is then the failure's code). Since ABI 200. */
uint64_t emm_alloc_ptr(emm_manager *m, size_t size, void *stream);
emm_status emm_free(emm_manager *m, uint64_t ptr, void *stream);

/* Pinned host memory: flags bit 0 mapped, bit 1 portable, bit 2 write-combined.
 * out_dev (may be NULL) gets the device address of mapped memory. */
emm_status emm_host_alloc(emm_manager *m, size_t size, uint32_t flags, void **out_host, uint64_t *out_dev);
emm_status emm_host_free(emm_manager *m, void *host);

/* Memory info, statistics, trim (released may be NULL). */
emm_status emm_memory_info(emm_manager *m, size_t *free, size_t *total);
emm_status emm_get_stats(emm_manager *m, emm_stats *out);
/* Every counter the manager keeps, as one line of text (NUL-terminated, truncated
 * to len); *written (may be NULL) gets the full length; buf may be NULL. */
emm_status emm_manager_report(emm_manager *m, char *buf, size_t len, size_t *written);
emm_status emm_trim(emm_manager *m, size_t *released);

/* IPC: export [ptr+offset, ptr+offset+len) of an allocation of this handle as bytes
 * (buf NULL: only the size needed is written); open bytes from another process;
 * close what was opened. */
emm_status emm_ipc_export(emm_manager *m, uint64_t ptr, size_t offset, size_t len, uint8_t *buf, size_t cap, size_t *written);
emm_status emm_ipc_open(emm_manager *m, const uint8_t *buf, size_t len, uint64_t *out_ptr);
emm_status emm_ipc_close(emm_manager *m, uint64_t ptr);

/* MemArray: an n-dimensional typed array (DLPack type code and bits; rank 1..4)
 * with a host mirror and a device copy from manager m (NULL: host only). side: 0
 * host, 1 device. Mutations fail while a lock (explicit or a DLPack export) lives. */
typedef struct emm_array emm_array;
emm_status emm_array_create(emm_manager *m, uint8_t code, uint8_t bits, int rank, const size_t *shape, emm_array **out);
void emm_array_destroy(emm_array *a);
emm_status emm_array_move(emm_array *a, int side, void *stream, int wait, int *moved);
emm_status emm_array_info(emm_array *a, uint64_t *data, int *side, int *device_type, int *device_id);
emm_status emm_array_get(emm_array *a, const size_t *idx, int rank, void *out, size_t size);
emm_status emm_array_set(emm_array *a, const size_t *idx, int rank, const void *value, size_t size);
emm_status emm_array_lock(emm_array *a, uint64_t *id);
emm_status emm_array_unlock(emm_array *a, uint64_t id);
/* DLPack export (versioned != 0: DLManagedTensorVersioned*, else DLManagedTensor*);
 * emm_dlpack_delete runs the deleter of an export nobody consumed. */
emm_status emm_array_to_dlpack(emm_array *a, int versioned, void **out);
void emm_dlpack_delete(void *tensor, int versioned);
uint64_t emm_array_deleters_run(emm_array *a);

/* PyTorch's pluggable allocator (torch.cuda.memory.CUDAPluggableAllocator). */
void *emm_torch_alloc(ssize_t size, int device, void *stream);
void emm_torch_free(void *ptr, ssize_t size, int device, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* EMM_H */
