//! What a trace would reserve in one arena sized for it up front: every request
//! placed by best fit (the smallest free block that holds it, the lowest address
//! among equals) in a single address range that grows only at its end, with
//! neighbouring free blocks joined, over several passes. The figure printed is
//! the range's end after each pass over the trace's peak live bytes.
//!
//! ```sh
//! cargo run --release -p emm-trace --example one_arena -- TRACE... [--passes N]
//! ```
//!
//! This is the floor for the pool without virtual memory (plain `cuMemAlloc`
//! segments, which cannot grow in place) if it knew how large a segment the job
//! needs before it starts, for example from a previous run: one segment of that
//! size, then no growth. It models no streams (every request shares the range),
//! no separate segments for small requests and no release; requests are rounded
//! as the pool rounds them (to 512 B). Passes follow
//! `emm replay`'s: what the trace never frees and made in its first half is kept
//! from one pass to the next, and what it never frees but made later is freed at
//! each pass's end. An id names one allocation at a time (a trace that makes an
//! id again while its earlier allocation is kept would free that one here;
//! none of the recorded traces does).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::process::ExitCode;

use emm_trace::{Op, Trace};

/// A request as the pool rounds it ([`emm_pool::round_size`]); an empty one
/// takes nothing, as in the pool.
fn round(size: u64) -> u64 {
    if size == 0 {
        return 0;
    }
    let size = usize::try_from(size).unwrap_or(usize::MAX);
    emm_pool::round_size(size) as u64
}

/// One address range placed by best fit.
#[derive(Default)]
struct Arena {
    /// Free blocks by (size, address).
    by_size: BTreeSet<(u64, u64)>,
    /// Free blocks by address: their size.
    by_addr: BTreeMap<u64, u64>,
    /// Where the range ends: it only grows (nothing is released, and it grows
    /// only for a request no free block holds, a free block at its end included).
    end: u64,
}

impl Arena {
    fn take_free(&mut self, addr: u64) -> Option<u64> {
        let size = self.by_addr.remove(&addr)?;
        self.by_size.remove(&(size, addr));
        Some(size)
    }

    fn put_free(&mut self, addr: u64, size: u64) {
        self.by_addr.insert(addr, size);
        self.by_size.insert((size, addr));
    }

    /// A block of `size` bytes: the best free fit, split, or the range's end.
    /// An empty request takes nothing (at address 0).
    fn alloc(&mut self, size: u64) -> u64 {
        if size == 0 {
            return 0;
        }
        if let Some(&(free, addr)) = self.by_size.range((size, 0)..).next() {
            self.take_free(addr);
            if free > size {
                self.put_free(addr + size, free - size);
            }
            return addr;
        }
        // A free block at the end grows in place.
        let start = match self.by_addr.range(..self.end).next_back() {
            Some((&a, &s)) if a + s == self.end => {
                self.take_free(a);
                a
            }
            _ => self.end,
        };
        self.end = start + size;
        start
    }

    /// Frees the block at `addr`, joined with free neighbours.
    fn free(&mut self, mut addr: u64, mut size: u64) {
        if size == 0 {
            return;
        }
        if let Some(next) = self.take_free(addr + size) {
            size += next;
        }
        if let Some((&a, &s)) = self.by_addr.range(..addr).next_back() {
            if a + s == addr {
                self.take_free(a);
                addr = a;
                size += s;
            }
        }
        self.put_free(addr, size);
    }
}

/// The range's reach after each of `passes` passes, and the peak of the bytes
/// requested live (rounding is part of what the arena costs).
fn simulate(trace: &Trace, passes: usize) -> Result<(Vec<u64>, u64), String> {
    let ops: Vec<Op> = {
        let mut events = trace.events().map_err(|e| e.to_string())?;
        let ops = events.by_ref().collect();
        events.finish().map_err(|e| e.to_string())?;
        ops
    };
    // The allocations live at the trace's end, by the index that made them.
    let mut at_end: HashMap<u64, usize> = HashMap::new();
    for (i, op) in ops.iter().enumerate() {
        match *op {
            Op::Alloc { id, .. } => {
                at_end.insert(id, i);
            }
            Op::Free { id } => {
                at_end.remove(&id);
            }
        }
    }
    let kept = |id: u64, i: usize| at_end.get(&id) == Some(&i) && i < ops.len() / 2;
    let mut arena = Arena::default();
    // Each live allocation's address, rounded size and requested size.
    let mut live: HashMap<u64, (u64, u64, u64)> = HashMap::new();
    // Requested bytes live and their peak (what `emm replay` divides by).
    let (mut bytes, mut peak) = (0u64, 0u64);
    let mut reach = Vec::new();
    for pass in 0..passes {
        for (i, op) in ops.iter().enumerate() {
            match *op {
                Op::Alloc { id, size, .. } => {
                    if pass > 0 && kept(id, i) {
                        continue;
                    }
                    if let Some((a, n, asked)) = live.remove(&id) {
                        arena.free(a, n);
                        bytes -= asked;
                    }
                    let n = round(size);
                    live.insert(id, (arena.alloc(n), n, size));
                    bytes += size;
                    peak = peak.max(bytes);
                }
                Op::Free { id } => {
                    if let Some((a, n, asked)) = live.remove(&id) {
                        arena.free(a, n);
                        bytes -= asked;
                    }
                }
            }
        }
        let ends: Vec<u64> = live
            .keys()
            .copied()
            .filter(|&id| at_end.get(&id).is_none_or(|&i| !kept(id, i)))
            .collect();
        for id in ends {
            if let Some((a, n, asked)) = live.remove(&id) {
                arena.free(a, n);
                bytes -= asked;
            }
        }
        reach.push(arena.end);
    }
    Ok((reach, peak))
}

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut passes = 10;
    if let Some(i) = args.iter().position(|a| a == "--passes") {
        match args.get(i + 1).and_then(|n| n.parse().ok()) {
            Some(n) if n > 0 => passes = n,
            _ => {
                eprintln!("one_arena: --passes takes a count of 1 or more");
                return ExitCode::FAILURE;
            }
        }
        args.drain(i..i + 2);
    }
    if args.is_empty() {
        eprintln!("usage: one_arena TRACE... [--passes N]");
        return ExitCode::FAILURE;
    }
    println!("trace                                    peak live   arena/live after pass 1, after pass {passes}");
    let mut failed = false;
    for path in &args {
        let traces = match Trace::open(Path::new(path), None) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("one_arena: {e}");
                failed = true;
                continue;
            }
        };
        for trace in &traces {
            match simulate(trace, passes) {
                Ok((reach, peak)) if peak > 0 => {
                    let ratio = |r: u64| r as f64 / peak as f64;
                    println!(
                        "{:40} {:>9.2} GiB   {:.3}x, {:.3}x",
                        trace.name().rsplit('/').next().unwrap_or(trace.name()),
                        peak as f64 / f64::from(1u32 << 30),
                        ratio(reach[0]),
                        ratio(reach[reach.len() - 1]),
                    );
                }
                Ok(_) => println!("{:40} no allocation", trace.name()),
                Err(e) => {
                    eprintln!("one_arena: {}: {e}", trace.name());
                    failed = true;
                }
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
