//! No import circle inside a crate or package (`tidy`).
//!
//! For each crate's `src/`, every file is a node and every `crate::…`, `super::…`
//! and `self::…` path in its code (a `use` or a path written out in full; comments
//! and string literals aside) is an edge to the file that defines the item. A path
//! that ends at a re-export (`pub use x::Y` in `lib.rs`, a glob `pub use x::*`) is
//! followed to the file that defines `Y`, so the crate root's facade ties nothing.
//! For `python/emm`, `from .x import`, `from . import x`, `from emm.x import`,
//! `from emm import x` and `import emm.x` are edges, wherever they stand (an import
//! inside a function is an edge too). A text scan, no compiler: it is meant to be
//! simple, and to err towards seeing an edge.
//!
//! A circle is a strongly connected set of two or more files; each is reported with
//! the names that tie its files.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// An edge of the file graph: from, to, and the names that make it.
type Edges = BTreeMap<(usize, usize), BTreeSet<String>>;

/// The circles among `files` (names) joined by `edges`, one text block each.
fn circles(files: &[String], edges: &Edges) -> Vec<String> {
    let n = files.len();
    let mut next: Vec<Vec<usize>> = vec![Vec::new(); n];
    for &(a, b) in edges.keys() {
        next[a].push(b);
    }
    let mut out = Vec::new();
    for scc in strongly_connected(&next) {
        if scc.len() < 2 {
            continue;
        }
        let mut text = String::new();
        let names: Vec<&str> = scc.iter().map(|&i| files[i].as_str()).collect();
        let _ = writeln!(text, "{}", names.join(" <-> "));
        for ((a, b), why) in edges {
            if scc.contains(a) && scc.contains(b) {
                let why: Vec<&str> = why.iter().map(String::as_str).collect();
                let _ = writeln!(
                    text,
                    "      {} -> {}: {}",
                    files[*a],
                    files[*b],
                    why.join(", ")
                );
            }
        }
        out.push(text);
    }
    out
}

/// Tarjan's strongly connected components (iterative), each sorted.
fn strongly_connected(next: &[Vec<usize>]) -> Vec<Vec<usize>> {
    let n = next.len();
    let mut index = vec![usize::MAX; n];
    let mut low = vec![0; n];
    let mut on_stack = vec![false; n];
    let mut stack = Vec::new();
    let mut counter = 0;
    let mut out = Vec::new();
    for start in 0..n {
        if index[start] != usize::MAX {
            continue;
        }
        // (node, position in its successor list)
        let mut work = vec![(start, 0)];
        while let Some(&mut (v, ref mut pos)) = work.last_mut() {
            if *pos == 0 && index[v] == usize::MAX {
                index[v] = counter;
                low[v] = counter;
                counter += 1;
                stack.push(v);
                on_stack[v] = true;
            }
            if let Some(&w) = next[v].get(*pos) {
                *pos += 1;
                if index[w] == usize::MAX {
                    work.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            work.pop();
            if let Some(&(parent, _)) = work.last() {
                low[parent] = low[parent].min(low[v]);
            }
            if low[v] == index[v] {
                let mut scc = Vec::new();
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    scc.push(w);
                    if w == v {
                        break;
                    }
                }
                scc.sort_unstable();
                out.push(scc);
            }
        }
    }
    out
}

/// Every circle in the crates under `crates/` and in `python/emm`, as text.
pub fn check(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut crates: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("src"))
        .filter(|p| p.is_dir())
        .collect();
    crates.sort();
    for src in crates {
        let base = src.parent().unwrap_or(root);
        let name = base
            .strip_prefix(root)
            .unwrap_or(base)
            .display()
            .to_string();
        for c in rust_circles(&src) {
            out.push(format!("{name}: {c}"));
        }
    }
    let py = root.join("python/emm");
    if py.is_dir() {
        for c in python_circles(&py) {
            out.push(format!("python/emm: {c}"));
        }
    }
    out
}

