//! The snapshot model the replayer works on: segments, blocks and trace events, decoupled from
//! the file format they were read from (pickle or JSON, any PyTorch version).

use c10_cuda::config::AllocatorConfig;
use c10_cuda::history::{Frames, TraceAction};
use c10_cuda::snapshot::BlockState;
use tensormem_pickle::Value;

/// One block of a recorded segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedBlock {
    /// Start address.
    pub address: u64,
    /// Bytes of the block.
    pub size: u64,
    /// Bytes requested by its allocation (0 when the file does not say).
    pub requested_size: u64,
    /// Allocated, pending free, or inactive.
    pub state: BlockState,
    /// The stack of the allocation holding it (`frames`, or the newest `history` entry's),
    /// when the file records one.
    pub frames: Option<Frames>,
}

/// One recorded segment (`torch.cuda.memory._snapshot()['segments'][i]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedSegment {
    /// Device index.
    pub device: u8,
    /// Start address.
    pub address: u64,
    /// Bytes of the segment.
    pub total_size: u64,
    /// The stream it serves.
    pub stream: u64,
    /// Large pool (`segment_type == 'large'`).
    pub is_large: bool,
    /// Part of an expandable segment.
    pub is_expandable: bool,
    /// Its blocks in address order.
    pub blocks: Vec<RecordedBlock>,
}

/// One recorded trace entry (`device_traces[d][i]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedEvent {
    /// What happened.
    pub action: TraceAction,
    /// Address (for `oom`: the device's free bytes).
    pub addr: u64,
    /// Bytes: requested for alloc/free entries, segment bytes for segment entries.
    pub size: u64,
    /// Stream.
    pub stream: u64,
    /// Microseconds, when the file records them (PyTorch 2.1+).
    pub time_us: Option<u64>,
    /// The stack (`frames`), innermost first; `None` when the entry has none.
    pub frames: Option<Frames>,
    /// `compile_context` (torch.compile's context string), when recorded.
    pub compile_context: Option<String>,
    /// `user_metadata` (set with `torch.cuda.memory._set_memory_metadata`), when recorded.
    pub user_metadata: Option<String>,
}

impl RecordedEvent {
    /// An entry with no stack, times or metadata.
    pub fn new(action: TraceAction, addr: u64, size: u64, stream: u64) -> Self {
        RecordedEvent {
            action,
            addr,
            size,
            stream,
            time_us: None,
            frames: None,
            compile_context: None,
            user_metadata: None,
        }
    }
}

/// What the file said about the allocator's settings.
#[derive(Clone, Debug, PartialEq)]
pub enum RecordedSettings {
    /// `allocator_settings` was present and understood.
    Recorded(AllocatorConfig),
    /// No `allocator_settings` (older PyTorch): the default is assumed.
    Absent,
}

/// A loaded snapshot.
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    /// Segments at the moment of the dump.
    pub segments: Vec<RecordedSegment>,
    /// Trace entries per device (empty when history was off).
    pub traces: Vec<Vec<RecordedEvent>>,
    /// The recorded allocator settings.
    pub settings: RecordedSettings,
    /// `external_annotations` as recorded (e.g. `record_function` ranges), kept verbatim.
    pub external_annotations: Option<Value>,
    /// Facts about the file's format, for the report.
    pub format: FormatNotes,
}

/// Facts about the file that was loaded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FormatNotes {
    /// `pickle` or `json`.
    pub encoding: &'static str,
    /// The file was a bare list of segments (very old PyTorch).
    pub bare_segment_list: bool,
    /// Some trace entries lacked `time_us`.
    pub missing_time: bool,
    /// Blocks used the old `history` key instead of `frames`.
    pub history_key: bool,
    /// Blocks had no `address` (older files): placed one after another from the segment start.
    pub blocks_without_address: bool,
}

/// Whether a trace is a memory history: it records at least one allocation or free request.
/// Entries of other kinds alone (a `snapshot` marker, a stray `oom` or segment entry) leave
/// nothing to replay.
pub fn is_history(trace: &[RecordedEvent]) -> bool {
    trace
        .iter()
        .any(|e| matches!(e.action, TraceAction::Alloc | TraceAction::FreeRequested))
}

impl Snapshot {
    /// The index of the device whose trace is the longest (the one to replay), among the
    /// traces that are a history ([`is_history`]).
    pub fn main_device(&self) -> Option<usize> {
        self.traces
            .iter()
            .enumerate()
            .filter(|(_, t)| is_history(t))
            .max_by_key(|(_, t)| t.len())
            .map(|(i, _)| i)
    }

    /// Whether any device has a history ([`is_history`]).
    pub fn has_history(&self) -> bool {
        self.main_device().is_some()
    }

    /// Trace entries other than `snapshot` in traces that are no history (a state-only file
    /// with a stray `oom` or segment entry): they are not replayed.
    pub fn stray_entries(&self) -> usize {
        self.traces
            .iter()
            .filter(|t| !is_history(t))
            .flatten()
            .filter(|e| e.action != TraceAction::Snapshot)
            .count()
    }

    /// The allocator configuration the run used (the default when not recorded).
    pub fn config(&self) -> AllocatorConfig {
        match &self.settings {
            RecordedSettings::Recorded(c) => c.clone(),
            RecordedSettings::Absent => AllocatorConfig::default(),
        }
    }

    /// Bytes reserved at the dump (sum of segment sizes).
    pub fn reserved_bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.total_size).sum()
    }

    /// Bytes in allocated blocks at the dump.
    pub fn allocated_bytes(&self) -> u64 {
        self.segments
            .iter()
            .flat_map(|s| &s.blocks)
            .filter(|b| b.state == BlockState::ActiveAllocated)
            .map(|b| b.size)
            .sum()
    }
}
