//! `cargo xtask install --prefix DIR [--libdir DIR] [--destdir DIR] [--profile NAME]`:
//! the C/C++ packaging of libemm_capi.
//!
//! Builds emm-capi (release unless `--profile` says otherwise) and installs
//!
//! - `PREFIX/include/`: every header of `crates/emm-capi/include/` (`emm.h`);
//! - `LIBDIR/libemm_capi.so.X.Y.Z` (X.Y.Z: emm-capi's package version), the link
//!   named by its SONAME (`libemm_capi.so.0.Y` before 1.0, `.so.X` after; set by
//!   emm-capi's build script and read back from the built file here) and the
//!   link-time name `libemm_capi.so`;
//! - `LIBDIR/pkgconfig/emm.pc` and the CMake package `LIBDIR/cmake/emm/`
//!   (`emmConfig.cmake`, `emmConfigVersion.cmake`; imported target `emm::emm`),
//!   both relocatable when LIBDIR is inside PREFIX (see [`files`]).
//!
//! LIBDIR is `PREFIX/lib` by default; a relative `--libdir` is taken under PREFIX.
//! `--destdir` (or the `DESTDIR` environment variable) stages the tree under another
//! root, as `make install DESTDIR=...` does: the files land in `DESTDIR/PREFIX/...`.
//! Before installing, the built library's exported functions are checked against
//! the header (see [`crate::header::check_exports`]). Linux (ELF) only.

pub mod files;

use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};

use crate::elf::SharedLibrary;
use crate::{cargo, header};

/// The package whose library is installed.
const PACKAGE: &str = "emm-capi";
/// The library's link-time name (`-lemm_capi`).
pub const LINK_NAME: &str = "libemm_capi.so";

/// What to install where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// The prefix the files are for (absolute, normalized).
    pub prefix: PathBuf,
    /// The library directory (absolute, normalized; `PREFIX/lib` by default).
    pub libdir: PathBuf,
    /// A staging root the files are written under (`DESTDIR`), if any.
    pub destdir: Option<PathBuf>,
    /// The cargo profile to build (`release` by default).
    pub profile: String,
}

impl Options {
    /// The usage line.
    pub const USAGE: &'static str =
        "cargo xtask install --prefix DIR [--libdir DIR] [--destdir DIR] [--profile release|dev]";

    /// Parses the arguments after `install`; `destdir_env` is `DESTDIR` from the
    /// environment (the option wins). Relative paths are taken from the current
    /// directory (a relative `--libdir`: from the prefix).
    pub fn parse(args: &[String], destdir_env: Option<OsString>) -> Result<Options, String> {
        let mut prefix = None;
        let mut libdir = None;
        let mut destdir = destdir_env.filter(|d| !d.is_empty()).map(PathBuf::from);
        let mut profile = "release".to_owned();
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            let (key, inline) = match arg.split_once('=') {
                Some((k, v)) if k.starts_with("--") => (k, Some(v.to_owned())),
                _ => (arg.as_str(), None),
            };
            let mut value = || {
                inline
                    .clone()
                    .or_else(|| it.next().cloned())
                    .filter(|v| !v.is_empty())
                    .ok_or_else(|| format!("{key} needs a value\n    usage: {}", Self::USAGE))
            };
            match key {
                "--prefix" => prefix = Some(PathBuf::from(value()?)),
                "--libdir" => libdir = Some(PathBuf::from(value()?)),
                "--destdir" => destdir = Some(PathBuf::from(value()?)),
                "--profile" => profile = value()?,
                _ => {
                    return Err(format!(
                        "unknown argument {arg:?}\n    usage: {}",
                        Self::USAGE
                    ))
                }
            }
        }
        let prefix =
            prefix.ok_or_else(|| format!("--prefix is required\n    usage: {}", Self::USAGE))?;
        let prefix = absolute(&prefix)?;
        let libdir = match libdir {
            None => prefix.join("lib"),
            Some(l) if l.is_absolute() => normalize(&l),
            Some(l) => normalize(&prefix.join(l)),
        };
        for (what, p) in [("prefix", &prefix), ("libdir", &libdir)] {
            if p.to_string_lossy()
                .contains(|c: char| c.is_whitespace() || c == '"' || c == '$')
            {
                return Err(format!(
                    "the {what} {} holds whitespace, a quote or `$`, which pkg-config files cannot carry",
                    p.display()
                ));
            }
        }
        let destdir = destdir.map(|d| absolute(&d)).transpose()?;
        Ok(Options {
            prefix,
            libdir,
            destdir,
            profile,
        })
    }

    /// Where a file meant for `path` is written: under the staging root, if any.
    pub fn staged(&self, path: &Path) -> PathBuf {
        match &self.destdir {
            None => path.to_path_buf(),
            Some(root) => {
                let rel: PathBuf = path
                    .components()
                    .filter(|c| !matches!(c, Component::RootDir | Component::Prefix(_)))
                    .collect();
                root.join(rel)
            }
        }
    }
}