// ---------------------------------------------------------------- Rust

/// One source file of a crate: its module path and what the scan found in it.
struct Module {
    /// `src/`-relative file name, for messages.
    file: String,
    /// Module path from the crate root (`[]` for `lib.rs`/`main.rs`).
    path: Vec<String>,
    /// Names the file defines at its top level (fn, struct, mod, macro, ...).
    defines: BTreeSet<String>,
    /// Names its top-level `use` declarations bring in: name -> absolute path.
    uses: HashMap<String, Vec<String>>,
    /// Absolute module paths of its top-level glob `use`s.
    globs: Vec<Vec<String>>,
    /// Absolute paths its code names through `crate::`, `super::` or `self::`.
    refs: Vec<Vec<String>>,
}

/// The circles among the files under `src`, as text.
pub fn rust_circles(src: &Path) -> Vec<String> {
    let mut files = Vec::new();
    collect(src, "rs", &mut files);
    files.sort();
    let modules: Vec<Module> = files
        .iter()
        .filter_map(|f| {
            let rel = f.strip_prefix(src).ok()?;
            let text = std::fs::read_to_string(f).ok()?;
            Some(scan_rust(&rel.display().to_string(), &text))
        })
        .collect();
    let by_path: HashMap<&[String], usize> = modules
        .iter()
        .enumerate()
        .map(|(i, m)| (m.path.as_slice(), i))
        .collect();
    let mut edges = Edges::new();
    for (i, m) in modules.iter().enumerate() {
        for r in &m.refs {
            if let Some((j, name)) = resolve(&modules, &by_path, r, 0) {
                if j != i {
                    edges.entry((i, j)).or_default().insert(name);
                }
            }
        }
    }
    let names: Vec<String> = modules.iter().map(|m| m.file.clone()).collect();
    circles(&names, &edges)
}

/// The file that defines what the absolute `path` names, and the item's name.
fn resolve(
    modules: &[Module],
    by_path: &HashMap<&[String], usize>,
    path: &[String],
    depth: usize,
) -> Option<(usize, String)> {
    // The deepest file module the path runs through.
    let mut at = *by_path.get(&path[..0])?;
    let mut used = 0;
    for k in 1..=path.len() {
        match by_path.get(&path[..k]) {
            Some(&i) => {
                at = i;
                used = k;
            }
            None => break,
        }
    }
    let Some(item) = path.get(used) else {
        // The path names a module: the module's file.
        return Some((at, path.last().cloned().unwrap_or_default()));
    };
    let m = &modules[at];
    if depth < 8 && !m.defines.contains(item) {
        // A re-export: follow it to where the item is defined.
        if let Some(target) = m.uses.get(item) {
            let mut p = target.clone();
            p.extend_from_slice(&path[used + 1..]);
            if let Some(found) = resolve(modules, by_path, &p, depth + 1) {
                return Some(found);
            }
        }
        for g in &m.globs {
            let mut p = g.clone();
            p.extend_from_slice(&path[used..]);
            if let Some((i, name)) = resolve(modules, by_path, &p, depth + 1) {
                if modules[i].defines.contains(item) || modules[i].uses.contains_key(item) {
                    return Some((i, name));
                }
            }
        }
    }
    Some((at, item.clone()))
}

/// Tokens of Rust code with comments and literals gone: identifiers and punctuation
/// (`::` as one token).
fn tokens(text: &str) -> Vec<String> {
    let c: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    while i < c.len() {
        let ch = c[i];
        let next = c.get(i + 1).copied();
        if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && next == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if ch == '"' {
            i = skip_string(&c, i + 1, 0);
        } else if (ch == 'r' || ch == 'b')
            && raw_string_hashes(&c, i).is_some()
            && (i == 0 || !ident(c[i - 1]))
        {
            let (start, hashes) = raw_string_hashes(&c, i).unwrap_or((i + 1, 0));
            i = skip_string(&c, start, hashes);
        } else if ch == '\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a).
            if next == Some('\\') {
                i += 2;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if c.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
            }
        } else if ident(ch) {
            let start = i;
            while i < c.len() && ident(c[i]) {
                i += 1;
            }
            out.push(c[start..i].iter().collect());
        } else if ch == ':' && next == Some(':') {
            out.push("::".into());
            i += 2;
        } else {
            out.push(ch.to_string());
            i += 1;
        }
    }
    out
}

