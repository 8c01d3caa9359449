//! Export of the pool's expandable segment by file descriptor
//! ([`IpcHandle::Vmm`]), against `emm-standin` (host memory: a piece is a memfd,
//! exported as a new descriptor of it, imported by mapping the same memfd at a
//! fresh address range, so one process sees the round trip through two
//! mappings). Cross-process round trips are the `vmm_ipc_*` tests of
//! `emm-pool/tests/gpu.rs`.
//!
//! The library is found next to the test executable; build it first with
//! `cargo build -p emm-standin`.

mod common;

use std::os::fd::AsRawFd;

use common::{fixture, snapshot, Snapshot};

use emm::core::IpcHandle;
use emm::{Context, EmmError, MemoryManager};
use emm_driver::memory;
use emm_pool::{PoolConfig, PoolManager, PoolUpstream};
use emm_sys::StandIn;

const MIB: usize = 1 << 20;

fn pool(ctx: &Context, exportable: bool) -> PoolManager {
    let config = PoolConfig {
        exportable,
        thread_cache_blocks: 0,
        ..PoolConfig::default()
    };
    PoolManager::with_config(PoolUpstream::Driver(ctx.clone()), config).unwrap()
}

fn pattern(seed: u8, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed))
        .collect()
}

fn read(ctx: &Context, ptr: u64, n: usize) -> Vec<u8> {
    let mut out = vec![0u8; n];
    // SAFETY: callers pass a range of `n` mapped bytes.
    unsafe { memory::copy_dtoh(ctx, &mut out, ptr) }.unwrap();
    out
}

fn write(ctx: &Context, ptr: u64, data: &[u8]) {
    // SAFETY: callers pass a range of `data.len()` mapped bytes.
    unsafe { memory::copy_htod(ctx, ptr, data) }.unwrap();
}

/// Descriptors open in this process.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

fn assert_clean(s: &StandIn<'_>, ctx: &Context, before: &Snapshot, fds: usize, what: &str) {
    ctx.synchronize().unwrap();
    assert_eq!(
        &snapshot(s),
        before,
        "{what}: the stand-in's live resources or bad-free counters changed"
    );
    assert_eq!(open_fds(), fds, "{what}: descriptors leaked");
}

fn vmm_parts(h: &IpcHandle) -> (u32, Vec<(i32, usize)>, usize, usize) {
    match h {
        IpcHandle::Vmm {
            pid,
            pieces,
            offset,
            size,
            ..
        } => (*pid, pieces.clone(), *offset, *size),
        other => panic!("expected a virtual-memory handle, got {other:?}"),
    }
}

