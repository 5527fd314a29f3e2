//! Call sites in the memory history: what each [`RecordContext`] records (PyTorch's
//! `_record_memory_history(context=...)`), `#[track_caller]` locations through the front and
//! c10-core's `Allocator`, full stacks, and the frames read back from the snapshot pickle.

use std::path::Path;
use std::sync::Arc;

use c10_core::Allocator;
use c10_cuda::call_site::{HistoryOptions, Stacks};
use c10_cuda::config::AllocatorConfig;
use c10_cuda::device::DevicePtr;
use c10_cuda::history::{Clock, Frame, Frames, TraceAction, TraceEntry};
use c10_cuda::snapshot::DeviceSnapshot;
use c10_cuda::snapshot_pickle::snapshot_pickle;
use c10_cuda::{CachingAllocator, RecordContext, SimDevice};
use rstest::rstest;
use tensormem_pickle::Value;

use TraceAction::*;

fn front(context: RecordContext, stacks: Stacks) -> Arc<CachingAllocator<SimDevice>> {
    let front = CachingAllocator::new(
        vec![SimDevice::address_only(0, 1 << 30)],
        AllocatorConfig::default(),
    )
    .unwrap();
    front.record_memory_history(
        &HistoryOptions::new(1000)
            .clock(Clock::Logical)
            .context(context)
            .stacks(stacks),
    );
    Arc::new(front)
}

/// The one-frame stack a `#[track_caller]` location gives: this file at `line`.
fn here(line: u32) -> Option<Vec<Frame>> {
    Some(vec![Frame {
        name: Arc::from("??"),
        filename: Arc::from(file!()),
        line,
    }])
}

fn frames_of(f: &Option<Frames>) -> Option<Vec<Frame>> {
    f.as_ref().map(|f| f.to_vec())
}

/// `(action, frames)` of each entry but the final `snapshot` one.
fn entries(snap: &DeviceSnapshot) -> Vec<(TraceAction, Option<Vec<Frame>>)> {
    snap.trace
        .iter()
        .filter(|e| e.action != Snapshot)
        .map(|e| (e.action, frames_of(&e.frames)))
        .collect()
}

/// One allocation (a new segment), a snapshot while it is live, its free and an
/// `empty_cache`, each from a known line. Returns the snapshot taken while the block was live,
/// the final one, and the lines of the three calls.
fn workload(
    front: &CachingAllocator<SimDevice>,
) -> (Vec<DeviceSnapshot>, Vec<DeviceSnapshot>, [u32; 3]) {
    let alloc_line = line!() + 1;
    let p = front.raw_alloc(0, 3 << 20).unwrap();
    let live = front.snapshot();
    let free_line = line!() + 1;
    front.raw_delete(p).unwrap();
    let empty_line = line!() + 1;
    front.empty_cache().unwrap();
    (live, front.snapshot(), [alloc_line, free_line, empty_line])
}

/// What PyTorch's modes record, entry by entry: `state` only the live block's stack, `alloc`
/// the allocation's stack on every entry of the allocation (its free and segment free
/// included), `all` the free's and `empty_cache`'s own.
#[rstest]
#[case::never(RecordContext::Never)]
#[case::state(RecordContext::State)]
#[case::alloc(RecordContext::Alloc)]
#[case::all(RecordContext::All)]
fn each_context_mode_records_what_pytorch_records(#[case] context: RecordContext) {
    let front = front(context, Stacks::Caller);
    let (live, end, [a, f, e]) = workload(&front);
    let (at, ft, et) = (here(a), here(f), here(e));
    let none = None;
    let want = match context {
        RecordContext::Never | RecordContext::State => vec![
            (SegmentAlloc, none.clone()),
            (Alloc, none.clone()),
            (FreeRequested, none.clone()),
            (FreeCompleted, none.clone()),
            (SegmentFree, none.clone()),
        ],
        RecordContext::Alloc => vec![
            (SegmentAlloc, at.clone()),
            (Alloc, at.clone()),
            (FreeRequested, at.clone()),
            (FreeCompleted, at.clone()),
            (SegmentFree, at.clone()),
        ],
        RecordContext::All => vec![
            (SegmentAlloc, at.clone()),
            (Alloc, at.clone()),
            (FreeRequested, ft.clone()),
            (FreeCompleted, ft),
            (SegmentFree, et),
        ],
    };
    assert_eq!(entries(&end[0]), want);
    // Snapshots: the live block and its segment carry the allocation's stack from `state` on.
    let kept = if context >= RecordContext::State {
        at
    } else {
        None
    };
    let segment = &live[0].segments[0];
    assert_eq!(frames_of(&segment.frames), kept);
    assert_eq!(frames_of(&segment.blocks[0].frames), kept);
    // The free remainder of the segment has none, and nothing is left at the end.
    assert_eq!(frames_of(&segment.blocks[1].frames), None);
    assert!(end[0].segments.is_empty());
}