/// Where a raw (or byte) string's body starts and its `#` count, if `c[i]` starts one.
fn raw_string_hashes(c: &[char], i: usize) -> Option<(usize, usize)> {
    let mut j = i;
    if c.get(j) == Some(&'b') {
        j += 1;
        if c.get(j) == Some(&'"') {
            return Some((j + 1, 0));
        }
    }
    if c.get(j) != Some(&'r') {
        return None;
    }
    j += 1;
    let mut hashes = 0;
    while c.get(j) == Some(&'#') {
        hashes += 1;
        j += 1;
    }
    (c.get(j) == Some(&'"')).then_some((j + 1, hashes))
}

/// The index after a string literal whose body starts at `i`.
fn skip_string(c: &[char], mut i: usize, hashes: usize) -> usize {
    while i < c.len() {
        if hashes == 0 && c[i] == '\\' {
            i += 2;
            continue;
        }
        if c[i] == '"' && (0..hashes).all(|k| c.get(i + 1 + k) == Some(&'#')) {
            return i + 1 + hashes;
        }
        i += 1;
    }
    i
}

/// The module path of a `src/`-relative file name.
fn module_path(rel: &str) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .trim_end_matches(".rs")
        .split('/')
        .map(str::to_owned)
        .collect();
    if parts.len() == 1 && (parts[0] == "lib" || parts[0] == "main") {
        parts.clear();
    } else if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

const ITEM_KEYWORDS: &[&str] = &[
    "fn", "struct", "enum", "union", "trait", "type", "const", "static", "mod",
];

fn scan_rust(rel: &str, text: &str) -> Module {
    let path = module_path(rel);
    let t = tokens(text);
    // The modules the file declares in files of their own (`mod x;`).
    let children: Vec<String> = t
        .windows(3)
        .filter(|w| w[0] == "mod" && w[2] == ";")
        .map(|w| w[1].clone())
        .collect();
    let mut m = Module {
        file: rel.to_owned(),
        path: path.clone(),
        defines: BTreeSet::new(),
        uses: HashMap::new(),
        globs: Vec::new(),
        refs: Vec::new(),
    };
    // Inline modules (`mod tests { .. }`): their names and the brace depth inside.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < t.len() {
        let tok = t[i].as_str();
        let here = || {
            let mut p = path.clone();
            p.extend(inline.iter().map(|(n, _)| n.clone()));
            p
        };
        match tok {
            "{" => depth += 1,
            "}" => {
                if inline.last().is_some_and(|&(_, d)| d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
            }
            "mod" if t.get(i + 2).is_some_and(|s| s == "{") => {
                if depth == 0 {
                    m.defines.insert(t[i + 1].clone());
                }
                inline.push((t[i + 1].clone(), depth + 1));
            }
            "use" if !prev_is(&t, i, "::") => {
                let end = (i..t.len()).find(|&k| t[k] == ";").unwrap_or(t.len());
                let mut leaves = Vec::new();
                use_tree(&t[i + 1..end], Vec::new(), &mut leaves);
                let module = here();
                for (rel_path, alias) in leaves {
                    let Some(abs) = absolute(&module, &rel_path, &children) else {
                        continue;
                    };
                    if inline.is_empty() {
                        match alias.as_deref() {
                            Some("*") => m.globs.push(abs.clone()),
                            Some("_") => {}
                            Some(a) => {
                                m.uses.insert(a.to_owned(), abs.clone());
                            }
                            None => {
                                if let Some(last) = abs.last() {
                                    m.uses.insert(last.clone(), abs.clone());
                                }
                            }
                        }
                    }
                    if matches!(
                        rel_path.first().map(String::as_str),
                        Some("crate" | "super" | "self")
                    ) {
                        m.refs.push(abs);
                    }
                }
                i = end;
                continue;
            }
            "crate" | "super" | "self"
                if t.get(i + 1).is_some_and(|s| s == "::") && !prev_is(&t, i, "::") =>
            {
                let mut p = vec![t[i].clone()];
                let mut k = i + 1;
                while t.get(k).is_some_and(|s| s == "::")
                    && t.get(k + 1).is_some_and(|s| is_ident(s))
                {
                    p.push(t[k + 1].clone());
                    k += 2;
                }
                if let Some(abs) = absolute(&here(), &p, &children) {
                    m.refs.push(abs);
                }
                i = k;
                continue;
            }
            "macro_rules" if depth == 0 && t.get(i + 1).is_some_and(|s| s == "!") => {
                if let Some(name) = t.get(i + 2) {
                    m.defines.insert(name.clone());
                }
            }
            _ if depth == 0 && ITEM_KEYWORDS.contains(&tok) => {
                if let Some(name) = t.get(i + 1).filter(|s| is_ident(s)) {
                    m.defines.insert(name.clone());
                }
            }
            _ => {}
        }
        i += 1;
    }
    m
}

