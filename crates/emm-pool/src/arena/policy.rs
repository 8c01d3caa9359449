//! How the pool sizes its segments and which of its policies are on
//! ([`SegmentPolicy`]).

use crate::kind::Kind;

/// Where the pool has no expandable segment (turned off, or refused by the
/// driver), it merges its wholly free large segments into one when the program
/// is quiet after the pool made a new one: live bytes at a sixth of reserved,
/// or back within a sixth of the way from their low to reserved after a step
/// ([`SegmentPolicy::merge_quiet`], `pool_legacy_merge`). Over 100 passes of
/// every recorded trace of 64 MiB or more (`legacy_steady.rs`), it makes no
/// driver allocation after pass 10 on any of the twenty-one. Without merging it
/// makes none either (since large segments serve requests of any size,
/// `SegmentPolicy::exclusive`), but holds looser footprints: after 100 passes
/// 1.247x of live on the mean against 1.203x merged, 1.643x against 1.180x on
/// `gpt2_infer_bucketed_h200.csv`, 1.511x against 1.240x on ViT inference,
/// 1.291x against 1.152x on `bert_h200.csv`; five traces are tighter unmerged,
/// most `gpt2_infer_h200.csv`, the FSDP2 GPT-2 trace and GPT-2's beam search
/// (1.179x, 1.140x and 1.119x against 1.506x, 1.288x and 1.182x). (Before a
/// free joined its settled neighbours, merging mattered more: 1.96x unmerged
/// against 1.15x on `h200_train_midway.pickle`, now 1.18x against 1.16x.)
pub const DEFAULT_LEGACY_MERGE: usize = 6;

/// The default [`SegmentPolicy::expand_step`]: a page, so growth at the end of
/// the expandable segment maps only what a request lacks (`growth.rs`). A step
/// past the request is reserved at the moment of a new peak: at the peak of a
/// Mistral-style generation (429 MiB live) a step of 20 MiB (or a 32nd of the
/// pool), the default until the fifty-eighth session, mapped 14 MiB where the
/// request lacked 4. Judged alone it moved the held-out traces both ways; with
/// threads caching only small blocks
/// ([`DEFAULT_THREAD_CACHE_LARGEST`](crate::DEFAULT_THREAD_CACHE_LARGEST)) and
/// pieces of at most four pages ([`DEFAULT_PIECE_PAGES`]) it is tighter on the
/// mean of the recorded and the held-out traces (`docs/benchmarks.md`,
/// fifty-sixth to fifty-eighth sessions). `pool_expand_step=20M` restores the
/// old step.
pub const DEFAULT_EXPAND_STEP: usize = 2 << 20;

/// The default [`SegmentPolicy::piece_share`]: new memory of the expandable
/// segment comes in pieces of at least a 4096th of what the arena reserves: two
/// 2 MiB pages from 16 GiB reserved, the most (eight pages) from 64 GiB. The
/// GPU measured 2048 first (runs 289, 291-292); replayed, 2048 took one shared
/// pool (`pool_stream_pools` 0) on the FSDP2 Llama past 1.05x of live at a
/// device lag (1.066x after 10 passes, 1.043x without the setting), which 4096
/// holds (1.049x), with the same footprint on the eighteen traces and fewer
/// driver calls where the device lags. On the GPU (FSDP2 of the 1.1 B Llama,
/// the pool about 40 GiB, five rotated rounds, runs 295-296) 4096 moved twice
/// 2048's pieces (6,418 against 3,403 in 200 timed steps), yet its steps took
/// 1.011 times expandable segments' device time against 2048's 1.029; over five
/// rounds of 300 steps (runs 297-298) 0.995, at 39.47 GiB at the device
/// against their 40.19 (`docs/benchmarks.md`, forty-fourth session).
pub const DEFAULT_PIECE_SHARE: usize = 4096;

/// The default [`SegmentPolicy::piece_pages`]: new memory of the expandable
/// segment comes in pieces of at most four 2 MiB pages. A piece moves only when
/// wholly free: with large blocks going back to the arena at their free, FSDP2
/// of the 1.1 B Llama drifted from 1.034x of live after one pass to 1.059x
/// after 100 with pieces of up to eight pages (the most until the
/// fifty-eighth session), its free memory at the peak (893 MiB) lying in
/// pieces that still held a block; with four, 1.045x (1.041x with the
/// defaults), and 1.034x with one page, which takes about twice the driver
/// calls in a later pass (`docs/benchmarks.md`, fifty-eighth session).
pub const DEFAULT_PIECE_PAGES: usize = 4;