/// Through c10-core's `Allocator`, the location is the caller of `allocate`; a `DataPtr`
/// dropped has no caller to name, so its free carries the allocation's stack.
#[test]
fn the_c10_allocator_passes_its_caller() {
    let front = front(RecordContext::All, Stacks::Caller);
    let allocator = front.allocator(0).unwrap();
    let line = line!() + 1;
    let data = allocator.allocate(5000).unwrap();
    let live = front.snapshot();
    drop(data);
    let end = front.snapshot();
    let at = here(line);
    assert_eq!(frames_of(&live[0].segments[0].blocks[0].frames), at);
    assert_eq!(
        entries(&end[0]),
        vec![
            (SegmentAlloc, at.clone()),
            (Alloc, at.clone()),
            (FreeRequested, at.clone()),
            (FreeCompleted, at),
        ]
    );
}

/// A block freed while recorded on another stream completes its free at a later malloc: that
/// `free_completed` carries the malloc's stack in modes `alloc` and `all` (PyTorch's malloc
/// gathers its context from `state` on and hands it to `process_events`), while the
/// `free_requested` carries the free's own stack in mode `all` and the allocation's in `alloc`.
#[rstest]
#[case::alloc(RecordContext::Alloc)]
#[case::all(RecordContext::All)]
fn a_deferred_free_completes_with_the_next_mallocs_stack(#[case] context: RecordContext) {
    let dev = SimDevice::address_only(0, 1 << 30);
    let front = CachingAllocator::new(vec![dev.clone()], AllocatorConfig::default()).unwrap();
    front.record_memory_history(
        &HistoryOptions::new(1000)
            .clock(Clock::Logical)
            .context(context),
    );
    let side = dev.new_stream();
    let a = line!() + 1;
    let p = front.raw_alloc(0, 4096).unwrap();
    front.record_stream(p, side).unwrap();
    let f = line!() + 1;
    front.raw_delete(p).unwrap();
    dev.complete_stream(side);
    let m = line!() + 1;
    front.raw_alloc(0, 4096).unwrap();
    let snap = front.snapshot();
    let completed: Vec<&TraceEntry> = snap[0]
        .trace
        .iter()
        .filter(|e| e.action == FreeCompleted)
        .collect();
    assert_eq!(completed.len(), 1);
    let free_requested = snap[0]
        .trace
        .iter()
        .find(|e| e.action == FreeRequested)
        .unwrap();
    let requested_from = if context == RecordContext::All { f } else { a };
    assert_eq!(frames_of(&free_requested.frames), here(requested_from));
    assert_eq!(frames_of(&completed[0].frames), here(m));
}

/// Allocates 4096 bytes from one call site, whoever calls it.
#[inline(never)]
fn alloc_at_one_site(front: &CachingAllocator<SimDevice>) -> (DevicePtr, u32) {
    (front.raw_alloc(0, 4096).unwrap(), line!())
}

/// Whether `frame` is in the capture machinery's sources: this crate's `src` (the front, this
/// module) or the `backtrace` crate's.
fn in_machinery_file(frame: &Frame) -> bool {
    let path = Path::new(&*frame.filename);
    path.parent().is_some_and(|d| d.ends_with("c10-cuda/src"))
        || path.components().any(|c| {
            c.as_os_str()
                .to_str()
                .is_some_and(|c| c.starts_with("backtrace-"))
        })
}

