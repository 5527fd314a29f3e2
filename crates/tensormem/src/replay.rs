//! Replaying a recorded history through our allocator: parity with PyTorch's decisions (from
//! the recorded start state) and what-if runs from an empty allocator, of the whole job (the
//! blocks live when recording began allocated first, under the what-if setting, then the
//! history) or of the recorded history alone.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use c10_cuda::config::AllocatorConfig;
use c10_cuda::device::StreamId;
use c10_cuda::history::{Clock, TraceAction, TraceEntry};
use c10_cuda::snapshot::DeviceSnapshot;
use c10_cuda::stats::DeviceStats;
use c10_cuda::summary::format_size;
use c10_cuda::{DeviceCachingAllocator, Error as AllocError, Rules, SimDevice};
use thiserror::Error;

use crate::model::{RecordedEvent, Snapshot};
use crate::start_state::{StartState, start_state};

/// How to replay.
#[derive(Clone, Debug)]
pub struct ReplayOptions {
    /// The allocator configuration to replay under.
    pub config: AllocatorConfig,
    /// Simulated device memory in bytes.
    pub capacity: usize,
    /// What-if mode: replay from an empty allocator, our decisions only. Otherwise rebuild the
    /// recorded start state at its recorded places and compare every decision (parity mode).
    pub from_empty: bool,
    /// With `from_empty`: replay the recorded history alone, leaving out the blocks that were
    /// live when recording began (`--history-only`). Otherwise (the default) those blocks
    /// ([`StartState::live`]) are allocated first, in address order, under the what-if
    /// setting, and freed where the history frees them: the replay covers the whole job.
    pub history_only: bool,
    /// The start state to use instead of rebuilding it from the snapshot (advise rebuilds it
    /// once for all its replays; explain passes the one of the whole history).
    pub start: Option<Arc<StartState>>,
    /// Keep the (event index, allocated, reserved) series for plotting.
    pub series: bool,
    /// Keep our own memory history (for `--dump`), with the recorded event behind each entry.
    pub keep_history: bool,
    /// Stop before the recorded event with this index (replay a prefix: the state at that
    /// moment, e.g. just before an `oom` entry). `None` replays everything.
    pub until_event: Option<usize>,
    /// Measure from the recorded event with this index (`--since`): the events before it are
    /// replayed (the job ran them) but the peaks, the lower bound, the peak's event and the
    /// series count only the state from just before it on. `None`: from the start.
    pub since_event: Option<usize>,
    /// Stop at the first allocation our replay cannot place (a yes/no "does it fit" run).
    pub stop_at_first_oom: bool,
    /// The PyTorch version's rules and the fixes to follow (default: the newest version with
    /// every fix; parity replays use [`Rules::pytorch_exact`], see [`crate::versions`]).
    pub rules: Rules,
}

impl ReplayOptions {
    /// Options for a plain replay under `config` on `capacity` bytes: no series, no history,
    /// every event.
    pub fn new(config: AllocatorConfig, capacity: usize, from_empty: bool) -> Self {
        ReplayOptions {
            config,
            capacity,
            from_empty,
            series: false,
            keep_history: false,
            until_event: None,
            since_event: None,
            stop_at_first_oom: false,
            rules: Rules::default(),
            history_only: false,
            start: None,
        }
    }

    /// The mode these options replay in.
    pub fn mode(&self) -> Mode {
        match (self.from_empty, self.history_only) {
            (false, _) => Mode::Parity,
            (true, false) => Mode::WholeJob,
            (true, true) => Mode::HistoryOnly,
        }
    }
}

/// What a replay covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The recorded start state at its recorded places, then the history, every decision
    /// compared with PyTorch's.
    Parity,
    /// What-if, the whole job: the blocks live when recording began, allocated first under
    /// the setting, then the history.
    WholeJob,
    /// What-if, the recorded history alone from an empty allocator (`--history-only`): the
    /// blocks live before recording are left out, so the figures undercount the job.
    HistoryOnly,
}

