//! Reading traces: formats, tolerance, and the typed errors of bad input.

use std::path::{Path, PathBuf};

use emm_trace::{scan, Format, Op, Trace, TraceError, MAX_LINE};

mod common;
use common::data;

fn fixture(name: &str) -> PathBuf {
    data("emm-trace/tests/fixtures").join(name)
}

#[path = "common/temp.rs"]
mod temp;
use temp::Temp;

fn temp(name: &str, bytes: &[u8]) -> Temp {
    temp::temp_in("emm-trace-test-", name, bytes)
}

fn open_one(p: &Path) -> Result<Trace, TraceError> {
    Trace::open(p, None).map(|mut v| v.remove(0))
}

#[test]
fn both_text_formats_parse_and_bad_lines_are_numbered() {
    let t = Trace::from_text(
        "t",
        "op,id,size,stream\na,1,100,0\na,2,50,1\nx,3,1,0\na,4\nf,1,100,0\n",
    )
    .unwrap();
    let s = scan(&t).unwrap();
    assert_eq!((s.events, s.requests, s.peak_live_bytes), (3, 2, 150));
    assert_eq!(s.diagnostics.bad, 2);
    let lines: Vec<u64> = s.diagnostics.first.iter().map(|e| e.line).collect();
    assert_eq!(lines, vec![4, 5]);
    assert!(s.diagnostics.first[0].message.contains("neither"));
    let r = Trace::from_text(
        "r",
        "Thread,Time,Action,Pointer,Size,Stream\n1,0.1,allocate,0x7f00,256,0x0\n1,0.2,allocate,0x7f10,64,0x0\n1,0.3,free,0x7f00,256,0x0\n1,0.4,free,0xdead,1,0x0\n",
    )
    .unwrap();
    assert_eq!(r.format(), Format::RmmLog);
    let ops: Vec<Op> = r.events().unwrap().collect();
    assert_eq!(
        ops,
        vec![
            Op::Alloc {
                id: 1,
                size: 256,
                stream: 0
            },
            Op::Alloc {
                id: 2,
                size: 64,
                stream: 0
            },
            Op::Free { id: 1 }
        ]
    );
    assert_eq!(scan(&r).unwrap().diagnostics.first[0].line, 5);
    // A stream that is not hex is said (the line skipped), not read as stream
    // 0; an empty one is the default stream; a free's stream is not read.
    let r = Trace::from_text(
        "r",
        "Thread,Time,Action,Pointer,Size,Stream\n1,0.1,allocate,0x7f00,256,zz\n1,0.2,allocate,0x7f10,64,\n1,0.3,allocate,0x7f20,8,0x1a\n1,0.4,free,0x7f10,64,zz\n",
    )
    .unwrap();
    let ops: Vec<Op> = r.events().unwrap().collect();
    assert_eq!(
        ops,
        vec![
            Op::Alloc {
                id: 1,
                size: 64,
                stream: 0
            },
            Op::Alloc {
                id: 2,
                size: 8,
                stream: 0x1a
            },
            Op::Free { id: 1 }
        ]
    );
    let d = scan(&r).unwrap().diagnostics;
    assert_eq!((d.bad, d.first[0].line), (1, 2));
    assert!(
        d.first[0].message.contains("stream \"zz\" is not hex"),
        "{:?}",
        d.first
    );
    // Hex, but past 64 bits: said as such, not as "not hex".
    let r = Trace::from_text(
        "r",
        "Thread,Time,Action,Pointer,Size,Stream\n1,0.1,allocate,0x7f00,256,0xffffffffffffffffff\n1,0.2,allocate,0x1ffffffffffffffff,8,0x0\n1,0.3,allocate,0x7f30,8,0x0\n",
    )
    .unwrap();
    let d = scan(&r).unwrap().diagnostics;
    assert_eq!(d.bad, 2);
    assert!(
        d.first[0]
            .message
            .contains("stream \"0xffffffffffffffffff\" is larger than 64 bits")
            && d.first[1]
                .message
                .contains("pointer \"0x1ffffffffffffffff\" is larger than 64 bits"),
        "{:?}",
        d.first
    );
    // A pointer allocated again while live is the emm CSV's reused id: the
    // earlier allocation is taken as freed there, and counted.
    let r = Trace::from_text(
        "r",
        "Thread,Time,Action,Pointer,Size,Stream\n1,0.1,allocate,0x7f00,256,0x0\n1,0.2,allocate,0x7f00,64,0x0\n1,0.3,free,0x7f00,64,0x0\n",
    )
    .unwrap();
    let s = scan(&r).unwrap();
    assert_eq!(
        (s.requests, s.reused_live_ids, s.peak_live_bytes),
        (2, 1, 256)
    );
    assert_eq!(s.unknown_frees, 0);
    // A failed allocation made no block, whatever its pointer says ("(nil)"
    // where glibc prints a null pointer).
    let r = Trace::from_text(
        "r",
        "Thread,Time,Action,Pointer,Size,Stream\n1,0.1,allocate failure,(nil),1024,0x0\n1,0.2,allocate,0x7f00,64,0x0\n",
    )
    .unwrap();
    let s = scan(&r).unwrap();
    assert_eq!(
        (s.requests, s.diagnostics.bad),
        (1, 0),
        "{:?}",
        s.diagnostics.first
    );
}

