//! Memory history and snapshots: the ring buffer, PyTorch's order of trace actions (miss, free,
//! record_stream, expandable segments, oom) and the block states and segment types of
//! `snapshot()`.

use c10_cuda::config::{AllocatorConfig, MIB};
use c10_cuda::device::{DevicePtr, StreamId};
use c10_cuda::history::{Clock, TraceAction, TraceEntry};
use c10_cuda::snapshot::BlockState;
use c10_cuda::{DeviceCachingAllocator, Error, SimDevice};

use TraceAction::*;

const S0: StreamId = StreamId::DEFAULT;

/// The allocator of these tests: history on (1000 entries).
fn allocator(capacity: usize, conf: &str) -> (SimDevice, DeviceCachingAllocator<SimDevice>) {
    crate::support::recording(capacity, conf, 1000)
}

/// `(action, addr, size)` of each entry.
fn trace(entries: &[TraceEntry]) -> Vec<(TraceAction, DevicePtr, u64)> {
    entries.iter().map(|e| (e.action, e.addr, e.size)).collect()
}

fn mib(n: usize) -> u64 {
    (n * MIB) as u64
}

#[test]
fn history_is_off_until_asked() {
    let dev = SimDevice::address_only(0, 1 << 30);
    let mut a = DeviceCachingAllocator::new(dev, AllocatorConfig::default()).unwrap();
    let p = a.malloc(4096, S0).unwrap().ptr;
    a.free(p).unwrap();
    assert!(a.history().is_empty());
}

/// The ring buffer keeps the newest `max_entries`; resizing drops the oldest; 0 stops
/// recording but keeps what is there.
#[test]
fn ring_buffer_keeps_only_max_entries() {
    let (_dev, mut a) = allocator(1 << 30, "");
    a.record_history(4, Clock::Logical);
    // segment_alloc, alloc, alloc, alloc, free_requested, free_completed: 6 entries.
    let p = a.malloc(4096, S0).unwrap().ptr;
    a.malloc(4096, S0).unwrap();
    a.malloc(4096, S0).unwrap();
    a.free(p).unwrap();
    let h = a.history();
    assert_eq!(
        h.iter().map(|e| (e.action, e.time_us)).collect::<Vec<_>>(),
        vec![
            (Alloc, 3),
            (Alloc, 4),
            (FreeRequested, 5),
            (FreeCompleted, 6)
        ]
    );
    a.record_history(2, Clock::Logical);
    let h = a.history();
    assert_eq!(h.iter().map(|e| e.time_us).collect::<Vec<_>>(), vec![5, 6]);
    a.record_history(0, Clock::Logical);
    a.malloc(4096, S0).unwrap();
    assert_eq!(a.history().len(), 2);
    a.clear_history();
    assert!(a.history().is_empty());
}

#[test]
fn system_clock_is_wall_time() {
    let (_dev, mut a) = allocator(1 << 30, "");
    a.record_history(10, Clock::System);
    a.malloc(4096, S0).unwrap();
    // Microseconds since 1970: after 2020-01-01.
    assert!(
        a.history()
            .iter()
            .all(|e| e.time_us > 1_577_836_800_000_000)
    );
}

/// A miss records `segment_alloc` (segment bytes) right before its `alloc` (requested bytes);
/// a hit records only `alloc`. A free records `free_requested` then `free_completed`, both
/// with the requested bytes.
#[test]
fn miss_and_free_order() {
    let (_dev, mut a) = allocator(1 << 30, "");
    let p = a.malloc(1000, S0).unwrap().ptr;
    let q = a.malloc(3000, S0).unwrap().ptr;
    assert_eq!(q, p + 1024);
    a.free(p).unwrap();
    let big = a.malloc(5 * MIB + 3, S0).unwrap().ptr;
    assert_eq!(
        trace(&a.history()),
        vec![
            (SegmentAlloc, p, mib(2)),
            (Alloc, p, 1000),
            (Alloc, q, 3000),
            (FreeRequested, p, 1000),
            (FreeCompleted, p, 1000),
            (SegmentAlloc, big, mib(20)),
            (Alloc, big, (5 * MIB + 3) as u64),
        ]
    );
    let times: Vec<u64> = a.history().iter().map(|e| e.time_us).collect();
    assert_eq!(times, (1..=7).collect::<Vec<_>>());
}

