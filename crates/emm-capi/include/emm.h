/* emm: the C ABI. Link with -lemm_capi (libemm_capi.so, built by
 * `cargo build --release -p emm-capi`). Kept in step with crates/emm-capi/src/lib.rs
 * by a test.
 *
 * Conventions: every function returns an emm_status (EMM_OK == 0). After a failure,
 * emm_last_error() copies the message of the calling thread's last failure. Device
 * pointers are uint64_t; streams are CUstream / cudaStream_t passed as void*
 * (NULL: the legacy default stream). Handles for one device share its manager with
 * every other emm user in the process (Python, PyTorch).
 *
 * The manager: without a choice it is "pool" (emm's caching pool), here as in Rust,
 * Python and PyTorch's allocator pair. EMM_MEMORY_MANAGER, emm_configure("manager",
 * ...) or a name passed to emm_manager_create choose another.
 *
 * Log output: on first use the library sends emm's warnings and errors to standard
 * error, filtered by EMM_LOG (tracing-subscriber's EnvFilter syntax, e.g. "debug";
 * default "warn"), unless the process installed its own tracing subscriber.
 * emm_capture_warnings(1) queues warnings and errors for emm_take_warning instead
 * (Python's bindings raise them through the warnings module). */
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
    EMM_ERR_OTHER = 9,
    EMM_ERR_INTERNAL = 10 /* a state emm should never reach (a bug); since ABI 302 */
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

/* Version of this ABI: major * 10000 + minor * 100 + patch. 300 (0.3.0) added
 * emm_configure, emm_last_oom, emm_capture_warnings and emm_take_warning, and made
 * "pool" the default manager; 301 added the memory tools (emm_memory_stat,
 * emm_memory_stats_json, emm_reset_peak_stats, emm_record_memory_history,
 * emm_memory_snapshot_json, emm_string_free); 302 added EMM_ERR_INTERNAL and
 * refuses handles that emm did not create, or that were destroyed, with
 * EMM_ERR_INVALID_ARGUMENT; 303 added managed memory (emm_alloc_managed,
 * emm_free_managed, EMM_MEM_ATTACH_GLOBAL/HOST). */
int emm_abi_version(void);

/* Configuration in code, before the first allocation of the process. Keys (each
 * mirrors an environment variable, whose name is accepted as the key too):
 *   "manager"                     EMM_MEMORY_MANAGER  "pool" (default), "default", "hostonly"
 *   "pool_limit"                  EMM_POOL_LIMIT      bytes the pool reserves per device
 *   "pool_expandable"             EMM_POOL_EXPANDABLE "1"/"0": large blocks in one VMM segment
 *   "hostonly_release_threshold"  EMM_HOSTONLY_RELEASE_THRESHOLD  bytes, or "max"
 *   "max_pending_deallocs_count"  EMM_MAX_PENDING_DEALLOCS_COUNT  queued frees before a flush
 *   "max_pending_deallocs_ratio"  EMM_MAX_PENDING_DEALLOCS_RATIO  0..1 of device memory
 * A set environment variable wins (with a warning). Values are validated at once
 * (EMM_ERR_INVALID_ARGUMENT; an unknown manager is EMM_ERR_UNKNOWN_MANAGER). Once a
 * manager has been created, a different value fails with EMM_ERR_ALREADY_IN_USE. */
emm_status emm_configure(const char *key, const char *value);

/* The last failure on this thread: message (NUL-terminated, truncated to len;
 * returns the full length; buf may be NULL) and code. */
size_t emm_last_error(char *buf, size_t len);
emm_status emm_last_error_code(void);
/* After EMM_ERR_OUT_OF_MEMORY: bytes requested, and free and total bytes (of the
 * device, or of the manager's limit) when it failed; 0 where unknown. Outputs may
 * be NULL. EMM_ERR_INVALID_ARGUMENT when the last failure was not out of memory. */
emm_status emm_last_oom(size_t *requested, size_t *free, size_t *total);

/* Warnings: on != 0 queues emm's warnings and errors for emm_take_warning instead of
 * printing them on standard error; returns the previous setting. emm_take_warning
 * copies the oldest (NUL-terminated) into buf, sets *len to its length and *level
 * (may be NULL) to EMM_LOG_ERROR or EMM_LOG_WARN, and removes it; *len is 0 when
 * none is queued. With buf NULL or cap <= *len it stays queued and the call returns
 * EMM_ERR_INVALID_ARGUMENT with *len the length needed (without the NUL). The queue
 * keeps the newest 256. */