impl Mode {
    /// How reports name it: `parity`, `whole job`, `history only`.
    pub fn label(self) -> &'static str {
        match self {
            Mode::Parity => "parity",
            Mode::WholeJob => "whole job",
            Mode::HistoryOnly => "history only",
        }
    }
}

/// Why a replay could not run.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ReplayError {
    /// The snapshot holds no history to replay.
    #[error("the snapshot has no memory history to replay (it holds state only)")]
    NoHistory,
    /// The segments that existed before the history began do not fit on the simulated device.
    #[error(
        "--device-memory {capacity}: too small for the segments that existed before the history \
         began ({needed}); use at least {needed}, or --from-empty to place their blocks with our \
         own decisions (--history-only leaves them out)",
        capacity = format_size(*.capacity as u64),
        needed = format_size(*.needed)
    )]
    StartStateTooLarge {
        /// Simulated device memory, bytes.
        capacity: usize,
        /// Bytes of the start state's segments.
        needed: u64,
    },
    /// The allocator or simulated device failed in a way a replay cannot continue from.
    #[error("allocator failure during replay: {0}")]
    Allocator(#[from] AllocError),
}

/// The parity figures: how many of PyTorch's decisions we reproduced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Parity {
    /// Allocations placed at the address PyTorch used (as segment + offset).
    pub alloc_address_match: usize,
    /// Allocations replayed.
    pub alloc_total: usize,
    /// Segment decisions (segment_alloc/free/map/unmap) identical in moment, size and place.
    pub segment_decision_match: usize,
    /// Segment decisions made by either side.
    pub segment_decision_total: usize,
    /// The first difference, if any.
    pub first_divergence: Option<Divergence>,
}

/// Where our replay first differed from the recording.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Divergence {
    /// Index of the recorded event.
    pub event_index: usize,
    /// What PyTorch did.
    pub expected: String,
    /// What we did.
    pub got: String,
}

/// One point of the memory curve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeriesPoint {
    /// Index of the recorded event.
    pub index: usize,
    /// Recorded time, when the file has it.
    pub time_us: Option<u64>,
    /// Allocated bytes after the event.
    pub allocated: u64,
    /// Reserved bytes after the event.
    pub reserved: u64,
}

/// What a replay found.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The configuration string replayed (empty for the default).
    pub config: String,
    /// The rules followed (the PyTorch version and our fixes).
    pub rules: Rules,
    /// What the replay covered.
    pub mode: Mode,
    /// Blocks live when recording began: imported in parity mode, allocated first in
    /// whole-job mode, left out (and not counted anywhere else) in history-only mode.
    pub start_blocks: usize,
    /// Their requested bytes.
    pub start_bytes: u64,
    /// Parity figures (parity mode only).
    pub parity: Option<Parity>,
    /// Recorded events processed.
    pub events: usize,
    /// Allocation requests replayed.
    pub allocs: usize,
    /// Allocation requests that ran out of memory in our replay.
    pub failed_allocs: usize,
    /// Frees of addresses never allocated inside the trace (from-empty mode) or unknown to us.
    pub skipped_frees: usize,
    /// `empty_cache` calls inferred from runs of recorded segment frees.
    pub empty_cache_calls: usize,
    /// Recorded `oom` entries.
    pub recorded_ooms: usize,
    /// Peak reserved bytes in our replay.
    pub peak_reserved: u64,
    /// The recorded event after which our reserved bytes were at their peak with the most
    /// bytes allocated (the first such event).
    pub peak_event_index: usize,
    /// The recorded event after which the replay stopped (the last one processed).
    pub last_event_index: usize,
    /// Peak allocated bytes in our replay.
    pub peak_allocated: u64,
    /// Peak reserved bytes in the recording (parity mode).
    pub recorded_peak_reserved: Option<u64>,
    /// Peak of live bytes, each request rounded up to 512: what any allocator must hold.
    pub lower_bound: u64,
    /// Device allocations (`num_device_alloc`).
    pub device_mallocs: i64,
    /// `num_alloc_retries`.
    pub retries: i64,
    /// `num_ooms`.
    pub ooms: i64,
    /// Statistics at the reserved peak.
    pub stats_at_peak: DeviceStats,
    /// Statistics at the end.
    pub stats_end: DeviceStats,
    /// The start state rebuilt (parity and whole-job modes).
    pub start: Option<Arc<StartState>>,
    /// The memory curve (when asked for).
    pub series: Vec<SeriesPoint>,
    /// Our snapshot at the end, with our history when kept.
    pub snapshot: DeviceSnapshot,
    /// With `keep_history`: for each entry of `snapshot.trace` (but the final `snapshot`
    /// entry), the index of the recorded event whose replay produced it.
    pub origins: Vec<usize>,
    /// With `keep_history`: our address of each block allocated at the end -> the index of the
    /// recorded `alloc` event it replays.
    pub live_origins: HashMap<u64, usize>,
}