#[test]
fn bom_spaces_blank_first_lines_and_comments_are_tolerated() {
    let p = temp(
        "bom.csv",
        "\u{feff}\n\n  # recorded by hand\n  Op, Id, Size, Stream  \r\na,1,512,0\r\nf,1,512,0\r\n"
            .as_bytes(),
    );
    let t = open_one(&p).unwrap();
    assert_eq!(t.format(), Format::EmmCsv);
    let s = scan(&t).unwrap();
    assert_eq!((s.requests, s.diagnostics.bad), (1, 0));
}

#[test]
fn a_missing_header_is_an_error_naming_file_and_line() {
    let p = temp("noheader.csv", b"\n\na,1,512,0\nf,1,512,0\n");
    let e = open_one(&p).unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(e, TraceError::MissingHeader { line: 3, .. }),
        "{msg}"
    );
    assert!(
        msg.contains("noheader.csv:3") && msg.contains("a,1,512,0"),
        "{msg}"
    );
    // With the format given, the header is optional.
    let t = Trace::open(&p, Some(Format::EmmCsv)).unwrap().remove(0);
    assert_eq!(scan(&t).unwrap().requests, 1);
}

#[test]
fn an_empty_or_all_bad_file_is_an_error() {
    let e = open_one(&temp("empty.csv", b"")).unwrap_err();
    assert!(matches!(e, TraceError::NoUsableEvent { .. }), "{e}");
    let f = temp("bad.csv", b"op,id,size,stream\nhello\nworld\n");
    let t = open_one(&f).unwrap();
    let e = scan(&t).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("all 2 lines") && msg.contains("line 2"),
        "{msg}"
    );
    let f = temp("headeronly.csv", b"op,id,size,stream\n");
    let t = open_one(&f).unwrap();
    assert!(matches!(scan(&t), Err(TraceError::NoUsableEvent { .. })));
}

#[test]
fn many_bad_lines_end_promptly_and_keep_only_a_few() {
    let mut text = b"op,id,size,stream\n".to_vec();
    for _ in 0..100_000 {
        text.extend_from_slice(b"garbage line\n");
    }
    let f = temp("garbage.csv", &text);
    let t = open_one(&f).unwrap();
    let e = scan(&t).unwrap_err();
    assert!(e.to_string().contains("first 1000 lines"), "{e}");
    // Mixed: counted, only the first few kept.
    let mut text = b"op,id,size,stream\na,1,512,0\n".to_vec();
    for _ in 0..5000 {
        text.extend_from_slice(b"x,1,2,3\n");
    }
    let f = temp("mixed.csv", &text);
    let s = scan(&open_one(&f).unwrap()).unwrap();
    assert_eq!(s.diagnostics.bad, 5000);
    assert_eq!(s.diagnostics.first.len(), emm_trace::KEPT_LINE_ERRORS);
}

