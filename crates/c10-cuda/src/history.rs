//! Memory history: trace entries in a ring buffer (PyTorch's `TraceEntry` and `alloc_trace`),
//! the call-site context attached to them, and the trace trackers called for each of them.
//!
//! Enabled by [`crate::DeviceCachingAllocator::record_history`], as PyTorch's
//! `torch.cuda.memory._record_memory_history(max_entries=N)`, or by
//! [`crate::DeviceCachingAllocator::record_memory_history`], which also takes the context mode
//! ([`RecordContext`], PyTorch's `context=` argument). Each allocator action appends one
//! [`TraceEntry`]; when `max_entries` are held the oldest is dropped.
//!
//! Contexts follow PyTorch's `DeviceCachingAllocator`: the operation in progress (a malloc, a
//! free, an `empty_cache`) sets the stack it was called from; an `alloc` keeps it as the block's
//! `context_when_allocated` (shown by snapshots while the block is active) and a `segment_alloc`
//! as the segment's; a free without a stack of its own (mode [`RecordContext::Alloc`]) is
//! recorded with the stack of the allocation, a `segment_free` with the segment's.
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::device::StreamId;

/// What happened (PyTorch's `TraceEntry::Action`, spelled as in snapshots).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TraceAction {
    /// A block was handed out (`alloc`); `size` is the requested bytes.
    Alloc,
    /// The user freed a block (`free_requested`); it may still wait on stream events.
    FreeRequested,
    /// The block is really free (`free_completed`).
    FreeCompleted,
    /// A segment was allocated with `cudaMalloc` (`segment_alloc`); `size` is the segment bytes.
    SegmentAlloc,
    /// A segment was released with `cudaFree` (`segment_free`).
    SegmentFree,
    /// Pages of an expandable segment were mapped (`segment_map`).
    SegmentMap,
    /// Pages of an expandable segment were unmapped (`segment_unmap`).
    SegmentUnmap,
    /// A snapshot was taken (`snapshot`); `size` is the active bytes at that moment.
    Snapshot,
    /// An allocation failed (`oom`); `addr` holds the device's free bytes, `size` the rounded
    /// request.
    Oom,
}

impl TraceAction {
    /// Every action, in PyTorch's enum order.
    pub const ALL: [TraceAction; 9] = [
        TraceAction::Alloc,
        TraceAction::FreeRequested,
        TraceAction::FreeCompleted,
        TraceAction::SegmentAlloc,
        TraceAction::SegmentFree,
        TraceAction::SegmentMap,
        TraceAction::SegmentUnmap,
        TraceAction::Snapshot,
        TraceAction::Oom,
    ];

    /// The name used in snapshots (`alloc`, `free_requested`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            TraceAction::Alloc => "alloc",
            TraceAction::FreeRequested => "free_requested",
            TraceAction::FreeCompleted => "free_completed",
            TraceAction::SegmentAlloc => "segment_alloc",
            TraceAction::SegmentFree => "segment_free",
            TraceAction::SegmentMap => "segment_map",
            TraceAction::SegmentUnmap => "segment_unmap",
            TraceAction::Snapshot => "snapshot",
            TraceAction::Oom => "oom",
        }
    }

    /// Parses a snapshot's action name; `None` for an unknown one.
    pub fn parse(name: &str) -> Option<TraceAction> {
        TraceAction::ALL.into_iter().find(|a| a.as_str() == name)
    }
}

impl std::fmt::Display for TraceAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One stack frame of an entry's context, as snapshots spell it (`{'name', 'filename',
/// 'line'}`; PyTorch's `GatheredContext` frames after symbolization).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    /// The function (`name`).
    pub name: Arc<str>,
    /// The source file (`filename`; `"??"` or empty when unknown).
    pub filename: Arc<str>,
    /// The line (`line`; 0 when unknown).
    pub line: u32,
}

/// A call stack, innermost frame first. Shared (`Arc`) because many entries carry the same
/// stack, as PyTorch's snapshots share their frame objects.
pub type Frames = Arc<[Frame]>;

/// One history entry (PyTorch's `TraceEntry`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceEntry {
    /// What happened.
    pub action: TraceAction,
    /// The block or segment address; for [`TraceAction::Oom`] the device's free bytes
    /// (snapshots call it `device_free`).
    pub addr: u64,
    /// Bytes: requested bytes for alloc/free entries, segment bytes for segment entries.
    pub size: u64,
    /// The stream of the block or segment.
    pub stream: StreamId,
    /// When, in microseconds (since the Unix epoch with [`Clock::System`], or a step counter
    /// with [`Clock::Logical`]).
    pub time_us: u64,
    /// Where the action came from (PyTorch's `context`, written as `frames`); `None` when no
    /// stack was recorded. The allocator records the caller's stack when history is recorded
    /// with a [`RecordContext`] of [`RecordContext::Alloc`] or more and the caller gave one
    /// (the thread-safe front does, see [`crate::call_site`]); callers may also attach stacks to
    /// the entries of [`crate::snapshot::DeviceSnapshot::trace`] (e.g. a replay attaches the
    /// recorded ones).
    pub frames: Option<Frames>,
}

