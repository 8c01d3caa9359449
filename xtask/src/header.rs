//! The C header, `crates/emm-capi/include/emm.h`: written by cbindgen from
//! emm-capi's source (`cargo xtask header`), so its declarations, types, struct
//! fields and doc comments are the library's. CI checks that the committed header is
//! the one cbindgen writes now ([`check`]) and that the built library exports exactly
//! the functions the header declares ([`check_exports`]).

use std::collections::BTreeSet;
use std::path::Path;

use crate::elf::SharedLibrary;

/// The crate the header is generated from, relative to the workspace root.
const CRATE_DIR: &str = "crates/emm-capi";
/// The committed header, relative to the workspace root.
pub const HEADER: &str = "crates/emm-capi/include/emm.h";

/// What cbindgen writes for emm-capi now (settings: `crates/emm-capi/cbindgen.toml`).
pub fn generate(root: &Path) -> Result<String, String> {
    let dir = root.join(CRATE_DIR);
    let config_path = dir.join("cbindgen.toml");
    let config = cbindgen::Config::from_file(&config_path)
        .map_err(|e| format!("reading {}: {e}", config_path.display()))?;
    let bindings = cbindgen::Builder::new()
        .with_crate(&dir)
        .with_config(config)
        .generate()
        .map_err(|e| format!("cbindgen could not generate {HEADER}: {e}"))?;
    let mut out = Vec::new();
    bindings.write(&mut out);
    String::from_utf8(out).map_err(|e| format!("cbindgen wrote a header that is not UTF-8: {e}"))
}

/// `cargo xtask header`: writes the generated header over the committed one.
pub fn write(root: &Path) -> Result<(), String> {
    let text = generate(root)?;
    let path = root.join(HEADER);
    std::fs::write(&path, &text).map_err(|e| format!("writing {}: {e}", path.display()))?;
    eprintln!(
        "==> header: wrote {} ({} functions)",
        path.display(),
        declared_functions(&text).len()
    );
    Ok(())
}

