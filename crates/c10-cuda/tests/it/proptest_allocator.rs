//! Property test of the caching allocator: random alloc / free / record_stream / event /
//! empty_cache sequences on a simulated device under several configurations, with a full
//! invariant check after every step and a clean teardown at the end.
//!
//! CI runs [`DEFAULT_CASES`] x [`STEPS_PER_CASE`] = 100,000 random steps. `TENSORMEM_SOAK_STEPS=N`
//! (set by `cargo xtask soak`, which runs this file in release mode) runs about N steps instead.

use c10_cuda::config::{AllocatorConfig, MIB};
use c10_cuda::device::{DevicePtr, StreamId};
use c10_cuda::sizes::LARGE_BUFFER;
use c10_cuda::{DeviceCachingAllocator, Error, SimDevice};
use proptest::prelude::*;

/// Steps in one generated case.
const STEPS_PER_CASE: usize = 250;
/// Cases in a normal test run: 400 x 250 = 100,000 steps.
const DEFAULT_CASES: u32 = 400;

/// The configurations a case picks from (fixed at construction, as in PyTorch).
const CONFIGS: &[&str] = &[
    "",
    "max_split_size_mb:64",
    "roundup_power2_divisions:4",
    "expandable_segments:True",
    "garbage_collection_threshold:0.6,per_process_memory_fraction:0.8",
    "expandable_segments:True,max_split_size_mb:128",
    "max_split_size_mb:20,max_non_split_rounding_mb:40,roundup_power2_divisions:[1:8,>:2]",
    "per_process_memory_fraction:0.5,max_split_size_mb:32",
    "expandable_segments:True,per_process_memory_fraction:0.7,garbage_collection_threshold:0.5",
];

fn cases() -> u32 {
    match std::env::var("TENSORMEM_SOAK_STEPS") {
        Ok(steps) => {
            let steps: usize = steps
                .trim()
                .parse()
                .expect("TENSORMEM_SOAK_STEPS must be a step count");
            u32::try_from(steps.div_ceil(STEPS_PER_CASE).max(1)).unwrap_or(u32::MAX)
        }
        Err(_) => DEFAULT_CASES,
    }
}

#[derive(Clone, Debug)]
enum Op {
    /// Allocate `size` bytes on stream `stream % streams`.
    Alloc { size: usize, stream: usize },
    /// Free live block `i % live`.
    Free(usize),
    /// Record live block `i % live` on stream `stream % streams`.
    RecordStream(usize, usize),
    /// Complete every pending event of a stream.
    CompleteStream(usize),
    /// Complete the oldest pending event of a stream.
    CompleteNext(usize),
    /// Complete every pending event.
    CompleteAll,
    /// `empty_cache()`.
    EmptyCache,
}

fn size() -> impl Strategy<Value = usize> {
    prop_oneof![
        // Small pool: below 1 MiB, plus the edges.
        5 => 0..MIB,
        1 => prop::sample::select(vec![0, 1, 511, 512, 513, MIB - 1, MIB, MIB + 1]),
        // Mid: 1 MiB to 20 MiB (20 MiB segments below 10 MiB, exact segments above).
        4 => MIB..20 * MIB,
        1 => prop::sample::select(vec![10 * MIB - 1, 10 * MIB, 10 * MIB + 1, 20 * MIB]),
        // Large: up to 512 MiB.
        2 => 20 * MIB..=512 * MIB,
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        12 => (size(), 0..3usize).prop_map(|(size, stream)| Op::Alloc { size, stream }),
        6 => any::<usize>().prop_map(Op::Free),
        5 => (any::<usize>(), 0..3usize).prop_map(|(i, s)| Op::RecordStream(i, s)),
        1 => (0..3usize).prop_map(Op::CompleteStream),
        2 => (0..3usize).prop_map(Op::CompleteNext),
        1 => Just(Op::CompleteAll),
        1 => Just(Op::EmptyCache),
    ]
}

