//! Rebuilding the allocator state that existed before a recorded history began.
//!
//! A trace usually starts with segments already present (recorded before history was turned
//! on). The start state is: the dump's segments not created inside the trace, plus segments the
//! trace frees without having created them; its live blocks are those the trace frees before
//! ever allocating them, plus the dump's allocated blocks the trace never touches. Everything
//! else inside a start segment was free (and, by the merge rule, one free block per gap).
//!
//! An expandable segment (`is_expandable`) grows and shrinks by `segment_map`/`segment_unmap`
//! inside the trace: its start size is the dump's mapped bytes minus the trace's net mapping in
//! its address range, and it is left out when nothing was mapped yet.
//!
//! Parity replays import the segments at their recorded places (an expandable one is rebuilt
//! by allocating its live blocks in address order); what-if replays of the whole
//! job allocate [`StartState::live`] first, under the what-if setting, then replay the history
//! (see [`crate::replay::ReplayOptions::history_only`]).

use std::collections::{BTreeMap, HashMap, HashSet};

use c10_cuda::config::AllocatorConfig;
use c10_cuda::history::TraceAction;
use c10_cuda::import::ImportBlock;
use c10_cuda::sizes::{SMALL_BUFFER, round_size, should_split};
use c10_cuda::snapshot::BlockState;

use crate::model::{RecordedEvent, Snapshot};

/// A segment to import before replaying.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StartSegment {
    /// The recorded address.
    pub address: u64,
    /// Bytes.
    pub size: u64,
    /// Small pool.
    pub small: bool,
    /// The stream it serves.
    pub stream: u64,
    /// Its blocks in address order, tiling it exactly.
    pub blocks: Vec<ImportBlock>,
    /// An expandable segment (`expandable_segments:True`): `size` is what was mapped when
    /// recording began. Parity replays rebuild it by allocating its live blocks in address
    /// order under the recorded setting (an imported plain segment could not grow).
    pub expandable: bool,
}

/// A block live when recording began.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StartBlock {
    /// Its recorded address.
    pub address: u64,
    /// Bytes requested (the dump's `requested_size`, or the size on the `free_requested` that
    /// frees it; 0 when neither is known).
    pub requested: u64,
    /// The block's size in the dump, when the dump holds it.
    pub size: Option<u64>,
    /// The stream it was allocated on.
    pub stream: u64,
}

impl StartBlock {
    /// The bytes to request when allocating it again: the requested size, else the block's.
    pub fn request_bytes(&self) -> u64 {
        if self.requested > 0 {
            self.requested
        } else {
            self.size.unwrap_or(0)
        }
    }
}

/// The start state and what could not be placed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StartState {
    /// Segments, sorted by address.
    pub segments: Vec<StartSegment>,
    /// Every block live when recording began (placed in a segment or not), by address.
    pub live: Vec<StartBlock>,
    /// Live blocks at the start (freed by the trace before being allocated, or never touched).
    pub live_blocks: usize,
    /// Addresses freed before being allocated that lie in no known segment (skipped).
    pub unplaced: usize,
}

#[derive(Clone, Copy)]
struct Live {
    size: Option<u64>,
    requested: u64,
    stream: u64,
}

impl StartState {
    /// Bytes requested by the blocks live at the start ([`StartBlock::request_bytes`]).
    pub fn live_bytes(&self) -> u64 {
        self.live.iter().map(StartBlock::request_bytes).sum()
    }
}