fn prev_is(t: &[String], i: usize, s: &str) -> bool {
    i > 0 && t[i - 1] == s
}

fn is_ident(s: &str) -> bool {
    s.chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_')
}

/// The leaves of a use tree: (path, alias), the alias `*` for a glob.
fn use_tree(t: &[String], prefix: Vec<String>, out: &mut Vec<(Vec<String>, Option<String>)>) {
    // Split at top-level commas.
    let mut parts = Vec::new();
    let mut level = 0;
    let mut start = 0;
    for (k, tok) in t.iter().enumerate() {
        match tok.as_str() {
            "{" => level += 1,
            "}" => level -= 1,
            "," if level == 0 => {
                parts.push(&t[start..k]);
                start = k + 1;
            }
            _ => {}
        }
    }
    parts.push(&t[start..]);
    for part in parts {
        let mut path = prefix.clone();
        let mut k = 0;
        // A leading `::` (extern crate path) or `$` (of `$crate`) is left out.
        while part.get(k).is_some_and(|s| s == "::" || s == "$") {
            k += 1;
        }
        while k < part.len() {
            match part[k].as_str() {
                "::" => k += 1,
                "{" => {
                    let close = part.len() - 1;
                    use_tree(&part[k + 1..close], path.clone(), out);
                    path.clear();
                    break;
                }
                "*" => {
                    out.push((path.clone(), Some("*".into())));
                    path.clear();
                    break;
                }
                "as" => {
                    if let Some(alias) = part.get(k + 1) {
                        out.push((path.clone(), Some(alias.clone())));
                    }
                    path.clear();
                    break;
                }
                s if is_ident(s) => {
                    path.push(s.to_owned());
                    k += 1;
                }
                _ => break,
            }
        }
        if path.len() > prefix.len() {
            out.push((path, None));
        }
    }
}

/// `rel` (a path as written in module `here`) from the crate root; None for a path
/// into another crate. A plain first segment is local when it is one of
/// `children`, the modules the file declares (`use manager::X` in `lib.rs`).
fn absolute(here: &[String], rel: &[String], children: &[String]) -> Option<Vec<String>> {
    let mut out: Vec<String> = match rel.first().map(String::as_str) {
        Some("crate") => Vec::new(),
        Some("super") | Some("self") => here.to_vec(),
        Some(first) if children.iter().any(|c| c == first) => here.to_vec(),
        _ => return None,
    };
    let mut iter = rel.iter().peekable();
    if rel.first().is_some_and(|s| s == "crate") {
        iter.next();
    }
    for seg in iter {
        match seg.as_str() {
            "super" => {
                out.pop()?;
            }
            "self" => {}
            s => out.push(s.to_owned()),
        }
    }
    Some(out)
}