/// Full stacks start at the caller (the capture machinery and the front cut off, in every
/// build profile: release frames have bare names such as `trace` or `full_frames`) and name
/// the caller with this file and line; identical call stacks share one `Frames`.
#[test]
fn full_stacks_start_at_the_caller() {
    let front = front(RecordContext::All, Stacks::Full);
    let mut ptrs = Vec::new();
    // One call site for both allocations: an `#[inline(never)]` helper, called from a loop
    // whose count the compiler cannot see (a constant count may be unrolled in release, giving
    // each allocation its own return address and so its own stack).
    for _ in 0..std::hint::black_box(2) {
        ptrs.push(alloc_at_one_site(&front));
    }
    let snap = front.snapshot();
    let allocs: Vec<&Frames> = snap[0]
        .trace
        .iter()
        .filter(|e| e.action == Alloc)
        .map(|e| e.frames.as_ref().expect("a stack"))
        .collect();
    assert_eq!(allocs.len(), 2);
    assert!(
        Arc::ptr_eq(allocs[0], allocs[1]),
        "the same stack is shared: {:?} vs {:?}",
        allocs[0],
        allocs[1]
    );
    let top = &allocs[0][0];
    assert!(
        top.name.contains("alloc_at_one_site"),
        "the innermost frame is the caller of the front, got {top:?}"
    );
    assert!(top.filename.ends_with("history_frames.rs"), "{top:?}");
    assert_eq!(top.line, ptrs[0].1, "{top:?}");
    let next = &allocs[0][1];
    assert!(
        next.name.contains("full_stacks_start_at_the_caller")
            && next.filename.ends_with("history_frames.rs")
            && next.line > 0,
        "then the test, got {next:?}"
    );
    assert!(
        allocs[0].iter().all(|f| !f.name.starts_with("c10_cuda::")
            && !f.name.starts_with("backtrace::")
            && !in_machinery_file(f)),
        "no machinery frame: {:?}",
        allocs[0]
    );
    for (p, _) in ptrs {
        front.raw_delete(p).unwrap();
    }
    // A `DataPtr` dropped: the stack starts at the drop (the deleter and `DataPtr` cut off).
    let data = front.allocator(0).unwrap().allocate(4096).unwrap();
    drop(data);
    let snap = front.snapshot();
    let freed = snap[0]
        .trace
        .iter()
        .rev()
        .find(|e| e.action == FreeRequested)
        .and_then(|e| e.frames.clone())
        .expect("a stack");
    let names: Vec<&str> = freed.iter().take(2).map(|f| &*f.name).collect();
    assert!(
        names
            .iter()
            .any(|n| n.contains("full_stacks_start_at_the_caller")),
        "{freed:?}"
    );
    assert!(
        freed.iter().all(|f| !f.name.starts_with("c10_cuda::")
            && !f.name.starts_with("c10_core::data_ptr::")
            && !f.name.starts_with("<c10_core::data_ptr::")
            && !f.filename.ends_with("data_ptr.rs")
            && !in_machinery_file(f)),
        "no machinery frame: {freed:?}"
    );
}

fn get<'a>(v: &'a Value, key: &str) -> &'a Value {
    v.get(key)
        .unwrap_or_else(|| panic!("no key {key} in {v:?}"))
}

fn list(v: &Value) -> &[Value] {
    v.as_list().unwrap()
}

fn text(v: &Value) -> String {
    v.as_str().unwrap().to_string()
}

fn int(v: &Value) -> i64 {
    v.as_i64().unwrap()
}

/// `{filename, line, name}` of a pickled stack.
fn pickled_frames(v: &Value) -> Vec<(String, i64, String)> {
    list(v)
        .iter()
        .map(|f| {
            (
                text(get(f, "filename")),
                int(get(f, "line")),
                text(get(f, "name")),
            )
        })
        .collect()
}

/// The frames come back from the snapshot pickle as PyTorch writes them: on trace entries, on
/// the live block and on its segment.
#[test]
fn frames_are_read_back_from_the_snapshot_pickle() {
    let front = front(RecordContext::All, Stacks::Caller);
    let line = i64::from(line!()) + 1;
    let p = front.raw_alloc(0, 3 << 20).unwrap();
    let free_line = i64::from(line!()) + 1;
    let q = front.raw_alloc(0, 1 << 20).unwrap();
    front.raw_delete(q).unwrap();
    let bytes = snapshot_pickle(&front.snapshot(), &AllocatorConfig::default());
    let value = tensormem_pickle::decode(&bytes).unwrap();
    let file = file!().to_string();
    let at = vec![(file.clone(), line, "??".to_string())];
    let trace = list(&list(get(&value, "device_traces"))[0]);
    let alloc = trace
        .iter()
        .find(|e| text(get(e, "action")) == "alloc")
        .unwrap();
    assert_eq!(pickled_frames(get(alloc, "frames")), at);
    let freed = trace
        .iter()
        .find(|e| text(get(e, "action")) == "free_requested")
        .unwrap();
    assert_eq!(
        pickled_frames(get(freed, "frames")),
        vec![(file.clone(), free_line + 1, "??".to_string())]
    );
    let segment = &list(get(&value, "segments"))[0];
    assert_eq!(pickled_frames(get(segment, "frames")), at);
    let block = &list(get(segment, "blocks"))[0];
    assert_eq!(text(get(block, "state")), "active_allocated");
    assert_eq!(int(get(block, "address")), p as i64);
    assert_eq!(pickled_frames(get(block, "frames")), at);
    front.raw_delete(p).unwrap();
}