/// Segment sizes: few upstream calls for many small requests, exact-ish segments
/// for large ones so that reserved memory tracks live memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentPolicy {
    /// Large blocks live in one expandable segment per pool (address space
    /// reserved once, memory mapped in pieces as it grows), when the upstream has
    /// virtual memory management: best fit over one contiguous range.
    pub expandable: bool,
    /// Address space asked for the expandable segment: where the driver
    /// refuses it, a quarter of it and so on (`AddressSpace::reserve_range`). At
    /// least [`SegmentPolicy::large_round`].
    pub expandable_reserve: usize,
    /// The expandable segment grows at its end by at least this much at a
    /// time, or by a 32nd of what the pool reserves when that is less
    /// (`growth.rs`; `pool_expand_step`). [`DEFAULT_EXPAND_STEP`] by default;
    /// a page maps only what a request lacks.
    pub expand_step: usize,
    /// Size of a small-block segment.
    pub small_segment: usize,
    /// Large requests below this share segments of this size.
    pub large_segment: usize,
    /// Large segments are rounded up to this.
    pub large_round: usize,
    /// Without the expandable segment: a large request that would take a new
    /// segment while reserved exceeds this percentage of the peak of live bytes
    /// (or of live plus the request, when more) first synchronizes and gives back
    /// wholly free large segments (`None`: never; see `Arena::tighten`).
    pub tight_percent: Option<u32>,
    /// Without the expandable segment: a large segment made for one request of at
    /// least this many bytes serves only requests of about its size, so that it
    /// comes free whole and can be given back (see `Arena::fit_in`). Off
    /// (`usize::MAX`) by default: at 256 MiB (the default before), the pool gave
    /// back and made 240-320 segments in every pass of a mixture of experts'
    /// trace, whose logits and experts' shares of the tokens change size every
    /// step (`moe_h200.csv`: 1.31x of live and rising at pass 100 with the
    /// earlier merging, 1.25x at pass 30 with today's; off, 1.31x and no driver
    /// allocation after pass 10);
    /// and with merging as it does now, turning it off took the recorded
    /// traces' mean footprint from 1.343x to 1.337x of live
    /// (`docs/benchmarks.md`, thirty-eighth session).
    pub exclusive: usize,
    /// Without the expandable segment: once a large segment has been made, the
    /// first large request that finds the pool quiet (live bytes at most
    /// 1/`merge_quiet` of reserved, or back within 1/`merge_quiet` of the way
    /// from their low since that segment to reserved after a step rose half of
    /// it: weights and optimizer state that stay live between steps keep live
    /// bytes above a fixed share) synchronizes, gives back every wholly free
    /// large segment and makes one sized to what the steps need, so that the
    /// blocks of the next steps share one range instead of pinning many (see
    /// `merge.rs`). `None`: never (`EMM_POOL_LEGACY_MERGE=0`); the default is
    /// [`DEFAULT_LEGACY_MERGE`].
    pub merge_quiet: Option<usize>,
    /// Every request, small ones too, is served from the expandable segment (where
    /// there is one): every block is then virtual memory, which a pause can unmap
    /// (the pools of tagged allocations; see `pause.rs`).
    pub one_range: bool,
    /// Before growing past the peak of reserved bytes while live bytes are well
    /// below their peak, a stream adopts free blocks parked for other streams
    /// whose events have not completed: its work is made to wait for those
    /// events on the device (`cuStreamWaitEvent`, no host wait), then the blocks
    /// are its own (CUDA's stream-ordered pools reuse across streams so by
    /// default). On a GPU the host runs ahead and such events are seldom
    /// complete when asked: on FSDP2 of a 1.1 B Llama every rank's peak came
    /// from a stream growing by 250 MiB while 8.9 GiB was live and 22.8-23.1 GiB
    /// waited parked (runs 202-203). Off by default: there it took the footprint from
    /// 1.064-1.069x of allocated to 1.051-1.054x, but the steps ran 5-11 %
    /// slower in both rounds (run 204); `streams.rs`, `Arena::adopt_parked`;
    /// `pool_adopt_parked`.
    pub adopt_parked: bool,
    /// Before growing past the peak of reserved bytes, a stream waits on the
    /// host for the events of free blocks parked for other streams (oldest
    /// first, until they hold the request), and takes them settled instead of
    /// reserving more (`streams.rs`, `Arena::wait_parked`; `pool_wait_parked`).
    /// On by default: on FSDP2 of a 1.1 B Llama on four H100s it took the
    /// footprint from 1.078-1.116x of allocated to 1.053-1.062x over 40 timed
    /// steps, with steps no slower (run 224); over six rounds of 100 steps
    /// 1.060-1.075x, the device's peak within 0.2 % of expandable segments'
    /// (runs 227-229). It runs before [`SegmentPolicy::adopt_parked`], which
    /// then finds nothing parked where the wait settled it.
    pub wait_parked: bool,
    /// With `n` > 0, growth replaces, instead of moving, the pieces smaller than
    /// `n` pages (and than the request's own new pieces) lying in free holes that
    /// no queued work uses any more: it unmaps them (their memory goes back
    /// first) and maps new memory in pieces of up to `n` pages (`replace.rs`).
    /// A moved piece costs its driver calls every time its hole is needed, and
    /// the pieces made for small requests (one page) are what the largest
    /// requests of a step are assembled from, pass after pass. 0 (the default):
    /// off (`EMM_POOL_REPLACE_PIECES`).
    pub replace_pieces: usize,
    /// With `n` > 0, new memory comes in pieces of at least an `n`th of what
    /// the arena reserves (rounded down to pages, at most
    /// [`SegmentPolicy::piece_pages`]; never smaller than without it, a 64th
    /// of the request), so a large pool maps, grants
    /// access to and later moves fewer pieces. The driver charges each mapping,
    /// not each byte: on one H200 (run 289) a T5 step spent 1.6-1.9 ms in its
    /// growths with `n` = 2048 against 2.5-2.7 ms without, a mixture of experts'
    /// 0.95 against 1.2 ms, at the same footprint at the device; replayed, the
    /// recorded traces held 1.0303x of live on the mean against 1.0302x (T5
    /// 1.033x against 1.030x). On FSDP2 of the 1.1 B Llama on one H200 (runs
    /// 291-292, five rotated rounds) `n` = 2048 moved 60 % fewer pieces and its steps
    /// took 1.005 times expandable segments' device time instead of 1.091
    /// (mean of round medians), 39.51 GiB at the device against 39.43 (and
    /// expandable segments' 40.19). [`DEFAULT_PIECE_SHARE`] by default; 0 turns
    /// it off (`EMM_POOL_PIECE_SHARE`).
    pub piece_share: usize,
    /// The most 2 MiB pages ([`SegmentPolicy::large_round`]) in one piece of
    /// new memory, whether sized by the request (a 64th of it) or by
    /// [`SegmentPolicy::piece_share`]; 0 counts as 1. Growth maps, grants access
    /// to and later moves each piece whole, and a piece moves only when wholly
    /// free: larger pieces take fewer driver calls, smaller ones leave less
    /// free memory stranded beside a block. [`DEFAULT_PIECE_PAGES`] by default
    /// (`EMM_POOL_PIECE_PAGES`).
    pub piece_pages: usize,
    /// Without the expandable segment (turned off, or none to be had from the
    /// driver): with `n` > 0, the pool's first allocation makes one plain
    /// segment of `n` bytes (rounded up to [`SegmentPolicy::large_round`]), its
    /// home, as RMM's pool takes an initial size (`home.rs`). Every request,
    /// small ones too, takes the best-fitting free block there first; other
    /// segments come only for what it cannot hold, and tightening, merging and
    /// the release threshold never give it back (`trim` and the out-of-memory
    /// ladder do, when it is wholly free; the next allocation asks for it
    /// again). Without virtual memory a segment cannot grow in place, so each
    /// trace's peak is set in its first pass, before the pool knows how large
    /// the steps get (mean
    /// 1.203x of live over the twenty-one recorded traces of 64 MiB or more);
    /// sized from a previous run (1.15x of its peak of allocated bytes), one
    /// home held all twenty-one at that 1.15x over 100 passes with no driver
    /// allocation after the first: the smallest home each needed was
    /// 1.009-1.139x of live (mean 1.080x; `legacy_steady.rs`,
    /// `docs/benchmarks.md`, fifty-second session), but one of two held-out
    /// traces (Wav2Vec2 training) needed 1.171x: a request the home cannot
    /// hold is counted (`home_overflows`) and the first logged as a warning.
    /// The pool then keeps no
    /// thread caches and makes no stream pools ([`crate::PoolConfig`]): blocks
    /// held in a cache or a stream's own pool are not free in the home to
    /// coalesce, and with them three of the traces grew a second segment
    /// (ViT inference 1.264x of live). 0 (the default): no home
    /// (`EMM_POOL_INITIAL_SIZE`). With the expandable segment it changes
    /// nothing: that segment grows in place and places every large request by
    /// best fit already.
    pub initial_size: usize,
}

impl Default for SegmentPolicy {
    fn default() -> Self {
        SegmentPolicy {
            expandable: true,
            expandable_reserve: 1 << 40,
            expand_step: DEFAULT_EXPAND_STEP,
            small_segment: 2 << 20,
            large_segment: 20 << 20,
            large_round: 2 << 20,
            tight_percent: Some(120),
            exclusive: usize::MAX,
            merge_quiet: Some(DEFAULT_LEGACY_MERGE),
            one_range: false,
            adopt_parked: false,
            wait_parked: true,
            replace_pieces: 0,
            piece_share: DEFAULT_PIECE_SHARE,
            piece_pages: DEFAULT_PIECE_PAGES,
            initial_size: 0,
        }
    }
}

impl SegmentPolicy {
    /// The size of the segment made for a request of `size` bytes of `kind`: a
    /// small segment, a shared large one, or the request rounded.
    pub(super) fn segment_for(&self, size: usize, kind: Kind) -> usize {
        match kind {
            Kind::Small => self.small_segment.max(size),
            Kind::Large if size < self.large_segment / 2 => self.large_segment,
            Kind::Large => size.div_ceil(self.large_round) * self.large_round,
        }
    }
}
