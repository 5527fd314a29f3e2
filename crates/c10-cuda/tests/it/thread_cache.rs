//! The front's thread caches (`c10_cuda::thread_cache`): nothing changes without contention;
//! under contention a thread keeps its small blocks and gets them back without the device lock;
//! double frees are still refused, `record_stream` and history bypass the cache, `empty_cache`,
//! the end of contended mode and an out-of-memory retry give every block back.
//!
//! Contention is made deterministic: another thread holds the device lock (`with_device`) while
//! the test thread allocates, so its `try_lock` fails.

use std::sync::mpsc;
use std::time::Duration;

use c10_cuda::call_site::HistoryOptions;
use c10_cuda::config::{AllocatorConfig, MIB};
use c10_cuda::device::DevicePtr;
use c10_cuda::history::TraceAction;
use c10_cuda::stats::StatType;
use c10_cuda::thread_cache::{CONTENDED_OPS, MAX_CACHED};
use c10_cuda::{CachingAllocator, Error, SimDevice};

const ALL: usize = StatType::Aggregate as usize;

fn front(capacity: usize) -> (SimDevice, CachingAllocator<SimDevice>) {
    let dev = SimDevice::address_only(0, capacity);
    let front = CachingAllocator::new(vec![dev.clone()], AllocatorConfig::default()).unwrap();
    (dev, front)
}

/// (allocated bytes now, allocations made so far) of device 0, as the allocator behind the
/// front sees them (blocks waiting in a thread cache are allocated there).
fn allocated(front: &CachingAllocator<SimDevice>) -> (i64, i64) {
    let s = front.with_device(0, |a| a.stats()).unwrap();
    (s.allocated_bytes[ALL].current, s.allocation[ALL].allocated)
}

/// Allocates `size` bytes while another thread holds the device lock: the calling thread's
/// `try_lock` fails, so it is in contended mode afterwards.
fn alloc_contended(front: &CachingAllocator<SimDevice>, size: usize) -> DevicePtr {
    std::thread::scope(|s| {
        let (tx, rx) = mpsc::channel();
        s.spawn(move || {
            front
                .with_device(0, |_| {
                    tx.send(()).unwrap();
                    std::thread::sleep(Duration::from_millis(30));
                })
                .unwrap();
        });
        rx.recv().unwrap();
        front.raw_alloc(0, size).unwrap()
    })
}

#[test]
fn without_contention_every_free_reaches_the_allocator() {
    let (_dev, front) = front(64 * MIB);
    for _ in 0..3 {
        let p = front.raw_alloc(0, 512).unwrap();
        front.raw_delete(p).unwrap();
        assert_eq!(allocated(&front).0, 0);
    }
    assert_eq!(allocated(&front).1, 3);
}

#[test]
fn under_contention_a_thread_gets_its_block_back_without_the_allocator() {
    let (_dev, front) = front(64 * MIB);
    let p = alloc_contended(&front, 512);
    assert_eq!(allocated(&front), (512, 1));
    front.raw_delete(p).unwrap();
    // Kept by the thread: still allocated for the allocator.
    assert_eq!(allocated(&front), (512, 1));
    let q = front.raw_alloc(0, 512).unwrap();
    assert_eq!(q, p);
    // Served from the thread cache: no new allocation in the allocator's counts.
    assert_eq!(allocated(&front), (512, 1));
    // Another size is the allocator's.
    let r = front.raw_alloc(0, 1024).unwrap();
    assert_eq!(allocated(&front), (512 + 1024, 2));
    front.raw_delete(q).unwrap();
    front.raw_delete(r).unwrap();
    // A block waiting in the cache, freed again, is refused like any double free.
    assert!(matches!(
        front.raw_delete(p),
        Err(Error::UnknownPointer { ptr }) if ptr == p
    ));
    // empty_cache gives every waiting block back first.
    front.empty_cache().unwrap();
    assert_eq!(allocated(&front).0, 0);
}

#[test]
fn a_recorded_stream_sends_the_free_to_the_allocator() {
    let (dev, front) = front(64 * MIB);
    let side = dev.new_stream();
    let p = alloc_contended(&front, 512);
    front.record_stream(p, side).unwrap();
    front.raw_delete(p).unwrap();
    // The allocator has it (waiting for the event on `side`), not the thread.
    assert_eq!(allocated(&front).0, 0);
}

