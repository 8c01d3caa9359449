"""The statistic names of ``memory_stats`` (PyTorch's ``torch.cuda.memory_stats``
keys where the meaning is the same, emm's own under ``emm.``), as constants for the
bindings' own use. The library's table (``emm_core::stat_names``, read through
``emm_stat_names``: :func:`emm.stat_names`) is the source;
``python/tests/test_stat_names.py`` checks this copy against it, and the names the
C++ allocator object and ``emm._torch_routes`` ask PyTorch's layout for against
both.
"""

ALLOCATED_BYTES_CURRENT = "allocated_bytes.all.current"
ALLOCATED_BYTES_PEAK = "allocated_bytes.all.peak"
ALLOCATED_BYTES_ALLOCATED = "allocated_bytes.all.allocated"
ALLOCATED_BYTES_FREED = "allocated_bytes.all.freed"
RESERVED_BYTES_CURRENT = "reserved_bytes.all.current"
RESERVED_BYTES_PEAK = "reserved_bytes.all.peak"
ACTIVE_BYTES_CURRENT = "active_bytes.all.current"
ACTIVE_BYTES_PEAK = "active_bytes.all.peak"
INACTIVE_SPLIT_BYTES_CURRENT = "inactive_split_bytes.all.current"
SEGMENT_CURRENT = "segment.all.current"
SEGMENT_PEAK = "segment.all.peak"
ALLOCATION_CURRENT = "allocation.all.current"
ALLOCATION_PEAK = "allocation.all.peak"
ALLOCATION_ALLOCATED = "allocation.all.allocated"
ALLOCATION_FREED = "allocation.all.freed"
NUM_ALLOC_RETRIES = "num_alloc_retries"
NUM_OOMS = "num_ooms"
NUM_DEVICE_ALLOC = "num_device_alloc"
NUM_DEVICE_FREE = "num_device_free"
THREAD_CACHED_BYTES = "emm.thread_cached_bytes"
THREAD_CACHE_HITS = "emm.thread_cache_hits"
SHARED_HITS = "emm.shared_hits"
CROSS_STREAM_REUSES = "emm.cross_stream_reuses"
PARKED_TAKEN_BACK = "emm.parked_taken_back"
PARKED_ADOPTED = "emm.parked_adopted"
PARKED_WAITED = "emm.parked_waited"
LOCKED_ALLOCS = "emm.locked_allocs"
LOCKED_FREES = "emm.locked_frees"
EVENTS_RECORDED = "emm.events_recorded"
EVENT_QUERIES = "emm.event_queries"
DEVICE_SYNCS = "emm.device_syncs"
MISSES = "emm.misses"
SCAN_STEPS = "emm.scan_steps"
PIECES_MAPPED = "emm.pieces_mapped"
PIECES_MOVED = "emm.pieces_moved"
PIECES_UNMAPPED = "emm.pieces_unmapped"
PIECES_REPLACED = "emm.pieces_replaced"
RETIRE_WAITS = "emm.retire_waits"
TIGHTENINGS = "emm.tightenings"
MERGES = "emm.merges"
HOME_OVERFLOWS = "emm.home_overflows"
THRESHOLD_RELEASES = "emm.threshold_releases"
CACHE_RECLAIMS = "emm.cache_reclaims"
PAUSED_BYTES = "emm.paused_bytes"
PEAK_SLACK_RESERVED_BYTES = "emm.peak_slack.reserved_bytes"
PEAK_SLACK_LIVE_BYTES = "emm.peak_slack.live_bytes"
PEAK_SLACK_THREAD_CACHED_BYTES = "emm.peak_slack.thread_cached_bytes"
PEAK_SLACK_OWN_STREAM_FREE_BYTES = "emm.peak_slack.own_stream_free_bytes"
PEAK_SLACK_OTHER_STREAMS_FREE_BYTES = "emm.peak_slack.other_streams_free_bytes"
PEAK_SLACK_SETTLED_FREE_BYTES = "emm.peak_slack.settled_free_bytes"
PEAK_SLACK_PARKED_BYTES = "emm.peak_slack.parked_bytes"
PEAK_SLACK_SMALL_FREE_BYTES = "emm.peak_slack.small_free_bytes"
PEAK_SLACK_REQUEST_BYTES = "emm.peak_slack.request_bytes"
PEAK_SLACK_STREAMS = "emm.peak_slack.streams"
MANAGED_BYTES_CURRENT = "emm.managed_bytes.current"
MANAGED_BYTES_PEAK = "emm.managed_bytes.peak"
MANAGED_ALLOCATIONS_CURRENT = "emm.managed_allocations.current"
MANAGED_ALLOCATIONS_ALLOCATED = "emm.managed_allocations.allocated"
MANAGED_PENDING_BYTES = "emm.managed_pending_bytes"

