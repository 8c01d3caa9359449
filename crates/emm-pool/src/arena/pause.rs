//! Pausing an arena: its memory goes back to the device and its addresses stay
//! (the pools of tagged allocations; see `emm_core::tags`).
//!
//! Every block of a tag's pool lies in the expandable segment (`one_range`), so
//! a pause unmaps the segment's pieces, whose physical memory goes back to the
//! device, while the address space stays reserved and every block keeps its
//! place in the arena. A resume maps fresh memory under the same pieces, at the
//! same addresses, and copies back the live blocks' bytes where the pause kept
//! them. Pointers held by the program (tensors' `data_ptr`, addresses baked
//! into captured CUDA graphs) stay valid across the two.
//!
//! Before unmapping, a pause waits for the device (the work queued on the
//! blocks is done), unmaps the old mappings of moved pieces and gives back the
//! idle pieces (as `trim` does), so only pieces under live blocks are recorded
//! and mapped again. While paused the arena serves no allocation (its pool
//! refuses them first); frees are bookkeeping and are allowed.

use emm_core::{PauseReport, Result};
use emm_sys::CUdeviceptr;

use super::pieces::{self, Piece};
use super::*;
use crate::events::EventSource;
use crate::host_copy::HostCopy;

/// The largest piece a resume maps: adjacent paused pieces are mapped again as
/// pieces of up to this size. The driver's cost is per piece, not per byte (on an
/// H100, `cuMemCreate` about 13 us and `cuMemRelease` 17 us a piece whatever its
/// size, `cuMemUnmap` 24 us; access is granted once per run), and growth's pieces
/// are at most 16 MiB: a 12 GiB KV cache paused and resumed at 2.3 ms per GiB
/// each way in those (run 175, H200), at 1.2-1.5 and 2.0 ms per GiB in pieces of
/// up to 64 MiB (run 176, H100), where torch_memory_saver, one handle per tensor
/// (1.5 GiB each there), took 0.35-0.49 and 0.87. Growth moves and trim unmaps
/// only wholly free pieces, so a large piece under a few live blocks stays
/// mapped; a tag's memory is mostly long-lived and allocated in large tensors
/// (weights, optimizer state, a KV cache), and a trim still gives back every
/// wholly free one.
pub(crate) const RESUME_PIECE: usize = 256 << 20;

/// What a pause took away, for the resume to put back.
pub(crate) struct Paused {
    /// The pieces unmapped, in address order.
    pieces: Vec<Piece>,
    /// The live blocks' bytes, when the pause kept them: address and copy.
    kept: Vec<(CUdeviceptr, HostCopy)>,
}

/// The expandable segment's pause: what a pause holds away, and the pinned
/// buffers a resume emptied, kept for the next pause (see `host_copy.rs`).
#[derive(Default)]
pub(super) struct PauseState {
    paused: Option<Paused>,
    spare: Vec<HostCopy>,
}

impl PauseState {
    /// Whether a pause holds the memory away.
    pub(super) fn is_paused(&self) -> bool {
        self.paused.is_some()
    }

    /// Bytes a pause holds away (0 when not paused).
    pub(super) fn paused_bytes(&self) -> usize {
        self.paused.as_ref().map_or(0, |p| pieces::bytes(&p.pieces))
    }

    /// Pinned host memory held for copies: the buffers a pause fills and the
    /// spare ones kept for the next.
    pub(super) fn host_copy_bytes(&self) -> usize {
        let kept = self
            .paused
            .as_ref()
            .map_or(0, |p| p.kept.iter().map(|(_, c)| c.capacity()).sum());
        kept + self.spare.iter().map(HostCopy::capacity).sum::<usize>()
    }

    /// Frees the spare pinned buffers; returns their bytes.
    pub(super) fn release_spare(&mut self) -> usize {
        let n = self.spare.iter().map(HostCopy::capacity).sum();
        self.spare.clear();
        n
    }

    /// The smallest spare pinned buffer with room for `size` bytes, taken.
    fn take_spare(&mut self, size: usize) -> Option<HostCopy> {
        let i = self
            .spare
            .iter()
            .enumerate()
            .filter(|(_, c)| c.capacity() >= size)
            .min_by_key(|(_, c)| c.capacity())
            .map(|(i, _)| i)?;
        Some(self.spare.swap_remove(i))
    }

    /// Keeps the buffers of `kept` for the next pause.
    fn keep_spare(&mut self, kept: Vec<(CUdeviceptr, HostCopy)>) {
        self.spare.extend(kept.into_iter().map(|(_, c)| c));
    }

