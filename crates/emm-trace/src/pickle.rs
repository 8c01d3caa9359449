//! A pickle decoder for snapshots that keeps Python's sharing: an object the
//! pickle writes once and refers to again (a memo reference: the same entry dict
//! repeated in a list, a frame list or a string used by many entries) is one
//! object here too, referred to from every place that holds it.
//!
//! `serde-pickle` copies such an object into each place and counts its uses to
//! free its memo entry: a shared container whose own contents are shared is used
//! more often than counted, and decoded empty (`None`) after its first use. Here
//! containers live in an arena ([`Pickle::nodes`]) and values refer to them by
//! index, so a reference costs one index, nothing is expanded, a cycle is harmless
//! and decoding does not recurse (no input can overflow the stack). Every opcode
//! makes at most one value, so memory is bounded by the input's length.
//!
//! Scalars, strings, containers (list, tuple, dict, set) and protocols 0 to 5
//! are read; other objects (globals, `REDUCE`, persistent ids, …) become
//! [`Val::Object`], which a snapshot reader reports as unexpected where it needs
//! a value.

use crate::nesting::{le, line, max_containers, max_memo, stack_passed, take};
use std::collections::HashMap;
use std::rc::Rc;

/// A decoded value: a scalar, or a container in the arena.
#[derive(Clone, Debug)]
pub(crate) enum Val {
    /// `None`.
    None,
    /// `True` or `False`.
    Bool(bool),
    /// An integer that fits in an `i64`.
    Int(i64),
    /// An integer too large for an `i64` (its bytes, little-endian two's complement).
    BigInt,
    /// A float.
    Float(f64),
    /// A `str` (shared: a memo reference costs no copy).
    Str(Rc<str>),
    /// `bytes`, `bytearray` or a protocol 0-2 byte string that is not UTF-8.
    Bytes(usize),
    /// A list, tuple, dict or set: index into [`Pickle::nodes`].
    Node(u32),
    /// Any other Python object (a global, the result of a call, a buffer, …).
    Object,
}

/// A container.
#[derive(Debug)]
pub(crate) enum Node {
    /// A list.
    List(Vec<Val>),
    /// A tuple.
    Tuple(Vec<Val>),
    /// A dict (boxed, so a container costs 32 bytes whatever its kind).
    Dict(Box<Dict>),
    /// A set or frozenset.
    Set(Vec<Val>),
}

/// A dict: its string keys (the last value set wins, as in Python), and how
/// many entries had other keys.
#[derive(Debug, Default)]
pub(crate) struct Dict {
    /// Entries with a `str` key.
    pub(crate) by_name: HashMap<Rc<str>, Val>,
    /// Entries with any other key (kept only as a count).
    pub(crate) other_keys: usize,
}

/// `s` for a message: the Debug form of its first 60 characters, and "…" when
/// cut. Only the prefix is escaped, so a huge string costs nothing here.
pub(crate) fn short_str(s: &str) -> String {
    let mut it = s.char_indices();
    let cut = it.nth(60).map_or(s.len(), |(i, _)| i);
    let more = if cut < s.len() { "…" } else { "" };
    format!("{:?}{more}", &s[..cut])
}

/// A scalar for a message, bounded in length whatever the value.
fn scalar(v: &Val) -> String {
    match v {
        Val::Str(s) => format!("String({})", short_str(s)),
        Val::Bytes(n) => format!("{n} bytes"),
        Val::Object => "a Python object".into(),
        Val::BigInt => "an integer beyond 64 bits".into(),
        Val::Float(f) => format!("Float({f})"),
        Val::Node(i) => format!("container {i}"),
        Val::None => "None".into(),
        Val::Bool(b) => format!("Bool({b})"),
        Val::Int(i) => format!("Int({i})"),
    }
}

/// A decoded pickle: the arena of containers and the top value.
#[derive(Debug)]
pub(crate) struct Pickle {
    /// Every container, referred to by [`Val::Node`].
    pub(crate) nodes: Vec<Node>,
    /// What the pickle holds.
    pub(crate) root: Val,
    /// The length of the pickle, in bytes.
    pub(crate) len: usize,
}

impl Pickle {
    /// The container `v` is, if any.
    pub(crate) fn node(&self, v: &Val) -> Option<&Node> {
        match v {
            Val::Node(i) => self.nodes.get(*i as usize),
            _ => None,
        }
    }

