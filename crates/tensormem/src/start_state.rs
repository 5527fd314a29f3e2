//! Rebuilding the allocator state that existed before a recorded history began.
//!
//! A trace usually starts with segments already present (recorded before history was turned
//! on). The start state is: the dump's segments not created inside the trace, plus segments the
//! trace frees without having created them; its live blocks are those the trace frees before
//! ever allocating them, plus the dump's allocated blocks the trace never touches. Everything
//! else inside a start segment was free (and, by the merge rule, one free block per gap).

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
}

/// The start state and what could not be placed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StartState {
    /// Segments, sorted by address.
    pub segments: Vec<StartSegment>,
    /// Live blocks at the start (freed by the trace before being allocated, or never touched).
    pub live_blocks: usize,
    /// Addresses freed before being allocated that lie in no known segment (skipped).
    pub unplaced: usize,
}

#[derive(Clone, Copy)]
struct Live {
    size: Option<u64>,
    requested: u64,
}

/// Rebuilds the start state of `device`'s trace from `snapshot` (see the module docs).
pub fn start_state(snapshot: &Snapshot, device: usize, config: &AllocatorConfig) -> StartState {
    let empty = Vec::new();
    let events: &Vec<RecordedEvent> = snapshot.traces.get(device).unwrap_or(&empty);
    let mut alive_in_trace: HashSet<u64> = HashSet::new();
    let mut segments: BTreeMap<u64, (u64, bool, u64)> = BTreeMap::new();
    let mut first_touch: HashMap<u64, (TraceAction, u64)> = HashMap::new();
    for e in events {
        match e.action {
            TraceAction::SegmentAlloc => {
                alive_in_trace.insert(e.addr);
            }
            TraceAction::SegmentFree if !alive_in_trace.remove(&e.addr) => {
                segments.insert(e.addr, (e.size, e.size == SMALL_BUFFER as u64, e.stream));
            }
            TraceAction::Alloc | TraceAction::FreeRequested => {
                first_touch.entry(e.addr).or_insert((e.action, e.size));
            }
            _ => {}
        }
    }
    let mut live: BTreeMap<u64, Live> = BTreeMap::new();
    for (&addr, &(action, size)) in &first_touch {
        if action == TraceAction::FreeRequested {
            live.insert(
                addr,
                Live {
                    size: None,
                    requested: size,
                },
            );
        }
    }
    for s in snapshot
        .segments
        .iter()
        .filter(|s| s.device as usize == device)
    {
        if alive_in_trace.contains(&s.address) {
            continue;
        }
        segments.insert(s.address, (s.total_size, !s.is_large, s.stream));
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
                    },
                );
            }
        }
    }
    let mut out = StartState::default();
    let mut placed = 0usize;
    for (&address, &(size, small, stream)) in &segments {
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
        });
    }
    out.live_blocks = placed;
    out.unplaced = live.len() - placed;
    out
}
