//! The `emm` command as users run it: arguments, inputs, outputs, exit statuses.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

// The `emm` command on the host stand-in, as the page tests run it (the rest of
// what they share is theirs).
#[allow(dead_code)]
mod common;
use common::emm;

fn run(args: &[&str]) -> Output {
    emm().args(args).output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[path = "../../emm-trace/tests/common/temp.rs"]
mod temp;
use temp::Temp;

fn temp(name: &str, bytes: &[u8]) -> Temp {
    temp::temp_in("emm-cli-test-", name, bytes)
}

fn snapshot() -> PathBuf {
    data("emm-trace/tests/fixtures/snapshot_small.pickle")
}

/// Test data under `crates/`, found at run time: `EMM_TEST_DATA` (the checkout's
/// `crates/` beside the GPU bundle, set by its `run.sh`), else cargo's `CARGO_MANIFEST_DIR` of the running
/// test. Never a path compiled in: a GPU bundle finds the checkout it was carried
/// beside.
fn data(rel: &str) -> PathBuf {
    if let Some(d) = std::env::var_os("EMM_TEST_DATA") {
        return PathBuf::from(d).join(rel);
    }
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR").expect(
        "run the tests through cargo, or set EMM_TEST_DATA to the checkout's crates/ folder",
    );
    PathBuf::from(manifest).join("..").join(rel)
}

