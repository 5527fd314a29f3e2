//! The pinned host caching allocator (PyTorch's `CachingHostAllocatorImpl`, torch 2.15) on the
//! simulated device's pinned memory: the rounding and bucket rules, event-gated reuse (in
//! PyTorch's oldest-first order that stops at the first unfinished event), the register path,
//! the background thread, statistics with a recount, and a property test with the invariants
//! after every step.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use c10_core::{Allocator, Storage};
use c10_cuda::SimDevice;
use c10_cuda::config::AllocatorConfig;
use c10_cuda::device::StreamId;
use c10_host_alloc::host_allocator::{
    CachingHostAllocator, HostAllocatorConfig, HostAllocatorError, power_of_two_ceil, size_index,
};
use c10_host_alloc::pinned_memory::SimPinnedMemory;
use proptest::prelude::*;
use rstest::rstest;

const MIB: usize = 1 << 20;

fn host(config: HostAllocatorConfig) -> (CachingHostAllocator<SimPinnedMemory>, SimDevice) {
    let sim = SimDevice::host_backed(0, 64 * MIB);
    let pinned = SimPinnedMemory::new(sim.clone());
    (CachingHostAllocator::new(pinned, config), sim)
}

fn checked(h: &CachingHostAllocator<SimPinnedMemory>) {
    if let Err(e) = h.check_invariants() {
        panic!("invariant broken: {e}");
    }
}

// PyTorch's `c10::llvm::PowerOf2Ceil` and `Log2_64_Ceil` (`size_index`).
#[rstest]
#[case(1, 1, 0)]
#[case(2, 2, 1)]
#[case(3, 4, 2)]
#[case(4, 4, 2)]
#[case(5, 8, 3)]
#[case(1000, 1024, 10)]
#[case(1024, 1024, 10)]
#[case(1025, 2048, 11)]
#[case(3 * MIB + 1, 4 * MIB, 22)]
#[case(1 << 40, 1 << 40, 40)]
fn pinned_rounding_and_buckets(#[case] size: usize, #[case] round: usize, #[case] bucket: usize) {
    assert_eq!(power_of_two_ceil(size), Some(round));
    assert_eq!(size_index(round), bucket);
    let (h, _) = host(HostAllocatorConfig::default());
    assert_eq!(h.round_size(size).unwrap(), round);
}

// Above `max_round_threshold` (or `max_cached_size`) a request keeps its size.
#[rstest]
#[case::at_threshold(MIB, MIB)]
#[case::below(MIB - 1000, MIB)]
#[case::above(MIB + 1, MIB + 1)]
#[case::far_above(5 * MIB + 3, 5 * MIB + 3)]
fn pinned_rounding_threshold(#[case] size: usize, #[case] round: usize) {
    let (h, _) = host(HostAllocatorConfig {
        max_round_threshold: MIB,
        ..HostAllocatorConfig::default()
    });
    assert_eq!(h.round_size(size).unwrap(), round);
}

#[test]
fn pinned_zero_and_impossible_sizes() {
    let (h, _) = host(HostAllocatorConfig::default());
    assert_eq!(h.malloc(0).unwrap(), 0);
    h.free(0).unwrap();
    assert!(matches!(
        h.malloc(usize::MAX).unwrap_err(),
        HostAllocatorError::SizeTooLarge { size: usize::MAX }
    ));
    assert!(matches!(
        h.free(0x1234).unwrap_err(),
        HostAllocatorError::UnknownPointer { ptr: 0x1234 }
    ));
    assert!(!h.record_event(0x1234, StreamId::DEFAULT));
    assert_eq!(h.stats().allocations.current, 0);
}

#[test]
fn pinned_block_recorded_on_an_unfinished_stream_is_not_handed_out() {
    let (h, sim) = host(HostAllocatorConfig::default());
    let s = sim.new_stream();
    let a = h.malloc(1000).unwrap();
    assert_eq!(h.block_size(a), Some(1024));
    assert!(h.record_event(a, s));
    assert!(
        h.record_event(a + 500, s),
        "an interior pointer finds its block"
    );
    h.free(a).unwrap();
    assert_eq!(
        h.pending_events(),
        1,
        "one event per stream, not per record"
    );
    checked(&h);
    // The stream has not finished: a new block.
    let b = h.malloc(1000).unwrap();
    assert_ne!(b, a);
    // A block freed without streams is cached at once and reused.
    h.free(b).unwrap();
    assert_eq!(h.malloc(700).unwrap(), b);
    checked(&h);
    sim.complete_stream(s);
    // The next allocation processes the completed event first: `a` is back.
    assert_eq!(h.malloc(1000).unwrap(), a);
    assert_eq!(h.pending_events(), 0);
    assert_eq!(h.stats().num_host_alloc, 2);
    checked(&h);
}

