//! The page `emm replay --html` writes, read as a file: self-contained (nothing
//! fetched) and bounded in size, also for a snapshot of 100,000 events whose
//! allocations carry stack frames.

mod common;
use common::{data, emm, out_dir, run};

/// A PyTorch-snapshot-shaped pickle (protocol 2), written by hand: strings and
/// frame dicts are memoized once and referred to again, as Python's pickler
/// does for objects a snapshot shares.
struct Pickle {
    out: Vec<u8>,
    memo: u32,
}

impl Pickle {
    fn new() -> Pickle {
        Pickle {
            out: vec![0x80, 2],
            memo: 0,
        }
    }
    fn str(&mut self, s: &str) {
        self.out.push(b'X');
        self.out.extend((s.len() as u32).to_le_bytes());
        self.out.extend(s.as_bytes());
    }
    fn int(&mut self, v: i64) {
        if let Ok(v) = i32::try_from(v) {
            self.out.push(b'J');
            self.out.extend(v.to_le_bytes());
        } else {
            self.out.extend([0x8a, 8]);
            self.out.extend(v.to_le_bytes());
        }
    }
    /// Memoizes the object on top of the stack; returns its memo number.
    fn put(&mut self) -> u32 {
        self.out.push(b'r');
        self.out.extend(self.memo.to_le_bytes());
        self.memo += 1;
        self.memo - 1
    }
    fn get(&mut self, id: u32) {
        self.out.push(b'j');
        self.out.extend(id.to_le_bytes());
    }
    /// `{key: value, …}` from pairs written by `items`.
    fn dict(&mut self, items: impl FnOnce(&mut Pickle)) {
        self.out.extend(b"}(");
        items(self);
        self.out.push(b'u');
    }
    /// `[…]` from items written by `items`.
    fn list(&mut self, items: impl FnOnce(&mut Pickle)) {
        self.out.extend(b"](");
        items(self);
        self.out.push(b'e');
    }
}

/// A snapshot of `events` trace entries on one device: allocations of 1 KiB to
/// 2 MiB, each freed some entries later (`free_requested`, `free_completed`),
/// segments mapped as live bytes grow, and each allocation's stack one of
/// `stacks` stacks of 32 frames with long C++ names.
fn big_snapshot(events: usize, stacks: usize) -> Vec<u8> {
    let mut p = Pickle::new();
    // Frames: memoized dicts, 32 a stack, names of ~150 characters.
    let mut frame_ids = Vec::new();
    p.out.push(b'(');
    for f in 0..stacks * 4 {
        p.dict(|p| {
            p.str("name");
            p.str(&format!(
                "at::native::(anonymous namespace)::kernel_{f}<c10::impl::detail::WrapFunctionIntoFunctor_<at::Tensor (c10::ArrayRef<c10::SymInt>)>>::call"
            ));
            p.str("filename");
            p.str(if f % 4 == 0 { "/work/model.py" } else { "RegisterCUDA_0.cpp" });
            p.str("line");
            p.int(f as i64);
        });
        frame_ids.push(p.put());
    }
    // Drop the frames from the stack: they are reached through the memo.
    p.out.push(b'1');
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut rand = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let base: i64 = 0x7f00_0000_0000;
    let t0: i64 = 1_795_382_951_000_000;
    p.dict(|p| {
        p.str("segments");
        p.list(|_| {});
        p.str("device_traces");
        p.list(|p| {
            p.list(|p| {
                let mut live: Vec<(i64, i64)> = Vec::new();
                let mut next_addr = base;
                let (mut mapped, mut held) = (0i64, 0i64);
                let mut n = 0;
                while n < events {
                    // Live allocations pile up to thousands (maps of thousands
                    // of blocks, each with its stack), then churn.
                    let free = !live.is_empty() && (live.len() > 8000 || rand() % 100 < 45);
                    let t = t0 + n as i64 * 37;
                    if free {
                        let i = (rand() as usize) % live.len();
                        let (addr, size) = live.swap_remove(i);
                        held -= size;
                        for action in ["free_requested", "free_completed"] {
                            p.dict(|p| {
                                p.str("action");
                                p.str(action);
                                p.str("addr");
                                p.int(addr);
                                p.str("size");
                                p.int(size);
                                p.str("stream");
                                p.int(0);
                                p.str("time_us");
                                p.int(t);
                            });
                            n += 1;
                        }
                    } else {
                        let size = 1024i64 << (rand() % 12);
                        let addr = next_addr;
                        next_addr += size;
                        held += size;
                        if held > mapped {
                            p.dict(|p| {
                                p.str("action");
                                p.str("segment_map");
                                p.str("addr");
                                p.int(base);
                                p.str("size");
                                p.int(held - mapped + (20 << 20));
                                p.str("stream");
                                p.int(0);
                                p.str("time_us");
                                p.int(t);
                            });
                            mapped = held + (20 << 20);
                            n += 1;
                        }
                        let stack = (rand() as usize) % stacks;
                        p.dict(|p| {
                            p.str("action");
                            p.str("alloc");
                            p.str("addr");
                            p.int(addr);
                            p.str("size");
                            p.int(size);
                            p.str("stream");
                            p.int(0);
                            p.str("time_us");
                            p.int(t);
                            p.str("frames");
                            p.list(|p| {
                                for k in 0..32 {
                                    p.get(frame_ids[(stack * 4 + k) % frame_ids.len()]);
                                }
                            });
                        });
                        live.push((addr, size));
                        n += 1;
                    }
                }
            });
        });
    });
    p.out.push(b'.');
    p.out
}