fn no_panic(o: &Output) {
    let err = text(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_ne!(o.status.code(), Some(101), "{err}");
}

#[test]
fn help_and_version_do_not_run_anything() {
    let o = run(&["bench", "--help"]);
    assert!(o.status.success());
    let out = text(&o.stdout);
    assert!(
        out.contains("Usage: emm bench") && !out.contains("median"),
        "{out}"
    );
    let o = run(&["--version"]);
    assert_eq!(
        text(&o.stdout).trim(),
        format!("emm {}", env!("CARGO_PKG_VERSION"))
    );
    let o = run(&["replay", "--help"]);
    assert!(o.status.success());
    let out = text(&o.stdout);
    assert!(
        out.contains("until its peak reserved bytes have not moved for 10 passes"),
        "{out}"
    );
}

#[test]
fn unknown_arguments_are_rejected_with_a_suggestion() {
    let o = run(&["replay", "--jsn"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("--json"), "{}", text(&o.stderr));
    let o = run(&["replay", "--manager", "pol"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("pool"));
    assert_eq!(run(&["repaly"]).status.code(), Some(2));
}

#[test]
fn the_bundled_trace_replays_on_the_host_stand_in() {
    let o = run(&["replay"]);
    no_panic(&o);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(
        out.lines().next().unwrap().contains("host-memory stand-in"),
        "{out}"
    );
    assert!(
        out.contains(" pool ") && out.contains(" default ") && out.contains("GiB"),
        "{out}"
    );
    assert!(
        text(&o.stderr).contains("hostonly skipped"),
        "{}",
        text(&o.stderr)
    );
}

/// `--passes N` replays each trace N times through one manager: the JSON has a
/// figure for each pass, the table a line on the passes, and a warm pool calls
/// the driver in the first pass only (this trace frees everything it makes).
#[test]
fn passes_replay_the_trace_again_and_count_driver_calls_per_pass() {
    let mut csv = String::from("op,id,size,stream\n");
    for i in 0..32u64 {
        csv.push_str(&format!("a,{i},{},0\n", (i + 1) << 16));
    }
    for i in 0..32u64 {
        csv.push_str(&format!("f,{i},0,0\n"));
    }
    let p = temp("passes.csv", csv.as_bytes());
    let o = emm()
        .args(["replay", "-m", "pool", "--passes", "3", "--json"])
        .arg(&p)
        .output()
        .unwrap();
    no_panic(&o);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let m = &v["traces"][0]["managers"][0];
    let passes = m["passes"].as_array().unwrap();
    assert_eq!(passes.len(), 3);
    let calls: Vec<u64> = passes
        .iter()
        .map(|p| p["driver"]["total"].as_u64().unwrap())
        .collect();
    assert!(calls[0] > 0 && calls[1..] == [0, 0], "{calls:?}");
    assert_eq!(m["driver"]["total"].as_u64(), Some(calls[0]));
    // The driver time at an idle H100's costs: each kind of call at its own.
    for p in passes {
        let d = &p["driver"];
        let n = |k: &str| d[k].as_f64().unwrap();
        let expect = (n("allocs") + n("frees")) * 36.5e-6
            + n("pieces_mapped") * 52e-6
            + n("pieces_moved") * 39e-6
            + n("pieces_unmapped") * 24e-6;
        let got = d["estimated_seconds"].as_f64().unwrap();
        assert!((got - expect).abs() < 1e-9, "{d}: {got} against {expect}");
    }
    assert!(passes[0]["driver"]["estimated_seconds"].as_f64().unwrap() > 0.0);
    assert_eq!(passes[2]["driver"]["estimated_seconds"].as_f64(), Some(0.0));
    // Exactly 3, with no search for a steady footprint.
    assert_eq!(m["steady_passes"], 3);
    assert_eq!(m["stopped_by"], "passes");
    assert_eq!(m["steady_reached"], false);
    assert!(v["steady_rule"].is_null(), "{v}");
    let o = emm()
        .args(["replay", "-m", "pool", "--passes", "3"])
        .arg(&p)
        .output()
        .unwrap();
    let out = text(&o.stdout);
    assert!(out.contains("driver calls"), "{out}");
    assert!(
        out.contains("through pool, 3 passes: driver calls in pass 1"),
        "{out}"
    );
    assert!(
        out.contains("at an idle H100's driver costs those calls take")
            && out.contains("and 0 us in each later pass"),
        "{out}"
    );
    let row = out.lines().find(|l| l.contains(" pool ")).unwrap();
    assert_eq!(cells(&out, row)[6], "3", "{out}");
    assert!(out.contains("pass 1   pass 3"), "{out}");
    assert!(!out.contains("steady"), "{out}");
    let html = temp("passes.html", b"");
    let o = emm()
        .args(["replay", "-m", "pool", "--passes", "5", "--html"])
        .arg(&html)
        .arg(&p)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    let page = std::fs::read_to_string(&html).unwrap();
    // The curves' x coordinates run over 0..1,000,000 across the plot (the
    // SVG scales them to its width, and the page's script to zoom).
    points_inside(&page, 1_000_000.0);
    assert!(page.contains("through pool, 5 passes: driver calls in pass 1"));
    let o = run(&["replay", "--passes", "0"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("--passes"), "{}", text(&o.stderr));
}

/// `--ranks N`: the pieces' calls of an expandable segment are estimated at N
/// times a lone process's cost (the driver runs a host's VMM calls one at a
/// time), allocations and frees as before; counts and footprints do not change.
#[test]
fn ranks_multiply_the_estimated_time_of_the_pieces_calls() {
    let mut csv = String::from("op,id,size,stream\n");
    for i in 0..48u64 {
        csv.push_str(&format!("a,{i},{},0\n", (i % 7 + 1) << 21));
    }
    for i in (0..48u64).step_by(2) {
        csv.push_str(&format!("f,{i},0,0\n"));
    }
    csv.push_str("a,100,100000000,0\n");
    let p = temp("ranks.csv", csv.as_bytes());
    let json = |ranks: &str| -> serde_json::Value {
        let o = emm()
            .args([
                "replay", "-m", "pool", "-m", "default", "--passes", "2", "--json", "--ranks",
                ranks,
            ])
            .arg(&p)
            .output()
            .unwrap();
        no_panic(&o);
        assert!(o.status.success(), "{}", text(&o.stderr));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let (one, four) = (json("1"), json("4"));
    assert_eq!(
        (one["ranks"].as_u64(), four["ranks"].as_u64()),
        (Some(1), Some(4))
    );
    for (m1, m4) in one["traces"][0]["managers"]
        .as_array()
        .unwrap()
        .iter()
        .zip(four["traces"][0]["managers"].as_array().unwrap())
    {
        assert_eq!(m1["peak_reserved_bytes"], m4["peak_reserved_bytes"]);
        let (d1, d4) = (&m1["driver"], &m4["driver"]);
        for k in [
            "allocs",
            "frees",
            "pieces_mapped",
            "pieces_moved",
            "pieces_unmapped",
        ] {
            assert_eq!(d1[k], d4[k], "{k}");
        }
        let n = |k: &str| d1[k].as_f64().unwrap();
        let pieces =
            n("pieces_mapped") * 52e-6 + n("pieces_moved") * 39e-6 + n("pieces_unmapped") * 24e-6;
        let calls = (n("allocs") + n("frees")) * 36.5e-6;
        let (t1, t4) = (
            d1["estimated_seconds"].as_f64().unwrap(),
            d4["estimated_seconds"].as_f64().unwrap(),
        );
        assert!((t1 - (calls + pieces)).abs() < 1e-9, "{d1}");
        assert!((t4 - (calls + 4.0 * pieces)).abs() < 1e-9, "{d4}");
        if m1["manager"] == "pool" {
            assert!(pieces > 0.0, "the pool maps pieces here: {d1}");
        } else {
            assert!(calls > 0.0 && pieces == 0.0, "{d1}");
        }
    }
    let o = emm()
        .args(["replay", "-m", "pool", "--passes", "2", "--ranks", "4"])
        .arg(&p)
        .output()
        .unwrap();
    let out = text(&o.stdout);
    assert!(
        out.contains("at an H100's driver costs with 4 ranks growing together those calls take"),
        "{out}"
    );
    for bad in ["0", "many", "70000"] {
        let o = run(&["replay", "--ranks", bad]);
        no_panic(&o);
        assert_eq!(o.status.code(), Some(2), "--ranks {bad}");
        assert!(text(&o.stderr).contains("--ranks"), "{}", text(&o.stderr));
    }
}

/// The cells of `row`, a row of the replay table `table`, cut at the columns'
/// widths (the trace's as wide as the head's up to `manager`), trimmed.
fn cells(table: &str, row: &str) -> Vec<String> {
    let head = table.lines().find(|l| l.starts_with("trace ")).unwrap();
    let name_w = head.find("manager").unwrap();
    // The manager column is as wide as its longest name (at least 7).
    let man_w = head.find("peak live").unwrap() - name_w - 3;
    let row: Vec<char> = row.chars().collect();
    let mut at = 0;
    let mut out = Vec::new();
    // Each column: the spaces before it, and its width.
    let columns = [
        (0, name_w),
        (0, man_w),
        (1, 11),
        (1, 13),
        (1, 8),
        (1, 8),
        (1, 9),
        (1, 12),
        (1, 10),
    ];
    for (gap, w) in columns {
        let start = (at + gap).min(row.len());
        let end = (start + w).min(row.len());
        out.push(row[start..end].iter().collect::<String>().trim().to_owned());
        at = end;
    }
    out
}

/// `--device-lag N`: the stand-in's device runs N requests behind the host, so a
/// block freed on one stream is not yet another stream's to take; without it,
/// events complete at once.
#[test]
fn device_lag_makes_cross_stream_reuse_wait_as_on_a_gpu() {
    // Stream 1 frees 64 MiB; stream 2 then asks for 64 MiB.
    let csv = "op,id,size,stream\na,0,67108864,1\nf,0,0,1\na,1,67108864,2\nf,1,0,2\n";
    let p = temp("lag.csv", csv.as_bytes());
    // (The thread's cache off: it would keep the freed block for its own stream
    // whatever the lag. Stream 2 grows rather than wait on the host for stream
    // 1's event, `pool_wait_parked` off, so that the lag shows; with it, below.
    // One shared pool, `pool_stream_pools` 0: with stream pools, on by default,
    // each stream's large blocks come from a pool of its own and stream 2 never
    // takes stream 1's block, lag or not; that too is checked below.)
    let replay_with = |lag: &str, json: bool, wait: &str| {
        let mut c = emm();
        c.env("EMM_POOL_THREAD_CACHE", "0")
            .env("EMM_POOL_STREAM_POOLS", "0")
            .env("EMM_POOL_WAIT_PARKED", wait)
            .args(["replay", "-m", "pool", "--passes", "1", "--device-lag", lag]);
        if json {
            c.arg("--json");
        }
        let o = c.arg(&p).output().unwrap();
        no_panic(&o);
        assert!(o.status.success(), "{}", text(&o.stderr));
        o
    };
    let replay = |lag: &str, json: bool| replay_with(lag, json, "0");
    let peak = |lag: &str| {
        let v: serde_json::Value = serde_json::from_slice(&replay(lag, true).stdout).unwrap();
        assert_eq!(v["device_lag_requests"].as_u64(), lag.parse().ok());
        v["traces"][0]["managers"][0]["peak_reserved_bytes"]
            .as_u64()
            .unwrap()
    };
    // At once: stream 2 takes stream 1's block. Behind: stream 1's event has not
    // completed when stream 2 asks, so it reserves its own.
    assert_eq!(peak("0"), 64 << 20);
    assert_eq!(peak("1000"), 128 << 20);
    let o = replay("1000", false);
    assert!(
        text(&o.stdout).contains("device lag: the stand-in's events complete 1000 requests after"),
        "{}",
        text(&o.stdout)
    );
    // Where the peak went: stream 1's block parked for stream 2 while it grew.
    assert!(
        text(&o.stdout).contains(
            "its peak of 128 MiB came with a request of 64.0 MiB while 64.0 MiB was live; beside it 0 B in threads' caches, free: 0 B on the stream that grew, 0 B on 0 other streams, 0 B settled, 64.0 MiB parked for another stream"
        ),
        "{}",
        text(&o.stdout)
    );
    let v: serde_json::Value = serde_json::from_slice(&replay("1000", true).stdout).unwrap();
    let s = &v["traces"][0]["managers"][0]["peak_slack"];
    assert_eq!(s["parked_bytes"], 64 << 20, "{s}");
    assert_eq!(s["reserved_bytes"], 128 << 20, "{s}");
    assert_eq!(s["request_bytes"], 64 << 20, "{s}");
    // With `pool_wait_parked` (the default), stream 2 would grow past the peak:
    // it waits for stream 1's event instead and takes its block.
    let v: serde_json::Value =
        serde_json::from_slice(&replay_with("1000", true, "1").stdout).unwrap();
    let m = &v["traces"][0]["managers"][0];
    assert_eq!(m["peak_reserved_bytes"], 64 << 20, "{m}");
    // Stream pools (the default): each stream's 64 MiB block comes from its own
    // pool, so the replay reserves both even with events that complete at once.
    let o = emm()
        .env("EMM_POOL_THREAD_CACHE", "0")
        .args(["replay", "-m", "pool", "--passes", "1", "--json"])
        .arg(&p)
        .output()
        .unwrap();
    no_panic(&o);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let m = &v["traces"][0]["managers"][0];
    assert_eq!(m["peak_reserved_bytes"], 128 << 20, "{m}");
}

/// Without `--passes`, each manager replays the trace until its peak reserved
/// bytes have not moved for 10 passes: a pool warm after the first pass of a
/// trace that frees all it makes takes exactly 11. The table shows reserved/live
/// after pass 1 beside the steady figure and the passes taken; the JSON the same.
#[test]
fn the_default_replays_until_the_footprint_holds() {
    let mut csv = String::from("op,id,size,stream\n");
    for i in 0..16u64 {
        csv.push_str(&format!("a,{i},{},0\n", (i + 1) << 16));
    }
    for i in 0..16u64 {
        csv.push_str(&format!("f,{i},0,0\n"));
    }
    let p = temp("steady.csv", csv.as_bytes());
    let o = emm()
        .args(["replay", "-m", "pool", "--json"])
        .arg(&p)
        .output()
        .unwrap();
    no_panic(&o);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["steady_rule"]["quiet_passes"], 10);
    assert_eq!(v["steady_rule"]["max_passes"], 100);
    assert_eq!(v["steady_rule"]["max_seconds"], 60.0);
    let m = &v["traces"][0]["managers"][0];
    let passes = m["passes"].as_array().unwrap();
    assert_eq!(passes.len(), 11);
    assert_eq!(m["steady_passes"], 11);
    assert_eq!(m["steady_reached"], true);
    assert_eq!(m["stopped_by"], "steady");
    assert_eq!(m["steady_from_pass"], 1);
    assert_eq!(m["requests"], 16 * 11);
    assert_eq!(
        m["first_pass_peak_reserved_bytes"],
        passes[0]["peak_reserved_bytes"]
    );
    assert_eq!(
        m["first_pass_peak_live_bytes"],
        passes[0]["peak_live_bytes"]
    );
    assert_eq!(m["peak_reserved_bytes"], passes[10]["peak_reserved_bytes"]);
    let ratio = m["first_pass_reserved_over_live"].as_f64().unwrap();
    assert!(ratio >= 1.0, "{m}");

    // The bundled trace: every manager settles (or says why not), its steady
    // footprint at least its first pass's, the last 10 passes' peaks unmoved.
    let o = run(&["replay", "--json"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let managers = v["traces"][0]["managers"].as_array().unwrap();
    assert!(managers.len() >= 2, "{v}");
    for m in managers {
        let peaks: Vec<u64> = m["passes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["peak_reserved_bytes"].as_u64().unwrap())
            .collect();
        let n = peaks.len();
        assert_eq!(m["steady_passes"].as_u64(), Some(n as u64));
        assert!(
            m["first_pass_peak_reserved_bytes"].as_u64().unwrap()
                <= m["peak_reserved_bytes"].as_u64().unwrap()
        );
        if m["steady_reached"] == true {
            assert!((11..=100).contains(&n), "{peaks:?}");
            assert!(
                peaks[n - 11..].windows(2).all(|w| w[0] == w[1]),
                "{peaks:?}"
            );
            assert_ne!(peaks[n - 11], *peaks.get(n.wrapping_sub(12)).unwrap_or(&0));
        } else {
            assert!(n == 100 || m["stopped_by"] == "max_time", "{m}");
        }
    }

    let o = run(&["replay"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    // The backend's lines (the host stand-in's reason wrapped), then the table.
    let mut lines = out.lines().skip_while(|l| l.trim() != "reserved/live");
    assert!(lines.next().unwrap().trim() == "reserved/live", "{out}");
    assert_eq!(
        cells(&out, lines.next().unwrap()),
        [
            "trace",
            "manager",
            "peak live",
            "peak reserved",
            "pass 1",
            "steady",
            "passes",
            "driver calls",
            "time"
        ],
        "{out}"
    );
    let row = out.lines().find(|l| l.contains(" pool ")).unwrap();
    let c = cells(&out, row);
    assert_eq!(c[1], "pool", "{c:?}");
    assert!(c[4].ends_with('x') && c[5].ends_with('x'), "{c:?}");
    let passes: u64 = c[6].parse().unwrap_or(0);
    assert!(passes >= 11 || c[6].contains('('), "{c:?}");
    assert!(
        out.contains("steady: passes until peak reserved held for 10 in a row"),
        "{out}"
    );
    // The table's rows fit 120 columns (the trace's name here is 23 characters).
    for l in out.lines().skip(1).take(4) {
        assert!(l.chars().count() <= 120, "{l}");
    }

    // `--passes 1`: the first pass alone, as before.
    let o = run(&["replay", "--passes", "1", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for m in v["traces"][0]["managers"].as_array().unwrap() {
        assert_eq!(m["passes"].as_array().unwrap().len(), 1);
        assert_eq!(
            m["peak_reserved_bytes"],
            m["first_pass_peak_reserved_bytes"]
        );
    }
}

/// `emm replay` with its standard output closed before it writes (the reader of
/// `| head` gone): the output stops, the run does not, so a failure still
/// reaches stderr and the exit status, and `--html` still writes its page.
fn replay_to_a_closed_pipe(args: &[&str]) -> Output {
    let mut child = emm()
        .arg("replay")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let o = child.wait_with_output().unwrap();
    no_panic(&o);
    o
}

#[test]
fn a_closed_pipe_ends_quietly() {
    // The reader goes away before the first write.
    let o = replay_to_a_closed_pipe(&["--json"]);
    assert!(o.status.success(), "{:?} {}", o.status, text(&o.stderr));
}

#[test]
fn a_closed_pipe_does_not_hide_a_failure_or_the_page() {
    let missing = "/nonexistent/trace.csv";
    let o = replay_to_a_closed_pipe(&[missing]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains(missing), "{}", text(&o.stderr));

    let page = temp("closed.html", b"");
    std::fs::remove_file(&page).unwrap();
    let o = replay_to_a_closed_pipe(&["--passes", "1", "--html", page.to_str().unwrap()]);
    assert!(o.status.success(), "{:?} {}", o.status, text(&o.stderr));
    let written = std::fs::read_to_string(&page).unwrap();
    assert!(written.contains("</html>"), "{} bytes", written.len());
}

#[test]
fn standard_input_named_twice_is_refused() {
    for twice in [["-", "-"], ["-", "/dev/stdin"]] {
        let o = run(&["replay", twice[0], twice[1]]);
        no_panic(&o);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
        assert!(
            text(&o.stderr).contains("is named more than once; it can be read once"),
            "{}",
            text(&o.stderr)
        );
    }
}

#[test]
fn a_page_named_as_a_trace_is_refused_and_the_trace_kept() {
    let body = b"op,id,size,stream\na,1,512,0\nf,1,0,0\n";
    let t = temp("page_is_trace.csv", body);
    let o = run(&["replay", "--html", t.to_str().unwrap(), t.to_str().unwrap()]);
    no_panic(&o);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    assert!(err.contains("writing the page would overwrite it"), "{err}");
    assert_eq!(std::fs::read(&t).unwrap(), body, "the trace is untouched");
    // The same when the trace comes as standard input redirected from it.
    let o = emm()
        .args(["replay", "--html", t.to_str().unwrap(), "-"])
        .stdin(std::fs::File::open(&t).unwrap())
        .output()
        .unwrap();
    no_panic(&o);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    assert_eq!(std::fs::read(&t).unwrap(), body, "the trace is untouched");
}

#[test]
fn a_full_disk_is_an_error_not_a_panic() {
    if !Path::new("/dev/full").exists() {
        return;
    }
    let o = emm()
        .arg("replay")
        .stdout(std::fs::File::create("/dev/full").unwrap())
        .output()
        .unwrap();
    no_panic(&o);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("No space left"),
        "{}",
        text(&o.stderr)
    );
}

#[test]
fn json_escapes_awkward_file_names() {
    let name = "we\"ird\\ na\tme\nx.csv";
    let p = temp(name, b"op,id,size,stream\na,1,512,0\nf,1,512,0\n");
    let o = emm().args(["replay", "--json"]).arg(&p).output().unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["traces"][0]["trace"], p.display().to_string());
    assert_eq!(v["traces"][0]["peak_live_bytes"], 512);
    assert_eq!(v["traces"][0]["managers"][1]["manager"], "pool");
}

#[test]
fn bad_inputs_fail_with_a_message_naming_the_file() {
    // Random bytes end promptly in a typed error naming the file: binary data, or
    // (when they happen to start like a pickle, 1 run in ~100) a bad snapshot.
    let o = run(&["replay", "/dev/urandom"]);
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    assert!(
        err.contains("/dev/urandom") && (err.contains("binary data") || err.contains("pickle")),
        "{err}"
    );

    let p = temp("noheader.csv", b"a,1,512,0\n");
    let o = emm().arg("replay").arg(&p).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("noheader.csv:1: no usable header"),
        "{}",
        text(&o.stderr)
    );

    let p = temp("allbad.csv", b"op,id,size,stream\nnope\nstill nope\n");
    let o = emm().arg("replay").arg(&p).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("no usable event"),
        "{}",
        text(&o.stderr)
    );

    let p = temp(
        "bom.csv",
        "\u{feff}\n  op , id , size , stream\na,1,512,0\n".as_bytes(),
    );
    let o = emm().arg("replay").arg(&p).output().unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
}

#[test]
fn manager_environment_applies_and_invalid_values_are_named() {
    let o = emm()
        .args(["replay", "-m", "pool"])
        .env("EMM_POOL_LIMIT", "lots")
        .output()
        .unwrap();
    no_panic(&o);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("EMM_POOL_LIMIT"),
        "{}",
        text(&o.stderr)
    );
    let o = emm()
        .args(["replay", "-m", "pool"])
        .env("EMM_POOL_EXPANDABLE", "maybe")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains("EMM_POOL_EXPANDABLE"));
    let o = emm()
        .args(["replay", "-m", "pool"])
        .env("EMM_POOL_LIMIT", "1000000")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("requests failed"),
        "{}",
        text(&o.stderr)
    );
    let o = emm()
        .args(["replay", "-m", "default"])
        .env("EMM_MAX_PENDING_DEALLOCS_COUNT", "ten")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains("EMM_MAX_PENDING_DEALLOCS_COUNT"));
}

/// `emm bench` builds its managers as `emm replay` does: an invalid `EMM_POOL_*`
/// value stops it with a message naming the variable and exit status 1, and a
/// valid one applies (a pool limit below the smallest pair makes it fail).
#[test]
fn bench_applies_the_pool_environment_and_names_invalid_values() {
    for (var, value) in [("EMM_POOL_LIMIT", "lots"), ("EMM_POOL_EXPANDABLE", "maybe")] {
        let o = emm().arg("bench").env(var, value).output().unwrap();
        no_panic(&o);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{var}={value}: {err}");
        assert!(
            err.contains(var) && err.contains(value) && err.contains("cannot build manager `pool`"),
            "{var}={value}: {err}"
        );
        assert!(
            !text(&o.stdout).contains("emm pool"),
            "no row measured with an invalid setting"
        );
    }
    let o = emm()
        .arg("bench")
        .env("EMM_POOL_LIMIT", "100")
        .output()
        .unwrap();
    no_panic(&o);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("out of device memory in manager `pool`"),
        "{err}"
    );
}

/// An invalid `EMM_LOG` is replaced by `warn`, and a warning says so once.
#[test]
fn an_invalid_emm_log_is_replaced_by_warn_and_said_once() {
    let o = emm()
        .arg("info")
        .env("EMM_LOG", "emm=notalevel")
        .output()
        .unwrap();
    no_panic(&o);
    let err = text(&o.stderr);
    // (`emm info` without a driver also lists the settings in effect: `  EMM_LOG=…`.)
    let said: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("EMM_LOG") && !l.starts_with("  EMM_LOG="))
        .collect();
    assert_eq!(said.len(), 1, "{err}");
    assert!(
        said[0].starts_with("emm: warning: ")
            && said[0].contains("EMM_LOG=\"emm=notalevel\" is not a valid log filter")
            && said[0].contains("using `warn` instead"),
        "{err}"
    );
}

#[test]
fn snapshots_replay_beside_pytorchs_own_figure_and_draw_a_page() {
    let html = temp("report.html", b"");
    let o = emm()
        .arg("replay")
        .arg(snapshot())
        .arg("--html")
        .arg(&html)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(
        out.contains(" pytorch ") && out.contains("22.0 MiB"),
        "{out}"
    );
    assert!(out.contains("reconstructed: 2"), "{out}");
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("<svg") && page.contains("PyTorch reserved, as recorded"));
    assert!(page.matches("<polyline").count() >= 3);
    // Each row's cells under their own heads: PyTorch's time is "(recorded)".
    assert!(
        page.contains("<th>driver calls</th><th>time</th>"),
        "{page}"
    );
    assert!(
        page.contains("<td>-</td><td>(recorded)</td></tr>"),
        "{page}"
    );
}