/// Rebuilds the start state of `device`'s trace from `snapshot` (see the module docs).
pub fn start_state(snapshot: &Snapshot, device: usize, config: &AllocatorConfig) -> StartState {
    let empty = Vec::new();
    let events: &Vec<RecordedEvent> = snapshot.traces.get(device).unwrap_or(&empty);
    let mut alive_in_trace: HashSet<u64> = HashSet::new();
    let mut segments: BTreeMap<u64, (u64, bool, u64, bool)> = BTreeMap::new();
    let mut first_touch: HashMap<u64, (TraceAction, u64, u64)> = HashMap::new();
    for e in events {
        match e.action {
            TraceAction::SegmentAlloc => {
                alive_in_trace.insert(e.addr);
            }
            TraceAction::SegmentFree if !alive_in_trace.remove(&e.addr) => {
                segments.insert(
                    e.addr,
                    (e.size, e.size == SMALL_BUFFER as u64, e.stream, false),
                );
            }
            TraceAction::Alloc | TraceAction::FreeRequested => {
                first_touch
                    .entry(e.addr)
                    .or_insert((e.action, e.size, e.stream));
            }
            _ => {}
        }
    }
    let mut live: BTreeMap<u64, Live> = BTreeMap::new();
    for (&addr, &(action, size, stream)) in &first_touch {
        if action == TraceAction::FreeRequested {
            live.insert(
                addr,
                Live {
                    size: None,
                    requested: size,
                    stream,
                },
            );
        }
    }
    let on_device: Vec<&crate::model::RecordedSegment> = snapshot
        .segments
        .iter()
        .filter(|s| s.device as usize == device)
        .collect();
    for s in &on_device {
        if alive_in_trace.contains(&s.address) {
            continue;
        }
        let mut size = s.total_size;
        if s.is_expandable {
            // An expandable segment grows and shrinks by segment_map/segment_unmap inside the
            // trace: what was mapped when recording began is the dump's mapped bytes minus
            // the trace's net mapping inside its address range (up to the next segment). It
            // used to be taken whole, so a whole-job dump of our own (everything mapped
            // inside the trace) replayed with its memory mapped twice and 0 segment decisions
            // matching.
            let end = on_device
                .iter()
                .map(|o| o.address)
                .filter(|&a| a > s.address)
                .min()
                .unwrap_or(u64::MAX);
            let inside = |e: &&RecordedEvent| e.addr >= s.address && e.addr < end;
            let mapped: u64 = events
                .iter()
                .filter(inside)
                .filter(|e| e.action == TraceAction::SegmentMap)
                .map(|e| e.size)
                .sum();
            let unmapped: u64 = events
                .iter()
                .filter(inside)
                .filter(|e| e.action == TraceAction::SegmentUnmap)
                .map(|e| e.size)
                .sum();
            size = (size + unmapped).saturating_sub(mapped);
            if size == 0 {
                continue;
            }
        }
        segments.insert(s.address, (size, !s.is_large, s.stream, s.is_expandable));
        for b in &s.blocks {
            let held = matches!(
                b.state,
                BlockState::ActiveAllocated | BlockState::ActivePendingFree
            );
            if held && !first_touch.contains_key(&b.address) {
                live.insert(
                    b.address,
                    Live {
                        size: Some(b.size),
                        requested: b.requested_size,
                        stream: s.stream,
                    },
                );
            }
        }
    }
    let mut out = StartState::default();
    let mut placed = 0usize;
    for (&address, &(size, small, stream, expandable)) in &segments {
        let end = address + size;
        let inside: Vec<(u64, Live)> = live.range(address..end).map(|(&a, &l)| (a, l)).collect();
        let mut blocks = Vec::new();
        let mut cursor = address;
        for (i, &(addr, l)) in inside.iter().enumerate() {
            if addr > cursor {
                blocks.push(ImportBlock {
                    size: (addr - cursor) as usize,
                    requested: 0,
                    allocated: false,
                });
            }
            let next = inside.get(i + 1).map_or(end, |n| n.0);
            let room = next.saturating_sub(addr);
            let block_size = match l.size {
                Some(s) => s.min(room),
                None => {
                    let rounded = (round_size(l.requested as usize, config) as u64).min(room);
                    // The allocator hands out the whole block when it would not split it.
                    if room > rounded
                        && !should_split(room as usize, rounded as usize, small, config)
                    {
                        room
                    } else {
                        rounded
                    }
                }
            };
            if block_size == 0 {
                continue;
            }
            blocks.push(ImportBlock {
                size: block_size as usize,
                requested: l.requested as usize,
                allocated: true,
            });
            placed += 1;
            cursor = addr + block_size;
        }
        if cursor < end {
            blocks.push(ImportBlock {
                size: (end - cursor) as usize,
                requested: 0,
                allocated: false,
            });
        }
        out.segments.push(StartSegment {
            address,
            size,
            small,
            stream,
            blocks,
            expandable,
        });
    }
    out.live_blocks = placed;
    out.unplaced = live.len() - placed;
    out.live = live
        .iter()
        .map(|(&address, l)| StartBlock {
            address,
            requested: l.requested,
            size: l.size,
            stream: l.stream,
        })
        .collect();
    out
}
