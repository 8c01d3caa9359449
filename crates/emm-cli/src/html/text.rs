//! What every part of the page writes with: HTML escaping, the managers'
//! colours, and data for the page's script as JSON that cannot end its
//! `<script>` element.

/// Escapes text for HTML and SVG (element content and attribute values).
pub fn escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

/// A manager's colour, the same in the table, the chart and the maps.
pub fn color(manager: &str) -> &'static str {
    match manager {
        "default" => "#d62728",
        "pool" => "#1f77b4",
        "pool-shared" => "#17becf",
        "hostonly" => "#2ca02c",
        "pytorch" => "#ff7f0e",
        "pytorch-native" => "#e377c2",
        "pytorch-expandable" => "#8c564b",
        _ => "#9467bd",
    }
}

/// `value` as JSON to put inside a `<script type="application/json">`: `<`
/// written as `\u003c`, so no string in it can close the element.
pub fn json_for_script(value: &serde_json::Value) -> String {
    value.to_string().replace('<', "\\u003c")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped() {
        assert_eq!(escape("a<b>&\"c'.csv"), "a&lt;b&gt;&amp;&quot;c&#39;.csv");
        let v = serde_json::json!({ "name": "</script><b>" });
        let s = json_for_script(&v);
        assert!(!s.contains("</"), "{s}");
        let back: serde_json::Value = serde_json::from_str(&s).unwrap();
        assert_eq!(back, v);
    }
}