/// Every point of a page's curves lies inside its chart, also when the curves run
/// over several passes of the trace.
fn points_inside(page: &str, width: f64) {
    for line in page.split("points=\"").skip(1) {
        let points = &line[..line.find('"').unwrap()];
        for p in points.split_whitespace() {
            let x: f64 = p.split(',').next().unwrap().parse().unwrap();
            assert!((0.0..=width).contains(&x), "x = {x} outside 0..{width}");
        }
    }
}

/// A snapshot without segments or segment events does not tell what PyTorch
/// reserved: its row shows `-`, not "0 B" and a ratio, a note says why, the
/// JSON has `null`, and the page draws no PyTorch line.
#[test]
fn a_snapshot_without_segments_shows_no_pytorch_reserved_figure() {
    let p = data("emm-trace/tests/fixtures/snapshot_completed_only.pickle");
    let html = temp("nosegments.html", b"");
    let o = emm()
        .args(["replay", "-m", "pool", "--passes", "1", "--html"])
        .arg(&html)
        .arg(&p)
        .output()
        .unwrap();
    no_panic(&o);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    let row = out.lines().find(|l| l.contains(" pytorch ")).unwrap();
    let c = cells(&out, row);
    assert_eq!((c[3].as_str(), c[4].as_str()), ("-", "-"), "{out}");
    assert!(!row.contains("0 B"), "{row}");
    assert!(
        out.contains("the snapshot has no segments and no segment events"),
        "{out}"
    );
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(!page.contains("PyTorch reserved, as recorded"), "{page}");
    assert!(page.contains("no segment events"), "{page}");
    let o = emm()
        .args(["replay", "-m", "pool", "--passes", "1", "--json"])
        .arg(&p)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let torch = &v["traces"][0]["pytorch"];
    assert!(torch["peak_reserved_bytes"].is_null(), "{torch}");
    assert_eq!(torch["segment_events"], 0);
    // A snapshot with segments keeps its figure.
    let o = emm()
        .args(["replay", "-m", "pool", "--passes", "1", "--json"])
        .arg(snapshot())
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["traces"][0]["pytorch"]["peak_reserved_bytes"], 22 << 20);
}