/// A block used on other streams: `free_requested` at the free, `free_completed` only once
/// every recorded stream's event has completed and a malloc processed the events.
#[test]
fn record_stream_defers_free_completed() {
    let (dev, mut a) = allocator(1 << 30, "");
    let (s1, s2) = (dev.new_stream(), dev.new_stream());
    let p = a.malloc(1000, S0).unwrap().ptr;
    a.record_stream(p, s1).unwrap();
    a.record_stream(p, s2).unwrap();
    a.record_stream(p, S0).unwrap(); // the allocation stream: ignored
    a.free(p).unwrap();
    assert_eq!(dev.pending_events(), 2);
    let last = |a: &DeviceCachingAllocator<SimDevice>| a.history().last().unwrap().action;
    assert_eq!(last(&a), FreeRequested);

    // Events still pending: a malloc processes nothing.
    let q = a.malloc(1000, S0).unwrap().ptr;
    assert_ne!(q, p);
    dev.complete_stream(s1);
    let r = a.malloc(1000, S0).unwrap().ptr;
    assert_ne!(r, p);
    let completed = |a: &DeviceCachingAllocator<SimDevice>| {
        a.history()
            .iter()
            .filter(|e| e.action == FreeCompleted)
            .count()
    };
    assert_eq!(completed(&a), 0);
    assert_eq!(
        a.snapshot().segments[0].blocks[0].state,
        BlockState::ActivePendingFree
    );

    // Both events done: the next malloc completes the free first, then reuses the block.
    assert!(dev.complete_next(s2));
    let again = a.malloc(1000, S0).unwrap().ptr;
    assert_eq!(again, p);
    let tail: Vec<_> = trace(&a.history()).into_iter().rev().take(2).collect();
    assert_eq!(tail, vec![(Alloc, p, 1000), (FreeCompleted, p, 1000)]);
    a.check_invariants().unwrap();
}

/// `empty_cache` synchronizes pending events: the free completes there.
#[test]
fn empty_cache_completes_pending_frees() {
    let (dev, mut a) = allocator(1 << 30, "");
    let s1 = dev.new_stream();
    let p = a.malloc(12 * MIB, S0).unwrap().ptr;
    a.record_stream(p, s1).unwrap();
    a.free(p).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(
        trace(&a.history()),
        vec![
            (SegmentAlloc, p, mib(12)),
            (Alloc, p, mib(12)),
            (FreeRequested, p, mib(12)),
            (FreeCompleted, p, mib(12)),
            (SegmentFree, p, mib(12)),
        ]
    );
    assert_eq!(a.stats().num_sync_all_streams, 1);
    assert_eq!(dev.pending_events(), 0);
}

/// Expandable segments map 20 MiB large-pool pages on demand (`segment_map`) and unmap wholly
/// free pages on release (`segment_unmap`); there is never a `segment_alloc` / `segment_free`.
#[test]
fn expandable_segments_map_and_unmap() {
    let (dev, mut a) = allocator(1 << 30, "expandable_segments:True");
    // 5 MiB: one page at the base of the reserved range.
    let p = a.malloc(5 * MIB, S0).unwrap().ptr;
    // 30 MiB: the free 15 MiB after p plus one more page, merged: [p + 5 MiB, p + 35 MiB).
    let q = a.malloc(30 * MIB, S0).unwrap().ptr;
    assert_eq!(q, p + mib(5));
    let snap = a.snapshot();
    assert_eq!(snap.segments.len(), 1);
    let seg = &snap.segments[0];
    assert!(seg.is_expandable);
    assert_eq!(seg.segment_type(), "large");
    assert_eq!((seg.address, seg.total_size), (p, mib(40)));
    a.free(p).unwrap();
    a.free(q).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(
        trace(&a.history()),
        vec![
            (SegmentMap, p, mib(20)),
            (Alloc, p, mib(5)),
            (SegmentMap, p + mib(20), mib(20)),
            (Alloc, q, mib(30)),
            (Snapshot, 0, mib(35)),
            (FreeRequested, p, mib(5)),
            (FreeCompleted, p, mib(5)),
            (FreeRequested, q, mib(30)),
            (FreeCompleted, q, mib(30)),
            (SegmentUnmap, p, mib(40)),
        ]
    );
    assert_eq!(a.reserved_bytes(), 0);
    assert!(dev.mapped_pages().is_empty());
    assert!(a.snapshot().segments.is_empty());
}

