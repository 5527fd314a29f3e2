//! Out-of-memory observers (PyTorch's `attachOutOfMemoryObserver`) against PyTorch's own
//! allocator (fixtures from the torch-oracle in `tests/oracle/`, torch 2.7.1 and 2.15.0), and
//! allocator trace trackers (`attachAllocatorTraceTracker`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::ThreadId;

use c10_cuda::config::AllocatorConfig;
use c10_cuda::device::{DevicePtr, StreamId};
use c10_cuda::history::{Clock, TraceAction, TraceEntry};
use c10_cuda::{
    CachingAllocator, DeviceCachingAllocator, Error, OomObservation, RecordContext, SimDevice,
};
use parking_lot::Mutex;
use rstest::rstest;

/// What happened, in order, as the oracle prints it: `alloc` (id, block bytes), `oom` (id),
/// `oom_observer` (observer number, device, alloc, device_total, device_free), `free` (id).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Event {
    Alloc { id: String, block: u64 },
    Oom { id: String },
    Observer { observer: u64, seen: [u64; 4] },
    Free { id: String },
}

fn oracle_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/oracle")
}

fn parse_size(text: &str) -> usize {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (n, unit) = text.split_at(split);
    let n: usize = n.parse().unwrap();
    n * match unit {
        "" => 1,
        "K" | "KiB" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        other => panic!("unknown size unit {other}"),
    }
}

/// The oracle's events from its JSON lines.
fn expected(name: &str, version: &str) -> Vec<Event> {
    let path = oracle_dir().join(format!("oom_observer_{name}.{version}.jsonl"));
    let text = std::fs::read_to_string(&path).unwrap();
    let mut out = Vec::new();
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let id = || v["id"].as_str().unwrap().to_string();
        let n = |k: &str| v[k].as_u64().unwrap();
        match v["op"].as_str().unwrap() {
            "config" => assert!(v["torch"].as_str().unwrap().starts_with(version)),
            "alloc" => out.push(Event::Alloc {
                id: id(),
                block: n("block"),
            }),
            "oom" => out.push(Event::Oom { id: id() }),
            "free" => out.push(Event::Free { id: id() }),
            "oom_observer" => out.push(Event::Observer {
                observer: n("observer"),
                seen: [n("device"), n("alloc"), n("device_total"), n("device_free")],
            }),
            _ => {}
        }
    }
    out
}

/// Runs an oracle script through our thread-safe front on a simulated device of the script's
/// size and returns the same events.
fn ours(name: &str) -> Vec<Event> {
    let script =
        std::fs::read_to_string(oracle_dir().join(format!("oom_observer_{name}.ops"))).unwrap();
    let mut capacity = 80usize << 30;
    let mut conf = String::new();
    let mut ops = Vec::new();
    for line in script.lines() {
        let line = line.split('#').next().unwrap().trim();
        if line.is_empty() {
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["env", kv] => match kv.split_once('=').unwrap() {
                ("FAKECUDA_TOTAL_MEM", v) => capacity = parse_size(v),
                ("PYTORCH_CUDA_ALLOC_CONF", v) => conf = v.to_string(),
                other => panic!("unknown env {other:?}"),
            },
            _ => ops.push(words.iter().map(|w| w.to_string()).collect::<Vec<_>>()),
        }
    }
    let front = CachingAllocator::new(
        vec![SimDevice::address_only(0, capacity)],
        AllocatorConfig::parse(&conf).unwrap(),
    )
    .unwrap();
    let events = Arc::new(Mutex::new(Vec::new()));
    let mut observers = 0u64;
    let mut live: HashMap<String, DevicePtr> = HashMap::new();
    for op in ops {
        match op.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
            ["observe"] => {
                let (events, observer) = (Arc::clone(&events), observers);
                observers += 1;
                front.attach_out_of_memory_observer(Arc::new(move |o: &OomObservation| {
                    events.lock().push(Event::Observer {
                        observer,
                        seen: [u64::from(o.device), o.alloc, o.device_total, o.device_free],
                    });
                }));
            }
            ["alloc", id, size] => match front.raw_alloc(0, parse_size(size)) {
                Ok(ptr) => {
                    let (block, _) = front
                        .with_device(0, |a| a.block_info(ptr))
                        .unwrap()
                        .unwrap();
                    live.insert(id.to_string(), ptr);
                    events.lock().push(Event::Alloc {
                        id: id.to_string(),
                        block: block as u64,
                    });
                }
                Err(Error::OutOfMemory(_)) => events.lock().push(Event::Oom { id: id.to_string() }),
                Err(e) => panic!("alloc {id}: {e}"),
            },
            ["free", id] => {
                front.raw_delete(live.remove(*id).unwrap()).unwrap();
                events.lock().push(Event::Free { id: id.to_string() });
            }
            ["set_fraction", f] => front.set_memory_fraction(0, f.parse().unwrap()).unwrap(),
            other => panic!("unknown op {other:?}"),
        }
    }
    events.lock().clone()
}