#[test]
fn a_block_of_the_expandable_segment_round_trips_through_its_export() {
    let f = fixture();
    let (before, fds) = (snapshot(&f.s), open_fds());
    {
        let pool = pool(&f.ctx, true);
        let block = pool.memalloc(24 * MIB).unwrap();
        let data = pattern(3, 24 * MIB);
        write(&f.ctx, block.ptr(), &data);
        let (off, len) = (5 * MIB + 512, 17 * MIB);
        let handle = pool.get_ipc_handle(block.view(off, len).unwrap()).unwrap();
        let (pid, pieces, offset, size) = vmm_parts(&handle);
        println!(
            "handle: pid {pid}, {} pieces {:?}, offset {offset}, size {size}, {} bytes as text",
            pieces.len(),
            pieces.iter().map(|p| p.1).collect::<Vec<_>>(),
            handle.to_hex().len()
        );
        assert_eq!(pid, std::process::id());
        assert_eq!(size, len);
        assert!(pieces.len() >= 2, "a 17 MiB range spans several pieces");
        assert!(offset < pieces[0].1);
        assert_eq!(IpcHandle::from_bytes(&handle.to_bytes()).unwrap(), handle);
        // The same block exported again names the same descriptors (one per piece).
        let again = pool.get_ipc_handle(block.view(off, len).unwrap()).unwrap();
        assert_eq!(vmm_parts(&again).1, pieces);

        let opened = handle.open(&f.ctx, &pool).unwrap();
        assert!(!opened.is_staged());
        assert_ne!(
            opened.ptr(),
            block.ptr() + off as u64,
            "a mapping of its own"
        );
        assert_eq!(read(&f.ctx, opened.ptr(), len), data[off..off + len]);
        // Written through the import, read through the exporter's block …
        let mine = pattern(77, 3 * MIB);
        write(&f.ctx, opened.ptr() + (len - 3 * MIB) as u64, &mine);
        let back = read(&f.ctx, block.ptr(), 24 * MIB);
        assert_eq!(back[off + len - 3 * MIB..off + len], mine[..]);
        assert_eq!(back[..off], data[..off], "bytes before the range untouched");
        assert_eq!(back[off + len..], data[off + len..], "bytes after it too");
        // … and the other way round.
        let theirs = pattern(200, MIB);
        write(&f.ctx, block.ptr() + off as u64, &theirs);
        assert_eq!(read(&f.ctx, opened.ptr(), MIB), theirs);
        let mut opened = opened;
        opened.close().unwrap();
        assert!(!opened.is_open());
        drop(block);
        pool.check().unwrap();
    }
    assert_clean(&f.s, &f.ctx, &before, fds, "export, open, close, free");
}

/// Set in the child of `a_block_of_many_pieces_opens_one_descriptor_at_a_time`.
const FD_LIMIT_CHILD: &str = "EMM_TEST_VMM_FD_LIMIT_CHILD";

#[test]
fn a_block_of_many_pieces_opens_one_descriptor_at_a_time() {
    // The descriptor limit is the process's: the check runs in a child (this
    // test binary again, running only `many_pieces_under_a_descriptor_limit`).
    // The fixture keeps the other tests, which count this process's
    // descriptors, waiting while the child's pipes are open.
    let _f = fixture();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "many_pieces_under_a_descriptor_limit",
            "--nocapture",
        ])
        .env(FD_LIMIT_CHILD, "1")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("opened: 1 check"),
        "the child ran no check: {text}"
    );
}

#[test]
fn many_pieces_under_a_descriptor_limit() {
    if std::env::var_os(FD_LIMIT_CHILD).is_none() {
        return; // only in the child of the test above
    }
    let f = fixture();
    let pool = pool(&f.ctx, true);
    let block = pool.memalloc(96 * MIB).unwrap();
    let data = pattern(9, 96 * MIB);
    write(&f.ctx, block.ptr(), &data);
    let handle = pool
        .get_ipc_handle(block.view(0, 96 * MIB).unwrap())
        .unwrap();
    let n = vmm_parts(&handle).1.len();
    assert!(n >= 8, "96 MiB spans pieces of at most 8 MiB: {n}");
    // Free descriptors for the stand-in's one per imported piece and half as
    // many again: enough when the opener holds one piece's descriptor at a
    // time, not when it takes every piece's first (2n).
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    let mut fill = Vec::new();
    // SAFETY: valid pointers; this child process runs this one test.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        let old = lim.rlim_cur;
        let highest = std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u64>().ok())
            .max()
            .unwrap();
        lim.rlim_cur = highest + 1;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
        while let Ok(g) = std::fs::File::open("/proc/self/stat") {
            fill.push(g); // every free number below the limit
        }
        lim.rlim_cur = highest + 1 + (n + n / 2) as u64;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
        lim.rlim_cur = old;
    }
    let opened = handle.open(&f.ctx, &pool);
    // SAFETY: as above.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
    drop(fill);
    let mut opened =
        opened.unwrap_or_else(|e| panic!("{n} pieces, {} descriptors free: {e}", n + n / 2));
    assert_eq!(read(&f.ctx, opened.ptr(), 96 * MIB), data);
    opened.close().unwrap();
    drop(block);
    pool.check().unwrap();
    println!(
        "opened: 1 check ({n} pieces with {} descriptors free)",
        n + n / 2
    );
}