/// Snapshots report one segment per contiguous mapped range of an expandable segment.
#[test]
fn expandable_snapshot_splits_at_unmapped_pages() {
    let (_dev, mut a) = allocator(1 << 30, "expandable_segments:True");
    let ptrs: Vec<DevicePtr> = (0..3)
        .map(|_| a.malloc(20 * MIB, S0).unwrap().ptr)
        .collect();
    assert_eq!(ptrs, vec![ptrs[0], ptrs[0] + mib(20), ptrs[0] + mib(40)]);
    assert_eq!(a.snapshot().segments.len(), 1);
    a.free(ptrs[1]).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(
        trace(&a.history()).last().copied(),
        Some((SegmentUnmap, ptrs[1], mib(20)))
    );
    let segs = a.snapshot().segments;
    let shape: Vec<_> = segs
        .iter()
        .map(|s| (s.address, s.total_size, s.is_expandable))
        .collect();
    assert_eq!(
        shape,
        vec![(ptrs[0], mib(20), true), (ptrs[2], mib(20), true)]
    );
    a.check_invariants().unwrap();
}

/// An OOM records one `oom` entry: `addr` holds the device's free bytes (`device_free` in
/// snapshots) and `size` the rounded request.
#[test]
fn oom_entry_records_device_free() {
    let (dev, mut a) = allocator(4 * MIB, "");
    dev.set_external_usage(MIB);
    let r = a.malloc(10 * MIB + 1, S0);
    assert!(matches!(r, Err(Error::OutOfMemory(_))));
    let h = a.history();
    assert_eq!(trace(&h), vec![(Oom, mib(3), (10 * MIB + 512) as u64)]);
    assert_eq!(h[0].stream, S0);
}

/// Block states and segment types: allocated, pending free (recorded on another stream) and
/// inactive blocks in a small segment; an unsplit large segment; the `snapshot` entry holds
/// the active bytes.
#[test]
fn snapshot_states_and_segment_types() {
    let (dev, mut a) = allocator(1 << 30, "");
    let s1 = dev.new_stream();
    let x = a.malloc(1000, S0).unwrap().ptr;
    let y = a.malloc(2000, S0).unwrap().ptr;
    let z = a.malloc(12 * MIB, s1).unwrap().ptr;
    a.record_stream(y, s1).unwrap();
    a.free(y).unwrap();
    let snap = a.snapshot();
    assert_eq!(snap.device, 0);
    let small = &snap.segments[0];
    assert_eq!(small.segment_type(), "small");
    assert_eq!(small.stream, S0);
    let blocks: Vec<_> = small
        .blocks
        .iter()
        .map(|b| (b.address, b.size, b.requested_size, b.state.as_str()))
        .collect();
    assert_eq!(
        blocks,
        vec![
            (x, 1024, 1000, "active_allocated"),
            (y, 2048, 2000, "active_pending_free"),
            (y + 2048, mib(2) - 3072, 0, "inactive"),
        ]
    );
    assert_eq!(
        (
            small.total_size,
            small.allocated_size,
            small.active_size,
            small.requested_size
        ),
        (mib(2), 1024, 3072, 3000)
    );
    let large = &snap.segments[1];
    assert_eq!(large.segment_type(), "large");
    assert_eq!(large.stream, s1);
    assert!(!large.is_expandable);
    assert_eq!(large.blocks.len(), 1);
    assert_eq!(
        (large.blocks[0].address, large.blocks[0].state),
        (z, BlockState::ActiveAllocated)
    );
    let last = snap.trace.last().unwrap();
    assert_eq!((last.action, last.size), (Snapshot, 1024 + 2048 + mib(12)));
    assert_eq!(
        BlockState::parse("active_pending_free"),
        Some(BlockState::ActivePendingFree)
    );
    assert_eq!(TraceAction::parse("segment_unmap"), Some(SegmentUnmap));
}