/// The `alloc` event index that marks a block live before the history began.
const BEFORE_HISTORY: usize = usize::MAX;

/// Bytes rounded up to 512 (the lower-bound unit).
fn round512(n: u64) -> u64 {
    n.div_ceil(512) * 512
}

/// Recorded segment address -> (size, our address), to compare addresses as segment + offset.
#[derive(Default)]
struct SegmentMap {
    map: BTreeMap<u64, (u64, u64)>,
}

impl SegmentMap {
    fn insert(&mut self, recorded: u64, size: u64, ours: u64) {
        self.map.insert(recorded, (size, ours));
    }

    fn remove(&mut self, recorded: u64) {
        self.map.remove(&recorded);
    }

    fn translate(&self, addr: u64) -> Option<u64> {
        let (&base, &(size, ours)) = self.map.range(..=addr).next_back()?;
        (addr < base + size).then(|| ours + (addr - base))
    }

    /// "segment S+0x1000" for messages.
    fn describe(&self, addr: u64) -> String {
        match self.map.range(..=addr).next_back() {
            Some((&base, &(size, _))) if addr < base + size => {
                format!("{addr:#x} (segment {base:#x} + {:#x})", addr - base)
            }
            _ => format!("{addr:#x}"),
        }
    }
}

fn is_segment_action(a: TraceAction) -> bool {
    matches!(
        a,
        TraceAction::SegmentAlloc
            | TraceAction::SegmentFree
            | TraceAction::SegmentMap
            | TraceAction::SegmentUnmap
    )
}