    /// `v` as a dict's string-keyed entries.
    pub(crate) fn dict(&self, v: &Val) -> Option<&HashMap<Rc<str>, Val>> {
        match self.node(v) {
            Some(Node::Dict(d)) => Some(&d.by_name),
            _ => None,
        }
    }

    /// `v` as a list's or tuple's items.
    pub(crate) fn list(&self, v: &Val) -> Option<&[Val]> {
        match self.node(v) {
            Some(Node::List(l) | Node::Tuple(l)) => Some(l),
            _ => None,
        }
    }

    /// A short description of `v` for messages: `a dict with 3 keys`, `a list of
    /// 2`, `Int(7)`, …
    pub(crate) fn describe(&self, v: &Val) -> String {
        match self.node(v) {
            Some(Node::Dict(d)) => format!("a dict with {} keys", d.by_name.len() + d.other_keys),
            Some(Node::List(l)) => format!("a list of {}", l.len()),
            Some(Node::Tuple(l)) => format!("a tuple of {}", l.len()),
            Some(Node::Set(s)) => format!("a set of {}", s.len()),
            None => scalar(v),
        }
    }
}

/// The pickle machine: its stack, marks and memo.
struct Machine {
    nodes: Vec<Node>,
    stack: Vec<Val>,
    marks: Vec<usize>,
    memo: HashMap<u64, Val>,
    /// [`max_containers`] of the input.
    max_nodes: usize,
    /// [`max_memo`] of the input.
    max_memo: usize,
    /// The input's length.
    len: usize,
}

type R<T> = Result<T, String>;

impl Machine {
    fn push(&mut self, v: Val) {
        self.stack.push(v);
    }

    fn pop(&mut self) -> R<Val> {
        self.stack
            .pop()
            .ok_or_else(|| "pops an empty stack".to_owned())
    }

    fn pop_mark(&mut self) -> R<Vec<Val>> {
        let at = self.marks.pop().ok_or("no MARK to pop to")?;
        if at > self.stack.len() {
            return Err("a MARK above the stack".into());
        }
        Ok(self.stack.split_off(at))
    }

    fn new_node(&mut self, n: Node) -> R<Val> {
        if self.nodes.len() >= self.max_nodes {
            return Err(format!(
                "more than {} containers in a file of {} bytes (at most one per 16 bytes, plus 4096)",
                self.max_nodes,
                self.len
            ));
        }
        let i = u32::try_from(self.nodes.len()).map_err(|_| "more than 2^32 containers")?;
        self.nodes.push(n);
        Ok(Val::Node(i))
    }

    fn dict_from(&mut self, items: Vec<Val>) -> R<Val> {
        let v = self.new_node(Node::Dict(Box::default()))?;
        self.set_items(&v, items)?;
        Ok(v)
    }

    /// The container on top of the stack (what APPEND, SETITEM, … add to);
    /// `None` for another object, whose additions are dropped.
    fn top_node(&mut self) -> R<Option<usize>> {
        match self.stack.last() {
            Some(Val::Node(i)) => Ok(Some(*i as usize)),
            Some(Val::Object) => Ok(None),
            Some(other) => Err(format!("adds items to {}, not a container", scalar(other))),
            None => Err("adds items with nothing on the stack".into()),
        }
    }

    fn append(&mut self, items: Vec<Val>) -> R<()> {
        let Some(i) = self.top_node()? else {
            return Ok(());
        };
        match self.nodes.get_mut(i) {
            Some(Node::List(l)) => {
                l.extend(items);
                Ok(())
            }
            _ => Err("APPEND to something that is not a list".into()),
        }
    }

    fn set_items(&mut self, target: &Val, items: Vec<Val>) -> R<()> {
        if items.len() % 2 != 0 {
            return Err("a dict's items are not key-value pairs".into());
        }
        let Val::Node(i) = target else {
            return Ok(());
        };
        let Some(Node::Dict(d)) = self.nodes.get_mut(*i as usize) else {
            return Err("SETITEM on something that is not a dict".into());
        };
        let mut it = items.into_iter();
        while let (Some(k), Some(v)) = (it.next(), it.next()) {
            match k {
                Val::Str(s) => {
                    d.by_name.insert(s, v);
                }
                _ => d.other_keys += 1,
            }
        }
        Ok(())
    }