    /// Forgets what a pause holds and the spare buffers (a reset: the blocks
    /// they held are gone).
    pub(super) fn clear(&mut self) {
        self.paused = None;
        self.spare.clear();
    }
}

impl Arena {
    /// Whether a pause holds the arena's memory away.
    pub fn is_paused(&self) -> bool {
        self.expandable.pause.is_paused()
    }

    /// Bytes a pause holds away (0 when not paused).
    pub fn paused_bytes(&self) -> usize {
        self.expandable.pause.paused_bytes()
    }

    /// Whether a pause could take the arena's memory now: `Err` (built by
    /// `refuse`) when it holds live blocks outside its expandable segment (no
    /// virtual memory management, or a segment an out-of-memory path made) or is
    /// paused already. Nothing changes; [`Arena::pause`] checks the same again.
    pub fn check_pausable(&self, refuse: &dyn Fn(&str) -> EmmError) -> Result<()> {
        if self.is_paused() {
            return Err(refuse("its memory is already paused"));
        }
        let outside = self.segments.iter().find(|(&base, s)| {
            !self.is_expandable(base)
                && !matches!(self.heap.get(base), Some(b) if b.size == s.size && !matches!(b.state, State::Live))
        });
        if let Some((&base, _)) = outside {
            return Err(refuse(&format!(
                "it holds live blocks outside virtual memory (a segment at {base:#x} from cuMemAlloc: the pool has no virtual memory management here, the driver refused its address space, or it made the segment on an out-of-memory path)"
            )));
        }
        Ok(())
    }

    /// Unmaps every piece of the expandable segment under a live block, keeping
    /// the address space (see the module's documentation); with `keep`, copies
    /// the live blocks to host memory first. `refuse` builds the error for memory
    /// that cannot be paused.
    ///
    /// The device is synchronized first: the work queued on the blocks, on any
    /// stream, is done before their memory goes. A refusal changes nothing. A
    /// driver failure while unmapping maps fresh memory again under the pieces
    /// already unmapped and copies back the kept bytes (without `keep`, those
    /// pieces' contents are lost); when even that fails, the arena is left paused
    /// over what stays unmapped, so that no allocation lands there and a resume
    /// can finish the job.
    pub fn pause(
        &mut self,
        keep: bool,
        events: &dyn EventSource,
        source: &dyn SegmentSource,
        refuse: &dyn Fn(&str) -> EmmError,
    ) -> Result<PauseReport> {
        self.check_pausable(refuse)?;
        // Every stream's work is done (consolidate alone does not synchronize
        // when no free block waits on a stream: the usual case when a tag's
        // blocks are all live), and blocks freed on streams are free everywhere.
        self.stats.counts.device_syncs += 1;
        events.synchronize_all()?;
        self.consolidate(events)?;
        // Wholly free segments outside the expandable one go back.
        self.release_whole_segments(source, None);
        self.check_pausable(refuse)?;
        let Some(base) = self.expandable.base() else {
            // No memory to give back; paused all the same (no allocation here
            // until the resume).
            self.expandable.pause.paused = Some(Paused {
                pieces: Vec::new(),
                kept: Vec::new(),
            });
            return Ok(PauseReport::default());
        };
        self.unmap_retired(events, source, true);
        if !self.expandable.retiring.is_empty() {
            return Err(refuse(
                "old mappings of moved pieces could not be unmapped (the driver refused; see the log)",
            ));
        }
        self.release_free_pieces(source);
        let pieces = self.expandable.pieces.as_slice().to_vec();
        let mut kept = Vec::new();
        let mut report = PauseReport::default();
        if keep {
            let live: Vec<(CUdeviceptr, usize)> = self
                .heap
                .blocks()
                .iter()
                .filter(|(_, b)| b.state == State::Live && b.segment == base)
                .map(|(&a, b)| (a, b.size))
                .collect();
            for (addr, size) in live {
                let spare = self.expandable.pause.take_spare(size);
                match source.save(addr, size, spare) {
                    Ok(copy) => {
                        report.copied_bytes += copy.len();
                        report.blocks_copied += 1;
                        kept.push((addr, copy));
                    }
                    Err(e) => {
                        self.expandable.pause.keep_spare(kept);
                        return Err(e);
                    }
                }
            }
        }
        // Spare buffers no block of this pause needed go back: pinned memory
        // does not pile up when the blocks' sizes change from pause to pause.
        self.expandable.pause.spare.clear();
        for (i, &Piece { offset: off, len }) in pieces.iter().enumerate() {
            if let Err(e) = source.unmap_done(base + off as u64, len) {
                let gone = &pieces[..i];
                match self.map_runs(base, gone, source) {
                    Ok(()) => {
                        for (addr, copy) in &kept {
                            if let Err(e) = copy.restore(*addr) {
                                tracing::error!(error = %e, addr, "restoring a block after a failed pause failed");
                            }
                        }
                        self.expandable.pause.keep_spare(kept);
                    }
                    Err(MapFailed { error: again, left }) => {
                        // (Pieces the failed remap mapped and could not unmap
                        // again stay the segment's, as those not reached.)
                        tracing::error!(error = %again, "mapping memory again after a failed pause failed; the pool stays paused over what is unmapped, for a resume");
                        self.settle_paused(gone.to_vec(), left, kept, true);
                    }
                }
                return Err(e);
            }
            self.stats.counts.pieces_unmapped += 1;
            report.bytes += len;
        }
        self.hold_paused(pieces, kept, true);
        Ok(report)
    }