#[test]
fn pinned_events_are_processed_oldest_first_up_to_the_first_unfinished() {
    let (h, sim) = host(HostAllocatorConfig::default());
    let (s1, s2) = (sim.new_stream(), sim.new_stream());
    let a = h.malloc(4096).unwrap();
    let b = h.malloc(4096).unwrap();
    h.record_event(a, s1);
    h.record_event(b, s2);
    h.free(a).unwrap(); // older event, on s1
    h.free(b).unwrap(); // newer event, on s2
    sim.complete_stream(s2);
    // b's event is complete, but a's (older) is not: processing stops there, b stays out.
    let c = h.malloc(4096).unwrap();
    assert!(c != a && c != b);
    assert_eq!(h.pending_events(), 2);
    sim.complete_stream(s1);
    h.process_events();
    assert_eq!((h.pending_events(), h.cached_blocks()), (0, 2));
    // Both come back, most recently cached first (PyTorch takes the back of the free list).
    assert_eq!(h.malloc(4096).unwrap(), b);
    assert_eq!(h.malloc(4096).unwrap(), a);
    checked(&h);
}

#[test]
fn pinned_block_used_on_two_streams_waits_for_both() {
    let (h, sim) = host(HostAllocatorConfig::default());
    let (s1, s2) = (sim.new_stream(), sim.new_stream());
    let a = h.malloc(100).unwrap();
    h.record_event(a, s1);
    h.record_event(a, s2);
    h.record_event(a, StreamId::DEFAULT);
    h.free(a).unwrap();
    assert_eq!(h.pending_events(), 3);
    sim.complete_stream(s1);
    sim.complete_stream(StreamId::DEFAULT);
    h.process_events();
    assert_eq!(h.cached_blocks(), 0, "s2 is not done");
    sim.complete_stream(s2);
    h.process_events();
    assert_eq!(h.cached_blocks(), 1);
    // Streams recorded before a free do not carry over to the next use.
    let again = h.malloc(128).unwrap();
    assert_eq!(again, a);
    h.free(again).unwrap();
    assert_eq!(h.pending_events(), 0);
    checked(&h);
}

#[test]
fn pinned_stats_follow_pytorch_and_recount() {
    let (h, _) = host(HostAllocatorConfig::default());
    let a = h.malloc(1000).unwrap(); // 1024, bucket 10
    let b = h.malloc(3000).unwrap(); // 4096, bucket 12
    h.free(a).unwrap();
    let c = h.malloc(600).unwrap(); // reuses a
    assert_eq!(c, a);
    checked(&h);
    let stats = h.host_memory_stats();
    let keys: Vec<&str> = stats.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "active_bytes.allocated",
            "active_bytes.current",
            "active_bytes.freed",
            "active_bytes.peak",
            "active_requests.allocated",
            "active_requests.current",
            "active_requests.freed",
            "active_requests.peak",
            "allocated_bytes.allocated",
            "allocated_bytes.current",
            "allocated_bytes.freed",
            "allocated_bytes.peak",
            "allocations.allocated",
            "allocations.current",
            "allocations.freed",
            "allocations.peak",
            "host_alloc_time.avg",
            "host_alloc_time.count",
            "host_alloc_time.max",
            "host_alloc_time.min",
            "host_alloc_time.total",
            "host_free_time.avg",
            "host_free_time.count",
            "host_free_time.max",
            "host_free_time.min",
            "host_free_time.total",
            "num_host_alloc",
            "num_host_free",
        ]
    );
    let v = |k: &str| stats[k];
    assert_eq!((v("allocations.current"), v("allocations.peak")), (2, 2));
    assert_eq!(v("allocated_bytes.current"), 1024 + 4096);
    assert_eq!(
        (v("active_requests.current"), v("active_requests.allocated")),
        (2, 3)
    );
    assert_eq!(v("active_requests.freed"), 1);
    assert_eq!(v("active_bytes.current"), 1024 + 4096);
    assert_eq!((v("num_host_alloc"), v("num_host_free")), (2, 0));
    assert_eq!(v("host_alloc_time.count"), 2);
    assert_eq!(v("host_free_time.count"), 0);
    assert_eq!(h.stats().bucket_allocation[10], 1);
    assert_eq!(h.stats().bucket_allocation[12], 1);

    h.free(b).unwrap();
    h.free(c).unwrap();
    h.empty_cache();
    checked(&h);
    let stats = h.host_memory_stats();
    assert_eq!(stats["allocations.current"], 0);
    assert_eq!(stats["allocated_bytes.freed"], 1024 + 4096);
    assert_eq!((stats["num_host_alloc"], stats["num_host_free"]), (2, 2));
    assert_eq!(stats["host_free_time.count"], 2);
    assert_eq!(h.backend().counters().live_bytes, 0);
    // Peak of the active stats: the sum of the per-bucket peaks (PyTorch's approximation).
    assert_eq!(stats["active_bytes.peak"], 1024 + 4096);

    h.reset_peak_stats();
    h.reset_accumulated_stats();
    let stats = h.host_memory_stats();
    assert_eq!(
        (
            stats["allocations.peak"],
            stats["num_host_alloc"],
            stats["host_alloc_time.count"]
        ),
        (0, 0, 0)
    );
}