/// Where trace timestamps come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Clock {
    /// Wall-clock microseconds since the Unix epoch (as PyTorch).
    #[default]
    System,
    /// A counter incremented per entry: deterministic, for tests and replays.
    Logical,
}

/// Which trace entries and blocks carry the stack they were made from (PyTorch's
/// `RecordContext`, chosen by `_record_memory_history(context=None|"state"|"alloc"|"all")`).
///
/// Ordered: each mode records what the one before it does, and more.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum RecordContext {
    /// No stacks (`NEVER`, `context=None`). Nothing is captured: no cost.
    #[default]
    Never = 0,
    /// Stacks of the active allocations only, shown by snapshots on their blocks (`STATE`,
    /// `context="state"`); trace entries carry none.
    State = 1,
    /// Also the stacks of allocations in the trace: `alloc`, `segment_alloc`, `segment_map` and
    /// `oom` entries carry the stack of the malloc, and the entries of a free carry the stack of
    /// the allocation it frees (`ALLOC`, `context="alloc"`).
    Alloc = 2,
    /// Also the stacks of frees and of `empty_cache`: `free_requested`, `free_completed`,
    /// `segment_free` and `segment_unmap` carry the stack of the call that freed (`ALL`,
    /// `context="all"`, PyTorch's default).
    All = 3,
}

impl RecordContext {
    /// PyTorch's spelling of the `context=` argument: `None`, `state`, `alloc`, `all`.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordContext::Never => "None",
            RecordContext::State => "state",
            RecordContext::Alloc => "alloc",
            RecordContext::All => "all",
        }
    }

    /// The mode from its number (`NEVER` = 0 ... `ALL` = 3, as PyTorch's enum); `None` above 3.
    pub fn from_u8(value: u8) -> Option<RecordContext> {
        match value {
            0 => Some(RecordContext::Never),
            1 => Some(RecordContext::State),
            2 => Some(RecordContext::Alloc),
            3 => Some(RecordContext::All),
            _ => None,
        }
    }
}

/// The ring buffer of trace entries, the contexts of live blocks and segments, and the
/// trace trackers.
#[derive(Default)]
pub(crate) struct History {
    entries: VecDeque<TraceEntry>,
    max_entries: usize,
    enabled: bool,
    clock: Clock,
    counter: u64,
    /// `enabled` or a trace tracker attached: whether entries are made at all (PyTorch's
    /// `record_history || !trace_trackers_.empty()`).
    active: bool,
    /// The context mode (PyTorch's `record_context_`); `Never` while not recording.
    context: RecordContext,
    /// The stack of the operation in progress (PyTorch passes it down as `context`).
    current: Option<Frames>,
    /// `context_when_allocated` of active blocks, by block address.
    blocks: HashMap<u64, Frames>,
    /// `context_when_segment_allocated`, by segment (or mapped range) address.
    segments: HashMap<u64, Frames>,
    /// Trace trackers (PyTorch's `trace_trackers_`) and the device index they are told.
    trackers: Vec<TraceTracker>,
    device: u8,
}

impl std::fmt::Debug for History {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("History")
            .field("entries", &self.entries.len())
            .field("max_entries", &self.max_entries)
            .field("enabled", &self.enabled)
            .field("context", &self.context)
            .field("trackers", &self.trackers.len())
            .finish_non_exhaustive()
    }
}

impl History {
    /// Starts recording without stacks (context [`RecordContext::Never`]).
    pub(crate) fn enable(&mut self, max_entries: usize, clock: Clock) {
        self.enable_with(max_entries, clock, RecordContext::Never);
    }

    /// Starts recording with the context mode `context`.
    pub(crate) fn enable_with(&mut self, max_entries: usize, clock: Clock, context: RecordContext) {
        self.enabled = max_entries > 0;
        self.max_entries = max_entries;
        self.clock = clock;
        self.set_context(if self.enabled {
            context
        } else {
            RecordContext::Never
        });
        while self.entries.len() > max_entries {
            self.entries.pop_front();
        }
        self.update_active();
    }

    pub(crate) fn disable(&mut self) {
        self.enabled = false;
        self.set_context(RecordContext::Never);
        self.update_active();
    }