/// Replays `device`'s history of `snapshot` (see [`ReplayOptions`]); `progress(done, total)`
/// is called every few thousand events.
///
/// # Errors
/// [`ReplayError::NoHistory`] for a state-only snapshot; [`ReplayError::Allocator`] when the
/// simulated device fails in a way that is not out-of-memory.
pub fn replay(
    snapshot: &Snapshot,
    device: usize,
    opts: &ReplayOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Outcome, ReplayError> {
    let events = snapshot
        .traces
        .get(device)
        .filter(|t| crate::model::is_history(t))
        .ok_or(ReplayError::NoHistory)?;
    let sim = SimDevice::address_only(device as u8, opts.capacity).with_auto_complete(true);
    let alloc = DeviceCachingAllocator::with_rules(sim.clone(), opts.config.clone(), opts.rules)?;
    let mut r = Runner {
        alloc,
        sim,
        segs: SegmentMap::default(),
        live: HashMap::new(),
        live_bytes: 0,
        peak_index: 0,
        allocated_at_peak: 0,
        origins: Vec::new(),
        parity: (!opts.from_empty).then(Parity::default),
        out_failed: 0,
        skipped: 0,
        empty_cache_calls: 0,
        peak_reserved: 0,
        peak_allocated: 0,
        stats_at_peak: DeviceStats::default(),
        lower_bound: 0,
        recorded_reserved: 0,
        recorded_peak: 0,
        series: Vec::new(),
        completions: HashMap::new(),
        measuring: opts.since_event.unwrap_or(0) == 0,
    };
    let mut start = None;
    let mut start_blocks = 0;
    let mut start_bytes = 0;
    let rebuild = || {
        opts.start
            .clone()
            .unwrap_or_else(|| Arc::new(start_state(snapshot, device, &opts.config)))
    };
    if !opts.from_empty {
        let st = rebuild();
        let needed: u64 = st.segments.iter().map(|s| s.size).sum();
        if needed > opts.capacity as u64 {
            return Err(ReplayError::StartStateTooLarge {
                capacity: opts.capacity,
                needed,
            });
        }
        for seg in st.segments.iter().filter(|s| !s.expandable) {
            r.sim.script_malloc(seg.address, seg.size as usize);
            let ours = r
                .alloc
                .import_segment(StreamId(seg.stream), seg.small, &seg.blocks)
                .map_err(|e| match e {
                    AllocError::Device(_) | AllocError::OutOfMemory(_) => {
                        ReplayError::StartStateTooLarge {
                            capacity: opts.capacity,
                            needed,
                        }
                    }
                    other => other.into(),
                })?;
            r.sim.clear_script();
            r.segs.insert(seg.address, seg.size, ours);
            r.recorded_reserved += seg.size;
            let mut cursor = seg.address;
            for b in &seg.blocks {
                if b.allocated {
                    r.live_bytes += round512(b.requested as u64);
                    start_blocks += 1;
                    start_bytes += b.requested as u64;
                }
                cursor += b.size as u64;
            }
            debug_assert_eq!(cursor, seg.address + seg.size);
        }
        // Expandable segments cannot be imported (a plain segment would never grow): their
        // live blocks are allocated in address order under the recorded setting, which maps
        // what the recording had mapped when it began when those blocks tiled it (as in our
        // own whole-job dumps), and addresses inside compare as offsets from its start.
        for seg in st.segments.iter().filter(|s| s.expandable) {
            let end = seg.address + seg.size;
            let inside: Vec<&crate::start_state::StartBlock> = st
                .live
                .iter()
                .filter(|b| b.address >= seg.address && b.address < end)
                .collect();
            let mut base = None;
            for b in inside {
                r.start_step(b)?;
                if base.is_none() {
                    if let Some(&(Some(ptr), _, _)) = r.live.get(&b.address) {
                        base = Some(ptr - (b.address - seg.address));
                    }
                }
                start_blocks += 1;
                start_bytes += b.requested;
            }
            if let Some(ours) = base {
                r.segs.insert(seg.address, seg.size, ours);
            }
            r.recorded_reserved += seg.size;
        }
        r.recorded_peak = r.recorded_reserved;
        start = Some(st);
    } else if !opts.history_only {
        let st = rebuild();
        for b in &st.live {
            r.start_step(b)?;
        }
        start_blocks = st.live.len();
        start_bytes = st.live_bytes();
        start = Some(st);
    } else {
        // History only: the blocks are left out, but reports say how many.
        let st = rebuild();
        start_blocks = st.live.len();
        start_bytes = st.live_bytes();
    }
    if !opts.from_empty || opts.keep_history {
        r.alloc
            .record_history(events.len() * 4 + 1024, Clock::Logical);
    }
    // The starting point carries the first event's time, so a fully timed trace plots on a
    // time axis.
    r.sample(0, events.first().and_then(|e| e.time_us), opts.series);
    r.lower_bound = r.live_bytes;

    let total = opts
        .until_event
        .map_or(events.len(), |u| u.min(events.len()));
    // The recorded `free_completed` of each `free_requested` (by event index), for the
    // origins of our own `free_completed` entries.
    let completed_of = if opts.keep_history {
        completion_events(&events[..total])
    } else {
        HashMap::new()
    };
    let mut recorded_ooms = 0;
    let mut allocs = 0;
    let mut i = 0;
    let mut last = 0;
    let since = opts.since_event.unwrap_or(0);
    while i < total {
        if opts.stop_at_first_oom && r.out_failed > 0 {
            break;
        }
        let e = &events[i];
        if !r.measuring && i >= since {
            // The window opens: the state after the events before it is its first point.
            r.measuring = true;
            r.lower_bound = 0;
            r.recorded_peak = r.recorded_reserved;
            r.sample(i - 1, events[i - 1].time_us, opts.series);
        }
        last = i;
        match e.action {
            TraceAction::Alloc => {
                allocs += 1;
                let pending = if opts.from_empty {
                    Vec::new()
                } else {
                    preceding_segment_events(events, i)
                };
                r.alloc_step(i, e, &pending)?;
                if opts.keep_history {
                    // Our segment entries of this step replay the recorded ones just before it
                    // (parity), else they come from this request, as in PyTorch.
                    r.note_step_origins(i, i - pending.len(), &events[i - pending.len()..i]);
                }
            }
            TraceAction::FreeRequested => {
                let freed = r.free_step(e, opts.from_empty)?;
                if let Some(ptr) = freed {
                    match completed_of.get(&i) {
                        Some(&j) => r.completions.insert(ptr, j),
                        None => r.completions.remove(&ptr),
                    };
                }
            }
            TraceAction::SegmentAlloc if !opts.from_empty => {
                r.sim.script_malloc(e.addr, e.size as usize);
                r.recorded_reserved += e.size;
                r.recorded_peak = r.recorded_peak.max(r.recorded_reserved);
            }
            TraceAction::SegmentMap if !opts.from_empty => {
                r.recorded_reserved += e.size;
                r.recorded_peak = r.recorded_peak.max(r.recorded_reserved);
            }
            TraceAction::SegmentFree | TraceAction::SegmentUnmap if !opts.from_empty => {
                let end = (i..total)
                    .find(|&j| {
                        !matches!(
                            events[j].action,
                            TraceAction::SegmentFree | TraceAction::SegmentUnmap
                        )
                    })
                    .unwrap_or(total);
                r.empty_cache_step(i, &events[i..end])?;
                if opts.keep_history {
                    // The k-th segment entry of ours replays the k-th recorded one of the run.
                    r.note_step_origins(i, i, &events[i..end]);
                }
                for ev in &events[i + 1..end] {
                    r.recorded_reserved -= ev.size.min(r.recorded_reserved);
                }
                r.recorded_reserved -= e.size.min(r.recorded_reserved);
                r.sample(end - 1, e.time_us, opts.series);
                last = end - 1;
                i = end;
                continue;
            }
            TraceAction::Oom => recorded_ooms += 1,
            _ => {}
        }
        if opts.keep_history {
            r.note_origins(i);
        }
        r.sample(i, e.time_us, opts.series);
        if i % 4096 == 0 {
            progress(i, total);
        }
        i += 1;
    }
    progress(total, total);
    let stats_end = r.alloc.stats();
    let snapshot_out = r.alloc.snapshot();
    let live_origins = if opts.keep_history {
        r.live
            .values()
            .filter(|&&(_, _, event)| event != BEFORE_HISTORY)
            .filter_map(|&(ptr, _, event)| Some((ptr?, event)))
            .collect()
    } else {
        HashMap::new()
    };
    Ok(Outcome {
        config: opts.config.to_string(),
        rules: opts.rules,
        mode: opts.mode(),
        start_blocks,
        start_bytes,
        parity: r.parity,
        events: total,
        allocs,
        failed_allocs: r.out_failed,
        skipped_frees: r.skipped,
        empty_cache_calls: r.empty_cache_calls,
        recorded_ooms,
        peak_reserved: r.peak_reserved,
        peak_event_index: r.peak_index,
        last_event_index: last,
        peak_allocated: r.peak_allocated,
        recorded_peak_reserved: (!opts.from_empty).then_some(r.recorded_peak),
        lower_bound: r.lower_bound,
        device_mallocs: stats_end.num_device_alloc,
        retries: stats_end.num_alloc_retries,
        ooms: stats_end.num_ooms,
        stats_at_peak: r.stats_at_peak,
        stats_end,
        start,
        series: r.series,
        snapshot: snapshot_out,
        origins: r.origins,
        live_origins,
    })
}

/// For each recorded `free_requested` (by index) that a `free_completed` of the same address
/// follows before the address is allocated again, that `free_completed`'s index.
fn completion_events(events: &[RecordedEvent]) -> HashMap<usize, usize> {
    let mut pending: HashMap<u64, usize> = HashMap::new();
    let mut out = HashMap::new();
    for (j, e) in events.iter().enumerate() {
        match e.action {
            TraceAction::FreeRequested => {
                pending.insert(e.addr, j);
            }
            TraceAction::FreeCompleted => {
                if let Some(i) = pending.remove(&e.addr) {
                    out.insert(i, j);
                }
            }
            TraceAction::Alloc => {
                pending.remove(&e.addr);
            }
            _ => {}
        }
    }
    out
}

/// The recorded segment_alloc / segment_map events directly before the alloc at `i`: the
/// device allocations that request caused.
fn preceding_segment_events(events: &[RecordedEvent], i: usize) -> Vec<RecordedEvent> {
    let mut j = i;
    while j > 0
        && matches!(
            events[j - 1].action,
            TraceAction::SegmentAlloc | TraceAction::SegmentMap
        )
    {
        j -= 1;
    }
    events[j..i].to_vec()
}

struct Runner {
    alloc: DeviceCachingAllocator<SimDevice>,
    sim: SimDevice,
    segs: SegmentMap,
    /// Recorded address -> (our address, or `None` when our replay ran out of memory for it;
    /// the bytes it counts toward the live-bytes lower bound, a property of the recording; the
    /// index of its `alloc` event).
    live: HashMap<u64, (Option<u64>, u64, usize)>,
    live_bytes: u64,
    /// The event index of the reserved peak (the one with the most allocated bytes).
    peak_index: usize,
    /// Allocated bytes at `peak_index`.
    allocated_at_peak: u64,
    /// Our history entry -> recorded event index (with `keep_history`).
    origins: Vec<usize>,
    parity: Option<Parity>,
    out_failed: usize,
    skipped: usize,
    empty_cache_calls: usize,
    peak_reserved: u64,
    peak_allocated: u64,
    stats_at_peak: DeviceStats,
    lower_bound: u64,
    recorded_reserved: u64,
    recorded_peak: u64,
    series: Vec<SeriesPoint>,
    /// With `keep_history`: our address of a block whose free was replayed -> the index of the
    /// recorded `free_completed` that our `free_completed` entry for it replays.
    completions: HashMap<u64, usize>,
    /// Whether the window (`since_event`) has opened: samples before it count for nothing.
    measuring: bool,
}

impl Runner {
    /// Marks the entries of a step at `index` (an alloc, or a run of segment frees): the k-th
    /// segment entry comes from the k-th of `recorded` (recorded segment events starting at
    /// `first`) when there is one, a `free_completed` from the recorded one of its block (see
    /// [`Self::origin_of`]).
    fn note_step_origins(&mut self, index: usize, first: usize, recorded: &[RecordedEvent]) {
        let start = self.origins.len();
        let n = self.alloc.history_len();
        let mut k = 0;
        for entry in start..n {
            let (action, addr) = self
                .alloc
                .history_since(entry)
                .next()
                .map_or((TraceAction::Snapshot, 0), |t| (t.action, t.addr));
            let origin = if is_segment_action(action) && k < recorded.len() {
                k += 1;
                first + k - 1
            } else {
                self.origin_of(action, addr, index)
            };
            self.origins.push(origin);
        }
    }

    /// Marks the history entries made since the last call as coming from event `index` (a
    /// `free_completed` from the recorded one of its block, see [`Self::origin_of`]).
    fn note_origins(&mut self, index: usize) {
        let start = self.origins.len();
        let n = self.alloc.history_len();
        for entry in start..n {
            let (action, addr) = self
                .alloc
                .history_since(entry)
                .next()
                .map_or((TraceAction::Snapshot, 0), |t| (t.action, t.addr));
            let origin = self.origin_of(action, addr, index);
            self.origins.push(origin);
        }
    }

    /// The recorded event behind our entry (`action` at our `addr`) of a step at `index`: for
    /// a `free_completed`, the recorded `free_completed` of that block when the recording has
    /// one (it may come later than its `free_requested`, with its own time and stack), else
    /// `index`.
    fn origin_of(&mut self, action: TraceAction, addr: u64, index: usize) -> usize {
        if action == TraceAction::FreeCompleted {
            if let Some(j) = self.completions.remove(&addr) {
                return j;
            }
        }
        index
    }

    fn sample(&mut self, index: usize, time_us: Option<u64>, series: bool) {
        if !self.measuring {
            return;
        }
        let reserved = self.alloc.reserved_bytes() as u64;
        let allocated = self.alloc.allocated_bytes() as u64;
        if reserved > self.peak_reserved {
            self.peak_reserved = reserved;
            self.peak_index = index;
            self.allocated_at_peak = allocated;
            self.stats_at_peak = self.alloc.stats();
        } else if reserved == self.peak_reserved && allocated > self.allocated_at_peak {
            // The moment of the peak that holds the most: what top call sites look at.
            self.peak_index = index;
            self.allocated_at_peak = allocated;
        }
        self.peak_allocated = self.peak_allocated.max(allocated);
        self.lower_bound = self.lower_bound.max(self.live_bytes);
        if series {
            self.series.push(SeriesPoint {
                index,
                time_us,
                allocated,
                reserved,
            });
        }
    }

    fn diverge(&mut self, event_index: usize, expected: String, got: String) {
        if let Some(p) = self.parity.as_mut() {
            if p.first_divergence.is_none() {
                p.first_divergence = Some(Divergence {
                    event_index,
                    expected,
                    got,
                });
            }
        }
    }

    /// Allocates a block live when recording began (whole-job mode), under our setting; it is
    /// live in the recording whether or not our replay can place it.
    fn start_step(&mut self, b: &crate::start_state::StartBlock) -> Result<(), ReplayError> {
        let bytes = b.request_bytes();
        let ptr = match self.alloc.malloc(bytes as usize, StreamId(b.stream)) {
            Ok(a) => Some(a.ptr),
            Err(AllocError::OutOfMemory(_)) => {
                self.out_failed += 1;
                None
            }
            Err(other) => return Err(other.into()),
        };
        let counted = round512(bytes);
        self.live_bytes += counted;
        self.live.insert(b.address, (ptr, counted, BEFORE_HISTORY));
        Ok(())
    }

    fn alloc_step(
        &mut self,
        i: usize,
        e: &RecordedEvent,
        pending: &[RecordedEvent],
    ) -> Result<(), ReplayError> {
        let h0 = self.alloc.history_len();
        let result = self.alloc.malloc(e.size as usize, StreamId(e.stream));
        let ours: Vec<TraceEntry> = self
            .alloc
            .history_since(h0)
            .filter(|t| is_segment_action(t.action))
            .cloned()
            .collect();
        self.sim.clear_script();
        let ptr = match result {
            Ok(a) => Some(a.ptr),
            Err(AllocError::OutOfMemory(_)) => {
                self.out_failed += 1;
                None
            }
            Err(other) => return Err(other.into()),
        };
        if self.parity.is_some() {
            self.compare_segments(i, pending, &ours);
            let p = self.parity.as_mut().expect("parity mode");
            p.alloc_total += 1;
            let expected = self.segs.translate(e.addr);
            if ptr.is_some() && ptr == expected {
                p.alloc_address_match += 1;
            } else {
                let want = self.segs.describe(e.addr);
                let got = ptr.map_or("out of memory".to_string(), |p| format!("{p:#x}"));
                self.diverge(i, format!("alloc of {} bytes at {want}", e.size), got);
            }
        }
        // The request is live in the recording whether or not our replay could place it.
        let counted = round512(e.size);
        self.live_bytes += counted;
        if let Some((old_ptr, old_counted, _)) = self.live.insert(e.addr, (ptr, counted, i)) {
            // The recording reused an address we still hold: keep ours consistent.
            if let Some(old_ptr) = old_ptr {
                let _ = self.alloc.free(old_ptr);
            }
            self.live_bytes -= old_counted;
        }
        Ok(())
    }

    fn compare_segments(&mut self, i: usize, recorded: &[RecordedEvent], ours: &[TraceEntry]) {
        let n = recorded.len().max(ours.len());
        let mut matched = 0;
        for k in 0..n {
            match (recorded.get(k), ours.get(k)) {
                (Some(rec), Some(our)) if rec.action == our.action && rec.size == our.size => {
                    matched += 1;
                    // A new segment, or a new mapping of an expandable one: addresses inside
                    // it compare as the same offset into it.
                    if matches!(
                        rec.action,
                        TraceAction::SegmentAlloc | TraceAction::SegmentMap
                    ) {
                        self.segs.insert(rec.addr, rec.size, our.addr);
                    }
                }
                (rec, our) => {
                    let show_rec = rec.map_or("nothing".into(), |r| {
                        format!("{} of {} bytes", r.action, r.size)
                    });
                    let show_our = our.map_or("nothing".into(), |o| {
                        format!("{} of {} bytes", o.action, o.size)
                    });
                    self.diverge(i, show_rec, show_our);
                    if let (Some(rec), Some(our)) = (rec, our) {
                        if rec.action == our.action
                            && matches!(
                                rec.action,
                                TraceAction::SegmentAlloc | TraceAction::SegmentMap
                            )
                        {
                            self.segs.insert(rec.addr, rec.size, our.addr);
                        }
                    }
                }
            }
        }
        let p = self.parity.as_mut().expect("parity mode");
        p.segment_decision_total += n;
        p.segment_decision_match += matched;
    }

    /// Frees the block of the recorded free `e`; returns our address of it when our allocator
    /// freed one.
    fn free_step(
        &mut self,
        e: &RecordedEvent,
        from_empty: bool,
    ) -> Result<Option<u64>, ReplayError> {
        let ptr = match self.live.remove(&e.addr) {
            Some((ptr, counted, _)) => {
                self.live_bytes -= counted;
                match ptr {
                    Some(ptr) => Some(ptr),
                    // Our replay never placed it (out of memory): nothing to free, not a skip.
                    None => return Ok(None),
                }
            }
            None if !from_empty => {
                // A block live at the start: imported at its recorded place.
                self.live_bytes = self.live_bytes.saturating_sub(round512(e.size));
                self.segs.translate(e.addr)
            }
            None => None,
        };
        match ptr.map(|p| (p, self.alloc.free(p))) {
            Some((p, Ok(()))) => Ok(Some(p)),
            Some((_, Err(AllocError::InvalidPointer { .. }))) | None => {
                self.skipped += 1;
                Ok(None)
            }
            Some((_, Err(other))) => Err(other.into()),
        }
    }

    fn empty_cache_step(
        &mut self,
        i: usize,
        recorded: &[RecordedEvent],
    ) -> Result<(), ReplayError> {
        self.empty_cache_calls += 1;
        let h0 = self.alloc.history_len();
        self.alloc.empty_cache()?;
        let ours: Vec<TraceEntry> = self
            .alloc
            .history_since(h0)
            .filter(|t| is_segment_action(t.action))
            .cloned()
            .collect();
        let n = recorded.len().max(ours.len());
        let mut matched = 0;
        for k in 0..n {
            match (recorded.get(k), ours.get(k)) {
                (Some(rec), Some(our))
                    if rec.action == our.action
                        && rec.size == our.size
                        && self.segs.translate(rec.addr) == Some(our.addr) =>
                {
                    matched += 1;
                }
                (rec, our) => {
                    let show_rec = rec.map_or("nothing".into(), |r| {
                        format!("{} of {} bytes at {:#x}", r.action, r.size, r.addr)
                    });
                    let show_our = our.map_or("nothing".into(), |o| {
                        format!("{} of {} bytes at {:#x}", o.action, o.size, o.addr)
                    });
                    self.diverge(
                        i + k.min(recorded.len().saturating_sub(1)),
                        show_rec,
                        show_our,
                    );
                }
            }
        }
        for rec in recorded {
            if rec.action == TraceAction::SegmentFree {
                self.segs.remove(rec.addr);
            }
        }
        if let Some(p) = self.parity.as_mut() {
            p.segment_decision_total += n;
            p.segment_decision_match += matched;
        }
        Ok(())
    }
}