#[test]
fn pinned_blocks_above_max_cached_size_are_released_at_free() {
    let (h, _) = host(HostAllocatorConfig {
        max_cached_size: 4096,
        ..HostAllocatorConfig::default()
    });
    let small = h.malloc(3000).unwrap();
    let big = h.malloc(8000).unwrap();
    assert_eq!(
        h.block_size(big),
        Some(8000),
        "not rounded above max_cached_size"
    );
    h.free(big).unwrap();
    h.free(small).unwrap();
    let stats = h.stats();
    assert_eq!((stats.num_host_free, stats.allocations.current), (1, 1));
    assert_eq!(h.cached_blocks(), 1);
    checked(&h);
}

#[test]
fn pinned_register_path_prefaults_with_threads_and_unregisters() {
    let config: AllocatorConfig =
        "pinned_use_cuda_host_register:True,pinned_num_register_threads:4,pinned_use_background_threads:False"
            .parse()
            .unwrap();
    let host_config = HostAllocatorConfig::from_alloc_config(&config);
    assert_eq!(
        (
            host_config.use_host_register,
            host_config.num_register_threads,
            host_config.use_background_threads
        ),
        (true, 4, false)
    );
    let (h, _) = host(host_config);
    let a = h.malloc(MIB).unwrap();
    let b = h.malloc(100).unwrap();
    // SAFETY: `a` is an allocated block of 1 MiB that only this test uses.
    let bytes = unsafe { std::slice::from_raw_parts(a as *const u8, MIB) };
    assert!(
        bytes.iter().all(|&x| x == 0),
        "pre-faulted pages are zeroed"
    );
    let c = h.backend().counters();
    assert_eq!((c.host_allocs, c.host_registers), (0, 2));
    h.free(a).unwrap();
    h.free(b).unwrap();
    h.empty_cache();
    let c = h.backend().counters();
    assert_eq!((c.host_frees, c.host_unregisters, c.live_bytes), (0, 2, 0));
}