/// Everything checked after each step.
fn check(dev: &SimDevice, a: &DeviceCachingAllocator<SimDevice>, step: usize) {
    if let Err(e) = a.check_invariants() {
        panic!("step {step}: {e}");
    }
    assert_eq!(dev.used_bytes(), a.reserved_bytes(), "step {step}");
    assert_eq!(
        a.stats().reserved_bytes[0].current as usize,
        a.reserved_bytes(),
        "step {step}"
    );
    // The fraction caps reserved memory. With expandable segments PyTorch (and so this port)
    // checks the request's segment size before mapping whole 20 MiB pages, so the cap can be
    // overshot, by less than one large page.
    if let Some(f) = a.config().per_process_memory_fraction {
        let allowed = (f * dev.capacity() as f64) as usize;
        let slack = if a.config().expandable_segments {
            LARGE_BUFFER
        } else {
            0
        };
        assert!(a.reserved_bytes() <= allowed + slack, "step {step}");
    }
}

fn run_case(config: usize, capacity: usize, streams: usize, ops: &[Op]) {
    let dev = SimDevice::address_only(0, capacity);
    let config = AllocatorConfig::parse(CONFIGS[config]).expect("valid config");
    let mut a = DeviceCachingAllocator::new(dev.clone(), config).expect("allocator");
    let mut ids = vec![StreamId::DEFAULT];
    ids.extend((1..streams).map(|_| dev.new_stream()));
    let stream = |i: usize| ids[i % ids.len()];
    let mut live: Vec<DevicePtr> = Vec::new();
    for (step, op) in ops.iter().enumerate() {
        match *op {
            Op::Alloc { size, stream: s } => match a.malloc(size, stream(s)) {
                Ok(got) => {
                    assert!(got.size >= size.max(1), "step {step}");
                    assert_eq!(got.ptr % 512, 0);
                    live.push(got.ptr);
                }
                Err(Error::OutOfMemory(_)) => {}
                Err(e) => panic!("step {step}: malloc({size}): {e}"),
            },
            Op::Free(i) if !live.is_empty() => {
                let p = live.swap_remove(i % live.len());
                a.free(p).unwrap_or_else(|e| panic!("step {step}: {e}"));
            }
            Op::RecordStream(i, s) if !live.is_empty() => {
                let p = live[i % live.len()];
                a.record_stream(p, stream(s))
                    .unwrap_or_else(|e| panic!("step {step}: {e}"));
            }
            Op::Free(_) | Op::RecordStream(..) => {}
            Op::CompleteStream(s) => dev.complete_stream(stream(s)),
            Op::CompleteNext(s) => {
                dev.complete_next(stream(s));
            }
            Op::CompleteAll => dev.complete_all(),
            Op::EmptyCache => a.empty_cache().unwrap(),
        }
        check(&dev, &a, step);
    }
    // Teardown: everything goes back to the device.
    for p in live.drain(..) {
        a.free(p).unwrap();
    }
    dev.complete_all();
    a.empty_cache().unwrap();
    check(&dev, &a, ops.len());
    assert_eq!(a.reserved_bytes(), 0);
    assert_eq!(dev.used_bytes(), 0);
    assert_eq!(dev.pending_events(), 0);
    assert!(dev.live_segments().is_empty());
    assert!(dev.mapped_pages().is_empty());
    for (key, value) in a.stats().memory_stats() {
        if key.ends_with(".current") {
            assert_eq!(value, 0, "{key}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn random_ops_keep_invariants(
        config in 0..CONFIGS.len(),
        capacity in 64 * MIB..=4096 * MIB,
        streams in 1..=3usize,
        ops in prop::collection::vec(op(), STEPS_PER_CASE),
    ) {
        run_case(config, capacity, streams, &ops);
    }
}

/// Every configuration at least once with a fixed sequence (so no config is left to chance).
#[test]
fn every_config_round_trips() {
    let ops: Vec<Op> = (0..200)
        .map(|i| match i % 5 {
            0 | 1 => Op::Alloc {
                size: [4096, 3 * MIB, 12 * MIB + 7, 150 * MIB][i % 4],
                stream: i % 3,
            },
            2 => Op::RecordStream(i * 13, i + 1),
            3 => Op::Free(i * 7),
            _ => Op::CompleteNext(i % 3),
        })
        .collect();
    for config in 0..CONFIGS.len() {
        run_case(config, 512 * MIB, 3, &ops);
    }
}