#[test]
fn binary_input_and_endless_lines_are_rejected_at_once() {
    let e = open_one(&temp("bin.dat", &[0x7f, b'E', b'L', b'F', 0, 1, 2])).unwrap_err();
    assert!(matches!(e, TraceError::Binary { .. }), "{e}");
    let e = open_one(&temp("latin.dat", &[b'a', 0xff, 0xfe, b'b'])).unwrap_err();
    assert!(e.to_string().contains("invalid UTF-8"), "{e}");
    let mut long = b"op,id,size,stream\n".to_vec();
    long.extend(std::iter::repeat_n(b'1', MAX_LINE * 4));
    let f = temp("long.csv", &long);
    let t = open_one(&f).unwrap();
    assert!(matches!(
        scan(&t),
        Err(TraceError::LineTooLong { line: 2, .. })
    ));
    if Path::new("/dev/urandom").exists() {
        // An endless binary stream ends in a typed error (a hang would stop the run).
        assert!(open_one(Path::new("/dev/urandom")).is_err());
    }
}

#[test]
fn snapshot_reconstructs_allocations_made_before_recording() {
    for name in ["snapshot_small.pickle", "snapshot_small_p2.pickle"] {
        let t = open_one(&fixture(name)).unwrap();
        assert_eq!(t.format(), Format::TorchSnapshot);
        let f = *t.torch_figures().unwrap();
        assert_eq!(f.reconstructed_allocs, 2, "{name}");
        assert_eq!(f.cross_stream_frees, 1);
        assert_eq!(f.ooms, 1);
        assert_eq!(f.reserved_at_dump, 20 << 20);
        assert_eq!(f.peak_reserved_bytes, 22 << 20);
        let s = scan(&t).unwrap();
        // At the start: 4 MiB (freed during the recording) + 2,000,000 (live at the
        // dump), both from before it. Without them the peak would be 4 MiB (1 + 3).
        assert_eq!(s.peak_live_bytes, (4 << 20) + 2_000_000);
        assert_eq!(s.requests, 5);
        assert_eq!(s.streams, 2);
        assert_eq!(s.diagnostics.bad, 0);
    }
}

