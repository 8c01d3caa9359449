//! The page of `emm replay --html` as a person sees it: opened in a real headless
//! browser (Chromium; `.ci/run` installs it), its script works the controls a
//! person would (`#selftest`: hover over the chart and the maps, drag and wheel
//! to zoom, reset) and says what was shown; a screenshot is kept to be looked at.
//!
//! Without a browser the test says it is skipped, unless `CI` is set (or
//! `EMM_REQUIRE_BROWSER=1`): then it fails.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;
use common::{data, emm, out_dir, run};

/// The browser: `EMM_BROWSER`, else Chromium or Chrome found on `PATH`.
fn browser() -> Option<PathBuf> {
    if let Some(b) = std::env::var_os("EMM_BROWSER") {
        return Some(PathBuf::from(b));
    }
    let path = std::env::var_os("PATH")?;
    for dir in std::env::split_paths(&path) {
        for name in [
            "chromium",
            "chromium-browser",
            "google-chrome",
            "google-chrome-stable",
        ] {
            let p = dir.join(name);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    None
}

/// Whether a missing browser fails the test rather than skips it.
fn required() -> bool {
    let set = |v: &str| std::env::var(v).is_ok_and(|s| !s.is_empty() && s != "0" && s != "false");
    set("CI") || set("EMM_REQUIRE_BROWSER")
}

/// Runs Chromium headless (sandbox and network off) with `args`, in a fresh
/// profile under `dir` removed afterwards; checks it succeeded.
fn chromium(b: &Path, dir: &Path, args: &[String]) -> Output {
    let profile = dir.join(format!("profile-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&profile);
    let o = Command::new(b)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&profile);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    o
}

/// `page` opened with `#selftest`: the DOM after the script ran, and what the
/// self-test saw (its JSON).
fn selftest(b: &Path, dir: &Path, page: &Path) -> (String, serde_json::Value) {
    let o = chromium(
        b,
        dir,
        &[
            "--dump-dom".into(),
            format!("file://{}#selftest", page.display()),
        ],
    );
    let dom = String::from_utf8_lossy(&o.stdout).into_owned();
    let start = dom
        .find("<pre id=\"selftest\" hidden=\"\">")
        .unwrap_or_else(|| panic!("the script did not run: {}", &dom[..dom.len().min(2000)]));
    let rest = &dom[start..];
    let text = &rest[rest.find('>').unwrap() + 1..rest.find("</pre>").unwrap()];
    let text = text
        .replace("&quot;", "\"")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&");
    (dom, serde_json::from_str(&text).unwrap())
}

/// A screenshot of `page` (with `hash`) into `png`, `height` pixels tall.
fn screenshot(b: &Path, dir: &Path, page: &Path, hash: &str, png: &Path, height: u32) {
    let _ = std::fs::remove_file(png);
    chromium(
        b,
        dir,
        &[
            format!("--window-size=1100,{height}"),
            format!("--screenshot={}", png.display()),
            format!("file://{}{hash}", page.display()),
        ],
    );
    let bytes = std::fs::read(png).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    let (w, h) = (
        u32::from_be_bytes(bytes[16..20].try_into().unwrap()),
        u32::from_be_bytes(bytes[20..24].try_into().unwrap()),
    );
    assert_eq!((w, h), (1100, height));
    // A blank or unstyled page compresses to a few KiB; this one has charts and
    // coloured maps.
    assert!(bytes.len() > 60_000, "{} bytes: a blank page?", bytes.len());
}

#[test]
fn a_person_sees_the_verdict_the_curves_and_the_maps_and_can_hover_and_zoom() {
    let Some(b) = browser() else {
        assert!(
            !required(),
            "no browser (chromium) found, and CI requires this test: install chromium or set EMM_BROWSER"
        );
        eprintln!("skipped: no browser (chromium, chrome) on PATH and no EMM_BROWSER; `.ci/run` installs one");
        return;
    };
    let dir = out_dir();
    // A recorded snapshot, every manager, several passes.
    let fixture = data("emm-trace/tests/fixtures/h200_train_midway.pickle");
    let page = dir.join("report.html");
    let o = run(emm()
        .args(["replay", "-m", "all", "--passes", "3", "--html"])
        .arg(&page)
        .arg(&fixture));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (dom, seen) = selftest(&b, &dir, &page);
    assert!(dom.contains("data-selftest=\"pass\""), "{seen:#}");
    assert_eq!(seen["ok"], true, "{seen:#}");
    assert_eq!(seen["failed_banner"], false);
    let verdict = seen["verdicts"][0].as_str().unwrap();
    // The pool's peak: above the snapshot's 811 MiB live, within the
    // steady-state bound (its exact figure moves with the pool's policy);
    // PyTorch's as recorded is the snapshot's own.
    let pool_mib: Option<f64> = verdict
        .strip_prefix("emm pool ")
        .and_then(|r| r.split(" MiB at peak").next())
        .and_then(|n| n.parse().ok());
    assert!(
        pool_mib.is_some_and(|m| (811.0..=811.0 * 1.05).contains(&m))
            && verdict.contains("PyTorch as recorded 1.02 GiB: the pool saves"),
        "{verdict}"
    );
    assert!(
        seen["axis"][0]
            .as_str()
            .unwrap()
            .starts_with("time since the recording's first event"),
        "{seen}"
    );
    let chart = &seen["charts"][0];
    // Live, five managers' reserved bytes (the snapshot has a side stream:
    // `pool-shared` too) and PyTorch's as recorded.
    assert_eq!(chart["drawn"], 7, "{chart}");
    assert_eq!(chart["below"], 0);
    assert!(chart["width"].as_f64().unwrap() >= 900.0);
    let tip = chart["tip"].as_str().unwrap();
    for m in [
        "live",
        "pool reserved",
        "pytorch-native reserved",
        "pool-shared reserved",
        "(pass 2)",
    ] {
        assert!(tip.contains(m), "{tip}");
    }
    let maps = seen["maps"].as_array().unwrap();
    let names: Vec<&str> = maps
        .iter()
        .map(|m| m["manager"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "default",
            "pool",
            "pool-shared",
            "pytorch-native",
            "pytorch-expandable"
        ]
    );
    for m in maps {
        let tip = m["tip"].as_str().unwrap();
        assert!(
            tip.contains("live block") && tip.contains("stream 0"),
            "{tip}"
        );
        assert!(m["rects"].as_u64().unwrap() <= 1500, "{m}");
    }
    // The pool's largest live block shows where it was made.
    let pool_tip = maps[1]["tip"].as_str().unwrap();
    assert!(
        pool_tip.contains("made at ") && pool_tip.contains("in segment"),
        "{pool_tip}"
    );
    assert!(pool_tip.contains("at::"), "frames: {pool_tip}");
    screenshot(&b, &dir, &page, "", &dir.join("report.png"), 2600);
    screenshot(
        &b,
        &dir,
        &page,
        "#selftest",
        &dir.join("report-hover.png"),
        1500,
    );
    eprintln!("screenshots: {}", dir.join("report.png").display());

    // A trace without times: the axis says it counts events.
    let csv = data("emm-cli/traces/gpt_train.csv");
    let page = dir.join("events.html");
    let o = run(emm()
        .args([
            "replay", "-m", "pool", "-m", "default", "--passes", "2", "--html",
        ])
        .arg(&page)
        .arg(&csv));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (_, seen) = selftest(&b, &dir, &page);
    assert_eq!(seen["ok"], true, "{seen:#}");
    let axis = seen["axis"][0].as_str().unwrap();
    assert!(
        axis.contains("event index") && axis.contains("2 passes"),
        "{axis}"
    );
    assert_eq!(seen["charts"][0]["drawn"], 3, "live, pool, default");

    // A failed run is marked where a person looks first.
    let page = dir.join("failed.html");
    let o = run(emm()
        .args(["replay", "-m", "pool", "--passes", "1", "--html"])
        .arg(&page)
        .arg(&csv)
        .env("EMM_POOL_LIMIT", "100000000"));
    assert_eq!(o.status.code(), Some(1));
    let (_, seen) = selftest(&b, &dir, &page);
    assert_eq!(seen["failed_banner"], true, "{seen}");
}
