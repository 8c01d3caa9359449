//! Gives `libemm_capi.so` its SONAME on ELF targets: `libemm_capi.so.<major>` from
//! 1.0 on, `libemm_capi.so.0.<minor>` before (under Cargo's rules a 0.x minor
//! release may break), `libemm_capi.so.0.0.<patch>` for 0.0.x (every release may);
//! see docs/decisions/c-packaging.md. The version is this
//! package's own (`CARGO_PKG_VERSION_*`); `cargo xtask install` reads the SONAME
//! back from the built library rather than computing it again.
//!
//! Nothing here links anything: the CUDA driver is loaded at run time.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    // ELF targets whose linkers take `-soname` (macOS uses install names, Windows
    // import libraries).
    let elf = matches!(
        os.as_str(),
        "linux" | "android" | "freebsd" | "netbsd" | "openbsd" | "dragonfly" | "illumos"
    );
    if !elf {
        return;
    }
    let part = |name: &str| std::env::var(name).unwrap_or_default();
    let (major, minor, patch) = (
        part("CARGO_PKG_VERSION_MAJOR"),
        part("CARGO_PKG_VERSION_MINOR"),
        part("CARGO_PKG_VERSION_PATCH"),
    );
    // The part of the version within which releases stay compatible, by Cargo's
    // rules (as cargo-c names its libraries).
    let soname = match (major.as_str(), minor.as_str()) {
        ("0", "0") => format!("libemm_capi.so.0.0.{patch}"),
        ("0", _) => format!("libemm_capi.so.0.{minor}"),
        _ => format!("libemm_capi.so.{major}"),
    };
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{soname}");
}
