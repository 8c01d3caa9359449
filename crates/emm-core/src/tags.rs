//! Tags: which part of a program an allocation belongs to (weights, optimizer
//! state, a KV cache), so that a part's memory can be paused and resumed as one
//! (sleep mode for RL and serving: [`Router::pause`](crate::Router::pause)).
//!
//! - **Regions.** Allocations made while a [`Region`] is open carry its tag:
//!   process-wide, from every thread and stream (autograd's backward threads and
//!   side streams allocate on threads of their own, as PyTorch's do), on every
//!   device. The open regions form one process-wide stack: the tag of the most
//!   recently opened region still open is current, and closing a region takes it
//!   out wherever it is (threads may close theirs in any order). Allocations
//!   outside every region carry [`Tag::DEFAULT`] (`"default"`).
//! - **States.** A tag is active or paused, process-wide. Allocating under a
//!   paused tag is [`EmmError::TagState`]; so are pausing a paused tag, resuming
//!   an active one and pausing `"default"`. Freeing a block of a paused tag is
//!   allowed (bookkeeping only: nothing touches the device).
//! - **Cost.** An allocation reads the current tag with one relaxed atomic load;
//!   tags are interned once, by name, and never forgotten (a program has a few).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, RwLock};

use crate::{EmmError, Result};

/// An interned tag: a small number standing for its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tag(u32);

/// What a pause keeps of the tagged blocks' contents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Keep {
    /// Nothing: after the resume the blocks hold whatever fresh memory holds
    /// (for caches rebuilt anyway, e.g. a KV cache between generations).
    Nothing,
    /// The live blocks' bytes, copied to pinned host memory before the memory goes
    /// and back after the resume (weights, optimizer state).
    Host,
}

/// The most tags a process may intern (names are never forgotten).
pub const MAX_TAGS: usize = 4096;

/// The name of [`Tag::DEFAULT`].
pub const DEFAULT_TAG: &str = "default";

struct Registry {
    names: Vec<Arc<str>>,
    paused: Vec<bool>,
}

static REGISTRY: RwLock<Registry> = RwLock::new(Registry {
    names: Vec::new(),
    paused: Vec::new(),
});

/// Held across a pause or a resume by every router of the process: the tags'
/// states are process-wide, so pauses and resumes run one at a time.
pub(crate) static PAUSING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The tag of allocations made now (0: `"default"`).
static CURRENT: AtomicU32 = AtomicU32::new(0);

fn read() -> std::sync::RwLockReadGuard<'static, Registry> {
    REGISTRY.read().unwrap_or_else(|p| p.into_inner())
}

fn write() -> std::sync::RwLockWriteGuard<'static, Registry> {
    REGISTRY.write().unwrap_or_else(|p| p.into_inner())
}

impl Tag {
    /// Allocations outside every region.
    pub const DEFAULT: Tag = Tag(0);

    /// The tag named `name`, interned on first use. An empty name, one longer
    /// than 255 bytes, or more than [`MAX_TAGS`] names is [`EmmError::InvalidArgument`].
    pub fn named(name: &str) -> Result<Tag> {
        if name.is_empty() || name.len() > 255 {
            return Err(EmmError::InvalidArgument {
                what: "tag name",
                found: format!("{name:?} ({} bytes)", name.len()),
                expected: "a name of 1 to 255 bytes".into(),
            });
        }
        if name == DEFAULT_TAG {
            return Ok(Tag::DEFAULT);
        }
        if let Some(i) = read().names.iter().position(|n| &**n == name) {
            return Ok(Tag(i as u32 + 1));
        }
        let mut r = write();
        if let Some(i) = r.names.iter().position(|n| &**n == name) {
            return Ok(Tag(i as u32 + 1));
        }
        if r.names.len() >= MAX_TAGS {
            return Err(EmmError::InvalidArgument {
                what: "tag name",
                found: format!("{name:?}, a new name beyond the {MAX_TAGS} this process interned"),
                expected: "one of the tags already used, or fewer tags".into(),
            });
        }
        r.names.push(name.into());
        r.paused.push(false);
        Ok(Tag(r.names.len() as u32))
    }