    /// Records `pieces` (unmapped now) as paused with the `kept` copies. With
    /// `counted` (pieces a pause unmapped, still in the segment's list and in the
    /// reserved bytes) they leave both (so reset and drop unmap nothing of them);
    /// without (fresh pieces of a failed resume) they were never in either.
    fn hold_paused(
        &mut self,
        pieces: Vec<Piece>,
        kept: Vec<(CUdeviceptr, HostCopy)>,
        counted: bool,
    ) {
        if counted {
            self.sub_reserved(pieces::bytes(&pieces));
            self.expandable.pieces.remove_all(&pieces);
        }
        self.expandable.pause.paused = Some(Paused { pieces, kept });
    }

    /// Maps fresh memory under the pieces the pause unmapped, at the same
    /// addresses, as pieces of up to [`RESUME_PIECE`], and copies back the kept
    /// bytes (the buffers stay for the next pause). Resuming past the pool's byte
    /// limit, out of memory, or a failed copy back leaves the arena paused as it
    /// was (what this call mapped is unmapped again), to be tried again.
    pub fn resume(&mut self, source: &dyn SegmentSource) -> Result<PauseReport> {
        let Some(paused) = self.expandable.pause.paused.take() else {
            return Ok(PauseReport::default());
        };
        let Some(base) = self.expandable.base() else {
            return Ok(PauseReport::default());
        };
        let fresh = coalesce(&paused.pieces, RESUME_PIECE);
        let bytes = pieces::bytes(&fresh);
        if let Some(limit) = self.limit() {
            if self.family_reserved() + bytes > limit {
                let free = limit.saturating_sub(self.family_reserved());
                self.expandable.pause.paused = Some(paused);
                return Err(EmmError::OutOfMemory {
                    what: "device",
                    manager: "pool".into(),
                    requested: bytes,
                    free,
                    total: limit,
                    detail: format!(
                        "resuming would pass the pool's byte limit of {}",
                        emm_core::fmt_bytes(limit)
                    ),
                });
            }
        }
        if let Err(MapFailed { error, left }) = self.map_runs(base, &fresh, source) {
            if left.is_empty() {
                self.expandable.pause.paused = Some(paused);
            } else {
                self.settle_paused(fresh, left, paused.kept, false);
            }
            return Err(error);
        }
        let mut report = PauseReport::new(bytes, 0, 0);
        for (addr, copy) in &paused.kept {
            if let Err(e) = copy.restore(*addr) {
                // Back to paused: unmap what was mapped (the kept bytes stay).
                let left = unmap_pieces(base, &fresh, source);
                self.settle_paused(fresh, left, paused.kept, false);
                return Err(e);
            }
            report.copied_bytes += copy.len();
            report.blocks_copied += 1;
        }
        // (Nothing was mapped while paused: no growth serves a paused arena.)
        self.expandable.pieces.add_missing(&fresh);
        self.add_reserved(bytes);
        self.stats.counts.pieces_mapped += fresh.len();
        // Kept for the next pause (see `host_copy.rs`).
        self.expandable.pause.keep_spare(paused.kept);
        Ok(report)
    }

    /// Pinned host memory held for copies: the buffers a pause fills and the
    /// spare ones kept for the next.
    pub fn host_copy_bytes(&self) -> usize {
        self.expandable.pause.host_copy_bytes()
    }

