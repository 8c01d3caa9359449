//! Link text that rustdoc left literal: an intra-doc link it could not resolve in
//! a place where `-D warnings` does not see it (a README included as crate docs, a
//! link to a crate that is not a dependency), rendered as `[emm_default::X]`.
//!
//! Reads the HTML of the workspace's crates under `target/doc/` after `cargo doc`,
//! drops what is code (`<code>`, `<pre>`, attribute listings) and markup, and
//! reports every `[name]` or `[path::name]` left in the prose.

use std::path::{Path, PathBuf};

/// Checks `target/doc/<crate>/` for every crate in `crates`.
pub fn check(root: &Path, crates: &[String]) -> Result<(), String> {
    let doc = crate::target_dir(root).join("doc");
    let mut found = Vec::new();
    let mut checked = 0;
    for name in crates {
        let dir = doc.join(name.replace('-', "_"));
        if !dir.is_dir() {
            continue; // a binary crate without library docs
        }
        checked += 1;
        let mut files = Vec::new();
        html_files(&dir, &mut files);
        for file in files {
            let Ok(text) = std::fs::read_to_string(&file) else {
                continue;
            };
            for link in literal_links(&text) {
                found.push(format!(
                    "{}: {link}",
                    file.strip_prefix(&doc).unwrap_or(&file).display()
                ));
            }
        }
    }
    if checked == 0 {
        return Err(format!(
            "step `doc links`: no rendered crate docs under {}; run `cargo doc --workspace --no-deps` first",
            doc.display()
        ));
    }
    found.sort();
    found.dedup();
    if found.is_empty() {
        eprintln!("==> doc links: no literal link text in the rendered docs of {checked} crates");
        Ok(())
    } else {
        Err(format!(
            "step `doc links`: rustdoc left {} link(s) as literal text:\n    {}\n    hint: link to an item the crate can name (a dependency, or a full path through one), or write the name in backticks without brackets",
            found.len(),
            found.join("\n    ")
        ))
    }
}

fn html_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            html_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "html") {
            out.push(path);
        }
    }
}

/// The `[name]` / `[a::b]` / `[name()]` texts left in the prose of one page.
pub fn literal_links(html: &str) -> Vec<String> {
    let prose = prose(html);
    let mut links = Vec::new();
    let bytes = prose.as_bytes();
    let mut i = 0;
    while let Some(open) = prose[i..].find('[').map(|k| i + k) {
        let Some(close) = prose[open..].find(']').map(|k| open + k) else {
            break;
        };
        let inner = &prose[open + 1..close];
        let path = inner.strip_suffix("()").unwrap_or(inner);
        let is_path = !path.is_empty()
            && path.split("::").all(|seg| {
                !seg.is_empty()
                    && seg
                        .chars()
                        .next()
                        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                    && seg.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            });
        let attribute = open > 0 && bytes[open - 1] == b'#';
        if is_path && !attribute {
            links.push(format!("[{inner}]"));
        }
        i = open + 1;
    }
    links
}

/// The text of a page outside code, comments and tags.
fn prose(html: &str) -> String {
    let mut out = String::with_capacity(html.len() / 2);
    let mut rest = html;
    let skip_blocks = [
        ("<!--", "-->"),
        ("<code", "</code>"),
        ("<pre", "</pre>"),
        ("<script", "</script>"),
        ("<style", "</style>"),
    ];
    while let Some(lt) = rest.find('<') {
        out.push_str(&rest[..lt]);
        rest = &rest[lt..];
        if let Some((_, end)) = skip_blocks
            .iter()
            .find(|(start, _)| rest.starts_with(start))
        {
            rest = rest.find(end).map_or("", |k| &rest[k + end.len()..]);
        } else if rest[..rest.find('>').unwrap_or(rest.len())].contains("code-header") {
            // A signature (`fn hash_slice(data: &[Self])`): code, not prose.
            let name: String = rest[1..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric())
                .collect();
            let close = format!("</{name}>");
            rest = rest.find(&close).map_or("", |k| &rest[k + close.len()..]);
        } else {
            rest = rest.find('>').map_or("", |k| &rest[k + 1..]);
            out.push(' ');
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::literal_links;

    #[test]
    fn finds_literal_links_and_ignores_code_attributes_and_resolved_links() {
        let html = r#"<p>See [emm_default::DefaultManager] and [HostOnly], <a href="x">Pool</a>,
            <code>[not_this]</code>, #[non_exhaustive], [1, 2], [a b], [KEYS()]</p>
            <pre class="rust">let v = [x];</pre><!--[if lt IE 9]><![endif]-->
            <h4 class="code-header">fn hash_slice(data: &amp;[Self])</h4>"#;
        assert_eq!(
            literal_links(html),
            ["[emm_default::DefaultManager]", "[HostOnly]", "[KEYS()]"]
        );
    }
}