/// CI: the committed header is exactly what cbindgen writes from the source now.
pub fn check(root: &Path) -> Result<(), String> {
    eprintln!("==> header: {HEADER} against cbindgen's output");
    let generated = generate(root)?;
    let path = root.join(HEADER);
    let committed =
        std::fs::read_to_string(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    match first_difference(&committed, &generated) {
        None => {
            eprintln!(
                "    header: {} functions, identical to the generated one",
                declared_functions(&generated).len()
            );
            Ok(())
        }
        Some((line, ours, theirs)) => Err(format!(
            "step `header` failed: {HEADER} is not what cbindgen writes from crates/emm-capi/src (first difference at line {line}:\n      committed: {ours}\n      generated: {theirs})\n    hint: the header is generated: change the Rust source (and its doc comments), run `cargo xtask header` and commit both"
        )),
    }
}

/// The first line where `a` and `b` differ: its number (from 1) and both texts.
fn first_difference(a: &str, b: &str) -> Option<(usize, String, String)> {
    let mut left = a.lines();
    let mut right = b.lines();
    let mut n = 0;
    loop {
        n += 1;
        match (left.next(), right.next()) {
            (None, None) => return None,
            (l, r) if l == r => continue,
            (l, r) => {
                let show = |s: Option<&str>| s.map_or("(end of file)".to_owned(), str::to_owned);
                return Some((n, show(l), show(r)));
            }
        }
    }
}

/// The functions `header` declares: each identifier followed by `(` outside
/// comments, preprocessor lines and parentheses (so parameters, and function
/// pointers, which read `(*name)(`, do not count).
pub fn declared_functions(header: &str) -> BTreeSet<String> {
    let code = strip_comments_and_directives(header);
    let mut names = BTreeSet::new();
    let mut depth = 0usize;
    let mut ident = String::new();
    for c in code.chars() {
        if c.is_ascii_alphanumeric() || c == '_' {
            ident.push(c);
            continue;
        }
        if c == '(' {
            if depth == 0 && !ident.is_empty() && !ident.starts_with(|d: char| d.is_ascii_digit()) {
                names.insert(std::mem::take(&mut ident));
            }
            depth += 1;
        } else if c == ')' {
            depth = depth.saturating_sub(1);
        }
        ident.clear();
    }
    names
}

/// `text` without `/* */` and `//` comments, string literals and `#` lines.
fn strip_comments_and_directives(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in strip_comments(text).lines() {
        if !line.trim_start().starts_with('#') {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, chars.peek()) {
            ('/', Some('*')) => {
                chars.next();
                let mut last = '\0';
                for d in chars.by_ref() {
                    if last == '*' && d == '/' {
                        break;
                    }
                    if d == '\n' {
                        out.push('\n');
                    }
                    last = d;
                }
                out.push(' ');
            }
            ('/', Some('/')) => {
                for d in chars.by_ref() {
                    if d == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            ('"', _) => {
                // `extern "C"`: the literal's text is no code.
                for d in chars.by_ref() {
                    if d == '"' {
                        break;
                    }
                }
                out.push(' ');
            }
            _ => out.push(c),
        }
    }
    out
}

/// CI: `lib` exports exactly the functions `header` declares, and no data symbol.
pub fn check_exports(header: &str, lib: &SharedLibrary) -> Result<(), String> {
    let declared = declared_functions(header);
    let missing: Vec<_> = declared.difference(&lib.functions).collect();
    let extra: Vec<_> = lib.functions.difference(&declared).collect();
    let mut problems = String::new();
    if !missing.is_empty() {
        problems.push_str(&format!(
            "\n      declared in {HEADER} but not exported: {missing:?}"
        ));
    }
    if !extra.is_empty() {
        problems.push_str(&format!(
            "\n      exported but not declared in {HEADER}: {extra:?}"
        ));
    }
    if !lib.data.is_empty() {
        problems.push_str(&format!(
            "\n      exported data symbols (the C ABI exports functions only): {:?}",
            lib.data
        ));
    }
    if problems.is_empty() {
        eprintln!(
            "    {}: exports the {} functions {HEADER} declares, nothing else",
            lib.path.display(),
            declared.len()
        );
        Ok(())
    } else {
        Err(format!(
            "step `exports` failed: {} does not match {HEADER}:{problems}\n    hint: exported functions are `#[no_mangle] pub extern \"C\"` items of crates/emm-capi; after changing them run `cargo xtask header`",
            lib.path.display()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"/* emm_fake(int) in a comment */
#ifndef EMM_H
#define EMM_H
#define EMM_OK 0
typedef struct emm_stats {
  /**
   * Peak (of bytes).
   */
  uint64_t peak;
} emm_stats;
#ifdef __cplusplus
extern "C" {
#endif // __cplusplus
int emm_abi_version(void);
emm_status emm_alloc(struct emm_manager *m, size_t size, void *stream, uint64_t *out_ptr);
void emm_register(void (*callback)(int code), int x); // emm_not_this(void)
#endif
"#;

    #[test]
    fn declared_functions_are_the_file_scope_declarations() {
        let names: Vec<_> = declared_functions(SAMPLE).into_iter().collect();
        assert_eq!(names, ["emm_abi_version", "emm_alloc", "emm_register"]);
    }

    #[test]
    fn differences_name_the_first_differing_line() {
        assert_eq!(first_difference("a\nb\n", "a\nb\n"), None);
        assert_eq!(
            first_difference("a\nb\n", "a\nc\n"),
            Some((2, "b".into(), "c".into()))
        );
        assert_eq!(
            first_difference("a\n", "a\nb\n"),
            Some((2, "(end of file)".into(), "b".into()))
        );
    }

    fn lib(functions: &[&str], data: &[&str]) -> SharedLibrary {
        SharedLibrary {
            path: "libemm_capi.so".into(),
            soname: None,
            functions: functions.iter().map(|s| s.to_string()).collect(),
            data: data.iter().map(|s| s.to_string()).collect(),
            needed: Vec::new(),
            is_64: true,
        }
    }

    #[test]
    fn exports_must_match_the_declarations_exactly() {
        let all = ["emm_abi_version", "emm_alloc", "emm_register"];
        assert!(check_exports(SAMPLE, &lib(&all, &[])).is_ok());
        let missing = check_exports(SAMPLE, &lib(&all[..2], &[])).unwrap_err();
        assert!(
            missing.contains("not exported: [\"emm_register\"]"),
            "{missing}"
        );
        let extra =
            check_exports(SAMPLE, &lib(&[all[0], all[1], all[2], "emm_secret"], &[])).unwrap_err();
        assert!(extra.contains("not declared"), "{extra}");
        let data = check_exports(SAMPLE, &lib(&all, &["EMM_TABLE"])).unwrap_err();
        assert!(data.contains("EMM_TABLE"), "{data}");
    }

    #[test]
    fn the_committed_header_declares_what_the_sources_export() {
        // Without cbindgen: every public `extern "C" fn` in the sources is
        // declared (a private one, such as a test's callback, is not exported).
        let root = crate::cmd::workspace_root();
        let header = std::fs::read_to_string(root.join(HEADER)).unwrap();
        let declared = declared_functions(&header);
        let mut found = 0;
        for file in crate::rust_files(&root.join(CRATE_DIR).join("src")) {
            let text = std::fs::read_to_string(&file).unwrap();
            let mut pieces = text.split("extern \"C\" fn ");
            let mut before = pieces.next().unwrap_or("");
            for piece in pieces {
                let line = before.rsplit('\n').next().unwrap_or("").trim_start();
                before = piece;
                if !line.starts_with("pub ") {
                    continue;
                }
                let name = piece.split('(').next().unwrap_or("").trim();
                assert!(declared.contains(name), "{HEADER} lacks {name}");
                found += 1;
            }
        }
        assert_eq!(found, declared.len(), "{declared:?}");
    }
}