fn collect(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            collect(&p, ext, out);
        } else if p.extension().is_some_and(|x| x == ext) {
            out.push(p);
        }
    }
}

// ---------------------------------------------------------------- Python

/// The circles among the modules of the package at `pkg`, as text.
pub fn python_circles(pkg: &Path) -> Vec<String> {
    let mut files = Vec::new();
    collect(pkg, "py", &mut files);
    files.sort();
    let names: Vec<String> = files
        .iter()
        .map(|f| f.strip_prefix(pkg).unwrap_or(f).display().to_string())
        .collect();
    // Dotted module name (within the package) -> index; the package is "".
    let dotted: HashMap<String, usize> = names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let d = n
                .trim_end_matches(".py")
                .trim_end_matches("__init__")
                .trim_end_matches('/')
                .replace('/', ".");
            (d, i)
        })
        .collect();
    let mut edges = Edges::new();
    for (i, f) in files.iter().enumerate() {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        let here: Vec<&str> = {
            let d = names[i].trim_end_matches(".py");
            let mut parts: Vec<&str> = d.split('/').collect();
            parts.pop(); // the module itself: relative imports start at its package
            parts
        };
        for (module, names_imported) in python_imports(&text) {
            // Absolute within the package, or None for another package.
            let base = if let Some(rest) = module.strip_prefix('.') {
                let ups = rest.chars().take_while(|&c| c == '.').count();
                let rest = &rest[ups..];
                if ups > here.len() {
                    continue;
                }
                let mut p: Vec<&str> = here[..here.len() - ups].to_vec();
                p.extend(rest.split('.').filter(|s| !s.is_empty()));
                p.join(".")
            } else if module == "emm" {
                String::new()
            } else if let Some(rest) = module.strip_prefix("emm.") {
                rest.to_owned()
            } else {
                continue;
            };
            let mut targets = Vec::new();
            for n in &names_imported {
                // `from pkg import submodule` names the submodule.
                let sub = if base.is_empty() {
                    n.clone()
                } else {
                    format!("{base}.{n}")
                };
                match dotted.get(&sub) {
                    Some(&j) => targets.push((j, n.clone())),
                    None => {
                        if let Some(&j) = dotted.get(&base) {
                            targets.push((j, n.clone()));
                        }
                    }
                }
            }
            if names_imported.is_empty() {
                if let Some(&j) = dotted.get(&base) {
                    targets.push((j, base.clone()));
                }
            }
            for (j, n) in targets {
                if j != i {
                    edges.entry((i, j)).or_default().insert(n);
                }
            }
        }
    }
    circles(&names, &edges)
}