#: Every name above, in the library's order.
NAMES = (
    ALLOCATED_BYTES_CURRENT,
    ALLOCATED_BYTES_PEAK,
    ALLOCATED_BYTES_ALLOCATED,
    ALLOCATED_BYTES_FREED,
    RESERVED_BYTES_CURRENT,
    RESERVED_BYTES_PEAK,
    ACTIVE_BYTES_CURRENT,
    ACTIVE_BYTES_PEAK,
    INACTIVE_SPLIT_BYTES_CURRENT,
    SEGMENT_CURRENT,
    SEGMENT_PEAK,
    ALLOCATION_CURRENT,
    ALLOCATION_PEAK,
    ALLOCATION_ALLOCATED,
    ALLOCATION_FREED,
    NUM_ALLOC_RETRIES,
    NUM_OOMS,
    NUM_DEVICE_ALLOC,
    NUM_DEVICE_FREE,
    THREAD_CACHED_BYTES,
    THREAD_CACHE_HITS,
    SHARED_HITS,
    CROSS_STREAM_REUSES,
    PARKED_TAKEN_BACK,
    PARKED_ADOPTED,
    PARKED_WAITED,
    LOCKED_ALLOCS,
    LOCKED_FREES,
    EVENTS_RECORDED,
    EVENT_QUERIES,
    DEVICE_SYNCS,
    MISSES,
    SCAN_STEPS,
    PIECES_MAPPED,
    PIECES_MOVED,
    PIECES_UNMAPPED,
    PIECES_REPLACED,
    RETIRE_WAITS,
    TIGHTENINGS,
    MERGES,
    HOME_OVERFLOWS,
    THRESHOLD_RELEASES,
    CACHE_RECLAIMS,
    PAUSED_BYTES,
    PEAK_SLACK_RESERVED_BYTES,
    PEAK_SLACK_LIVE_BYTES,
    PEAK_SLACK_THREAD_CACHED_BYTES,
    PEAK_SLACK_OWN_STREAM_FREE_BYTES,
    PEAK_SLACK_OTHER_STREAMS_FREE_BYTES,
    PEAK_SLACK_SETTLED_FREE_BYTES,
    PEAK_SLACK_PARKED_BYTES,
    PEAK_SLACK_SMALL_FREE_BYTES,
    PEAK_SLACK_REQUEST_BYTES,
    PEAK_SLACK_STREAMS,
    MANAGED_BYTES_CURRENT,
    MANAGED_BYTES_PEAK,
    MANAGED_ALLOCATIONS_CURRENT,
    MANAGED_ALLOCATIONS_ALLOCATED,
    MANAGED_PENDING_BYTES,
)

#: PyTorch's ``memory_stats`` keys (flat, ``all`` pool) that its allocator object
#: reads and emm keeps no counter for: they read 0 under emm.
TORCH_ONLY = (
    "segment.all.allocated",
    "segment.all.freed",
    "active.all.current",
    "active.all.peak",
    "active.all.allocated",
    "active.all.freed",
    "inactive_split.all.current",
    "inactive_split.all.peak",
    "inactive_split.all.allocated",
    "inactive_split.all.freed",
    "reserved_bytes.all.allocated",
    "reserved_bytes.all.freed",
    "active_bytes.all.allocated",
    "active_bytes.all.freed",
    "inactive_split_bytes.all.peak",
    "inactive_split_bytes.all.allocated",
    "inactive_split_bytes.all.freed",
    "requested_bytes.all.current",
    "requested_bytes.all.peak",
    "requested_bytes.all.allocated",
    "requested_bytes.all.freed",
    "num_sync_all_streams",
    "max_split_size",
)