#[test]
fn attached_frames_are_exported_and_shared_once() {
    use c10_cuda::history::{Frame, Frames};
    use std::sync::Arc;
    let (_dev, mut a) = allocator(1 << 30, "");
    let x = a.malloc(1000, S0).unwrap().ptr;
    a.free(x).unwrap();
    let mut snap = a.snapshot();
    assert!(snap.trace.iter().all(|e| e.frames.is_none()));
    let stack: Frames = Arc::from(vec![
        Frame {
            name: "forward".into(),
            filename: "model.py".into(),
            line: 12,
        },
        Frame {
            name: "<module>".into(),
            filename: "train.py".into(),
            line: 3,
        },
    ]);
    for e in &mut snap.trace {
        if matches!(e.action, Alloc | FreeRequested) {
            e.frames = Some(stack.clone());
        }
    }
    snap.segments[0].blocks[0].frames = Some(stack.clone());
    let value = c10_cuda::snapshot_pickle::snapshot_value(
        std::slice::from_ref(&snap),
        &AllocatorConfig::default(),
    );
    let bytes = tensormem_pickle::encode(&value);
    let back = tensormem_pickle::decode(&bytes).unwrap();
    let trace = back.get("device_traces").unwrap().as_list().unwrap()[0]
        .as_list()
        .unwrap()
        .to_vec();
    let frames_of = |e: &tensormem_pickle::Value| {
        e.get("frames")
            .unwrap()
            .as_list()
            .unwrap()
            .iter()
            .map(|f| {
                (
                    f.get("name").unwrap().as_str().unwrap().to_string(),
                    f.get("filename").unwrap().as_str().unwrap().to_string(),
                    f.get("line").unwrap().as_i64().unwrap(),
                )
            })
            .collect::<Vec<_>>()
    };
    let want = vec![
        ("forward".to_string(), "model.py".to_string(), 12),
        ("<module>".to_string(), "train.py".to_string(), 3),
    ];
    for e in &trace {
        let action = e.get("action").unwrap().as_str().unwrap();
        let expected = if matches!(action, "alloc" | "free_requested") {
            want.clone()
        } else {
            Vec::new()
        };
        assert_eq!(frames_of(e), expected, "{action}");
    }
    let block = &back.get("segments").unwrap().as_list().unwrap()[0]
        .get("blocks")
        .unwrap()
        .as_list()
        .unwrap()[0];
    assert_eq!(frames_of(block), want);
    // A stack is written once and referenced after: two more entries with a 40-frame stack
    // cost their own few keys, not the stack again.
    let big: Frames = (0..40)
        .map(|i| Frame {
            name: format!("function_number_{i}").into(),
            filename: format!("/a/long/path/to/module_{i}.py").into(),
            line: i,
        })
        .collect();
    let bare = snapshot_len_with_copies(&snap, None, 1);
    let once = snapshot_len_with_copies(&snap, Some(&big), 1);
    let thrice = snapshot_len_with_copies(&snap, Some(&big), 3);
    assert!(
        once - bare > 2000,
        "the stack itself: {} bytes",
        once - bare
    );
    assert!(thrice - once < 200, "{once} -> {thrice} bytes");
}

/// The pickle's length when the snapshot's trace holds its alloc entry `copies` times, each
/// with `stack`.
fn snapshot_len_with_copies(
    snap: &c10_cuda::snapshot::DeviceSnapshot,
    stack: Option<&c10_cuda::history::Frames>,
    copies: usize,
) -> usize {
    let mut s = snap.clone();
    for e in &mut s.trace {
        e.frames = None;
    }
    for b in s.segments.iter_mut().flat_map(|s| &mut s.blocks) {
        b.frames = None;
    }
    let mut alloc = s.trace.iter().find(|e| e.action == Alloc).unwrap().clone();
    alloc.frames = stack.cloned();
    for _ in 0..copies {
        s.trace.push(alloc.clone());
    }
    tensormem_pickle::encode(&c10_cuda::snapshot_pickle::snapshot_value(
        std::slice::from_ref(&s),
        &AllocatorConfig::default(),
    ))
    .len()
}