/// `libemm_standin.so`, the stand-in driver, next to the test executable
/// (`cargo build -p emm-standin` builds it; `cargo xtask ci` does). `None` in a
/// GPU bundle (`EMM_BIN` set), which does not ship it.
fn standin() -> Option<PathBuf> {
    let exe = std::env::current_exe().unwrap();
    let path = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test executable lives in target/<profile>/deps")
        .join("libemm_standin.so");
    if std::env::var_os("EMM_BIN").is_some() && !path.is_file() {
        return None;
    }
    assert!(
        path.is_file(),
        "{} is missing: run `cargo build -p emm-standin` first (cargo xtask ci does)",
        path.display()
    );
    Some(path)
}

/// On a driver whose device has no stream-ordered memory pools, `--manager all`
/// skips `hostonly` with a note, on standard error and under the table, and
/// replays the others (it once printed nothing and exited 1; then the table
/// did not say why `hostonly` was missing).
#[test]
fn a_device_without_memory_pools_skips_hostonly_and_replays_the_rest() {
    let Some(driver) = standin() else {
        return;
    };
    let p = temp("nopools.csv", b"op,id,size,stream\na,1,4096,0\nf,1,0,0\n");
    for json in [false, true] {
        let mut c = emm();
        c.env("EMM_CUDA_DRIVER", &driver)
            .env("EMM_STANDIN_MEMPOOLS", "0")
            .args(["replay", "--passes", "1"]);
        if json {
            c.arg("--json");
        }
        let o = c.arg(&p).output().unwrap();
        no_panic(&o);
        let (out, err) = (text(&o.stdout), text(&o.stderr));
        assert!(o.status.success(), "{out}\n{err}");
        assert!(
            err.contains("hostonly skipped: not supported here")
                && err.contains("stream-ordered allocator"),
            "{err}"
        );
        if json {
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
            assert_eq!(v["backend"], "gpu", "{v}");
            let t = &v["traces"][0];
            // default, pool and the two models of PyTorch's allocator.
            assert_eq!(t["managers"].as_array().unwrap().len(), 4, "{t}");
            assert_eq!(t["skipped"][0]["manager"], "hostonly", "{t}");
        } else {
            assert!(out.contains(" default ") && out.contains(" pool "), "{out}");
            // Said under the table too: stdout kept in a file says why a
            // manager is missing.
            assert_eq!(
                out.lines()
                    .filter(|l| l.starts_with("hostonly skipped: not supported here"))
                    .count(),
                1,
                "{out}"
            );
        }
    }
}

