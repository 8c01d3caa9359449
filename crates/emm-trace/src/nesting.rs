//! How deeply a pickle's containers nest, found without recursion before the
//! snapshot reader decodes it: no snapshot nests more than a few levels, so a
//! deeper pickle is refused at once as not one. (It once guarded `serde-pickle`,
//! which recursed once per level; emm's decoder, `pickle`, does not recurse.)
//!
//! The scan runs the pickle machine's stack effects over the opcodes, keeping for
//! each container the containers put into it (memo references included, so a
//! container filled after it was nested counts), then takes the longest chain with
//! an explicit stack. Cycles end a chain.

use std::collections::HashMap;

/// An item on the simulated stack: a container (its index in the graph) or a
/// scalar.
#[derive(Clone, Copy)]
enum Item {
    Scalar,
    Container(u32),
}

struct Machine {
    stack: Vec<Item>,
    marks: Vec<usize>,
    memo: HashMap<u64, Item>,
    /// For each container, the containers put into it.
    children: Vec<Vec<u32>>,
    /// [`max_containers`] of the input.
    max_containers: usize,
    /// [`max_memo`] of the input.
    max_memo: usize,
    /// The input's length.
    len: usize,
}

impl Machine {
    fn pop(&mut self) -> Result<Item, String> {
        self.stack
            .pop()
            .ok_or_else(|| "pops an empty stack".to_owned())
    }

    fn pop_mark(&mut self) -> Result<Vec<Item>, String> {
        let at = self.marks.pop().ok_or("no MARK to pop to")?;
        if at > self.stack.len() {
            return Err("a MARK above the stack".into());
        }
        Ok(self.stack.split_off(at))
    }

    fn new_container(&mut self, items: &[Item]) -> Result<Item, String> {
        if self.children.len() >= self.max_containers {
            return Err(format!(
                "more than {} containers in a file of {} bytes (at most one per 16 bytes, plus 4096)",
                self.max_containers,
                self.len
            ));
        }
        let id = u32::try_from(self.children.len()).map_err(|_| "more than 2^32 containers")?;
        self.children.push(Vec::new());
        self.add_to(Item::Container(id), items);
        Ok(Item::Container(id))
    }

    fn add_to(&mut self, target: Item, items: &[Item]) {
        if let Item::Container(t) = target {
            for it in items {
                if let Item::Container(c) = it {
                    self.children[t as usize].push(*c);
                }
            }
        }
    }

    fn top(&self) -> Result<Item, String> {
        self.stack
            .last()
            .copied()
            .ok_or_else(|| "no object to add to".into())
    }
}

fn counted(data: &[u8], at: &mut usize, width: usize) -> Result<(), String> {
    let n = le(take(data, at, width)?);
    let n = usize::try_from(n).map_err(|_| "a length past the address space")?;
    take(data, at, n).map(|_| ())
}

/// The next `n` bytes from `at` (moved past them); "truncated" past the end.
pub(crate) fn take<'a>(data: &'a [u8], at: &mut usize, n: usize) -> Result<&'a [u8], String> {
    let end = at
        .checked_add(n)
        .filter(|&e| e <= data.len())
        .ok_or("truncated")?;
    let s = &data[*at..end];
    *at = end;
    Ok(s)
}

/// A little-endian unsigned number.
pub(crate) fn le(bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .rev()
        .fold(0u64, |v, &b| (v << 8) | u64::from(b))
}

/// The text up to the next newline from `at` (moved past it), without a
/// trailing carriage return; "truncated line" when there is none.
pub(crate) fn line<'a>(data: &'a [u8], at: &mut usize) -> Result<&'a [u8], String> {
    let rest = data.get(*at..).unwrap_or(&[]);
    let n = rest
        .iter()
        .position(|&b| b == b'\n')
        .ok_or("truncated line")?;
    *at += n + 1;
    let l = &rest[..n];
    Ok(l.strip_suffix(b"\r").unwrap_or(l))
}

/// The most containers a pickle of `len` bytes may make: one per 16 bytes, plus
/// 4096. A PyTorch snapshot makes one per 100 bytes or so; a file of bare
/// `EMPTY_LIST` opcodes, one per byte, is refused here instead of taking ~100
/// bytes of memory per byte of input.
pub(crate) fn max_containers(len: usize) -> usize {
    len / 16 + 4096
}

/// The most memo entries a pickle of `len` bytes may make: one per 8 bytes, plus
/// 4096 (a snapshot memoizes each container and string: one per 30 bytes or so).
pub(crate) fn max_memo(len: usize) -> usize {
    len / 8 + 4096
}

/// The most items the pickle machine's stack, or its marks, may hold at once.
/// Python's pickler writes a list's, dict's or set's items in batches of
/// 1,000 (a tuple's at once, and a snapshot's tuples are a few items), so a
/// snapshot's stack holds a few thousand at most; a file of bare `NONE` or
/// `MARK` opcodes, each a byte that pushes an item of 8 to 24 bytes, is
/// refused here instead of taking up to 26 bytes of memory per byte of input.
pub(crate) const MAX_STACK: usize = 1 << 20;