    fn top_set_items(&mut self, items: Vec<Val>) -> R<()> {
        match self.stack.last().cloned() {
            Some(t @ Val::Node(_)) => self.set_items(&t, items),
            Some(Val::Object) => Ok(()),
            _ => Err("SETITEM on something that is not a dict".into()),
        }
    }

    fn memo_get(&self, id: u64) -> R<Val> {
        self.memo
            .get(&id)
            .cloned()
            .ok_or_else(|| format!("a GET of memo entry {id}, which was never PUT"))
    }
}

/// A length-prefixed payload: `width` bytes of length, then the bytes.
fn counted<'a>(data: &'a [u8], at: &mut usize, width: usize) -> R<&'a [u8]> {
    let n = le(take(data, at, width)?);
    let n = usize::try_from(n).map_err(|_| "a length past the address space")?;
    take(data, at, n)
}

/// A little-endian two's complement integer of any length (LONG1, LONG4).
fn long(bytes: &[u8]) -> Val {
    if bytes.is_empty() {
        return Val::Int(0);
    }
    if bytes.len() > 8 {
        // Fits only if the extra bytes are sign extension.
        let neg = bytes[bytes.len() - 1] & 0x80 != 0;
        let fill = if neg { 0xff } else { 0 };
        let (low, high) = bytes.split_at(8);
        if high.iter().all(|&b| b == fill) && (low[7] & 0x80 != 0) == neg {
            return long(low);
        }
        return Val::BigInt;
    }
    let mut v = le(bytes);
    if bytes[bytes.len() - 1] & 0x80 != 0 && bytes.len() < 8 {
        v |= u64::MAX << (8 * bytes.len());
    }
    Val::Int(v as i64)
}

fn text_int(l: &[u8]) -> R<Val> {
    let s = std::str::from_utf8(l).map_err(|_| "an INT that is not text")?;
    let s = s.trim().trim_end_matches('L');
    match s {
        "00" => return Ok(Val::Bool(false)),
        "01" => return Ok(Val::Bool(true)),
        _ => {}
    }
    match s.parse::<i64>() {
        Ok(i) => Ok(Val::Int(i)),
        Err(_)
            if !s.is_empty()
                && s.trim_start_matches('-')
                    .bytes()
                    .all(|b| b.is_ascii_digit()) =>
        {
            Ok(Val::BigInt)
        }
        Err(_) => Err(format!(
            "an INT or LONG {} that is not a number",
            short_str(s)
        )),
    }
}

fn text(bytes: &[u8]) -> Val {
    match std::str::from_utf8(bytes) {
        Ok(s) => Val::Str(Rc::from(s)),
        Err(_) => Val::Bytes(bytes.len()),
    }
}

/// Protocol 0's `STRING` argument: a quoted Python literal; escapes other than
/// `\\`, `\'` and `\"` are kept as written (snapshot strings need none).
fn quoted(l: &[u8]) -> R<Val> {
    let inner = match l {
        [q @ (b'\'' | b'"'), inner @ .., last] if last == q => inner,
        _ => return Err("a STRING that is not quoted".into()),
    };
    let mut out = Vec::with_capacity(inner.len());
    let mut it = inner.iter();
    while let Some(&b) = it.next() {
        if b == b'\\' {
            match it.next() {
                Some(&e @ (b'\\' | b'\'' | b'"')) => out.push(e),
                Some(&e) => out.extend([b'\\', e]),
                None => out.push(b'\\'),
            }
        } else {
            out.push(b);
        }
    }
    Ok(text(&out))
}

/// Protocol 0's `UNICODE` argument: raw-unicode-escape (`\uXXXX`, `\UXXXXXXXX`).
fn raw_unicode(l: &[u8]) -> Val {
    let mut out = String::with_capacity(l.len());
    let mut i = 0;
    while i < l.len() {
        let esc = match (l[i], l.get(i + 1)) {
            (b'\\', Some(b'u')) => Some(4),
            (b'\\', Some(b'U')) => Some(8),
            _ => None,
        };
        if let Some(n) = esc {
            let c = l
                .get(i + 2..i + 2 + n)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u32::from_str_radix(h, 16).ok())
                .and_then(char::from_u32);
            if let Some(c) = c {
                out.push(c);
                i += 2 + n;
                continue;
            }
        }
        // Latin-1 for everything else, as raw-unicode-escape is.
        out.push(char::from(l[i]));
        i += 1;
    }
    Val::Str(Rc::from(out))
}