#[test]
fn pinned_background_thread_processes_events() {
    let config: AllocatorConfig = "pinned_use_background_threads:True".parse().unwrap();
    let (h, sim) = host(HostAllocatorConfig::from_alloc_config(&config));
    let s = sim.new_stream();
    assert!(!h.background_thread_started());
    let a = h.malloc(1000).unwrap();
    // The thread starts at the first cache miss (PyTorch's `background_thread_flag`).
    assert!(h.background_thread_started());
    h.record_event(a, s);
    h.free(a).unwrap();
    let b = h.malloc(1000).unwrap();
    assert_ne!(a, b, "the stream is not done");
    sim.complete_stream(s);
    // Not a timing assertion: wait (up to a generous limit) for the thread to cache `a`.
    let deadline = Instant::now() + Duration::from_secs(30);
    while h.cached_blocks() == 0 {
        assert!(
            Instant::now() < deadline,
            "the background thread never processed the event"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(h.malloc(1000).unwrap(), a);
    checked(&h);
}

#[test]
fn pinned_data_ptrs_are_cpu_storages_that_return_their_block() {
    let (h, _) = host(HostAllocatorConfig::default());
    let allocator: Arc<dyn Allocator> = Arc::new(h.allocator());
    let storage = Storage::new(3000, Arc::clone(&allocator), false).unwrap();
    assert_eq!(storage.device(), c10_core::Device::cpu());
    let ptr = storage.data_ptr() as usize;
    assert!(h.is_pinned(ptr) && h.is_pinned(ptr + 2999));
    assert!(!h.is_pinned(ptr + 4096));
    assert_eq!(h.stats().active_requests.current, 1);
    drop(storage);
    assert_eq!(h.stats().active_requests.current, 0);
    assert_eq!(h.cached_blocks(), 1);
    let again = allocator.allocate(4000).unwrap();
    assert_eq!(again.get() as usize, ptr, "the cached block is reused");
    let empty = allocator.allocate(0).unwrap();
    assert!(empty.is_null());
}

#[test]
fn pinned_mlock_either_locks_or_says_why() {
    let sim = SimDevice::host_backed(0, 64 * MIB);
    let pinned = SimPinnedMemory::new(sim).with_mlock(true);
    let h = CachingHostAllocator::new(pinned, HostAllocatorConfig::default());
    match h.malloc(4096) {
        Ok(ptr) => {
            assert_eq!(h.backend().counters().locked_bytes, 4096);
            h.free(ptr).unwrap();
            h.empty_cache();
            assert_eq!(h.backend().counters().locked_bytes, 0);
        }
        // A host whose RLIMIT_MEMLOCK is 0: a clear error naming mlock, nothing held.
        Err(HostAllocatorError::Backend { source, .. }) => {
            assert!(source.to_string().contains("mlock"), "{source}");
            assert_eq!(h.stats().allocations.current, 0);
        }
        Err(other) => panic!("unexpected error {other}"),
    }
}

#[derive(Clone, Debug)]
enum Op {
    Alloc(usize),
    Free(usize),
    Record(usize, usize),
    CompleteStream(usize),
    CompleteNext(usize),
    Process,
    EmptyCache,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1usize..70_000).prop_map(Op::Alloc),
        3 => any::<usize>().prop_map(Op::Free),
        3 => (any::<usize>(), 0usize..3).prop_map(|(i, s)| Op::Record(i, s)),
        2 => (0usize..3).prop_map(Op::CompleteStream),
        2 => (0usize..3).prop_map(Op::CompleteNext),
        1 => Just(Op::Process),
        1 => Just(Op::EmptyCache),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// After every step: the allocator's own invariants (structure and a recount of every
    /// stat); live blocks do not overlap and are at least as large as asked; and a block is
    /// never handed out while an event recorded at its last free is pending (the model follows
    /// the simulated streams' event queues).
    #[test]
    fn pinned_proptest_invariants_hold_after_every_step(
        ops in proptest::collection::vec(op(), 1..80),
        max_cached in prop_oneof![Just(usize::MAX), Just(16_384usize)],
    ) {
        let (h, sim) = host(HostAllocatorConfig { max_cached_size: max_cached, ..HostAllocatorConfig::default() });
        let streams = [StreamId::DEFAULT, sim.new_stream(), sim.new_stream()];
        // Live blocks: ptr -> (asked size, streams recorded since handed out).
        let mut live: BTreeMap<usize, (usize, BTreeSet<usize>)> = BTreeMap::new();
        // Per stream, the blocks whose events are queued on it, oldest first.
        let mut queues: Vec<VecDeque<usize>> = vec![VecDeque::new(); 3];
        for op in ops {
            match op {
                Op::Alloc(size) => {
                    let ptr = h.malloc(size).unwrap();
                    let pending = queues.iter().any(|q| q.contains(&ptr));
                    prop_assert!(!pending, "block {ptr:#x} handed out with events pending");
                    let bsize = h.block_size(ptr).unwrap();
                    prop_assert!(bsize >= size);
                    for &p in live.keys() {
                        let pb = h.block_size(p).unwrap();
                        prop_assert!(ptr + bsize <= p || p + pb <= ptr, "overlap");
                    }
                    live.insert(ptr, (size, BTreeSet::new()));
                }
                Op::Free(i) if !live.is_empty() => {
                    let ptr = *live.keys().nth(i % live.len()).unwrap();
                    let (_, used) = live.remove(&ptr).unwrap();
                    h.free(ptr).unwrap();
                    for s in used {
                        queues[s].push_back(ptr);
                    }
                }
                Op::Record(i, s) if !live.is_empty() => {
                    let ptr = *live.keys().nth(i % live.len()).unwrap();
                    prop_assert!(h.record_event(ptr, streams[s]));
                    live.get_mut(&ptr).unwrap().1.insert(s);
                }
                Op::CompleteStream(s) => {
                    sim.complete_stream(streams[s]);
                    queues[s].clear();
                }
                Op::CompleteNext(s) => {
                    if sim.complete_next(streams[s]) {
                        queues[s].pop_front();
                    }
                }
                Op::Process => h.process_events(),
                Op::EmptyCache => h.empty_cache(),
                Op::Free(_) | Op::Record(..) => {}
            }
            if let Err(e) = h.check_invariants() {
                prop_assert!(false, "{}", e);
            }
            let stats = h.stats();
            prop_assert!(stats.active_requests.current as usize >= live.len());
            prop_assert_eq!(
                stats.active_requests.current,
                stats.allocations.current - h.cached_blocks() as i64
            );
        }
        for (ptr, _) in std::mem::take(&mut live) {
            h.free(ptr).unwrap();
        }
        sim.complete_all();
        h.empty_cache();
        prop_assert_eq!(h.stats().allocations.current, 0);
        prop_assert_eq!(h.backend().counters().live_bytes, 0);
        prop_assert_eq!(h.pending_events(), 0);
    }
}
