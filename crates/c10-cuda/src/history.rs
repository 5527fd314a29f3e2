//! Memory history: trace entries in a ring buffer (PyTorch's `TraceEntry` and `alloc_trace`).
//!
//! Enabled by [`crate::DeviceCachingAllocator::record_history`], as PyTorch's
//! `torch.cuda.memory._record_memory_history(max_entries=N)`. Each allocator action appends one
//! [`TraceEntry`]; when `max_entries` are held the oldest is dropped.

use std::collections::VecDeque;
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
    /// stack was recorded. The allocator records none itself: callers attach stacks to the
    /// entries of [`crate::snapshot::DeviceSnapshot::trace`] (e.g. a replay attaches the
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

/// The ring buffer of trace entries.
#[derive(Clone, Debug, Default)]
pub(crate) struct History {
    entries: VecDeque<TraceEntry>,
    max_entries: usize,
    enabled: bool,
    clock: Clock,
    counter: u64,
}

impl History {
    pub(crate) fn enable(&mut self, max_entries: usize, clock: Clock) {
        self.enabled = max_entries > 0;
        self.max_entries = max_entries;
        self.clock = clock;
        while self.entries.len() > max_entries {
            self.entries.pop_front();
        }
    }

    pub(crate) fn disable(&mut self) {
        self.enabled = false;
    }

    #[inline(always)]
    pub(crate) fn record(&mut self, action: TraceAction, addr: u64, size: u64, stream: StreamId) {
        if self.enabled {
            self.push(action, addr, size, stream);
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
        if self.entries.len() == self.max_entries {
            self.entries.pop_front();
        }
        self.entries.push_back(TraceEntry {
            action,
            addr,
            size,
            stream,
            time_us,
            frames: None,
        });
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