/// Decodes `data`, one pickle, up to its `STOP`. `Err` says what is wrong.
pub(crate) fn decode(data: &[u8]) -> R<Pickle> {
    let mut m = Machine {
        nodes: Vec::new(),
        stack: Vec::new(),
        marks: Vec::new(),
        memo: HashMap::new(),
        max_nodes: max_containers(data.len()),
        max_memo: max_memo(data.len()),
        len: data.len(),
    };
    let mut at = 0usize;
    loop {
        let Some(&op) = data.get(at) else {
            return Err("ends without STOP".into());
        };
        let pos = at;
        at += 1;
        let step = |m: &mut Machine, at: &mut usize| -> R<bool> {
            match op {
                0x80 => drop(take(data, at, 1)?), // PROTO
                0x95 => drop(take(data, at, 8)?), // FRAME
                b'.' => return Ok(true),          // STOP
                b'(' => m.marks.push(m.stack.len()),
                b'0' => {
                    // POP: the top item, or the mark when the stack above it is empty.
                    if m.marks.last() == Some(&m.stack.len()) {
                        m.pop_mark()?;
                    } else {
                        m.pop()?;
                    }
                }
                b'1' => drop(m.pop_mark()?),
                b'2' => {
                    let t = m.stack.last().cloned().ok_or("DUP of an empty stack")?;
                    m.push(t);
                }
                b'N' => m.push(Val::None),
                0x88 => m.push(Val::Bool(true)),
                0x89 => m.push(Val::Bool(false)),
                b'I' | b'L' => {
                    let v = text_int(line(data, at)?)?;
                    m.push(v);
                }
                b'F' => {
                    let l = line(data, at)?;
                    let f = std::str::from_utf8(l)
                        .ok()
                        .and_then(|s| s.trim().parse::<f64>().ok())
                        .ok_or("a FLOAT that is not a number")?;
                    m.push(Val::Float(f));
                }
                b'G' => {
                    let b = take(data, at, 8)?;
                    let mut a = [0u8; 8];
                    a.copy_from_slice(b);
                    m.push(Val::Float(f64::from_be_bytes(a)));
                }
                b'K' => {
                    let v = take(data, at, 1)?[0];
                    m.push(Val::Int(i64::from(v)));
                }
                b'M' => {
                    let v = le(take(data, at, 2)?);
                    m.push(Val::Int(v as i64));
                }
                b'J' => {
                    let v = le(take(data, at, 4)?) as u32 as i32;
                    m.push(Val::Int(i64::from(v)));
                }
                0x8a => {
                    let v = long(counted(data, at, 1)?);
                    m.push(v);
                }
                0x8b => {
                    let v = long(counted(data, at, 4)?);
                    m.push(v);
                }
                b'S' => {
                    let v = quoted(line(data, at)?)?;
                    m.push(v);
                }
                b'V' => {
                    let v = raw_unicode(line(data, at)?);
                    m.push(v);
                }
                b'P' => {
                    line(data, at)?;
                    m.push(Val::Object);
                }
                b'U' => {
                    let v = text(counted(data, at, 1)?);
                    m.push(v);
                }
                b'T' => {
                    let v = text(counted(data, at, 4)?);
                    m.push(v);
                }
                0x8c => {
                    let v = text(counted(data, at, 1)?);
                    m.push(v);
                }
                b'X' => {
                    let v = text(counted(data, at, 4)?);
                    m.push(v);
                }
                0x8d => {
                    let v = text(counted(data, at, 8)?);
                    m.push(v);
                }
                b'C' => {
                    let n = counted(data, at, 1)?.len();
                    m.push(Val::Bytes(n));
                }
                b'B' => {
                    let n = counted(data, at, 4)?.len();
                    m.push(Val::Bytes(n));
                }
                0x8e | 0x96 => {
                    let n = counted(data, at, 8)?.len();
                    m.push(Val::Bytes(n));
                }
                0x97 => m.push(Val::Object), // NEXT_BUFFER
                0x98 => {}                   // READONLY_BUFFER
                b']' => {
                    let v = m.new_node(Node::List(Vec::new()))?;
                    m.push(v);
                }
                b')' => {
                    let v = m.new_node(Node::Tuple(Vec::new()))?;
                    m.push(v);
                }
                b'}' => {
                    let v = m.dict_from(Vec::new())?;
                    m.push(v);
                }
                0x8f => {
                    let v = m.new_node(Node::Set(Vec::new()))?;
                    m.push(v);
                }
                b'l' => {
                    let items = m.pop_mark()?;
                    let v = m.new_node(Node::List(items))?;
                    m.push(v);
                }
                b't' => {
                    let items = m.pop_mark()?;
                    let v = m.new_node(Node::Tuple(items))?;
                    m.push(v);
                }
                0x85..=0x87 => {
                    let n = usize::from(op - 0x84);
                    if m.stack.len() < n || m.marks.last().is_some_and(|&k| k > m.stack.len() - n) {
                        return Err("a tuple of missing items".into());
                    }
                    let items = m.stack.split_off(m.stack.len() - n);
                    let v = m.new_node(Node::Tuple(items))?;
                    m.push(v);
                }
                b'd' => {
                    let items = m.pop_mark()?;
                    let v = m.dict_from(items)?;
                    m.push(v);
                }
                0x91 => {
                    let items = m.pop_mark()?;
                    let v = m.new_node(Node::Set(items))?;
                    m.push(v);
                }
                b'a' => {
                    let x = m.pop()?;
                    m.append(vec![x])?;
                }
                b'e' => {
                    let items = m.pop_mark()?;
                    m.append(items)?;
                }
                b's' => {
                    let v = m.pop()?;
                    let k = m.pop()?;
                    m.top_set_items(vec![k, v])?;
                }
                b'u' => {
                    let items = m.pop_mark()?;
                    m.top_set_items(items)?;
                }
                0x90 => {
                    let items = m.pop_mark()?;
                    if let Some(i) = m.top_node()? {
                        match m.nodes.get_mut(i) {
                            Some(Node::Set(s)) => s.extend(items),
                            _ => return Err("ADDITEMS to something that is not a set".into()),
                        }
                    }
                }
                // Objects: a global, a call, an instance. Their arguments go; the
                // object stays opaque.
                b'c' => {
                    line(data, at)?;
                    line(data, at)?;
                    m.push(Val::Object);
                }
                0x93 => {
                    m.pop()?;
                    m.pop()?;
                    m.push(Val::Object);
                }
                b'R' | 0x81 => {
                    m.pop()?;
                    m.pop()?;
                    m.push(Val::Object);
                }
                0x92 => {
                    m.pop()?;
                    m.pop()?;
                    m.pop()?;
                    m.push(Val::Object);
                }
                b'b' => {
                    m.pop()?;
                    if m.stack.is_empty() {
                        return Err("BUILD with nothing to build".into());
                    }
                }
                b'i' => {
                    line(data, at)?;
                    line(data, at)?;
                    m.pop_mark()?;
                    m.push(Val::Object);
                }
                b'o' => {
                    m.pop_mark()?;
                    m.push(Val::Object);
                }
                b'Q' => {
                    m.pop()?;
                    m.push(Val::Object);
                }
                0x82 => {
                    take(data, at, 1)?;
                    m.push(Val::Object);
                }
                0x83 => {
                    take(data, at, 2)?;
                    m.push(Val::Object);
                }
                0x84 => {
                    take(data, at, 4)?;
                    m.push(Val::Object);
                }
                // The memo.
                b'p' | b'q' | b'r' | 0x94 => {
                    let id = match op {
                        b'p' => std::str::from_utf8(line(data, at)?)
                            .ok()
                            .and_then(|s| s.trim().parse().ok())
                            .ok_or("a PUT index that is not a number")?,
                        b'q' => le(take(data, at, 1)?),
                        b'r' => le(take(data, at, 4)?),
                        _ => m.memo.len() as u64,
                    };
                    let t = m.stack.last().cloned().ok_or("PUT of an empty stack")?;
                    if m.memo.len() >= m.max_memo && !m.memo.contains_key(&id) {
                        return Err(format!(
                            "more than {} memo entries in a file of {} bytes (at most one per 8 bytes, plus 4096)",
                            m.max_memo,
                            m.len
                        ));
                    }
                    m.memo.insert(id, t);
                }
                b'g' | b'h' | b'j' => {
                    let id = match op {
                        b'g' => std::str::from_utf8(line(data, at)?)
                            .ok()
                            .and_then(|s| s.trim().parse().ok())
                            .ok_or("a GET index that is not a number")?,
                        b'h' => le(take(data, at, 1)?),
                        _ => le(take(data, at, 4)?),
                    };
                    let v = m.memo_get(id)?;
                    m.push(v);
                }
                other => return Err(format!("unknown opcode {other:#04x}")),
            }
            Ok(false)
        };
        match step(&mut m, &mut at) {
            Ok(false) => {}
            Ok(true) => break,
            Err(e) => return Err(format!("{e} (opcode {op:#04x} at byte {pos})")),
        }
        if let Some(e) = stack_passed(m.stack.len(), m.marks.len()) {
            return Err(format!("{e} at byte {pos}"));
        }
    }
    let root = m.pop()?;
    Ok(Pickle {
        nodes: m.nodes,
        root,
        len: data.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_memo_reference_is_the_same_object_every_time() {
        // d = {'a': 'x'}; [d, d, d] at protocol 2: d is PUT once and GOT twice.
        let p = b"\x80\x02]q\x00(}q\x01X\x01\x00\x00\x00aq\x02X\x01\x00\x00\x00xq\x03sh\x01h\x01e.";
        let k = decode(p).unwrap();
        let l = k.list(&k.root).unwrap();
        assert_eq!(l.len(), 3);
        for v in l {
            let d = k.dict(v).unwrap();
            assert!(matches!(d.get("a"), Some(Val::Str(s)) if &**s == "x"));
        }
    }

    #[test]
    fn integers_of_any_width_and_sign() {
        assert!(matches!(long(&[]), Val::Int(0)));
        assert!(matches!(long(&[0xff]), Val::Int(-1)));
        assert!(matches!(
            long(&[0, 0, 0, 0, 0xf0, 0x7f]),
            Val::Int(0x7ff0_0000_0000)
        ));
        assert!(matches!(long(&[1; 9]), Val::BigInt));
        assert!(matches!(long(&[0xff; 12]), Val::Int(-1)));
        assert!(matches!(text_int(b"01").unwrap(), Val::Bool(true)));
        assert!(matches!(text_int(b"-12L").unwrap(), Val::Int(-12)));
    }

    #[test]
    fn messages_format_only_a_prefix_of_a_string() {
        let big: Rc<str> = Rc::from("\u{1}".repeat(10_000_000));
        let p = Pickle {
            nodes: Vec::new(),
            root: Val::Str(big),
            len: 0,
        };
        let d = p.describe(&p.root);
        assert!(d.starts_with("String(\"\\u{1}"), "{d}");
        assert!(d.ends_with("…)"), "{d}");
        assert!(d.len() < 60 * 8, "{}", d.len());
        assert_eq!(short_str("ab"), "\"ab\"");
    }

    #[test]
    fn memo_entries_are_bounded_by_the_input() {
        let mut p = vec![0x80, 4, b'N'];
        p.extend(std::iter::repeat_n(0x94, 100_000));
        p.push(b'.');
        let e = decode(&p).unwrap_err();
        assert!(e.contains("more than 16596 memo entries"), "{e}");
        assert!(crate::nesting::depth(&p, 10).is_err());
    }

    #[test]
    fn the_stack_and_its_marks_are_bounded() {
        use crate::nesting::MAX_STACK;
        // A byte an item: `NONE`s, then `MARK`s; a list just under the bound
        // (MARK, its items, APPENDS) is read.
        for op in [b'N', b'('] {
            let mut p = vec![0x80, 2];
            p.extend(std::iter::repeat_n(op, MAX_STACK + 1));
            p.push(b'.');
            let e = decode(&p).unwrap_err();
            assert!(e.contains("the stack passed 1048576 items"), "{e}");
            let e = crate::nesting::depth(&p, 10).unwrap_err();
            assert!(e.contains("the stack passed"), "{e}");
        }
        let mut p = vec![0x80, 2, b']', b'('];
        p.extend(std::iter::repeat_n(b'N', MAX_STACK - 2));
        p.extend([b'e', b'.']);
        let k = decode(&p).unwrap();
        assert_eq!(k.list(&k.root).map(<[Val]>::len), Some(MAX_STACK - 2));
    }

    #[test]
    fn a_cycle_and_bad_input_do_not_hang_or_panic() {
        // l = []; l.append(l)
        let k = decode(b"\x80\x02]q\x00h\x00a.").unwrap();
        assert_eq!(k.list(&k.root).map(<[Val]>::len), Some(1));
        for bad in [
            &b""[..],
            b"\x80",
            b"h\x05.",
            b"a.",
            b"(t",
            b"\xff",
            b"X\xff\xff\xff\xff",
        ] {
            assert!(decode(bad).is_err(), "{bad:?}");
        }
    }
}