/// `p` made absolute against the current directory, without `.` and `..`.
fn absolute(p: &Path) -> Result<PathBuf, String> {
    std::path::absolute(p)
        .map(|a| normalize(&a))
        .map_err(|e| format!("{}: {e}", p.display()))
}

/// `p` without `.` components and with each `..` taking away the one before it.
pub fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    out.push(c);
                }
            }
            _ => out.push(c),
        }
    }
    out
}

/// A package version: the text and its numeric core.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    /// As written in the manifest (may carry a pre-release or build suffix).
    pub text: String,
    /// Major, minor and patch.
    pub numbers: [u64; 3],
}

impl Version {
    /// Parses `X.Y.Z`, optionally followed by `-pre` and/or `+build`.
    pub fn parse(text: &str) -> Result<Version, String> {
        let core = text.split(['-', '+']).next().unwrap_or("");
        let parts: Vec<&str> = core.split('.').collect();
        let bad = || format!("version {text:?} is not MAJOR.MINOR.PATCH");
        if parts.len() != 3 {
            return Err(bad());
        }
        let mut numbers = [0u64; 3];
        for (n, p) in numbers.iter_mut().zip(&parts) {
            *n = p.parse().map_err(|_| bad())?;
        }
        Ok(Version {
            text: text.to_owned(),
            numbers,
        })
    }

    /// `X.Y.Z`.
    pub fn core(&self) -> String {
        let [a, b, c] = self.numbers;
        format!("{a}.{b}.{c}")
    }
}

/// What was installed.
#[derive(Debug)]
pub struct Installed {
    /// The options it was installed with.
    pub options: Options,
    /// emm-capi's version.
    pub version: Version,
    /// The library's SONAME (`libemm_capi.so.0.1`).
    pub soname: String,
    /// The library's file name (`libemm_capi.so.0.1.0`).
    pub file_name: String,
    /// Every file and link written (staged paths).
    pub written: Vec<PathBuf>,
}

/// `cargo xtask install ARGS`.
pub fn command(root: &Path, args: &[String]) -> Result<(), String> {
    let options = Options::parse(args, std::env::var_os("DESTDIR"))?;
    let done = install(root, &options)?;
    let o = &done.options;
    eprintln!(
        "==> installed emm {} ({} files and links) for prefix {}{}",
        done.version.text,
        done.written.len(),
        o.prefix.display(),
        o.destdir
            .as_ref()
            .map(|d| format!(", staged under {}", d.display()))
            .unwrap_or_default()
    );
    for w in &done.written {
        eprintln!("    {}", w.display());
    }
    eprintln!(
        "    use: PKG_CONFIG_PATH={}/pkgconfig pkg-config --cflags --libs emm\n         cmake -DCMAKE_PREFIX_PATH={} ... (find_package(emm CONFIG REQUIRED), target emm::emm)",
        o.libdir.display(),
        o.prefix.display()
    );
    Ok(())
}