/// `-m hostonly` where it cannot run replays nothing: it says why and exits 1
/// (it once printed an empty table and exited 0).
#[test]
fn a_run_where_every_manager_is_skipped_says_why_and_fails() {
    let o = run(&["replay", "-m", "hostonly"]);
    no_panic(&o);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(1), "{out}\n{err}");
    assert!(
        err.contains(
            "nothing was replayed: hostonly skipped: needs CUDA's stream-ordered allocator"
        ),
        "{err}"
    );
    assert!(!out.contains("peak live"), "no empty table: {out}");
    let o = run(&["replay", "-m", "hostonly", "--json"]);
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["traces"][0]["skipped"][0]["manager"], "hostonly");
}

/// A replay with failed requests is marked as failed wherever it shows: the
/// table's row (`FAILED: n of m requests`, no ratio) and the first failure
/// under it, `failed: true` in the JSON, the page's row; the out-of-memory
/// message names the limit that was hit (`EMM_POOL_LIMIT`), not only the host
/// stand-in's 1 TiB. The run exits 1.
#[test]
fn a_failed_replay_is_marked_and_names_the_limit() {
    let p = temp(
        "fails.csv",
        b"op,id,size,stream\na,1,4096,0\na,2,8388608,0\nf,1,0,0\nf,2,0,0\n",
    );
    let html = temp("fails.html", b"");
    let o = emm()
        .args(["replay", "-m", "pool", "--passes", "1", "--html"])
        .arg(&html)
        .arg(&p)
        .env("EMM_POOL_LIMIT", "3000000")
        .output()
        .unwrap();
    no_panic(&o);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(1), "{out}\n{err}");
    let row = out.lines().find(|l| l.contains(" pool ")).unwrap();
    assert!(row.ends_with("FAILED: 1 of 2 requests"), "{out}");
    let c = cells(&out, row);
    assert_eq!((c[4].as_str(), c[5].as_str()), ("-", "-"), "{out}");
    let under = out
        .lines()
        .find(|l| l.contains("through pool: FAILED: 1 of 2 requests failed; the first: out of"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        under.contains("the pool's byte limit (EMM_POOL_LIMIT) is 2.9 MiB"),
        "{under}"
    );
    // The table ends saying the run failed, and what failed (the page's path
    // follows it).
    let lines: Vec<&str> = out.lines().collect();
    let end = &lines[lines.len() - 2..];
    assert!(
        end[0].starts_with("FAILED: this run exits with status 1; what failed: ")
            && end[0].contains("through pool: FAILED: 1 of 2 requests failed")
            && end[1].starts_with("wrote "),
        "{out}"
    );
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("FAILED: 1 of 2 requests</strong>"), "{page}");
    assert!(
        page.contains("the pool&#39;s byte limit (EMM_POOL_LIMIT) is 2.9 MiB")
            || page.contains("the pool's byte limit (EMM_POOL_LIMIT) is 2.9 MiB"),
        "{page}"
    );

    let o = emm()
        .args(["replay", "-m", "pool", "--passes", "1", "--json"])
        .arg(&p)
        .env("EMM_POOL_LIMIT", "3000000")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let m = &v["traces"][0]["managers"][0];
    assert_eq!(m["failed"], true, "{m}");
    assert_eq!(m["failures"], 1, "{m}");
    assert!(
        m["first_failure"]
            .as_str()
            .is_some_and(|s| s.contains("the pool's byte limit (EMM_POOL_LIMIT) is 2.9 MiB")),
        "{m}"
    );
    // A replay without failures says so too.
    let o = emm()
        .args(["replay", "-m", "pool", "--passes", "1", "--json"])
        .arg(&p)
        .output()
        .unwrap();
    assert!(o.status.success());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["traces"][0]["managers"][0]["failed"], false);
}