    /// Frees the spare pinned buffers (a trim); returns their bytes.
    pub fn release_spare_copies(&mut self) -> usize {
        self.expandable.pause.release_spare()
    }

    /// Maps fresh memory under `pieces` (of the segment at `base`, in address
    /// order), one `map_pieces` call per run of adjacent pieces. On a failure,
    /// unmaps what this call mapped and returns the error with the pieces that
    /// would not unmap (still mapped).
    fn map_runs(
        &mut self,
        base: CUdeviceptr,
        pieces: &[Piece],
        source: &dyn SegmentSource,
    ) -> std::result::Result<(), MapFailed> {
        let mut mapped: Vec<Piece> = Vec::new();
        let mut i = 0;
        while i < pieces.len() {
            let start = pieces[i].offset;
            let mut end = start;
            let mut run = Vec::new();
            while i < pieces.len() && pieces[i].offset == end {
                run.push((None, pieces[i].len));
                end = pieces[i].end();
                i += 1;
            }
            let (n, r) = source.map_pieces(base + start as u64, &run);
            let mut at = start;
            for &(_, len) in run.iter().take(n) {
                mapped.push(Piece::new(at, len));
                at += len;
            }
            if let Err(error) = r {
                let left = unmap_pieces(base, &mapped, source);
                return Err(MapFailed { error, left });
            }
        }
        Ok(())
    }

    /// After a failure that left `left` mapped out of pieces meant to be
    /// unmapped: those stay the segment's (mapped, counted reserved); the rest of
    /// `unmapped` (a layout covering what is unmapped) is held paused with `kept`
    /// (`counted`: as [`Arena::hold_paused`]).
    fn settle_paused(
        &mut self,
        unmapped: Vec<Piece>,
        left: Vec<Piece>,
        kept: Vec<(CUdeviceptr, HostCopy)>,
        counted: bool,
    ) {
        let still: Vec<Piece> = unmapped
            .into_iter()
            .filter(|p| left.binary_search(p).is_err())
            .collect();
        // `left` pieces may not be in the segment's list (fresh pieces of a
        // resume): they are mapped memory, so they join it and count.
        let joined = self.expandable.pieces.add_missing(&left);
        self.add_reserved(joined);
        self.hold_paused(still, kept, counted);
    }
}

/// Unmaps `pieces` of the segment at `base` (the device is done with them);
/// returns those the driver would not unmap (still mapped), in address order.
fn unmap_pieces(base: CUdeviceptr, pieces: &[Piece], source: &dyn SegmentSource) -> Vec<Piece> {
    let mut left = Vec::new();
    for &p in pieces {
        if let Err(e) = source.unmap_done(base + p.offset as u64, p.len) {
            tracing::error!(error = %e, off = p.offset, len = p.len, "unmapping a piece after a failed pause or resume failed; it stays mapped");
            left.push(p);
        }
    }
    left
}

/// `pieces` (address order) with adjacent ones joined while the joined piece
/// stays within `max` bytes (a piece already larger stays whole).
fn coalesce(pieces: &[Piece], max: usize) -> Vec<Piece> {
    let mut out: Vec<Piece> = Vec::with_capacity(pieces.len());
    for &p in pieces {
        match out.last_mut() {
            Some(last) if last.end() == p.offset && last.len + p.len <= max => last.len += p.len,
            _ => out.push(p),
        }
    }
    out
}

/// A `map_runs` that failed: the driver's error, and the pieces it had mapped
/// that would not unmap again (still mapped, in address order).
struct MapFailed {
    error: EmmError,
    left: Vec<Piece>,
}

#[cfg(test)]
mod tests {
    use super::{coalesce, Piece};

    fn p(list: &[(usize, usize)]) -> Vec<Piece> {
        list.iter().map(|&(o, l)| Piece::new(o, l)).collect()
    }

    #[test]
    fn adjacent_pieces_join_up_to_the_limit() {
        let m = 1 << 20;
        let pieces = [
            (0, 16 * m),
            (16 * m, 16 * m),
            (32 * m, 40 * m),
            (80 * m, 2 * m),
            (82 * m, 100 * m),
        ];
        assert_eq!(
            coalesce(&p(&pieces), 64 * m),
            p(&[
                (0, 32 * m),
                (32 * m, 40 * m),
                (80 * m, 2 * m),
                (82 * m, 100 * m)
            ])
        );
        assert_eq!(coalesce(&[], 64 * m), vec![]);
    }
}