#[test]
fn pieces_the_pool_moves_while_an_export_is_open_keep_the_data() {
    let f = fixture();
    let (before, fds) = (snapshot(&f.s), open_fds());
    {
        let pool = pool(&f.ctx, true);
        // A hole of 64 MiB below a live block, then a request that does not fit:
        // the hole's pieces move to the end (as `emm-pool/tests/retire.rs`).
        let a = pool.memalloc(64 * MIB).unwrap();
        let b = pool.memalloc(64 * MIB).unwrap();
        let data_b = pattern(9, 64 * MIB);
        write(&f.ctx, b.ptr(), &data_b);
        let hb = pool.get_ipc_handle(b.view(0, 64 * MIB).unwrap()).unwrap();
        let ob = hb.open(&f.ctx, &pool).unwrap();
        drop(a);
        let moved_before = pool.stats().counts.pieces_moved;
        let c = pool.memalloc(200 * MIB).unwrap();
        let moved = pool.stats().counts.pieces_moved - moved_before;
        println!("pieces moved while b's export was open: {moved}");
        assert!(moved > 0, "the hole's pieces were not moved");
        // c is made partly of moved pieces: its export maps them too.
        let data_c = pattern(21, 200 * MIB);
        write(&f.ctx, c.ptr(), &data_c);
        let hc = pool
            .get_ipc_handle(c.view(MIB, 190 * MIB).unwrap())
            .unwrap();
        let oc = hc.open(&f.ctx, &pool).unwrap();
        assert_eq!(
            read(&f.ctx, oc.ptr(), 190 * MIB),
            data_c[MIB..191 * MIB],
            "c through its import"
        );
        assert_eq!(
            read(&f.ctx, ob.ptr(), 64 * MIB),
            data_b,
            "b through its import"
        );
        let mark = pattern(5, 2 * MIB);
        write(&f.ctx, ob.ptr() + (10 * MIB) as u64, &mark);
        assert_eq!(read(&f.ctx, b.ptr() + (10 * MIB) as u64, 2 * MIB), mark);
        write(&f.ctx, oc.ptr() + (100 * MIB) as u64, &mark);
        assert_eq!(read(&f.ctx, c.ptr() + (101 * MIB) as u64, 2 * MIB), mark);
        // The exporter frees b and gives the idle memory back while b's import is
        // still open: the import keeps its own reference to the memory.
        drop(b);
        pool.trim();
        assert_eq!(read(&f.ctx, ob.ptr() + (10 * MIB) as u64, 2 * MIB), mark);
        drop(ob);
        drop(oc);
        drop(c);
        pool.check().unwrap();
    }
    assert_clean(&f.s, &f.ctx, &before, fds, "moves under open exports");
}

#[test]
fn unexportable_pools_and_small_segments_keep_their_old_answers() {
    let f = fixture();
    let pool = pool(&f.ctx, false);
    // A small block before any large one: a small segment (`cuMemAlloc`), so
    // legacy IPC.
    let small = pool.memalloc(4096).unwrap();
    let h = pool.get_ipc_handle(small.view(0, 4096).unwrap()).unwrap();
    assert!(matches!(h, IpcHandle::Legacy { .. }), "{h:?}");
    let big = pool.memalloc(8 * MIB).unwrap();
    let e = pool.get_ipc_handle(big.view(0, MIB).unwrap()).unwrap_err();
    println!("{e}");
    assert!(
        matches!(&e, EmmError::Unsupported { manager, .. } if manager.contains("EMM_POOL_EXPORTABLE=1")),
        "{e}"
    );
    // With exportable pieces: a small block placed in the expandable segment
    // (its free tail: 7 MiB take four 2 MiB pages) exports by descriptor too.
    let exportable = self::pool(&f.ctx, true);
    let big = exportable.memalloc(7 * MIB).unwrap();
    let small = exportable.memalloc(4096).unwrap();
    let h = exportable
        .get_ipc_handle(small.view(512, 1024).unwrap())
        .unwrap();
    let (_, pieces, offset, size) = vmm_parts(&h);
    assert_eq!((pieces.len(), size), (1, 1024));
    let opened = h.open(&f.ctx, &exportable).unwrap();
    write(&f.ctx, small.ptr() + 512, &pattern(1, 1024));
    assert_eq!(read(&f.ctx, opened.ptr(), 1024), pattern(1, 1024));
    assert!(offset < pieces[0].1);
    drop((opened, small, big));
}