/// Small defects of the command, each once accepted silently or said badly.
#[test]
fn arguments_and_inputs_are_checked_and_explained() {
    // `--format` without a trace file is an error, not ignored.
    let o = run(&["replay", "--format", "rmm"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o.stderr).contains("--format applies to the trace files given"),
        "{}",
        text(&o.stderr)
    );
    // `--format rmm` on emm's CSV names the header found and the one expected.
    let csv = temp("emm.csv", b"op,id,size,stream\na,1,512,0\nf,1,0,0\n");
    let o = emm()
        .args(["replay", "--format", "rmm"])
        .arg(&csv)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("the header is emm-csv's"),
        "{}",
        text(&o.stderr)
    );
    // `-` reads standard input.
    let mut child = emm()
        .args(["replay", "-m", "pool", "--passes", "1", "--json", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"op,id,size,stream\na,1,512,0\na,1,1024,0\nf,1,0,0\n")
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["traces"][0]["trace"], "(standard input)");
    assert_eq!(v["traces"][0]["peak_live_bytes"], 1024);
    // An id allocated again while live is counted and said.
    assert_eq!(v["traces"][0]["reused_live_ids"], 1);
    assert!(
        text(&o.stderr).contains("1 allocations of an id that was still live"),
        "{}",
        text(&o.stderr)
    );
    // An --html path that cannot be created fails before any replay.
    let o = run(&["replay", "--html", "/nonexistent-dir/x.html"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("cannot create --html /nonexistent-dir/x.html"),
        "{}",
        text(&o.stderr)
    );
    assert!(text(&o.stdout).is_empty(), "{}", text(&o.stdout));
    // The backend lines fit 120 columns, and a legend explains the table.
    let o = run(&["replay", "-m", "pool", "--passes", "1"]);
    let out = text(&o.stdout);
    let table_at = out.find("reserved/live").unwrap();
    for l in out[..table_at].lines() {
        assert!(l.chars().count() <= 120, "{l}");
    }
    assert!(
        out.contains("driver calls: the manager's calls to the driver"),
        "{out}"
    );
    assert!(out.contains("upstream (JSON upstream_allocs)"), "{out}");
    let o = run(&["replay", "--help"]);
    assert!(
        text(&o.stdout).contains("upstream_allocs counts"),
        "{}",
        text(&o.stdout)
    );
}

/// `emm info` without a driver gives the version, the `EMM_*` settings in effect
/// and a hint about `EMM_CUDA_DRIVER`, beside the error.
#[test]
fn info_without_a_driver_says_version_settings_and_a_hint() {
    let o = emm()
        .arg("info")
        .env("EMM_POOL_LIMIT", "5G")
        .output()
        .unwrap();
    no_panic(&o);
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    assert!(err.contains("no usable CUDA driver"), "{err}");
    assert!(
        err.contains(&format!("emm {}", env!("CARGO_PKG_VERSION"))),
        "{err}"
    );
    assert!(err.contains("  EMM_POOL_LIMIT=5G"), "{err}");
    assert!(err.contains("hint: set EMM_CUDA_DRIVER"), "{err}");
}