    /// The tag's name.
    pub fn name(self) -> Arc<str> {
        if self.0 == 0 {
            return DEFAULT_TAG.into();
        }
        read()
            .names
            .get(self.0 as usize - 1)
            .cloned()
            .unwrap_or_else(|| format!("tag#{}", self.0).into())
    }

    /// Its number (0 for `"default"`; the index of a manager's per-tag tables).
    pub fn index(self) -> usize {
        self.0 as usize
    }

    /// The tag allocations made now carry (see [`Region`]).
    #[inline]
    pub fn current() -> Tag {
        Tag(CURRENT.load(Ordering::Relaxed))
    }

    /// Whether the tag is paused.
    pub fn is_paused(self) -> bool {
        self.0 != 0
            && read()
                .paused
                .get(self.0 as usize - 1)
                .copied()
                .unwrap_or(false)
    }

    /// [`EmmError::TagState`] when the tag is paused: what an allocation checks.
    pub fn check_active(self, operation: &'static str) -> Result<()> {
        if self.is_paused() {
            return Err(self.state_error(operation, "it is paused; resume it first"));
        }
        Ok(())
    }

    /// Marks the tag paused (`true`) or active; fails when it already is, or for
    /// `"default"`.
    pub(crate) fn set_paused(self, paused: bool) -> Result<()> {
        let operation = if paused { "pause" } else { "resume" };
        if self.0 == 0 {
            return Err(self.state_error(
                operation,
                "the default tag cannot be paused: allocate what is to be paused inside a region of its own",
            ));
        }
        let mut r = write();
        let Some(p) = r.paused.get_mut(self.0 as usize - 1) else {
            return Err(EmmError::InvalidArgument {
                what: "tag",
                found: format!("tag number {}", self.0),
                expected: "a tag made by Tag::named".into(),
            });
        };
        if *p == paused {
            drop(r);
            return Err(self.state_error(
                operation,
                if paused {
                    "it is already paused"
                } else {
                    "it is not paused"
                },
            ));
        }
        *p = paused;
        Ok(())
    }

    /// [`EmmError::TagState`] for `operation` under this tag.
    pub fn state_error(self, operation: &'static str, found: &str) -> EmmError {
        EmmError::TagState {
            tag: self.name().to_string(),
            operation,
            found: found.into(),
        }
    }
}

/// The open regions, oldest first: `(id, tag)`. The last one's tag is current.
static OPEN: std::sync::Mutex<Vec<(u64, Tag)>> = std::sync::Mutex::new(Vec::new());

/// The next region's id.
static NEXT_REGION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn open_regions() -> std::sync::MutexGuard<'static, Vec<(u64, Tag)>> {
    OPEN.lock().unwrap_or_else(|p| p.into_inner())
}

/// Opens a region of `tag`; returns its id, for [`exit_region`]. Prefer
/// [`Region`] in Rust.
pub fn enter_region(tag: Tag) -> u64 {
    let id = NEXT_REGION.fetch_add(1, Ordering::Relaxed);
    let mut open = open_regions();
    open.push((id, tag));
    CURRENT.store(tag.0, Ordering::Relaxed);
    id
}

/// Closes the region `id` wherever it is in the stack; the tag of the last
/// region still open (else `"default"`) becomes current. Returns whether a
/// region of that id was open.
pub fn exit_region(id: u64) -> bool {
    let mut open = open_regions();
    let Some(i) = open.iter().position(|&(r, _)| r == id) else {
        return false;
    };
    open.remove(i);
    let top = open.last().map_or(Tag::DEFAULT, |&(_, t)| t);
    CURRENT.store(top.0, Ordering::Relaxed);
    true
}

/// An open region: allocations carry its tag until it is dropped (see the
/// module's documentation).
///
/// ```
/// use emm_core::{Region, Tag};
/// let r = Region::enter("kv_cache").unwrap();
/// assert_eq!(&*Tag::current().name(), "kv_cache");
/// drop(r);
/// assert_eq!(Tag::current(), Tag::DEFAULT);
/// ```
#[derive(Debug)]
#[must_use = "the region closes when this value is dropped"]
pub struct Region {
    id: u64,
}

impl Region {
    /// Opens a region of the tag named `name` (interned on first use).
    pub fn enter(name: &str) -> Result<Region> {
        Ok(Region::of(Tag::named(name)?))
    }

