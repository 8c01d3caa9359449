//! The headless browser the page test opens `emm replay --html`'s page in
//! (`crates/emm-cli/tests/browser.rs`): `EMM_BROWSER`, else Chromium or Chrome
//! on `PATH` (`.ci/run` installs Debian's chromium when none is there). On CI
//! (`CI` set) a missing browser fails `ci` before the tests; elsewhere the test
//! says it is skipped.

use std::path::PathBuf;

const NAMES: [&str; 4] = [
    "chromium",
    "chromium-browser",
    "google-chrome",
    "google-chrome-stable",
];

/// Whether this run is on CI (`CI` set, and not to `0` or `false`).
pub fn on_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && v != "false")
}

/// The browser the page test will use, if any; on CI, none is an error.
pub fn find() -> Result<Option<PathBuf>, String> {
    let found = std::env::var_os("EMM_BROWSER")
        .map(PathBuf::from)
        .filter(|p| p.is_file())
        .or_else(|| {
            let path = std::env::var_os("PATH")?;
            std::env::split_paths(&path)
                .flat_map(|d| NAMES.iter().map(move |n| d.join(n)))
                .find(|p| p.is_file())
        });
    match (&found, on_ci()) {
        (Some(b), _) => eprintln!("==> page test: headless browser {}", b.display()),
        (None, true) => {
            return Err(format!(
                "no headless browser for the page test (crates/emm-cli/tests/browser.rs), and CI needs it.\n    hint: run `.ci/run` (it installs Debian's chromium), install chromium or Chrome ({}), or set EMM_BROWSER",
                NAMES.join(", ")
            ))
        }
        (None, false) => eprintln!(
            "==> page test: no headless browser ({}; or EMM_BROWSER): the test will say it is skipped",
            NAMES.join(", ")
        ),
    }
    Ok(found)
}