enum { EMM_LOG_ERROR = 1, EMM_LOG_WARN = 2 };
int emm_capture_warnings(int on);
emm_status emm_take_warning(char *buf, size_t cap, size_t *len, int *level);

/* Managers: name is "default", "pool" or "hostonly" (NULL: EMM_MEMORY_MANAGER, else
 * the one configured, else "pool"). Choosing a different name after another manager served memory fails
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

/* Managed memory (cuMemAllocManaged; Numba's memallocmanaged): one address valid on
 * the host and on every device. flags is exactly one of EMM_MEM_ATTACH_GLOBAL
 * (accessible from any stream on any device) and EMM_MEM_ATTACH_HOST (attached to
 * the host); anything else is EMM_ERR_INVALID_ARGUMENT. size 0 sets *out to 0 and
 * allocates nothing. Never pooled: one driver allocation per call, freed at once
 * by emm_free_managed (which emm_free refuses, and the other way round). Counted
 * apart from emm_get_stats, under "emm.managed_bytes.current",
 * "emm.managed_bytes.peak", "emm.managed_allocations.current",
 * "emm.managed_allocations.allocated" and "emm.managed_pending_bytes" of
 * emm_memory_stat. EMM_ERR_UNSUPPORTED where the driver or device has no managed
 * memory; EMM_ERR_OUT_OF_MEMORY (see emm_last_oom) when it cannot be had. Since
 * ABI 303. */
enum { EMM_MEM_ATTACH_GLOBAL = 1, EMM_MEM_ATTACH_HOST = 2 };
emm_status emm_alloc_managed(emm_manager *m, size_t size, unsigned int flags, uint64_t *out);
emm_status emm_free_managed(emm_manager *m, uint64_t ptr);

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

/* Memory tools. Counters are named as in PyTorch's memory_stats where they mean
 * the same ("allocated_bytes.all.current", "allocated_bytes.all.peak",
 * "allocated_bytes.all.allocated", "allocated_bytes.all.freed",
 * "reserved_bytes.all.current", "reserved_bytes.all.peak",
 * "active_bytes.all.current", "active_bytes.all.peak",
 * "inactive_split_bytes.all.current", "segment.all.current", "segment.all.peak",
 * "allocation.all.current", "allocation.all.peak", "allocation.all.allocated",
 * "allocation.all.freed", "num_alloc_retries", "num_ooms", "num_device_alloc",
 * "num_device_free"; the pool's own under "emm.", e.g. "emm.thread_cached_bytes").
 * In the pool, "allocated" excludes blocks parked in thread caches (they count as
 * "active"); the allocated peaks are sampled at every locked allocation and every
 * query (a peak reached by thread-cache hits alone and undone before the next
 * sample is missed).
 *
 * emm_memory_stat: one counter by name (unknown: EMM_ERR_INVALID_ARGUMENT).
 * emm_memory_stats_json: every counter as one JSON object.
 * emm_reset_peak_stats: every peak set to its current value.
 * emm_record_memory_history: keep the latest max_entries allocation events (0:
 *   stop and drop them); EMM_ERR_UNSUPPORTED for managers without a history.
 * emm_memory_snapshot_json: {"segments": [{"address", "total_size", "stream",
 *   "large", "expandable", "blocks": [{"address", "size", "requested_size",
 *   "allocated"}]}], "trace": [{"action", "addr", "size", "stream", "time_us",
 *   "device_free"}], "stats": {...}}, taken at one time (the calling thread's
 *   cached blocks go back to the pool first; other threads' cached blocks show as
 *   allocated). Actions: alloc, free_requested, free_completed, segment_alloc,
 *   segment_free, segment_map, segment_unmap, oom. EMM_ERR_UNSUPPORTED for
 *   managers without segments of their own.
 * The JSON strings belong to the caller: free them with emm_string_free. */
emm_status emm_memory_stat(emm_manager *m, const char *key, uint64_t *value);
emm_status emm_memory_stats_json(emm_manager *m, char **out, size_t *len);
emm_status emm_reset_peak_stats(emm_manager *m);
emm_status emm_record_memory_history(emm_manager *m, size_t max_entries);
emm_status emm_memory_snapshot_json(emm_manager *m, char **out, size_t *len);
void emm_string_free(char *s);

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

/* PyTorch's pluggable allocator (torch.cuda.memory.CUDAPluggableAllocator): the
 * process's manager (EMM_MEMORY_MANAGER, else the one configured, else "pool"). */
void *emm_torch_alloc(ssize_t size, int device, void *stream);
void emm_torch_free(void *ptr, ssize_t size, int device, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* EMM_H */