/// The error once `stack` or `marks` items passed [`MAX_STACK`].
pub(crate) fn stack_passed(stack: usize, marks: usize) -> Option<String> {
    (stack > MAX_STACK || marks > MAX_STACK).then(|| {
        format!(
            "the stack passed {MAX_STACK} items ({stack} items, {marks} marks; a snapshot's holds a few thousand)"
        )
    })
}

/// The deepest nesting of containers in `data`; `Err` says why the pickle cannot
/// be read (the decoder would refuse it too) or that it nests deeper than `limit`.
pub(crate) fn depth(data: &[u8], limit: usize) -> Result<usize, String> {
    let mut m = Machine {
        stack: Vec::new(),
        marks: Vec::new(),
        memo: HashMap::new(),
        children: Vec::new(),
        max_containers: max_containers(data.len()),
        max_memo: max_memo(data.len()),
        len: data.len(),
    };
    let mut at = 0usize;
    let mut root = None;
    let mut stopped = false;
    while at < data.len() {
        let op = data[at];
        at += 1;
        match op {
            0x80 => drop(take(data, &mut at, 1)?), // PROTO
            0x95 => drop(take(data, &mut at, 8)?), // FRAME
            b'.' => {
                root = m.stack.last().copied();
                stopped = true;
                break;
            }
            b'(' => m.marks.push(m.stack.len()),
            b'0' => drop(m.pop()?),
            b'1' => drop(m.pop_mark()?),
            b'2' => {
                let t = m.top()?;
                m.stack.push(t);
            }
            b'N' | 0x88 | 0x89 | 0x97 => m.stack.push(Item::Scalar),
            0x98 => {} // READONLY_BUFFER
            b'I' | b'L' | b'F' | b'S' | b'V' | b'P' => {
                line(data, &mut at)?;
                m.stack.push(Item::Scalar);
            }
            b'c' => {
                line(data, &mut at)?;
                line(data, &mut at)?;
                m.stack.push(Item::Scalar);
            }
            b'K' | 0x82 => {
                take(data, &mut at, 1)?;
                m.stack.push(Item::Scalar);
            }
            b'M' | 0x83 => {
                take(data, &mut at, 2)?;
                m.stack.push(Item::Scalar);
            }
            b'J' | 0x84 => {
                take(data, &mut at, 4)?;
                m.stack.push(Item::Scalar);
            }
            b'G' => {
                take(data, &mut at, 8)?;
                m.stack.push(Item::Scalar);
            }
            0x8a | b'U' | 0x8c | b'C' => {
                counted(data, &mut at, 1)?;
                m.stack.push(Item::Scalar);
            }
            0x8b | b'T' | b'X' | b'B' => {
                counted(data, &mut at, 4)?;
                m.stack.push(Item::Scalar);
            }
            0x8d | 0x8e | 0x96 => {
                counted(data, &mut at, 8)?;
                m.stack.push(Item::Scalar);
            }
            b']' | b'}' | b')' | 0x8f => {
                let c = m.new_container(&[])?;
                m.stack.push(c);
            }
            b'l' | b't' | b'd' | 0x91 | b'o' => {
                let items = m.pop_mark()?;
                let c = m.new_container(&items)?;
                m.stack.push(c);
            }
            b'i' => {
                line(data, &mut at)?;
                line(data, &mut at)?;
                let items = m.pop_mark()?;
                let c = m.new_container(&items)?;
                m.stack.push(c);
            }
            0x85..=0x87 => {
                let n = usize::from(op - 0x84);
                if m.stack.len() < n {
                    return Err("a tuple of missing items".into());
                }
                let items = m.stack.split_off(m.stack.len() - n);
                let c = m.new_container(&items)?;
                m.stack.push(c);
            }
            b'a' => {
                let x = m.pop()?;
                let t = m.top()?;
                m.add_to(t, &[x]);
            }
            b's' => {
                let v = m.pop()?;
                let k = m.pop()?;
                let t = m.top()?;
                m.add_to(t, &[k, v]);
            }
            b'e' | b'u' | 0x90 => {
                let items = m.pop_mark()?;
                let t = m.top()?;
                m.add_to(t, &items);
            }
            b'b' => {
                let state = m.pop()?;
                let t = m.top()?;
                m.add_to(t, &[state]);
            }
            b'R' | 0x81 => {
                let a = m.pop()?;
                let f = m.pop()?;
                let c = m.new_container(&[f, a])?;
                m.stack.push(c);
            }
            0x92 => {
                let k = m.pop()?;
                let a = m.pop()?;
                let f = m.pop()?;
                let c = m.new_container(&[f, a, k])?;
                m.stack.push(c);
            }
            0x93 => {
                m.pop()?;
                m.pop()?;
                m.stack.push(Item::Scalar);
            }
            b'Q' => {
                m.pop()?;
                m.stack.push(Item::Scalar);
            }
            b'p' | b'q' | b'r' | 0x94 => {
                let id = match op {
                    b'p' => {
                        let l = line(data, &mut at)?;
                        std::str::from_utf8(l)
                            .ok()
                            .and_then(|s| s.trim().parse().ok())
                            .ok_or("a PUT index that is not a number")?
                    }
                    b'q' => le(take(data, &mut at, 1)?),
                    b'r' => le(take(data, &mut at, 4)?),
                    _ => m.memo.len() as u64,
                };
                let t = m.top()?;
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
                    b'g' => {
                        let l = line(data, &mut at)?;
                        std::str::from_utf8(l)
                            .ok()
                            .and_then(|s| s.trim().parse().ok())
                            .ok_or("a GET index that is not a number")?
                    }
                    b'h' => le(take(data, &mut at, 1)?),
                    _ => le(take(data, &mut at, 4)?),
                };
                let it = *m.memo.get(&id).ok_or("a GET of a missing memo entry")?;
                m.stack.push(it);
            }
            other => return Err(format!("unknown opcode {other:#04x}")),
        }
        if let Some(e) = stack_passed(m.stack.len(), m.marks.len()) {
            return Err(format!("{e} at byte {at}"));
        }
    }
    if !stopped {
        // Truncated: the decoder refuses it too, so say so before it decodes.
        return Err("ends without STOP".into());
    }
    let Some(Item::Container(root)) = root else {
        return Ok(0);
    };
    longest_chain(&m.children, root, limit)
}

