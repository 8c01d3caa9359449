//! Gives `libemm_capi.so` its SONAME on ELF targets: `libemm_capi.so.<major>` from
//! 1.0 on, `libemm_capi.so.0.<minor>` before (under Cargo's rules a 0.x minor
//! release may break; see docs/decisions/c-packaging.md). The version is this
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
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").unwrap_or_default();
    let minor = std::env::var("CARGO_PKG_VERSION_MINOR").unwrap_or_default();
    let soname = if major == "0" {
        format!("libemm_capi.so.0.{minor}")
    } else {
        format!("libemm_capi.so.{major}")
    };
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{soname}");
}