#[test]
fn garbled_foreign_and_stale_handles_are_typed_errors() {
    let f = fixture();
    let (before, fds) = (snapshot(&f.s), open_fds());
    {
        let pool = pool(&f.ctx, true);
        let block = pool.memalloc(8 * MIB).unwrap();
        let good = pool
            .get_ipc_handle(block.view(0, 8 * MIB).unwrap())
            .unwrap();
        let (pid, pieces, offset, size) = vmm_parts(&good);
        let uuid = good.device_uuid();
        let with = |pid: u32, pieces: Vec<(i32, usize)>| IpcHandle::Vmm {
            pid,
            pieces,
            offset,
            size,
            device_uuid: uuid,
        };
        // Bytes: garbled, truncated, foreign.
        let mut bytes = good.to_bytes();
        bytes[20] ^= 1;
        let e = IpcHandle::from_bytes(&bytes).unwrap_err();
        assert!(matches!(e, EmmError::InvalidIpcHandle { .. }), "{e}");
        println!("garbled: {e}");
        let e = IpcHandle::from_bytes(&good.to_bytes()[..30]).unwrap_err();
        println!("truncated: {e}");
        assert!(matches!(e, EmmError::InvalidIpcHandle { .. }), "{e}");
        let e = IpcHandle::from_bytes(b"EMMSTIPC and then something else").unwrap_err();
        println!("foreign: {e}");
        assert!(e.to_string().contains("not an emm IPC handle"), "{e}");
        // A descriptor the exporter does not have open: stale.
        let stale = IpcHandle::Vmm {
            size: 4096,
            offset: 0,
            pid,
            pieces: vec![(987_654, pieces[0].1)],
            device_uuid: uuid,
        };
        let e = stale.open(&f.ctx, &pool).unwrap_err();
        println!("stale: {e}");
        assert!(
            matches!(&e, EmmError::InvalidIpcHandle { reason } if reason.contains("987654")),
            "{e}"
        );
        // An exporter that is gone.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let gone = child.id();
        child.wait().unwrap();
        let e = with(gone, pieces.clone()).open(&f.ctx, &pool).unwrap_err();
        println!("gone: {e}");
        assert!(
            matches!(&e, EmmError::IpcExporterGone { pid: p, .. } if *p == gone),
            "{e}"
        );
        assert!(e.to_string().contains(&format!("process {gone}")), "{e}");
        // A descriptor of this process that is no piece of memory: the driver
        // refuses the import.
        let file = std::fs::File::open("/proc/self/stat").unwrap();
        let e = IpcHandle::Vmm {
            size: 4096,
            offset: 0,
            pid,
            pieces: vec![(file.as_raw_fd(), pieces[0].1)],
            device_uuid: uuid,
        }
        .open(&f.ctx, &pool)
        .unwrap_err();
        println!("not memory: {e}");
        assert!(
            matches!(&e, EmmError::Driver(_))
                && e.to_string().contains("cuMemImportFromShareableHandle"),
            "{e}"
        );
        drop(file);
        // Real pieces claimed larger than they are: the map fails, and what was
        // imported before is undone.
        let mut wrong = pieces.clone();
        wrong[0].1 *= 2;
        let e = with(pid, wrong).open(&f.ctx, &pool).unwrap_err();
        println!("wrong sizes: {e}");
        assert!(e.to_string().contains("cuMemMap"), "{e}");
        drop(block);
        pool.check().unwrap();
    }
    assert_clean(&f.s, &f.ctx, &before, fds, "typed errors");
}