/// The longest chain of containers from `root`, walked with an explicit stack; a
/// container met again on the current chain (a cycle) ends it.
fn longest_chain(children: &[Vec<u32>], root: u32, limit: usize) -> Result<usize, String> {
    const UNSEEN: u32 = u32::MAX;
    const ON_CHAIN: u32 = u32::MAX - 1;
    let mut depth = vec![UNSEEN; children.len()];
    // (node, next child index)
    let mut walk: Vec<(u32, usize)> = vec![(root, 0)];
    depth[root as usize] = ON_CHAIN;
    while let Some(&(node, next)) = walk.last() {
        if walk.len() > limit {
            return Err(format!("containers nest deeper than {limit} levels"));
        }
        let kids = &children[node as usize];
        if next < kids.len() {
            if let Some(top) = walk.last_mut() {
                top.1 += 1;
            }
            let c = kids[next];
            if depth[c as usize] == UNSEEN {
                depth[c as usize] = ON_CHAIN;
                walk.push((c, 0));
            }
        } else {
            let d = 1 + kids
                .iter()
                .map(|&c| match depth[c as usize] {
                    UNSEEN | ON_CHAIN => 0,
                    d => d,
                })
                .max()
                .unwrap_or(0);
            depth[node as usize] = d;
            walk.pop();
            if d as usize > limit {
                return Err(format!("containers nest deeper than {limit} levels"));
            }
        }
    }
    Ok(depth[root as usize] as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested_lists(n: usize) -> Vec<u8> {
        let mut p = vec![0x80, 2];
        p.extend(std::iter::repeat_n(b']', n));
        p.extend(std::iter::repeat_n(b'a', n - 1));
        p.push(b'.');
        p
    }

    #[test]
    fn deep_nesting_is_found_without_recursion() {
        assert_eq!(depth(&nested_lists(3), 100).unwrap(), 3);
        let e = depth(&nested_lists(4_000), 1_000).unwrap_err();
        assert!(e.contains("deeper than 1000"), "{e}");
        // A million containers in 2 MB are more than such a file may make.
        let e = depth(&nested_lists(1_000_000), 10_000).unwrap_err();
        assert!(e.contains("more than 129096 containers"), "{e}");
    }

    #[test]
    fn nesting_through_a_memo_reference_filled_later_counts() {
        // A = []; memo 0; B = [A]; then A gets nested lists appended via GET 0.
        let mut p = vec![0x80, 2, b']', b'q', 0, b']', b'h', 0, b'a', b'0', b'h', 0];
        p.extend([b']', b']', b'a', b'a']); // A.append([[]])
        p.push(b'.');
        // The root is A here (the last item on the stack): A -> [] -> [].
        assert_eq!(depth(&p, 100).unwrap(), 3);
    }

    #[test]
    fn truncated_and_unknown_input_is_an_error() {
        assert!(depth(&[0x80, 2, b'X', 255, 255], 10).is_err());
        assert!(depth(&[0xff], 10).is_err());
        assert!(depth(b"a", 10).is_err());
        // No STOP: truncated, as the decoder says too.
        let e = depth(&[0x80, 2, b']', b']'], 10).unwrap_err();
        assert!(e.contains("without STOP"), "{e}");
    }
}