/// Builds emm-capi with `options.profile` and installs it (see the module docs).
pub fn install(root: &Path, options: &Options) -> Result<Installed, String> {
    let (version, description) = package_version(root)?;
    let built = build_library(root, &options.profile)?;
    let lib = SharedLibrary::read(&built)?;
    let soname = check_soname(&lib, &version)?;
    let header_path = root.join(header::HEADER);
    let header_text = std::fs::read_to_string(&header_path)
        .map_err(|e| format!("reading {}: {e}", header_path.display()))?;
    header::check_exports(&header_text, &lib)?;

    let layout = files::Layout::new(options, &version, &soname, &description, lib.is_64)?;
    let mut written = Vec::new();

    // Headers.
    let include_src = root.join("crates/emm-capi/include");
    let include_dst = options.staged(&options.prefix.join("include"));
    copy_tree(&include_src, &include_dst, &mut written)?;

    // The library and its links.
    let libdir = options.staged(&options.libdir);
    create_dir(&libdir)?;
    let file = libdir.join(&layout.file_name);
    remove_if_present(&file)?;
    // A fresh file, not one rewritten in place: a running program may map the old one.
    std::fs::copy(&built, &file)
        .map_err(|e| format!("copying {} to {}: {e}", built.display(), file.display()))?;
    written.push(file);
    for (link, target) in [
        (&soname, &layout.file_name),
        (&LINK_NAME.to_owned(), &soname),
    ] {
        let path = libdir.join(link);
        remove_if_present(&path)?;
        std::os::unix::fs::symlink(target, &path)
            .map_err(|e| format!("linking {} -> {target}: {e}", path.display()))?;
        written.push(path);
    }

    // pkg-config and CMake.
    for (rel, text) in [
        ("pkgconfig/emm.pc", layout.pkg_config()),
        ("cmake/emm/emmConfig.cmake", layout.cmake_config()),
        (
            "cmake/emm/emmConfigVersion.cmake",
            layout.cmake_config_version(),
        ),
    ] {
        let path = libdir.join(rel);
        if let Some(dir) = path.parent() {
            create_dir(dir)?;
        }
        std::fs::write(&path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
        written.push(path);
    }
    Ok(Installed {
        options: options.clone(),
        version,
        soname,
        file_name: layout.file_name,
        written,
    })
}

/// emm-capi's version and description, from `cargo metadata`.
fn package_version(root: &Path) -> Result<(Version, String), String> {
    let out = cargo()
        .current_dir(root)
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .output()
        .map_err(|e| format!("cargo metadata could not start: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cargo metadata failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("cargo metadata printed no JSON: {e}"))?;
    let package = meta["packages"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == PACKAGE))
        .ok_or_else(|| format!("cargo metadata lists no package {PACKAGE}"))?;
    let version = package["version"]
        .as_str()
        .ok_or_else(|| format!("{PACKAGE} has no version in cargo metadata"))?;
    let description = package["description"].as_str().unwrap_or("").to_owned();
    Ok((Version::parse(version)?, description))
}

/// Builds emm-capi's cdylib with `profile`; returns its path (from cargo's own
/// report of the artifact, so `CARGO_TARGET_DIR` and `--target` need no guessing).
fn build_library(root: &Path, profile: &str) -> Result<PathBuf, String> {
    eprintln!("==> install: cargo build -p {PACKAGE} --profile {profile}");
    let out = cargo()
        .current_dir(root)
        .args(["build", "-p", PACKAGE, "--profile", profile])
        .args(["--message-format", "json-render-diagnostics"])
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("cargo build could not start: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "step `install: build` failed ({}).\n    hint: `cargo build -p {PACKAGE} --profile {profile}` must succeed",
            out.status
        ));
    }
    cdylib_from_messages(&String::from_utf8_lossy(&out.stdout)).ok_or_else(|| {
        format!("cargo build -p {PACKAGE} reported no cdylib (crate-type in crates/emm-capi/Cargo.toml?)")
    })
}

/// The `.so` of emm_capi's cdylib target among cargo's JSON messages.
fn cdylib_from_messages(stdout: &str) -> Option<PathBuf> {
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "emm_capi")
        .filter(|m| {
            m["target"]["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == "cdylib"))
        })
        .flat_map(|m| {
            m["filenames"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
        })
        .filter_map(|f| f.as_str().map(PathBuf::from))
        .find(|f| f.extension().is_some_and(|e| e == "so"))
}

/// The SONAME of the built library, checked against the version: `libemm_capi.so.`
/// followed by the leading numbers of `X.Y.Z`.
fn check_soname(lib: &SharedLibrary, version: &Version) -> Result<String, String> {
    let soname = lib.soname.clone().ok_or_else(|| {
        format!(
            "{} has no SONAME.\n    hint: crates/emm-capi/build.rs sets one on ELF targets (cargo:rustc-cdylib-link-arg=-Wl,-soname,...)",
            lib.path.display()
        )
    })?;
    let suffix = soname.strip_prefix(&format!("{LINK_NAME}.")).unwrap_or("");
    let core = version.core();
    let fits = !suffix.is_empty() && (core == suffix || core.starts_with(&format!("{suffix}.")));
    if !fits {
        return Err(format!(
            "{} has SONAME {soname}, which does not fit version {core} (expected {LINK_NAME}.<leading numbers of {core}>)",
            lib.path.display()
        ));
    }
    Ok(soname)
}

fn create_dir(dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))
}

fn remove_if_present(path: &Path) -> Result<(), String> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("removing {}: {e}", path.display())),
    }
}