/// Nothing on the page is fetched: no `src` or `href` to another place, no
/// stylesheet link, no CSS import or remote `url()`, no request from the script.
fn assert_self_contained(page: &str) {
    for bad in [
        "src=\"http",
        "href=\"http",
        "src='http",
        "href='http",
        "<link",
        "@import",
        "url(http",
        "fetch(",
        "XMLHttpRequest",
        "<iframe",
    ] {
        assert!(!page.contains(bad), "the page fetches: {bad}");
    }
    assert_eq!(
        page.matches("<script").count(),
        2,
        "the data and the script"
    );
}

/// The page of a 100,000-event snapshot with stack frames (2,000 distinct
/// stacks of 32 long frames), replayed through every manager and several
/// passes, stays under 3 MiB, and says which stacks it left out; the largest
/// recorded fixture gives a page of under 1 MiB.
#[test]
fn the_page_is_self_contained_and_bounded_in_size() {
    let dir = out_dir();
    let snap = dir.join("synthetic_100k.pickle");
    let bytes = big_snapshot(100_000, 2_000);
    std::fs::write(&snap, &bytes).unwrap();
    let html = dir.join("synthetic_100k.html");
    let o = run(emm()
        .args(["replay", "-m", "all", "--passes", "2", "--html"])
        .arg(&html)
        .arg(&snap));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let _ = std::fs::remove_file(&snap);
    let page = std::fs::read_to_string(&html).unwrap();
    eprintln!(
        "synthetic snapshot: {} bytes, {} events; page {} bytes",
        bytes.len(),
        100_000,
        page.len()
    );
    assert!(page.len() < 3 << 20, "{} bytes", page.len());
    assert_self_contained(&page);
    // Hover details carry frames; the time axis is the recording's.
    assert!(page.contains("kernel_"), "no frame on the page");
    // Thousands of live blocks at the peak: maps merge small blocks into runs.
    assert!(page.contains("are merged into runs"));
    assert!(page.contains("time_us"));
    for m in ["default", "pool", "pytorch-native", "pytorch-expandable"] {
        assert!(page.contains(&format!("{m} at its peak")), "no map of {m}");
    }

    let fixture = data("emm-trace/tests/fixtures/h200_train_midway.pickle");
    let html = dir.join("h200_train_midway.html");
    let o = run(emm()
        .args(["replay", "-m", "all", "--passes", "3", "--html"])
        .arg(&html)
        .arg(&fixture));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let page = std::fs::read_to_string(&html).unwrap();
    eprintln!("h200_train_midway.pickle: page {} bytes", page.len());
    assert!(page.len() < 1 << 20, "{} bytes", page.len());
    assert_self_contained(&page);
}