    /// Opens a region of `tag`.
    pub fn of(tag: Tag) -> Region {
        Region {
            id: enter_region(tag),
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        exit_region(self.id);
    }
}

/// The tag named `name` if one was interned (nothing is interned here).
pub fn find(name: &str) -> Option<Tag> {
    if name == DEFAULT_TAG {
        return Some(Tag::DEFAULT);
    }
    read()
        .names
        .iter()
        .position(|n| &**n == name)
        .map(|i| Tag(i as u32 + 1))
}

/// A manager's memory under one tag, read at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TagStats {
    /// The tag's name.
    pub tag: String,
    /// Bytes handed out and not yet freed.
    pub allocated_bytes: usize,
    /// Bytes of device memory held for the tag (paused memory excluded).
    pub reserved_bytes: usize,
    /// Bytes whose memory a pause gave back, address space kept.
    pub paused_bytes: usize,
    /// Whether the tag is paused.
    pub paused: bool,
    /// Pinned host memory held for the tag's copies: what a pause that kept
    /// contents holds, and the buffers kept after a resume for the next pause
    /// (a trim, PyTorch's `empty_cache`, gives those back).
    pub host_copy_bytes: usize,
}

/// What a pause or a resume did in one manager, or summed over several.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PauseReport {
    /// Bytes of device memory given back (pause) or mapped again (resume).
    pub bytes: usize,
    /// Bytes of block contents copied to host memory (pause) or back (resume).
    pub copied_bytes: usize,
    /// Blocks whose contents were copied.
    pub blocks_copied: usize,
}

impl PauseReport {
    /// A report of `bytes` mapped or unmapped and `copied_bytes` in `blocks_copied` blocks.
    pub fn new(bytes: usize, copied_bytes: usize, blocks_copied: usize) -> PauseReport {
        PauseReport {
            bytes,
            copied_bytes,
            blocks_copied,
        }
    }

    /// Adds `other` to this report.
    pub fn add(&mut self, other: PauseReport) {
        self.bytes += other.bytes;
        self.copied_bytes += other.copied_bytes;
        self.blocks_copied += other.blocks_copied;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The regions are process-wide: these tests take turns.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn names_intern_and_regions_nest() {
        let _s = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let a = Tag::named("tags-test-a").unwrap();
        assert_eq!(Tag::named("tags-test-a").unwrap(), a);
        assert_eq!(&*a.name(), "tags-test-a");
        assert_eq!(Tag::named("default").unwrap(), Tag::DEFAULT);
        assert!(Tag::named("").is_err());
        assert!(Tag::named(&"x".repeat(256)).is_err());
        let before = Tag::current();
        {
            let _r = Region::of(a);
            assert_eq!(Tag::current(), a);
            {
                let _s = Region::enter("tags-test-b").unwrap();
                assert_eq!(&*Tag::current().name(), "tags-test-b");
            }
            assert_eq!(Tag::current(), a);
        }
        assert_eq!(Tag::current(), before);
    }

    #[test]
    fn regions_closed_out_of_order_leave_the_last_open_one_current() {
        let _s = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let w = Tag::named("tags-test-w").unwrap();
        let kv = Tag::named("tags-test-kv").unwrap();
        let a = Region::of(w);
        let b = Region::of(kv);
        drop(a); // another thread's region closes first
        assert_eq!(Tag::current(), kv);
        drop(b);
        assert_eq!(Tag::current(), Tag::DEFAULT);
        assert!(!exit_region(u64::MAX));
        assert_eq!(find("tags-test-w"), Some(w));
        assert_eq!(find("tags-test-never-made"), None);
    }

    #[test]
    fn states_are_checked() {
        let t = Tag::named("tags-test-state").unwrap();
        assert!(t.check_active("allocate").is_ok());
        assert!(matches!(
            t.set_paused(false),
            Err(EmmError::TagState { .. })
        ));
        t.set_paused(true).unwrap();
        let e = t.check_active("allocate").unwrap_err();
        assert!(e.to_string().contains("tags-test-state"), "{e}");
        assert!(e.to_string().contains("paused"), "{e}");
        assert!(matches!(t.set_paused(true), Err(EmmError::TagState { .. })));
        t.set_paused(false).unwrap();
        assert!(matches!(
            Tag::DEFAULT.set_paused(true),
            Err(EmmError::TagState { .. })
        ));
    }
}
