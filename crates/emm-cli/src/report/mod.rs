//! What `emm replay` found, as data (serialised with `serde_json` for `--json`) and
//! as the text table.
//!
//! - `model.rs`: the data, [`Report`] and what it holds.
//! - `lines.rs`: the sentences under the table (and on the page).
//! - `table.rs`: the table, followed by those sentences.
//!
//! Files point one way: `table` -> `lines` -> `model`.

use std::io;

use crate::out::Out;

mod lines;
mod model;
mod table;
#[cfg(test)]
mod tests;

pub use lines::*;
pub use model::*;
pub use table::*;

/// Writes the report as one JSON document.
pub fn json(out: &mut Out, r: &Report) -> io::Result<()> {
    let mut text = serde_json::to_string_pretty(r).map_err(io::Error::other)?;
    text.push('\n');
    out.bytes(text.as_bytes())
}