/// The JSON says where each manager stood at its peak (with `--html`), and a
/// failed run says so at its top: `failed` and what failed.
#[test]
fn the_json_has_the_peak_and_marks_a_failed_run() {
    let fixture = data("emm-trace/tests/fixtures/h200_infer.pickle");
    let html = out_dir().join("h200_infer.html");
    let o = run(emm()
        .args([
            "replay", "-m", "pool", "-m", "default", "--passes", "2", "--json", "--html",
        ])
        .arg(&html)
        .arg(&fixture));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["schema_version"], 1);
    assert_eq!(v["failed"], false);
    assert_eq!(v["errors"].as_array().map(Vec::len), Some(0));
    let pool = &v["traces"][0]["managers"][0];
    let p = &pool["at_peak"];
    assert_eq!(p["reserved_bytes"], pool["peak_reserved_bytes"], "{p}");
    assert!(p["segments"].as_u64().unwrap() > 0, "{p}");
    assert!(
        p["time_us"].as_u64().unwrap() > 1_700_000_000_000_000,
        "{p}"
    );
    let parts = ["live_bytes", "free_bytes", "stranded_bytes", "cached_bytes"];
    let sum: u64 = parts.iter().map(|k| p[k].as_u64().unwrap()).sum();
    // Live bytes are requested sizes; the blocks hold them rounded to 512.
    let reserved = p["reserved_bytes"].as_u64().unwrap();
    assert!(
        sum <= reserved && sum + p["live_blocks"].as_u64().unwrap() * 512 >= reserved,
        "{p}"
    );
    let default = &v["traces"][0]["managers"][1]["at_peak"];
    assert!(default["segments"].is_null(), "{default}");
    assert!(default["held_bytes"].as_u64().unwrap() > 0, "{default}");

    // A failed run: the pool is limited below what the trace needs.
    let csv = out_dir().join("fails.csv");
    std::fs::write(
        &csv,
        "op,id,size,stream\na,1,4096,0\na,2,8388608,0\nf,1,0,0\nf,2,0,0\n",
    )
    .unwrap();
    let html = out_dir().join("fails.html");
    let o = run(emm()
        .args(["replay", "-m", "pool", "--passes", "1", "--json", "--html"])
        .arg(&html)
        .arg(&csv)
        .env("EMM_POOL_LIMIT", "3000000"));
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["failed"], true);
    let errors = v["errors"].as_array().unwrap();
    assert!(
        errors
            .iter()
            .any(|e| e.as_str().unwrap().contains("FAILED: 1 of 2 requests")),
        "{errors:?}"
    );
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("This run FAILED"), "the page's banner");
    assert!(
        page.contains("FAILED: requests were refused"),
        "the chart's legend"
    );
    // Without --html no map is taken.
    let o = run(emm()
        .args(["replay", "-m", "pool", "--passes", "1", "--json"])
        .arg(&fixture));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["traces"][0]["managers"][0]["at_peak"].is_null());
}

/// The data the page draws (its `#emm-data`).
fn page_data(page: &str) -> serde_json::Value {
    let start = page.find("id=\"emm-data\">").unwrap() + "id=\"emm-data\">".len();
    let end = start + page[start..].find("</script>").unwrap();
    serde_json::from_str(&page[start..end]).unwrap()
}

/// Issue 34: with `--passes 20` the default manager's reserved curve was drawn
/// below live. Every drawn point of every manager's curve is at or above live,
/// with 20 passes, and without `--passes`, where the managers replay different
/// numbers of passes and their curves are put on one grid.
#[test]
fn no_reserved_curve_is_drawn_below_live() {
    for (name, args) in [
        (
            "passes20",
            &["-m", "default", "-m", "pool", "--passes", "20"][..],
        ),
        ("steady", &["-m", "all"][..]),
    ] {
        let html = out_dir().join(format!("{name}.html"));
        let o = run(emm().arg("replay").args(args).arg("--html").arg(&html));
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let page = std::fs::read_to_string(&html).unwrap();
        let chart = &page_data(&page)["charts"][0];
        let series = chart["series"].as_array().unwrap();
        let live = series[0]["y"].as_array().unwrap();
        assert_eq!(series[0]["name"], "live");
        assert!(live.len() > 900, "{name}: {} points", live.len());
        let mut checked = 0;
        for s in &series[1..] {
            for (j, (y, l)) in s["y"].as_array().unwrap().iter().zip(live).enumerate() {
                if let (Some(y), Some(l)) = (y.as_u64(), l.as_u64()) {
                    assert!(y >= l, "{name}: {} at point {j}: {y} < live {l}", s["name"]);
                    checked += 1;
                }
            }
        }
        assert!(checked > 1800, "{name}: {checked} points checked");
    }
}