/// The imports of a Python file: (module as written, names imported; empty for
/// `import x`). Triple-quoted strings and comments are left out.
fn python_imports(text: &str) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    let mut in_string: Option<&str> = None;
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let mut rest = line;
        // Skip triple-quoted strings (docstrings) that span lines.
        if let Some(q) = in_string {
            match rest.find(q) {
                Some(k) => {
                    rest = &rest[k + 3..];
                    in_string = None;
                }
                None => continue,
            }
        }
        let code = rest.split('#').next().unwrap_or("").trim();
        for q in ["\"\"\"", "'''"] {
            if code.matches(q).count() % 2 == 1 {
                in_string = Some(q);
            }
        }
        let mut stmt = code.to_owned();
        if stmt.contains('(') && !stmt.contains(')') {
            for more in lines.by_ref() {
                stmt.push(' ');
                stmt.push_str(more.split('#').next().unwrap_or(""));
                if more.contains(')') {
                    break;
                }
            }
        }
        let stmt = stmt.replace(['(', ')'], " ");
        let words: Vec<&str> = stmt.split_whitespace().collect();
        match words.as_slice() {
            ["from", module, "import", names @ ..] => {
                let names: Vec<String> = names
                    .join(" ")
                    .split(',')
                    .filter_map(|n| n.split_whitespace().next())
                    .map(str::to_owned)
                    .collect();
                out.push(((*module).to_owned(), names));
            }
            ["import", modules @ ..] => {
                for m in modules.join(" ").split(',') {
                    if let Some(m) = m.split_whitespace().next() {
                        out.push((m.to_owned(), Vec::new()));
                    }
                }
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A folder for one test's sources, removed when the guard goes.
    fn tmp(name: &str) -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix(&format!("xtask-circles-{name}-"))
            .tempdir()
            .unwrap()
    }

    fn write(dir: &Path, rel: &str, text: &str) {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    #[test]
    fn a_two_file_circle_is_found_with_its_names() {
        let dir = tmp("rust-circle");
        let src = dir.path();
        write(src, "lib.rs", "mod a;\nmod b;\npub use a::A;\n");
        write(src, "a.rs", "use crate::b::B;\npub struct A(B);\n");
        write(
            src,
            "b.rs",
            "pub struct B;\nfn f() -> super::a::A { super::a::A(B) }\n",
        );
        let found = rust_circles(src);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("a.rs -> b.rs: B"), "{found:?}");
        assert!(found[0].contains("b.rs -> a.rs: A"), "{found:?}");
    }

    #[test]
    fn re_exports_comments_strings_and_test_modules_tie_nothing() {
        let dir = tmp("rust-clean");
        let src = dir.path();
        write(
            src,
            "lib.rs",
            "mod a;\nmod b;\npub use a::*;\npub use b::{B, helper as h};\npub fn top() {}\n",
        );
        // a uses b's items through the root's re-exports; b uses the root's own fn.
        write(
            src,
            "a.rs",
            "use crate::{B, h};\n/// [`crate::b::B`] in a comment\npub fn a() { let _ = \"crate::b::x\"; crate::top(); }\n",
        );
        write(
            src,
            "b.rs",
            "pub struct B;\npub fn helper() {}\nfn g() { crate::top() }\n#[cfg(test)]\nmod tests {\n    use super::*;\n    fn t() { super::helper(); }\n}\n",
        );
        assert_eq!(rust_circles(src), Vec::<String>::new());
        // ... but a glob re-export is followed: b naming crate::a() ties b to a.
        write(
            src,
            "b.rs",
            "pub struct B;\npub fn helper() { crate::a() }\n",
        );
        let found = rust_circles(src);
        assert_eq!(found.len(), 1, "{found:?}");
    }

    #[test]
    fn python_imports_in_functions_are_edges() {
        let dir = tmp("py");
        let pkg = dir.path();
        write(pkg, "__init__.py", "from ._lib import load\n");
        write(pkg, "_lib.py", "import os\n");
        write(
            pkg,
            "torch.py",
            "from . import _routes\nfrom ._lib import load\n",
        );
        write(
            pkg,
            "_routes.py",
            "\"\"\"Doc.\n\nfrom . import torch\n\"\"\"\ndef f():\n    from . import torch as et\n",
        );
        let found = python_circles(pkg);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].contains("_routes.py -> torch.py: torch"),
            "{found:?}"
        );
        write(pkg, "_routes.py", "import emm._lib\nfrom emm import _lib\n");
        assert_eq!(python_circles(pkg), Vec::<String>::new());
    }

    #[test]
    fn this_workspace_has_no_import_circle() {
        let found = check(&crate::cmd::workspace_root());
        assert!(found.is_empty(), "{}", found.join(""));
    }
}