/// Copies the files under `from` to `to`, keeping their relative paths.
fn copy_tree(from: &Path, to: &Path, written: &mut Vec<PathBuf>) -> Result<(), String> {
    create_dir(to)?;
    let entries =
        std::fs::read_dir(from).map_err(|e| format!("reading {}: {e}", from.display()))?;
    for e in entries {
        let e = e.map_err(|e| format!("reading {}: {e}", from.display()))?;
        let (src, dst) = (e.path(), to.join(e.file_name()));
        if src.is_dir() {
            copy_tree(&src, &dst, written)?;
        } else {
            std::fs::copy(&src, &dst)
                .map_err(|err| format!("copying {} to {}: {err}", src.display(), dst.display()))?;
            written.push(dst);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn options_default_to_lib_under_the_prefix_and_a_release_build() {
        let o = Options::parse(&args(&["--prefix", "/opt/emm"]), None).unwrap();
        assert_eq!(o.prefix, PathBuf::from("/opt/emm"));
        assert_eq!(o.libdir, PathBuf::from("/opt/emm/lib"));
        assert_eq!(o.destdir, None);
        assert_eq!(o.profile, "release");
        let o = Options::parse(
            &args(&[
                "--prefix=/opt/emm/",
                "--libdir",
                "lib/x86_64-linux-gnu",
                "--profile=dev",
            ]),
            Some("/stage".into()),
        )
        .unwrap();
        assert_eq!(o.libdir, PathBuf::from("/opt/emm/lib/x86_64-linux-gnu"));
        assert_eq!(o.destdir, Some(PathBuf::from("/stage")));
        assert_eq!(o.profile, "dev");
        assert_eq!(
            o.staged(&o.libdir),
            PathBuf::from("/stage/opt/emm/lib/x86_64-linux-gnu")
        );
        // The option wins over the environment; an absolute libdir stays.
        let o = Options::parse(
            &args(&[
                "--prefix",
                "/usr/local/../opt",
                "--libdir",
                "/usr/lib64",
                "--destdir",
                "/s2",
            ]),
            Some("/stage".into()),
        )
        .unwrap();
        assert_eq!(o.prefix, PathBuf::from("/usr/opt"));
        assert_eq!(o.libdir, PathBuf::from("/usr/lib64"));
        assert_eq!(o.destdir, Some(PathBuf::from("/s2")));
    }

    #[test]
    fn bad_arguments_are_refused_with_the_usage() {
        for bad in [
            &[][..],
            &["--prefix"][..],
            &["--prefix", "/a", "--frobnicate"][..],
            &["--libdir", "lib"][..],
            &["--prefix", "/a b"][..],
        ] {
            let err = Options::parse(&args(bad), None).unwrap_err();
            assert!(
                err.contains("usage:") || err.contains("pkg-config files cannot carry"),
                "{bad:?}: {err}"
            );
        }
    }

    #[test]
    fn versions_parse_with_suffixes_and_refuse_anything_else() {
        let v = Version::parse("0.3.2").unwrap();
        assert_eq!(v.numbers, [0, 3, 2]);
        assert_eq!(
            Version::parse("1.2.3-rc.1+build.5").unwrap().core(),
            "1.2.3"
        );
        for bad in ["1.2", "1.2.x", "", "1.2.3.4"] {
            assert!(Version::parse(bad).is_err(), "{bad}");
        }
    }

    fn lib_with(soname: Option<&str>) -> SharedLibrary {
        SharedLibrary {
            path: "libemm_capi.so".into(),
            soname: soname.map(str::to_owned),
            functions: Default::default(),
            data: Default::default(),
            needed: Vec::new(),
            is_64: true,
        }
    }

    #[test]
    fn the_soname_must_fit_the_version() {
        let v = Version::parse("0.1.0").unwrap();
        assert_eq!(
            check_soname(&lib_with(Some("libemm_capi.so.0.1")), &v).unwrap(),
            "libemm_capi.so.0.1"
        );
        assert!(check_soname(&lib_with(Some("libemm_capi.so.0")), &v).is_ok());
        assert!(check_soname(&lib_with(Some("libemm_capi.so.0.2")), &v).is_err());
        assert!(check_soname(&lib_with(Some("libemm_capi.so.0.10")), &v).is_err());
        assert!(check_soname(&lib_with(Some("libother.so.0.1")), &v).is_err());
        let err = check_soname(&lib_with(None), &v).unwrap_err();
        assert!(err.contains("build.rs"), "{err}");
    }

    #[test]
    fn the_cdylib_is_found_among_cargo_messages() {
        let msgs = r#"{"reason":"compiler-artifact","target":{"name":"emm_core","kind":["lib"]},"filenames":["/t/libemm_core.rlib"]}
{"reason":"compiler-artifact","target":{"name":"emm_capi","kind":["cdylib","rlib"]},"filenames":["/t/libemm_capi.so","/t/libemm_capi.rlib"]}
{"reason":"build-finished","success":true}"#;
        assert_eq!(
            cdylib_from_messages(msgs),
            Some(PathBuf::from("/t/libemm_capi.so"))
        );
        assert_eq!(cdylib_from_messages("not json\n"), None);
    }
}