/// Our observers are called with PyTorch's arguments (the segment size it tried, the total or
/// the memory fraction's limit, the free bytes), once per observer in attachment order, before
/// the error comes back; and the same allocations succeed and fail as in PyTorch.
#[rstest]
#[case::two_observers("plain")]
#[case::segment_rounding("rounding")]
#[case::memory_fraction_limit("fraction")]
#[case::expandable_segments("expandable")]
fn oom_observers_see_what_pytorch_passes(
    #[case] name: &str,
    #[values("2.15.0", "2.7.1")] version: &str,
) {
    let want = expected(name, version);
    assert!(
        want.iter().any(|e| matches!(e, Event::Observer { .. })),
        "the fixture has an observer call"
    );
    assert_eq!(ours(name), want);
}

/// The observer runs on the allocating thread with no allocator lock held: it can take a
/// snapshot and read the stats, which already count the OOM and end with its trace entry.
#[test]
fn an_observer_may_call_back_into_the_allocator() {
    let front = Arc::new(
        CachingAllocator::new(
            vec![SimDevice::address_only(0, 64 << 20)],
            AllocatorConfig::default(),
        )
        .unwrap(),
    );
    front.record_history(100, Clock::Logical);
    type Seen = (ThreadId, i64, Option<TraceAction>, usize);
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    {
        let (seen, weak) = (Arc::clone(&seen), Arc::downgrade(&front));
        front.attach_out_of_memory_observer(Arc::new(move |o: &OomObservation| {
            let front = weak.upgrade().unwrap();
            let ooms = front.memory_stats(o.device).unwrap()["num_ooms"];
            let snapshot = front.snapshot();
            let last = snapshot[0].trace.iter().rev().nth(1).map(|e| e.action);
            // The allocator is usable from here: a small allocation succeeds.
            let p = front.raw_alloc(0, 4096).unwrap();
            front.raw_delete(p).unwrap();
            seen.lock().push((
                std::thread::current().id(),
                ooms,
                last,
                snapshot[0].segments.len(),
            ));
        }));
    }
    let big = front.raw_alloc(0, 40 << 20).unwrap();
    let err = front.raw_alloc(0, 40 << 20).unwrap_err();
    assert!(matches!(err, Error::OutOfMemory(_)));
    let seen = seen.lock().clone();
    // The snapshot's last entry is its own `snapshot` entry; the one before is the `oom`.
    assert_eq!(
        seen,
        vec![(std::thread::current().id(), 1, Some(TraceAction::Oom), 1)]
    );
    front.raw_delete(big).unwrap();
}

/// Observers belong to the front: they see every device, each with its index.
#[test]
fn observers_see_the_failing_device() {
    let front = CachingAllocator::new(
        vec![
            SimDevice::address_only(0, 1 << 30),
            SimDevice::address_only(1, 32 << 20),
        ],
        AllocatorConfig::default(),
    )
    .unwrap();
    let seen: Arc<Mutex<Vec<OomObservation>>> = Arc::default();
    let s = Arc::clone(&seen);
    front.attach_out_of_memory_observer(Arc::new(move |o: &OomObservation| s.lock().push(*o)));
    front.raw_alloc(0, 40 << 20).unwrap();
    assert!(front.raw_alloc(1, 40 << 20).is_err());
    let seen: Vec<_> = seen
        .lock()
        .iter()
        .map(|o| {
            (
                o.device,
                o.alloc,
                o.device_total,
                o.device_free,
                o.requested,
            )
        })
        .collect();
    assert_eq!(seen, [(1, 40 << 20, 32 << 20, 32 << 20, 40 << 20)]);
}

