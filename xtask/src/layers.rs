//! The workspace's layers, read from `cargo metadata`: every workspace package
//! states the floor it stands on in its manifest,
//!
//! ```toml
//! [package.metadata.emm]
//! layer = 2
//! ```
//!
//! and its normal dependencies on other workspace packages all stand on lower
//! floors, so imports point one way. A package that states no floor, or states
//! one that is not a number, is a problem too: a new crate cannot slip past the
//! check. Dev-dependencies (tests) may reach anywhere.

use std::collections::BTreeMap;
use std::path::Path;

/// One workspace package: its floor, if stated, and its normal dependencies.
struct Package {
    layer: Option<u64>,
    stated: Option<String>,
    deps: Vec<String>,
}

/// The problems with the layers, one line each; empty when every package
/// states a floor and depends only downwards.
pub fn check(root: &Path) -> Result<Vec<String>, String> {
    let out = crate::cargo()
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(root)
        .output()
        .map_err(|e| format!("cargo metadata: could not start: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("cargo metadata printed something that is not JSON: {e}"))?;
    Ok(problems(&packages(&meta)))
}

/// The workspace's packages from `cargo metadata --no-deps` (which lists only
/// workspace members).
fn packages(meta: &serde_json::Value) -> BTreeMap<String, Package> {
    let mut out = BTreeMap::new();
    for p in meta["packages"].as_array().into_iter().flatten() {
        let Some(name) = p["name"].as_str() else {
            continue;
        };
        let layer = &p["metadata"]["emm"]["layer"];
        let deps = p["dependencies"]
            .as_array()
            .into_iter()
            .flatten()
            // `kind` is null for normal dependencies ("dev", "build" otherwise).
            .filter(|d| d["kind"].is_null())
            .filter_map(|d| d["name"].as_str().map(str::to_owned))
            .collect();
        out.insert(
            name.to_owned(),
            Package {
                layer: layer.as_u64(),
                stated: (!layer.is_null()).then(|| layer.to_string()),
                deps,
            },
        );
    }
    out
}

fn problems(pkgs: &BTreeMap<String, Package>) -> Vec<String> {
    let mut out = Vec::new();
    for (name, p) in pkgs {
        let Some(layer) = p.layer else {
            out.push(match &p.stated {
                Some(v) => format!("{name} states layer = {v}: a floor is a whole number"),
                None => format!(
                    "{name} states no floor: add [package.metadata.emm] layer = N to its Cargo.toml"
                ),
            });
            continue;
        };
        for d in &p.deps {
            let Some(dep) = pkgs.get(d) else {
                continue; // not a workspace package
            };
            if let Some(dl) = dep.layer.filter(|&dl| dl >= layer) {
                out.push(format!(
                    "{name} (layer {layer}) depends on {d} (layer {dl}): a layer may depend only on lower ones"
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A package for [`meta`]: name, stated floor, dependencies with their kind.
    type Entry<'a> = (&'a str, serde_json::Value, &'a [(&'a str, Option<&'a str>)]);

    fn meta(entries: &[Entry<'_>]) -> serde_json::Value {
        let pkgs: Vec<_> = entries
            .iter()
            .map(|(name, layer, deps)| {
                let deps: Vec<_> = deps
                    .iter()
                    .map(|(d, kind)| serde_json::json!({"name": d, "kind": kind}))
                    .collect();
                serde_json::json!({"name": name, "metadata": {"emm": {"layer": layer}}, "dependencies": deps})
            })
            .collect();
        serde_json::json!({ "packages": pkgs })
    }

    #[test]
    fn downward_dependencies_pass_and_upward_or_sideways_ones_fail() {
        let ok = meta(&[
            ("a", serde_json::json!(0), &[("libc", None)]),
            ("b", serde_json::json!(1), &[("a", None)]),
            (
                "c",
                serde_json::json!(1),
                &[("a", None), ("b", Some("dev"))],
            ),
        ]);
        assert!(problems(&packages(&ok)).is_empty());
        let bad = meta(&[
            ("a", serde_json::json!(0), &[("b", None)]),
            ("b", serde_json::json!(1), &[("c", None)]),
            ("c", serde_json::json!(1), &[]),
        ]);
        let p = problems(&packages(&bad));
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(p[0].contains("a (layer 0) depends on b (layer 1)"), "{p:?}");
        assert!(p[1].contains("b (layer 1) depends on c (layer 1)"), "{p:?}");
    }

    #[test]
    fn a_package_without_a_floor_is_a_problem() {
        let m = meta(&[
            ("a", serde_json::Value::Null, &[]),
            ("b", serde_json::json!("two"), &[]),
        ]);
        let p = problems(&packages(&m));
        assert!(p[0].contains("a states no floor"), "{p:?}");
        assert!(p[1].contains("b states layer = \"two\""), "{p:?}");
    }
}