/// A close whose release of a piece the driver refuses keeps the range's
/// address reserved until a later close releases the piece: no later import
/// in this process is given the address of a range still kept (the C ABI
/// keeps opened memory by its address).
#[test]
fn a_refused_release_keeps_the_range_reserved_until_a_later_close() {
    let f = fixture();
    let (before, fds) = (snapshot(&f.s), open_fds());
    {
        let pool = pool(&f.ctx, true);
        let block = pool.memalloc(24 * MIB).unwrap();
        let handle = pool.get_ipc_handle(block.as_view()).unwrap();
        let mut opened = handle.open(&f.ctx, &pool).unwrap();
        let reservations = f.s.live().unwrap().reservations;
        f.s.control("fail cuMemRelease 1 CUDA_ERROR_UNKNOWN")
            .unwrap();
        let e = opened.close().unwrap_err();
        assert!(e.to_string().contains("cuMemRelease"), "{e}");
        assert!(opened.is_open(), "the refused piece is kept");
        assert_eq!(
            f.s.live().unwrap().reservations,
            reservations,
            "the range stays reserved while a piece of it is kept"
        );
        let mut other = handle.open(&f.ctx, &pool).unwrap();
        assert_ne!(other.ptr(), opened.ptr(), "a new import, another address");
        other.close().unwrap();
        opened.close().unwrap();
        assert!(!opened.is_open());
        assert_eq!(f.s.live().unwrap().reservations, reservations - 1);
        drop(block);
    }
    assert_clean(&f.s, &f.ctx, &before, fds, "a refused release closed again");
}

/// An imported range dropped while the context's wait is refused hands all of
/// it to the context, and the context undoes a mapping only after a wait of its
/// own succeeds (the importer's work on it may still be queued): a refused
/// wait at the retry keeps the mappings and the range for the next try.
#[test]
fn a_range_dropped_without_its_wait_is_unmapped_only_after_the_contexts_wait() {
    let f = fixture();
    let (before, fds) = (snapshot(&f.s), open_fds());
    {
        let pool = pool(&f.ctx, true);
        let block = pool.memalloc(24 * MIB).unwrap();
        let handle = pool.get_ipc_handle(block.as_view()).unwrap();
        let opened = handle.open(&f.ctx, &pool).unwrap();
        let reservations = f.s.live().unwrap().reservations;
        f.s.control("fail cuCtxSynchronize 1 CUDA_ERROR_UNKNOWN")
            .unwrap();
        drop(opened);
        assert!(f.ctx.doomed_handles() >= 3, "mappings, handles, range");
        let _ = f.ctx.take_deferred_errors();
        // A trim's quiet retry adds no wait of the context: the mappings stay.
        let waits = f.s.control("calls cuCtxSynchronize").unwrap();
        f.ctx.retry_destroys_in_trim();
        assert_eq!(f.s.control("calls cuCtxSynchronize").unwrap(), waits);
        assert_eq!(f.s.live().unwrap().reservations, reservations);
        f.s.control("fail cuCtxSynchronize 1 CUDA_ERROR_UNKNOWN")
            .unwrap();
        let e = f.ctx.retry_destroys().unwrap_err();
        assert!(e.to_string().contains("cuCtxSynchronize"), "{e}");
        assert_eq!(
            f.s.live().unwrap().reservations,
            reservations,
            "nothing unmapped, so the range is kept"
        );
        f.ctx.retry_destroys().unwrap();
        assert_eq!(f.ctx.doomed_handles(), 0);
        assert_eq!(f.s.live().unwrap().reservations, reservations - 1);
        drop(block);
    }
    assert_clean(
        &f.s,
        &f.ctx,
        &before,
        fds,
        "a range handed over and released",
    );
}