#[test]
fn the_models_of_pytorchs_allocator_replay_beside_emms_managers() {
    // The bundled GPT training trace: PyTorch 2.11 reserved 1.390x of peak live
    // natively and 1.086x with expandable segments on an H100 (run 137).
    let o = run(&[
        "replay",
        "--passes",
        "2",
        "--json",
        "-m",
        "pytorch-native",
        "-m",
        "pytorch-expandable",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let ms = v["traces"][0]["managers"].as_array().unwrap();
    let ratio = |name: &str| {
        ms.iter().find(|m| m["manager"] == name).unwrap()["reserved_over_live"]
            .as_f64()
            .unwrap()
    };
    assert!((ratio("pytorch-native") - 1.390).abs() < 0.005, "{v}");
    assert!((ratio("pytorch-expandable") - 1.086).abs() < 0.005, "{v}");

    // Settings as PyTorch spells them: a split limit changes the native model's
    // answer and leaves the run whole.
    let o = run(&[
        "replay",
        "--passes",
        "1",
        "--json",
        "-m",
        "pytorch-native",
        "--pytorch-conf",
        "max_split_size_mb:64",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let r = v["traces"][0]["managers"][0]["reserved_over_live"]
        .as_f64()
        .unwrap();
    assert!(r > 1.0 && (r - 1.390).abs() > 1e-6, "{v}");

    // PyTorch's settings from the environment matter only to the models: one
    // they cannot follow skips them with a note, and never stops emm's managers.
    let o = emm()
        .env("PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync")
        .args([
            "replay",
            "--passes",
            "1",
            "--json",
            "-m",
            "pool",
            "-m",
            "pytorch-native",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("models of PyTorch's allocator are skipped"),
        "{}",
        text(&o.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        v["traces"][0]["managers"].as_array().unwrap().len(),
        1,
        "{v}"
    );
    let o = emm()
        .env("PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync")
        .args(["replay", "--passes", "1", "-m", "pool"])
        .output()
        .unwrap();
    assert!(
        o.status.success() && o.stderr.is_empty(),
        "{}",
        text(&o.stderr)
    );

    // A setting PyTorch would refuse is refused, naming it.
    let o = run(&[
        "replay",
        "-m",
        "pytorch-native",
        "--pytorch-conf",
        "max_split_size_mb:5",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o.stderr).contains("max_split_size_mb:5"),
        "{}",
        text(&o.stderr)
    );
}

#[test]
fn as_fraction_caps_pytorchs_models_as_set_per_process_memory_fraction() {
    // `setMemoryFraction` refuses a new segment by its rounded size before any
    // page is mapped, so with expandable segments it refuses earlier than a
    // device of the same bytes would (run 162 on an H100: the device answer
    // ran out of memory under the fraction on two of three traces).
    let fit = |fraction: bool| {
        let mut a = vec![
            "replay",
            "--passes",
            "1",
            "--json",
            "--fit",
            "-m",
            "pytorch-expandable",
        ];
        if fraction {
            a.push("--as-fraction");
        }
        let o = run(&a);
        assert!(o.status.success(), "{}", text(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(
            v["pytorch_cap"],
            if fraction { "fraction" } else { "device" },
            "{v}"
        );
        v["traces"][0]["fit"][0]["needs_bytes"].as_u64().unwrap()
    };
    let (device, fraction) = (fit(false), fit(true));
    assert!(fraction >= device, "fraction {fraction} < device {device}");
    // Alone it would cap nothing: refused, naming what it needs.
    let o = run(&["replay", "--passes", "1", "--as-fraction"]);
    no_panic(&o);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("--device-memory <SIZE>|--fit"),
        "{}",
        text(&o.stderr)
    );
    // At the device answer, the fraction refuses or runs as the model says, and
    // the text says how the models were capped.
    let o = run(&[
        "replay",
        "--passes",
        "1",
        "-m",
        "pytorch-expandable",
        "--as-fraction",
        "--device-memory",
        &fraction.to_string(),
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        text(&o.stdout).contains("(PyTorch's models capped as set_per_process_memory_fraction)"),
        "{}",
        text(&o.stdout)
    );
}

#[test]
fn device_memory_says_which_managers_fit_and_fit_finds_the_smallest_device() {
    // The bundled trace peaks at 3.31 GiB live; PyTorch's default allocator
    // reserves 4.60 GiB uncapped.
    let o = run(&[
        "replay",
        "--passes",
        "2",
        "--json",
        "--device-memory",
        "3.5G",
        "-m",
        "pool",
        "-m",
        "pytorch-native",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["device_memory_bytes"], 3.5 * (1u64 << 30) as f64, "{v}");
    let ms = v["traces"][0]["managers"].as_array().unwrap();
    let failed = |name: &str| ms.iter().find(|m| m["manager"] == name).unwrap()["failed"] == true;
    assert!(!failed("pool") && failed("pytorch-native"), "{v}");
    assert_eq!(
        o.status.code(),
        Some(1),
        "a manager that does not fit fails the run"
    );
    let o = run(&[
        "replay",
        "--passes",
        "2",
        "--device-memory",
        "3.5G",
        "-m",
        "pool",
        "-m",
        "pytorch-native",
    ]);
    let out = text(&o.stdout);
    assert!(
        out.contains("on a device of 3.50 GiB: fits: pool; does not fit: pytorch-native"),
        "{out}"
    );

    let o = run(&[
        "replay",
        "--passes",
        "2",
        "--json",
        "--fit",
        "--overhead",
        "512M",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let fits = v["traces"][0]["fit"].as_array().unwrap();
    let live = v["traces"][0]["peak_live_bytes"].as_f64().unwrap();
    for f in fits {
        let needs = f["needs_bytes"].as_f64().unwrap();
        assert!(needs >= live, "{f}");
        assert_eq!(
            f["with_overhead_bytes"].as_f64().unwrap(),
            needs + 512.0 * 1048576.0
        );
        assert!(f["runs"].as_u64().unwrap() >= 2, "{f}");
    }
    let needs = |name: &str| {
        fits.iter().find(|f| f["manager"] == name).unwrap()["needs_bytes"]
            .as_f64()
            .unwrap()
    };
    // emm's pool needs less than PyTorch's allocator with expandable segments,
    // which needs less than its default.
    assert!(needs("pool") < needs("pytorch-expandable"), "{fits:?}");
    assert!(
        needs("pytorch-expandable") < needs("pytorch-native"),
        "{fits:?}"
    );
    // The answer runs; a little less does not (a device of the answer minus 1 %).
    let answer = needs("pytorch-native") as u64;
    for (cap, ok) in [(answer, true), (answer - answer / 100, false)] {
        let o = run(&[
            "replay",
            "--passes",
            "2",
            "--json",
            "-m",
            "pytorch-native",
            "--device-memory",
            &cap.to_string(),
        ]);
        assert_eq!(o.status.success(), ok, "at {cap}: {}", text(&o.stderr));
    }
}

#[test]
fn the_verdict_says_what_the_pool_saves_in_the_table_json_and_page() {
    let page = temp("verdict.html", b"");
    let page_arg = page.to_string_lossy().into_owned();
    let o = run(&[
        "replay",
        "--passes",
        "1",
        "-m",
        "pool",
        "-m",
        "pytorch-native",
        "--html",
        &page_arg,
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    let verdict = out
        .lines()
        .find(|l| l.contains("emm pool") && l.contains("at peak"))
        .unwrap_or_else(|| panic!("no verdict in\n{out}"));
    assert!(
        verdict.contains("pytorch-native 4.60 GiB: the pool saves"),
        "{verdict}"
    );
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        html.contains("<p class=\"verdict\"><strong>emm pool"),
        "the page leads with the verdict"
    );
    assert!(
        html.contains(env!("CARGO_PKG_VERSION")) && html.contains("--html"),
        "version and command"
    );
    // With a device that PyTorch's default does not fit on, the verdict says so.
    let o = run(&[
        "replay",
        "--passes",
        "1",
        "-m",
        "pool",
        "-m",
        "pytorch-native",
        "--device-memory",
        "3.5G",
    ]);
    let out = text(&o.stdout);
    assert!(
        out.contains("; on 3.50 GiB: pytorch-native does not run"),
        "{out}"
    );
    let o = run(&[
        "replay",
        "--passes",
        "1",
        "-m",
        "pool",
        "--device-memory",
        "8G",
    ]);
    assert!(
        text(&o.stdout).contains("; on 8.00 GiB: every manager runs"),
        "{}",
        text(&o.stdout)
    );
    let o = run(&["replay", "--passes", "1", "-m", "pool", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["schema_version"], 1);
    assert!(
        v["command"].as_str().unwrap().contains("replay --passes 1"),
        "{v}"
    );
}

/// `all` adds `pool-shared` (the pool with one shared arena for every stream)
/// for a trace of several streams while stream pools are on, and the verdict
/// says which suits the job; a single-stream trace, or stream pools off, leave
/// it out (it would replay exactly as `pool`); asked by name, it always runs.
#[test]
fn a_trace_of_several_streams_is_replayed_through_one_shared_pool_too() {
    // Stream 1 frees 64 MiB; stream 2 then asks for 64 MiB: one shared pool
    // reuses the block, stream pools reserve both.
    let two = temp(
        "shared_two.csv",
        b"op,id,size,stream\na,0,67108864,1\nf,0,0,1\na,1,67108864,2\nf,1,0,2\n",
    );
    let one = temp(
        "shared_one.csv",
        b"op,id,size,stream\na,0,67108864,0\nf,0,0,0\na,1,67108864,0\nf,1,0,0\n",
    );
    let replay = |path: &Path, args: &[&str], env: &[(&str, &str)]| {
        let mut c = emm();
        c.env("EMM_POOL_THREAD_CACHE", "0");
        for (k, v) in env {
            c.env(k, v);
        }
        let o = c
            .args(["replay", "--passes", "1"])
            .args(args)
            .arg(path)
            .output()
            .unwrap();
        no_panic(&o);
        assert!(o.status.success(), "{}", text(&o.stderr));
        o
    };
    let peaks = |o: &Output| -> Vec<(String, u64)> {
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v["traces"][0]["managers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["manager"].as_str().unwrap().to_owned(),
                    m["peak_reserved_bytes"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    let of = |p: &[(String, u64)], name: &str| p.iter().find(|m| m.0 == name).map(|m| m.1);
    let p = peaks(&replay(&two, &["--json"], &[]));
    assert_eq!(of(&p, "pool"), Some(128 << 20), "{p:?}");
    assert_eq!(of(&p, "pool-shared"), Some(64 << 20), "{p:?}");
    let o = replay(&two, &[], &[]);
    assert!(
        text(&o.stdout).contains("with one shared pool for every stream 64.0 MiB, 64.0 MiB less: set EMM_POOL_STREAM_POOLS=0 for this job"),
        "{}",
        text(&o.stdout)
    );
    // Why it was left out, in the JSON only.
    let left_out = |o: &Output| -> Vec<(String, String)> {
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v["traces"][0]["left_out"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|m| {
                        (
                            m["manager"].as_str().unwrap().to_owned(),
                            m["why"].as_str().unwrap().to_owned(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(left_out(&replay(&two, &["--json"], &[])), vec![]);
    // One stream: the same as `pool`, left out.
    let o = replay(&one, &["--json"], &[]);
    let p = peaks(&o);
    assert_eq!(of(&p, "pool"), Some(64 << 20), "{p:?}");
    assert_eq!(of(&p, "pool-shared"), None, "{p:?}");
    assert_eq!(
        left_out(&o),
        vec![(
            "pool-shared".to_owned(),
            "the trace has one stream: one shared pool is the pool".to_owned()
        )]
    );
    assert!(
        !text(&replay(&one, &[], &[]).stdout).contains("pool-shared"),
        "a table says nothing of it"
    );
    // Stream pools off: `pool` is the shared pool already.
    let o = replay(&two, &["--json"], &[("EMM_POOL_STREAM_POOLS", "0")]);
    let p = peaks(&o);
    assert_eq!(of(&p, "pool"), Some(64 << 20), "{p:?}");
    assert_eq!(of(&p, "pool-shared"), None, "{p:?}");
    assert!(
        left_out(&o)[0].1.starts_with("stream pools are off"),
        "{:?}",
        left_out(&o)
    );
    // By name, it runs on any trace.
    let p = peaks(&replay(&one, &["--json", "-m", "pool-shared"], &[]));
    assert_eq!(p, vec![("pool-shared".to_owned(), 64 << 20)]);
}

/// `--initial-size`: the smallest home segment of the pool without virtual
/// memory. The answer holds the trace in one segment when set; a home 2 % smaller
/// does not (a request goes beside it), and the path's default reserves more.
#[test]
fn initial_size_finds_the_home_that_holds_the_trace_in_one_segment() {
    let pool = |env: &[(&str, String)], extra: &[&str]| {
        let mut c = emm();
        c.env("EMM_POOL_EXPANDABLE", "0");
        for (k, v) in env {
            c.env(k, v);
        }
        let o = c
            .args(["replay", "-m", "pool", "--passes", "3", "--json"])
            .args(extra)
            .output()
            .unwrap();
        no_panic(&o);
        assert!(o.status.success(), "{}", text(&o.stderr));
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()
    };
    let v = pool(&[], &["--initial-size"]);
    let t = &v["traces"][0];
    let home = &t["initial_size"];
    let bytes = home["bytes"].as_u64().expect("an answer");
    let live = t["peak_live_bytes"].as_f64().unwrap();
    let default = t["managers"][0]["peak_reserved_bytes"].as_f64().unwrap();
    assert_eq!(home["passes"], 3);
    assert!(home["runs"].as_u64().unwrap() >= 2, "{home}");
    assert!(
        (bytes as f64) >= live && (bytes as f64) < default,
        "{home}, default {default}"
    );
    assert!((home["over_live"].as_f64().unwrap() - bytes as f64 / live).abs() < 1e-9);
    let with = |size: u64| {
        let v = pool(&[("EMM_POOL_INITIAL_SIZE", size.to_string())], &[]);
        let m = &v["traces"][0]["managers"][0];
        let allocs: u64 = m["passes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["driver"]["allocs"].as_u64().unwrap())
            .sum();
        (m["peak_reserved_bytes"].as_u64().unwrap(), allocs)
    };
    // Set, it is the pool's only segment: rounded up to a 2 MiB page.
    assert_eq!(with(bytes), (bytes.next_multiple_of(2 << 20), 1));
    // 2 % smaller, a request goes beside it.
    let (reserved, allocs) = with(bytes - bytes / 50);
    assert!(
        allocs > 1 && reserved > bytes,
        "{reserved} reserved, {allocs} allocations"
    );
    // The line says what to set.
    let o = emm()
        .env("EMM_POOL_EXPANDABLE", "0")
        .args(["replay", "-m", "pool", "--passes", "3", "--initial-size"])
        .output()
        .unwrap();
    let out = text(&o.stdout);
    assert!(
        out.contains(&format!(
            "EMM_POOL_INITIAL_SIZE={}M",
            bytes.div_ceil(1 << 20)
        )),
        "{out}"
    );
    // Unasked, a loose footprint without a home names the search; with a home
    // set, or with the expandable segment, nothing does.
    let table = |env: &[(&str, &str)]| {
        let mut c = emm();
        for (k, v) in env {
            c.env(k, v);
        }
        let o = c
            .args(["replay", "-m", "pool", "--passes", "3"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o.stderr));
        text(&o.stdout)
    };
    let hint = "--initial-size names the EMM_POOL_INITIAL_SIZE";
    let out = table(&[("EMM_POOL_EXPANDABLE", "0")]);
    assert!(out.contains(hint), "{out}");
    let size = bytes.to_string();
    let out = table(&[
        ("EMM_POOL_EXPANDABLE", "0"),
        ("EMM_POOL_INITIAL_SIZE", &size),
    ]);
    assert!(!out.contains(hint), "{out}");
    let out = table(&[]);
    assert!(!out.contains(hint), "{out}");
    // Without the pool among the managers it says so and runs the rest.
    let o = run(&["replay", "-m", "default", "--passes", "1", "--initial-size"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("--initial-size skipped: it needs a replay through the pool"),
        "{}",
        text(&o.stderr)
    );
    // With the pool asked for but its replay failed (a request no device
    // holds), it says that, not that the pool was missing.
    let huge = temp(
        "initial_size_huge.csv",
        b"op,id,size,stream\na,1,1024,0\na,2,99999999999999,0\nf,1,0,0\nf,2,0,0\n",
    );
    let o = run(&[
        "replay",
        "-m",
        "pool",
        "--passes",
        "1",
        "--initial-size",
        huge.to_str().unwrap(),
    ]);
    no_panic(&o);
    assert!(
        text(&o.stderr).contains("--initial-size skipped: the pool's replay failed"),
        "{}",
        text(&o.stderr)
    );
}