#[test]
fn contended_mode_ends_and_gives_the_blocks_back() {
    let (_dev, front) = front(64 * MIB);
    let p = alloc_contended(&front, 4096);
    front.raw_delete(p).unwrap();
    assert_eq!(allocated(&front).0, 4096);
    // Every allocation and free counts; the last one of contended mode frees what waits.
    for _ in 0..CONTENDED_OPS {
        let q = front.raw_alloc(0, 4096).unwrap();
        front.raw_delete(q).unwrap();
    }
    assert_eq!(allocated(&front).0, 0);
    // And afterwards nothing is kept.
    let q = front.raw_alloc(0, 4096).unwrap();
    front.raw_delete(q).unwrap();
    assert_eq!(allocated(&front).0, 0);
}

#[test]
fn a_slot_holds_a_bounded_number_of_blocks() {
    let (_dev, front) = front(64 * MIB);
    let first = alloc_contended(&front, 512);
    let mut ptrs = vec![first];
    for _ in 0..MAX_CACHED + 4 {
        ptrs.push(front.raw_alloc(0, 512).unwrap());
    }
    for p in ptrs {
        front.raw_delete(p).unwrap();
    }
    assert_eq!(allocated(&front).0, 512 * MAX_CACHED as i64);
    front.empty_cache().unwrap();
    assert_eq!(allocated(&front).0, 0);
}

#[test]
fn history_turns_the_caches_off() {
    let (_dev, front) = front(64 * MIB);
    front.record_memory_history(&HistoryOptions::new(1000));
    let p = alloc_contended(&front, 512);
    front.raw_delete(p).unwrap();
    assert_eq!(allocated(&front).0, 0);
    let snap = front.snapshot();
    let frees = snap[0]
        .trace
        .iter()
        .filter(|e| e.action == TraceAction::FreeRequested && e.addr == p)
        .count();
    assert_eq!(frees, 1);
}

#[test]
fn an_out_of_memory_retry_frees_the_waiting_blocks_first() {
    // 21 MiB: the small segment (2 MiB) of a waiting block leaves too little for a 20 MiB one.
    let (_dev, front) = front(21 * MIB);
    let p = alloc_contended(&front, 512);
    front.raw_delete(p).unwrap();
    assert_eq!(allocated(&front).0, 512);
    let big = front.raw_alloc(0, 5 * MIB).unwrap();
    assert_ne!(big, 0);
    assert_eq!(allocated(&front).0, 5 * MIB as i64);
}

#[test]
fn the_fronts_reports_count_only_the_users_blocks() {
    let (_dev, front) = front(64 * MIB);
    let p = alloc_contended(&front, 512);
    let q = front.raw_alloc(0, 2048).unwrap();
    front.raw_delete(p).unwrap();
    assert_eq!(allocated(&front).0, 512 + 2048);
    // memory_stats() and friends give the waiting block back first.
    let stats = front.device_stats(0).unwrap();
    assert_eq!(stats.allocated_bytes[ALL].current, 2048);
    assert_eq!(
        front.memory_stats(0).unwrap()["allocated_bytes.all.current"],
        2048
    );
    assert_eq!(allocated(&front).0, 2048);
    front.raw_delete(q).unwrap();
}

#[test]
fn a_block_freed_by_another_thread_goes_to_the_allocator() {
    let (_dev, front) = front(64 * MIB);
    let p = alloc_contended(&front, 512);
    let q = front.raw_alloc(0, 512).unwrap();
    front.raw_delete(q).unwrap();
    // `p` is tracked by this thread's slot; another thread frees it: the allocator gets it.
    std::thread::scope(|s| {
        s.spawn(|| front.raw_delete(p).unwrap()).join().unwrap();
    });
    assert_eq!(
        allocated(&front).0,
        512,
        "only `q` waits in this thread's slot"
    );
    // `q` waits here: another thread freeing it again is a double free.
    std::thread::scope(|s| {
        let r = s.spawn(|| front.raw_delete(q)).join().unwrap();
        assert!(matches!(r, Err(Error::UnknownPointer { ptr }) if ptr == q));
    });
    // And this thread gets `q` back for the next 512 B.
    assert_eq!(front.raw_alloc(0, 512).unwrap(), q);
}

#[test]
fn settle_thread_caches_gives_the_waiting_blocks_back() {
    let (_dev, front) = front(64 * MIB);
    let p = alloc_contended(&front, 512);
    let q = front.raw_alloc(0, 2048).unwrap();
    front.raw_delete(p).unwrap();
    // Waiting in the slot: allocated for the raw allocator.
    assert_eq!(allocated(&front), (512 + 2048, 2));
    front.settle_thread_caches();
    // Only the user's block is left; the next 512-byte request is the allocator's again.
    assert_eq!(allocated(&front), (2048, 2));
    front.raw_delete(q).unwrap();
    front.settle_thread_caches();
    assert_eq!(allocated(&front).0, 0);
}