/// A snapshot pickled at protocol 0 or 1 (no `PROTO` opcode at its start; a
/// protocol-1 file holds NUL bytes, a protocol-0 file is ASCII) is found to be a
/// snapshot from its first bytes, as Python's `pickle` reads it, and reads as the
/// same snapshot at protocol 4; from standard input too. They were once refused
/// as binary data or as a text file with no usable header unless `--format
/// pytorch` was given.
#[test]
fn snapshots_of_protocols_0_and_1_are_detected_without_format() {
    let p4 = open_one(&fixture("snapshot_small.pickle")).unwrap();
    let (p4_ops, p4_diag) = ops_of(&p4);
    for name in ["snapshot_small_p0.pickle", "snapshot_small_p1.pickle"] {
        let t = open_one(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(t.format(), Format::TorchSnapshot, "{name}");
        assert_eq!(t.torch_figures(), p4.torch_figures(), "{name}");
        assert_eq!(ops_of(&t), (p4_ops.clone(), p4_diag.clone()), "{name}");
        let bytes = std::fs::read(fixture(name)).unwrap();
        let t = Trace::from_reader("(standard input)", &bytes[..], None)
            .unwrap_or_else(|e| panic!("{name} from a reader: {e}"));
        assert_eq!(t[0].format(), Format::TorchSnapshot, "{name}");
    }
    // Text that merely begins with a brace or a parenthesis is still text.
    for head in [&b"}\nop,id,size,stream\n"[..], b"(d)\nop,id,size,stream\n"] {
        match open_one(&temp("brace.csv", head)) {
            Ok(t) => assert_eq!(t.format(), Format::EmmCsv),
            Err(e) => assert!(
                !matches!(e, TraceError::Pickle { .. } | TraceError::Snapshot { .. }),
                "{e:?}"
            ),
        }
    }
}

/// Snapshots PyTorch 2.11 wrote on an H200 (`python/gpu/benchmarks/record_snapshot.py`): a
/// training run whose recording starts at step 15, with a side stream and
/// `record_stream`, and variable-batch inference. The expected figures come from
/// `python/gpu/benchmarks/snapshot_to_csv.py`, written separately in Python over `pickle`.
#[test]
fn real_pytorch_snapshots_give_the_peak_they_imply() {
    for (name, peak, reconstructed, streams) in [
        ("h200_train_midway.pickle", 850_202_280u128, 221, 2),
        ("h200_infer.pickle", 173_029_168, 51, 1),
    ] {
        let t = open_one(&fixture(name)).unwrap();
        assert_eq!(t.format(), Format::TorchSnapshot);
        let f = *t.torch_figures().unwrap();
        assert_eq!(f.reconstructed_allocs, reconstructed, "{name}");
        assert_eq!(f.ooms, 0);
        let s = scan(&t).unwrap();
        assert_eq!(s.peak_live_bytes, peak, "{name}");
        assert_eq!(s.streams, streams, "{name}");
        assert_eq!(s.diagnostics.bad, 0, "{name}");
    }
}

/// A pickle of 200,000 nested lists (200 KB) once overflowed the decoder's stack and
/// aborted the process; it is a typed error now.
#[test]
fn a_deeply_nested_pickle_is_a_typed_error_not_an_abort() {
    let n = 200_000;
    let mut p = vec![0x80, 2];
    p.extend(std::iter::repeat_n(b']', n));
    p.extend(std::iter::repeat_n(b'a', n - 1));
    p.push(b'.');
    let e = open_one(&temp("nested.pickle", &p)).unwrap_err();
    assert!(matches!(e, TraceError::Pickle { .. }), "{e}");
    // 200,000 containers in 200 KB are more than the file may make, so that is
    // said first; 1,000 levels (within that bound) are refused as too deep.
    assert!(e.to_string().contains("more than 29096 containers"), "{e}");
    let n = 1_000;
    let mut p = vec![0x80, 2];
    p.extend(std::iter::repeat_n(b']', n));
    p.extend(std::iter::repeat_n(b'a', n - 1));
    p.push(b'.');
    let e = open_one(&temp("nested1k.pickle", &p)).unwrap_err();
    assert!(e.to_string().contains("nest deeper"), "{e}");
}

#[test]
fn a_pickle_that_is_not_a_snapshot_is_a_typed_error() {
    let e = open_one(&fixture("not_a_snapshot.pickle")).unwrap_err();
    assert!(matches!(e, TraceError::Snapshot { .. }), "{e}");
    let e = open_one(&temp("trunc.pickle", &[0x80, 4, 0x95, 1, 2])).unwrap_err();
    assert!(matches!(e, TraceError::Pickle { .. }), "{e}");
}

/// Every event of `t`, and what reading it found.
fn ops_of(t: &Trace) -> (Vec<Op>, emm_trace::Diagnostics) {
    let mut ev = t.events().unwrap();
    let ops: Vec<_> = (&mut ev).collect();
    (ops, ev.finish().unwrap())
}

/// A snapshot whose entries share Python objects (pickle memo references: the
/// same entry dict, frame list or string written once and referred to after) reads
/// exactly as the same snapshot written without sharing. The shared dicts once
/// decoded as empty after their first use: 1 request and "unknown action" records.
#[test]
fn a_snapshot_whose_entries_share_objects_reads_as_without_sharing() {
    let plain = open_one(&fixture("snapshot_unshared.pickle")).unwrap();
    let (plain_ops, plain_diag) = ops_of(&plain);
    assert_eq!(plain_diag.bad, 0, "{:?}", plain_diag.first);
    assert!(
        plain_ops.len() > 3 * 6,
        "small()'s client events, 3 times: {plain_ops:?}"
    );
    for name in [
        "snapshot_shared.pickle",
        "snapshot_shared_p2.pickle",
        "snapshot_shared_p1.pickle",
        "snapshot_shared_p0.pickle",
    ] {
        let t = open_one(&fixture(name)).unwrap();
        let (ops, diag) = ops_of(&t);
        assert_eq!(diag, plain_diag, "{name}");
        assert_eq!(ops, plain_ops, "{name}");
        assert_eq!(t.torch_figures(), plain.torch_figures(), "{name}");
    }

    // One alloc dict 1,000 times: 1,000 requests of 1 MiB, each replacing the last.
    let t = open_one(&fixture("snapshot_repeated_alloc.pickle")).unwrap();
    let s = scan(&t).unwrap();
    assert_eq!(s.diagnostics.bad, 0, "{:?}", s.diagnostics.first);
    assert_eq!(s.requests, 1000);
    assert_eq!(s.peak_live_bytes, 1 << 20);
}

/// A `free_completed` of a live block that no `free_requested` freed frees it:
/// 100 allocations of 1 MiB, each followed by its `free_completed` alone, hold
/// 1 MiB at most, not 100 MiB.
#[test]
fn a_free_completed_without_free_requested_frees_the_block() {
    let t = open_one(&fixture("snapshot_completed_only.pickle")).unwrap();
    let s = scan(&t).unwrap();
    assert_eq!(s.requests, 100);
    assert_eq!(s.peak_live_bytes, 1 << 20);
    assert_eq!(s.unknown_frees, 0);
    assert_eq!(s.diagnostics.bad, 0, "{:?}", s.diagnostics.first);
    let (ops, _) = ops_of(&t);
    assert_eq!(
        ops.iter().filter(|o| matches!(o, Op::Free { .. })).count(),
        100
    );
    // Not a cross-stream free: nothing held it back.
    assert_eq!(t.torch_figures().unwrap().cross_stream_frees, 0);
    // A free_completed after its free_requested frees nothing more: small() has
    // 3 free_requested, each followed by its free_completed.
    let t = open_one(&fixture("snapshot_small.pickle")).unwrap();
    let (ops, _) = ops_of(&t);
    assert_eq!(
        ops.iter().filter(|o| matches!(o, Op::Free { .. })).count(),
        3
    );
}

/// `--format rmm` on an emm CSV says what header it found and which it expected,
/// instead of calling the header a malformed line 1.
#[test]
fn a_forced_format_on_another_formats_header_says_what_was_expected() {
    let p = temp("emm_as_rmm.csv", b"op,id,size,stream\na,1,512,0\nf,1,0,0\n");
    let e = Trace::open(&p, Some(Format::RmmLog)).unwrap_err();
    assert!(
        matches!(e, TraceError::HeaderMismatch { line: 1, .. }),
        "{e}"
    );
    let m = e.to_string();
    assert!(
        m.contains("the header is emm-csv's (\"op,id,size,stream\")")
            && m.contains("to be read as rmm-log (expected the header \"Thread,Time,Action,Pointer,Size,Stream\")"),
        "{m}"
    );
    // The format the header names is read as before.
    assert!(Trace::open(&p, Some(Format::EmmCsv)).is_ok());
    // `--format pytorch` on it says it begins as text, with emm's header, not
    // what the pickle decoder made of it ("no MARK to pop to").
    for e in [
        Trace::open(&p, Some(Format::TorchSnapshot)).unwrap_err(),
        Trace::from_reader(
            "(standard input)",
            &b"\n op,id,size,stream\na,1,512,0\n"[..],
            Some(Format::TorchSnapshot),
        )
        .unwrap_err(),
    ] {
        assert!(matches!(e, TraceError::NotASnapshot { .. }), "{e}");
        let m = e.to_string();
        assert!(
            m.contains("it begins with the text line \"op,id,size,stream\", emm-csv's header; drop --format"),
            "{m}"
        );
    }
}

/// Protocol 2 `SHORT_BINUNICODE`-style string (`X`, 4-byte length).
fn x(s: &str) -> Vec<u8> {
    let mut v = vec![b'X'];
    v.extend((s.len() as u32).to_le_bytes());
    v.extend(s.as_bytes());
    v
}

/// One segment dict of `k` active blocks (one block dict, memo 1, referred to
/// `k` times), listed `n` times in `segments` (memo 2), and one alloc entry.
fn shared_segments(k: usize, n: usize) -> Vec<u8> {
    let mut blk = b"}q\x01(".to_vec();
    for part in [
        x("state"),
        x("active_allocated"),
        x("address"),
        b"K\x01".to_vec(),
    ] {
        blk.extend(part);
    }
    blk.extend(x("size"));
    blk.extend(b"K\x10u");
    let mut seg = b"}q\x02(".to_vec();
    seg.extend(x("total_size"));
    seg.extend(b"K\x10");
    seg.extend(x("blocks"));
    seg.extend(b"](");
    seg.extend(blk);
    seg.extend(b"h\x01".repeat(k - 1));
    seg.extend(b"eu");
    let mut p = b"\x80\x02}(".to_vec();
    p.extend(x("segments"));
    p.extend(b"](");
    p.extend(seg);
    p.extend(b"h\x02".repeat(n - 1));
    p.extend(b"e");
    p.extend(x("device_traces"));
    p.extend(b"](](}(");
    for part in [
        x("action"),
        x("alloc"),
        x("addr"),
        b"K\x02".to_vec(),
        x("size"),
    ] {
        p.extend(part);
    }
    p.extend(b"K\x10ueeu.");
    p
}

/// A segment listed 3,000 times by memo reference, holding one block dict 3,000
/// times (12 KB): each blocks list is read once, not once per segment that holds
/// it (9 million block visits, seconds in a debug build, before), and the figures
/// are those of the snapshot written out without sharing.
#[test]
fn segments_shared_many_times_are_read_in_linear_time() {
    let (k, n) = (3_000u128, 3_000u128);
    let p = shared_segments(k as usize, n as usize);
    let t0 = std::time::Instant::now();
    let f = temp("shared_segments.pickle", &p);
    let t = open_one(&f).unwrap();
    let took = t0.elapsed();
    let f = *t.torch_figures().unwrap();
    assert_eq!(f.reserved_at_dump, 16 * n);
    assert_eq!(f.allocated_at_dump, 16 * n * k);
    // The one address held at the dump, never allocated in the trace.
    assert_eq!(f.reconstructed_allocs, 1);
    assert!(took < std::time::Duration::from_secs(2), "{took:?}");
}

/// Devices that share one `device_traces` list would replay it once each: time
/// and memory quadratic in the file. More entries over all devices than bytes in
/// the file is a typed error saying so.
#[test]
fn a_trace_list_shared_by_many_devices_is_a_typed_error() {
    let (k, n) = (1_000usize, 1_000usize);
    let mut p = b"\x80\x02}(".to_vec();
    p.extend(x("segments"));
    p.extend(b"]");
    p.extend(x("device_traces"));
    p.extend(b"](](}q\x01(");
    p.extend(x("action"));
    p.extend(x("alloc"));
    p.extend(x("addr"));
    p.extend(b"K\x02uq\x02");
    p.extend(b"h\x01".repeat(k - 1));
    p.extend(b"eq\x03");
    p.extend(b"h\x03".repeat(n - 1));
    p.extend(b"eu.");
    let e = open_one(&temp("shared_devices.pickle", &p)).unwrap_err();
    assert!(matches!(e, TraceError::Snapshot { .. }), "{e}");
    assert!(e.to_string().contains("entries so far in a file of"), "{e}");
}

/// One `blocks` list of `n` distinct active blocks (memo 1), held by `n`
/// segments of `n` devices: each device reconstructs every block, n² in all
/// from a file linear in n (a 400 KB file once took 3.5 GB and 77 s). Past one
/// reconstructed block or entry per byte of the file it is a typed error.
#[test]
fn a_blocks_list_shared_by_many_devices_is_a_typed_error() {
    let n = 2_000u32;
    let mut p = b"\x80\x02}(".to_vec();
    p.extend(x("segments"));
    p.extend(b"](");
    for d in 0..n {
        p.extend(b"}(");
        p.extend(x("device"));
        p.push(b'J');
        p.extend(d.to_le_bytes());
        p.extend(x("total_size"));
        p.extend(b"K\x10");
        p.extend(x("blocks"));
        if d == 0 {
            p.extend(b"](");
            for i in 0..n {
                p.extend(b"}(");
                p.extend(x("state"));
                p.extend(x("active_allocated"));
                p.extend(x("address"));
                p.push(b'J');
                p.extend((4096 * (i + 1)).to_le_bytes());
                p.extend(x("size"));
                p.extend(b"M\x00\x02u");
            }
            p.extend(b"eq\x01");
        } else {
            p.extend(b"h\x01");
        }
        p.push(b'u');
    }
    p.extend(b"e");
    p.extend(x("device_traces"));
    p.extend(b"]u.");
    let t0 = std::time::Instant::now();
    let e = open_one(&temp("shared_blocks.pickle", &p)).unwrap_err();
    let took = t0.elapsed();
    assert!(matches!(e, TraceError::Snapshot { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("allocated block per byte of the file"),
        "{e}"
    );
    assert!(took < std::time::Duration::from_secs(2), "{took:?}");
}

/// A 1 MB string referred to as 2,000 trace entries that are not dicts: the
/// message of each bad entry once formatted the whole string (2 GB of escaping,
/// many seconds) before cutting it to 60 characters. Only a prefix is formatted
/// now, and only for the entries kept.
#[test]
fn a_huge_shared_string_as_bad_entries_is_reported_promptly() {
    let (len, m) = (1_000_000usize, 2_000usize);
    let mut p = b"\x80\x04}(\x8c\x08segments]\x8c\x0ddevice_traces](](\x8d".to_vec();
    p.extend((len as u64).to_le_bytes());
    p.extend(std::iter::repeat_n(b'\x01', len));
    p.push(0x94);
    p.extend(b"h\x00".repeat(m - 1));
    p.extend(b"eeu.");
    let t0 = std::time::Instant::now();
    let f = temp("shared_string.pickle", &p);
    let t = open_one(&f).unwrap();
    let (_, diag) = ops_of(&t);
    let took = t0.elapsed();
    assert_eq!(diag.bad, m as u64);
    let first = &diag.first[0].message;
    assert!(first.contains("String(\"\\u{1}"), "{first}");
    assert!(first.len() < 200, "{first}");
    assert!(took < std::time::Duration::from_secs(2), "{took:?}");
}

/// 1 MB of `EMPTY_LIST`: a container per byte once took ~87 bytes of memory per
/// byte of input (4.3 GB for 50 MB). A pickle may make one container per 16
/// bytes (plus 4096); more is a typed error, and so is a pickle with no STOP.
#[test]
fn a_pickle_of_bare_containers_is_refused_before_it_takes_memory() {
    let mut p = vec![0x80, 2];
    p.extend(std::iter::repeat_n(b']', 1_000_000));
    p.push(b'.');
    let e = open_one(&temp("manylists.pickle", &p)).unwrap_err();
    assert!(matches!(e, TraceError::Pickle { .. }), "{e}");
    assert!(e.to_string().contains("more than 66596 containers"), "{e}");
    p.pop();
    let e = open_one(&temp("manylists_nostop.pickle", &p)).unwrap_err();
    assert!(matches!(e, TraceError::Pickle { .. }), "{e}");
    // A file with no STOP that stays within the bound is refused as truncated.
    let e = open_one(&temp("nostop.pickle", b"\x80\x02]]]")).unwrap_err();
    assert!(e.to_string().contains("ends without STOP"), "{e}");
}

/// A snapshot record whose `size` is not a non-negative integer (a string, a
/// negative number) or whose `action` is not a string is reported and skipped,
/// saying what was found, not read as an allocation of 0 bytes or as an
/// unknown action "".
#[test]
fn a_record_with_a_bad_size_or_action_is_reported_with_what_it_holds() {
    fn entry(action: &[u8], addr: u8, size: &[u8]) -> Vec<u8> {
        let mut e = b"}(".to_vec();
        e.extend(x("action"));
        e.extend(action);
        e.extend(x("addr"));
        e.extend([b'K', addr]);
        e.extend(x("size"));
        e.extend(size);
        e.push(b'u');
        e
    }
    let mut p = b"\x80\x02}(".to_vec();
    p.extend(x("segments"));
    p.push(b']');
    p.extend(x("device_traces"));
    p.extend(b"](](");
    p.extend(entry(&x("alloc"), 1, &x("1024")));
    p.extend(entry(&x("alloc"), 2, b"J\xfb\xff\xff\xff")); // -5
    p.extend(entry(b"K\x05", 3, b"K\x10"));
    p.extend(entry(&x("alloc"), 4, b"K\x10"));
    p.extend(entry(&x("segment_alloc"), 5, b"N")); // None
    p.extend(b"eeu.");
    let f = temp("bad_size_action.pickle", &p);
    let t = open_one(&f).unwrap();
    let (ops, diag) = ops_of(&t);
    assert_eq!(
        ops,
        vec![Op::Alloc {
            id: 1,
            size: 16,
            stream: 0
        }],
        "only the good record is an event"
    );
    assert_eq!(diag.bad, 4, "{:?}", diag.first);
    let said: Vec<&str> = diag.first.iter().map(|e| e.message.as_str()).collect();
    assert!(
        said[0].contains("(alloc) has no non-negative integer `size` (found String(\"1024\"))"),
        "{said:?}"
    );
    assert!(
        said[1].contains("(alloc) has no non-negative integer `size` (found Int(-5))"),
        "{said:?}"
    );
    assert!(
        said[2].contains("has no string `action` (found Int(5))"),
        "{said:?}"
    );
    assert!(
        said[3].contains("(segment_alloc) has no non-negative integer `size` (found None)"),
        "{said:?}"
    );
}

/// A text trace from a FIFO (as `<(...)` or `/dev/stdin` give one) is read once:
/// every pass replays all of it. It used to be opened again for each pass, so
/// the bytes read to find its format were lost (line 1 cut, then every pass
/// after the first empty or waiting for a writer that was gone).
#[cfg(unix)]
#[test]
fn a_text_trace_from_a_fifo_is_read_once_and_every_pass_has_all_of_it() {
    let dir = tempfile::Builder::new()
        .prefix("emm-trace-fifo-")
        .tempdir()
        .unwrap();
    let fifo = dir.path().join("trace.csv");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success(), "mkfifo {}", fifo.display());
    // More than the 64 KiB the format is found from.
    let mut text = String::from("op,id,size,stream\n");
    for i in 0..5_000 {
        text.push_str(&format!("a,{i},{},0\nf,{i},0,0\n", 512 * (1 + i % 7)));
    }
    assert!(text.len() > 64 << 10);
    let writer = {
        let (fifo, text) = (fifo.clone(), text.clone());
        std::thread::spawn(move || std::fs::write(fifo, text))
    };
    let t = open_one(&fifo).unwrap();
    writer.join().unwrap().unwrap();
    // Passes on a thread of their own: a pass that opened the FIFO again would
    // wait for a writer for ever, and the test fails after 60 s instead of
    // hanging.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for _ in 0..2 {
            let s = scan(&t).map(|s| (s.requests, s.diagnostics.bad));
            let _ = tx.send(s.map_err(|e| e.to_string()));
        }
    });
    for pass in 0..2 {
        let got = rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("pass {pass} did not end: the FIFO was opened again"));
        assert_eq!(got, Ok((5_000, 0)), "pass {pass}");
    }
    let _ = std::fs::remove_file(&fifo);
}