/// `(action, addr, size, stream)` of each entry.
fn key(e: &TraceEntry) -> (TraceAction, u64, u64, StreamId) {
    (e.action, e.addr, e.size, e.stream)
}

/// A trace tracker sees each entry as the history records it, with the device index, the
/// `snapshot` entry included.
#[test]
fn a_trace_tracker_sees_every_history_entry() {
    let front = CachingAllocator::new(
        vec![
            SimDevice::address_only(0, 1 << 30),
            SimDevice::address_only(1, 1 << 30),
        ],
        AllocatorConfig::default(),
    )
    .unwrap();
    let seen: Arc<Mutex<Vec<(u8, TraceEntry)>>> = Arc::default();
    let s = Arc::clone(&seen);
    front.attach_allocator_trace_tracker(Arc::new(move |device, e: &TraceEntry| {
        s.lock().push((device, e.clone()));
    }));
    front.record_history(1000, Clock::Logical);
    let a = front.raw_alloc(0, 3 << 20).unwrap();
    let b = front.raw_alloc(1, 1000).unwrap();
    front.raw_delete(a).unwrap();
    front.empty_cache().unwrap();
    front.raw_delete(b).unwrap();
    let snapshot = front.snapshot();
    let seen = seen.lock().clone();
    for (device, snap) in snapshot.iter().enumerate() {
        let tracked: Vec<TraceEntry> = seen
            .iter()
            .filter(|(d, _)| usize::from(*d) == device)
            .map(|(_, e)| e.clone())
            .collect();
        assert_eq!(tracked, snap.trace, "device {device}");
    }
    use TraceAction::*;
    let device0: Vec<TraceAction> = snapshot[0].trace.iter().map(|e| e.action).collect();
    assert_eq!(
        device0,
        vec![
            SegmentAlloc,
            Alloc,
            FreeRequested,
            FreeCompleted,
            SegmentFree,
            Snapshot
        ]
    );
}

/// As in PyTorch, trackers are called whether or not history is recorded (and then no entry
/// is kept).
#[test]
fn a_trace_tracker_works_without_history() {
    let dev = SimDevice::address_only(0, 1 << 30);
    let mut a = DeviceCachingAllocator::new(dev, AllocatorConfig::default()).unwrap();
    let seen: Arc<Mutex<Vec<(u8, TraceEntry)>>> = Arc::default();
    let s = Arc::clone(&seen);
    a.attach_trace_tracker(Arc::new(move |device, e: &TraceEntry| {
        s.lock().push((device, e.clone()));
    }));
    assert_eq!(a.record_context(), RecordContext::Never);
    let p = a.malloc(1000, StreamId::DEFAULT).unwrap();
    a.free(p.ptr).unwrap();
    assert!(a.history().is_empty());
    let seen = seen.lock().clone();
    let segment = seen[0].1.addr;
    assert_eq!(
        seen.iter().map(|(d, e)| (*d, key(e))).collect::<Vec<_>>(),
        vec![
            (
                0,
                (
                    TraceAction::SegmentAlloc,
                    segment,
                    2 << 20,
                    StreamId::DEFAULT
                )
            ),
            (0, (TraceAction::Alloc, p.ptr, 1000, StreamId::DEFAULT)),
            (
                0,
                (TraceAction::FreeRequested, p.ptr, 1000, StreamId::DEFAULT)
            ),
            (
                0,
                (TraceAction::FreeCompleted, p.ptr, 1000, StreamId::DEFAULT)
            ),
        ]
    );
    assert!(seen.iter().all(|(_, e)| e.frames.is_none()));
}
