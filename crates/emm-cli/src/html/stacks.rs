//! The stacks the page shows on hover: the frames of the code that made an
//! allocation (a snapshot's `frames`), the program's own (Python) frames first,
//! each stack and each frame written once per page, and the frames' text
//! bounded, so a snapshot of any length gives a page of bounded size.

use std::collections::HashMap;

use emm::trace::{Frame, StackId, TraceDetails};
use serde_json::{json, Value};

/// Frames shown of a stack.
pub const SHOWN_FRAMES: usize = 8;
/// The longest frame shown (a longer one keeps its end).
pub const FRAME_CHARS: usize = 160;
/// The most text of frames on one page; stacks past it are left out (and
/// counted).
pub const FRAME_BUDGET: usize = 512 << 10;

/// The page's stacks.
#[derive(Default)]
pub struct Stacks {
    frames: Vec<String>,
    frame_ids: HashMap<String, u32>,
    stacks: Vec<Vec<u32>>,
    stack_ids: HashMap<Vec<u32>, u32>,
    /// Each trace's stacks already seen: (trace, its stack) -> the page's.
    seen: HashMap<(usize, StackId), Option<u32>>,
    chars: usize,
    /// Stacks left out for the budget.
    pub left_out: u64,
}

impl Stacks {
    /// The page's number of stack `s` of trace number `trace` (`d` its details),
    /// or `None` when it shows no frame or the budget is spent.
    pub fn id(&mut self, trace: usize, d: &TraceDetails, s: StackId) -> Option<u32> {
        self.intern((trace, s), || shown(d.stack(s)))
    }

    /// The page's number of the stack known as `key`, whose frames shown
    /// `frames` gives (asked once per key).
    fn intern(
        &mut self,
        key: (usize, StackId),
        frames: impl FnOnce() -> Vec<String>,
    ) -> Option<u32> {
        if let Some(&id) = self.seen.get(&key) {
            return id;
        }
        let shown = frames();
        let new_chars: usize = shown
            .iter()
            .filter(|f| !self.frame_ids.contains_key(*f))
            .map(|f| f.len() + 3)
            .sum();
        let id = if shown.is_empty() {
            None
        } else if self.chars + new_chars > FRAME_BUDGET {
            self.left_out += 1;
            None
        } else {
            self.chars += new_chars;
            let ids: Vec<u32> = shown
                .into_iter()
                .map(|f| {
                    let next = self.frames.len() as u32;
                    *self.frame_ids.entry(f).or_insert_with_key(|f| {
                        self.frames.push(f.clone());
                        next
                    })
                })
                .collect();
            let next = self.stacks.len() as u32;
            Some(*self.stack_ids.entry(ids).or_insert_with_key(|ids| {
                self.stacks.push(ids.clone());
                next
            }))
        };
        self.seen.insert(key, id);
        id
    }

    /// `{"frames": [text, …], "stacks": [[frame, …], …]}`.
    pub fn json(&self) -> Value {
        json!({ "frames": self.frames, "stacks": self.stacks })
    }
}

/// Whether `f` is PyTorch's allocator or its unwinder rather than the program.
fn internal(f: &Frame) -> bool {
    let n = &*f.name;
    n.starts_with("torch::unwind")
        || n.starts_with("torch::CapturedTraceback")
        || n.starts_with("torch::cuda::(anonymous namespace)::gather")
        || n.contains("CUDACachingAllocator")
}

/// The frames shown of a stack, innermost first: its Python frames, or where it
/// has none, its frames outside the allocator; at most [`SHOWN_FRAMES`].
fn shown<'a>(stack: impl Iterator<Item = &'a Frame> + Clone) -> Vec<String> {
    let python: Vec<&Frame> = stack
        .clone()
        .filter(|f| f.filename.ends_with(".py"))
        .take(SHOWN_FRAMES)
        .collect();
    let frames = if python.is_empty() {
        stack.filter(|f| !internal(f)).take(SHOWN_FRAMES).collect()
    } else {
        python
    };
    frames.into_iter().map(text).collect()
}

/// A frame as `name (file:line)`, `name` where the file is unknown; an
/// installed package's file from its package on (`torch/nn/modules/module.py`);
/// cut to [`FRAME_CHARS`] keeping its end.
fn text(f: &Frame) -> String {
    let file = ["site-packages/", "dist-packages/"]
        .iter()
        .find_map(|p| f.filename.rfind(p).map(|i| &f.filename[i + p.len()..]))
        .unwrap_or(&f.filename);
    let s = match (file, f.line) {
        ("" | "??", _) => f.name.to_string(),
        (file, 0) => format!("{} ({file})", f.name),
        (file, line) => format!("{} ({file}:{line})", f.name),
    };
    let n = s.chars().count();
    if n <= FRAME_CHARS {
        s
    } else {
        let tail: String = s.chars().skip(n - (FRAME_CHARS - 1)).collect();
        format!("…{tail}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(name: &str, file: &str, line: i64) -> Frame {
        Frame {
            name: name.into(),
            filename: file.into(),
            line,
        }
    }

    /// Frames are kept once, stacks too, and stacks past the budget are left
    /// out and counted, while those whose frames are already on the page cost
    /// nothing more.
    #[test]
    fn the_frames_text_is_bounded() {
        let mut s = Stacks::default();
        let frame = |i: usize| format!("{i:0>150}");
        let a = s.intern((0, 0), || vec![frame(1), frame(2)]);
        let b = s.intern((1, 7), || vec![frame(1), frame(2)]);
        assert_eq!((a, b), (Some(0), Some(0)), "the same frames, one stack");
        assert_eq!(s.frames.len(), 2);
        let mut i = 3;
        while s.left_out == 0 {
            s.intern((0, i as u32), || (i..i + 8).map(frame).collect());
            i += 8;
        }
        assert!(s.chars <= FRAME_BUDGET);
        assert!(s.json().to_string().len() < FRAME_BUDGET + (64 << 10));
        // Known frames still make a stack past the budget.
        assert!(s.intern((2, 0), || vec![frame(2), frame(1)]).is_some());
        assert_eq!(s.intern((2, 1), Vec::new), None);
    }

    #[test]
    fn python_frames_come_first_and_long_ones_keep_their_end() {
        assert_eq!(
            text(&frame(
                "forward",
                "/v/lib/python3.12/site-packages/torch/nn/linear.py",
                7
            )),
            "forward (torch/nn/linear.py:7)"
        );
        let stack = [
            frame("torch::unwind::unwind()", "??", 0),
            frame("c10::cuda::CUDACachingAllocator::malloc", "x.cpp", 0),
            frame("at::empty", "??", 0),
            frame("forward", "/m/model.py", 12),
            frame("<module>", "/m/train.py", 3),
        ];
        assert_eq!(
            shown(stack.iter()),
            ["forward (/m/model.py:12)", "<module> (/m/train.py:3)"]
        );
        assert_eq!(shown(stack[..3].iter()), ["at::empty"]);
        let long = text(&frame(&"x".repeat(300), "??", 0));
        assert_eq!(long.chars().count(), FRAME_CHARS);
        assert!(long.starts_with('…'));
    }
}