    fn set_context(&mut self, context: RecordContext) {
        self.context = context;
        if context == RecordContext::Never {
            // Nothing keeps these up to date any more.
            self.blocks.clear();
            self.segments.clear();
        }
    }

    fn update_active(&mut self) {
        self.active = self.enabled || !self.trackers.is_empty();
    }

    /// The context mode in force.
    pub(crate) fn context(&self) -> RecordContext {
        self.context
    }

    /// Sets the stack of the operation in progress (`None` when it has none); returns the one
    /// it replaces.
    pub(crate) fn set_current(&mut self, frames: Option<Frames>) -> Option<Frames> {
        std::mem::replace(&mut self.current, frames)
    }

    /// The stack an active block was allocated from (its `context_when_allocated`).
    pub(crate) fn block_frames(&self, addr: u64) -> Option<Frames> {
        self.blocks.get(&addr).cloned()
    }

    /// The stack a segment was allocated from (its `context_when_segment_allocated`).
    pub(crate) fn segment_frames(&self, addr: u64) -> Option<Frames> {
        self.segments.get(&addr).cloned()
    }

    /// Attaches a trace tracker, told `device` with each entry.
    pub(crate) fn attach_tracker(&mut self, device: u8, tracker: TraceTracker) {
        self.device = device;
        self.trackers.push(tracker);
        self.update_active();
    }

    /// Whether entries are recorded (history enabled or a trace tracker attached).
    #[inline(always)]
    pub(crate) fn is_active(&self) -> bool {
        self.active
    }

    #[inline(always)]
    pub(crate) fn record(&mut self, action: TraceAction, addr: u64, size: u64, stream: StreamId) {
        if self.active {
            self.push(action, addr, size, stream);
        }
    }

    /// The stack an entry carries, keeping the block and segment contexts up to date (PyTorch's
    /// `context ? context : block->context_when_allocated` and friends).
    fn entry_context(&mut self, action: TraceAction, addr: u64) -> Option<Frames> {
        if self.context == RecordContext::Never {
            return None;
        }
        let current = self.current.clone();
        match action {
            TraceAction::Alloc => {
                match &current {
                    Some(frames) => self.blocks.insert(addr, Arc::clone(frames)),
                    None => self.blocks.remove(&addr),
                };
                current
            }
            TraceAction::FreeRequested => current.or_else(|| self.blocks.get(&addr).cloned()),
            TraceAction::FreeCompleted => {
                let allocated = self.blocks.remove(&addr);
                current.or(allocated)
            }
            TraceAction::SegmentAlloc | TraceAction::SegmentMap => {
                if let Some(frames) = &current {
                    self.segments.insert(addr, Arc::clone(frames));
                }
                current
            }
            TraceAction::SegmentFree | TraceAction::SegmentUnmap => {
                let allocated = self.segments.remove(&addr);
                current.or(allocated)
            }
            TraceAction::Oom => current,
            TraceAction::Snapshot => None,
        }
    }

    #[cold]
    #[inline(never)]
    fn push(&mut self, action: TraceAction, addr: u64, size: u64, stream: StreamId) {
        self.counter += 1;
        let time_us = match self.clock {
            Clock::Logical => self.counter,
            Clock::System => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as u64),
        };
        let context = self.entry_context(action, addr);
        let frames = if self.context >= RecordContext::Alloc {
            context
        } else {
            None
        };
        let entry = TraceEntry {
            action,
            addr,
            size,
            stream,
            time_us,
            frames,
        };
        for tracker in &self.trackers {
            tracker(self.device, &entry);
        }
        if !self.enabled {
            return;
        }
        if self.entries.len() == self.max_entries {
            self.entries.pop_front();
        }
        self.entries.push_back(entry);
    }

    pub(crate) fn entries(&self) -> impl ExactSizeIterator<Item = &TraceEntry> {
        self.entries.iter()
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn since(&self, start: usize) -> impl ExactSizeIterator<Item = &TraceEntry> {
        self.entries.range(start.min(self.entries.len())..)
    }

    pub(crate) fn clear(&mut self) {
        self.entries.clear();
    }
}

/// A function called with every trace entry as the allocator makes it (PyTorch's
/// `AllocatorTraceTracker`), with the device index: whether or not history is being
/// recorded, as in PyTorch.
///
/// It runs while the device's allocator lock is held, as in PyTorch: it must not call back into
/// the allocator of that device (that would deadlock), and any lock it takes must never be held
/// by a thread that waits on the allocator.
pub type TraceTracker = Arc<dyn Fn(u8, &TraceEntry) + Send + Sync>;
