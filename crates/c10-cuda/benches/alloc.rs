//! Benchmarks of the caching allocator on the simulated device (address-only `SimDevice`).
//!
//! - `warm_pair/<size>`: one `malloc` + `free` of the same size, served from the cache (the
//!   block was allocated and freed once before timing starts).
//! - `replay/<trace>`: the alloc/free sequence of a real PyTorch snapshot (the `alloc` and
//!   `free_requested` entries of its `device_traces`, in order), replayed from an empty
//!   allocator; criterion reports events/s. Frees of blocks allocated before the history started
//!   are skipped.
//! - `replay_peer/<trace>` and `warm_pair_peer/<size>` (feature `bench-peer-cubecl`): the same
//!   work through cubecl-runtime 0.10's `MemoryManagement`, configured as cubecl-cuda configures
//!   it (default `MemoryConfiguration::SubSlices`, largest page = device memory / 4, alignment
//!   512) over a storage that only counts bytes. A free is dropping the handle, as cubecl does.
//!
//! After the timed groups a table compares, per trace: events, ns per alloc/free pair (ours and
//! the peer's: the mean of every iteration criterion timed, warm-up included), the ratio, both peak reserved figures and
//! the live-bytes lower bound (the peak over the sequence of the live requests, each rounded up
//! to 512 bytes). A "pair" is two events: ns/pair = 2 x ns/event.
//!
//! Both allocators see an 80 GiB device (the largest trace reserved about 57 GiB in PyTorch, so
//! it ran on an 80 GiB-class GPU); the peer's largest page is then 20 GiB. The snapshot pickles
//! are read from `shared/data/snapshots` beside the workspace with `tensormem-pickle`; when that
//! folder is absent the replay groups are skipped with a message. Block addresses are resolved
//! to slots before timing, so the timed loops do no address lookups. Under `cargo test`
//! (criterion's test mode) every benchmark runs once, unoptimized: under a second in all.
//!
//! # Targets
//! - a warm pair in well under 100 ns, single-threaded;
//! - replay of the largest shared snapshot (`lm2.7b_ctx128_trainstep_fp32`) at over 5 million
//!   events/s;
//! - at least 5x faster per pair than the cubecl-runtime peer on every shared trace.
//!
//! # Measured
//! On the development machine (2 x86-64 cores in a shared VM; run-to-run spread 10 to 20%),
//! after the hot-path work of 2026-11-29 (intrusive class lists with a B-tree for long classes,
//! an open-addressing pointer map, pool-only stat updates; see `src/free_index.rs`,
//! `src/ptr_map.rs`, `src/stats.rs`):
//! `cargo bench -p c10-cuda --bench alloc --features bench-peer-cubecl -- --warm-up-time 1
//! --measurement-time 3`, ns per alloc/free pair (the printed table; two runs back to back,
//! the second shown, the first in brackets):
//!
//! | benchmark | ours | peer | peer/ours | ours Mev/s | peak reserved ours / peer / live (MiB) |
//! |---|---|---|---|---|---|
//! | warm_pair/512B | 65.6 (71.1) | 160.4 (148.1) | 2.4x (2.1x) | | |
//! | warm_pair/1MiB | 71.9 (71.4) | 177.0 (151.7) | 2.5x (2.1x) | | |
//! | warm_pair/20MiB | 40.9 (40.2) | 28.5 (27.8) | 0.7x (0.7x) | | |
//! | lm_small_forward_from_empty (62 events) | 97.8 (101.3) | 140.6 (154.5) | 1.4x (1.5x) | 20.4 | 3606 / 5540 / 3099 |
//! | lm_small_forward_bf16 (1,362) | 68.2 (75.6) | 137.1 (161.3) | 2.0x (2.1x) | 29.3 | 42 / 420 / 31.5 |
//! | gpt2small_trainstep_steady (3,440) | 68.4 (65.6) | 366.2 (376.5) | 5.4x (5.7x) | 29.2 | 12336 / 13540 / 12281 |
//! | lm2.7b_ctx128_forward_fp32 (3,213) | 92.6 (84.0) | 1252.1 (1449.4) | 13.5x (17.3x) | 21.6 | 5630 / 5640 / 5459 |
//! | lm2.7b_ctx512_forward_bf16 (4,116) | 104.6 (109.6) | 1285.1 (1480.6) | 12.3x (13.5x) | 19.1 | 25476 / 27100 / 24981 |
//! | lm2.7b_ctx128_trainstep_fp32 (12,665) | 96.7 (113.0) | 1522.0 (1225.4) | 15.7x (10.8x) | 20.7 | 45154 / 47620 / 39267 |
//!
//! Before that work the same command gave 92 / 90 / 62 ns for the warm pairs and 228 / 97 /
//! 114 / 113 / 121 / 127 ns per pair on the six traces (the harness then dropped each replay's
//! allocator before building the next, which also charged page faults to the smallest trace).
//!
//! Verdict: replay of the largest trace at 18 to 21 M events/s meets its target; warm pairs
//! at 40 to 72 ns are under 100 ns. ">= 5x the peer on every trace" holds on four traces
//! (5.4x to 17x) and not on the two small ones (1.4x and 2.0x), where the peer's few pages make
//! it fast: 5x there would need about 20 to 30 ns (some 300 instructions) per pair, while
//! PyTorch's rules cost about 850 to 1,000 instructions per pair in our implementation
//! (callgrind: a best-fit search, a split and a merge with their index updates, the pointer
//! map, ten stat updates); on the 62-event trace every allocation also creates a segment on the
//! simulated device.
//!
//! Run: `cargo bench -p c10-cuda --bench alloc` (ours only) or
//! `cargo bench -p c10-cuda --bench alloc --features bench-peer-cubecl` (with the peer);
//! add `-- --warm-up-time 1 --measurement-time 3` for a quick run, or a filter such as
//! `-- replay/` to run one group.

use std::collections::HashMap;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use c10_cuda::config::AllocatorConfig;
use c10_cuda::device::{DevicePtr, StreamId};
use c10_cuda::stats::StatType;
use c10_cuda::{DeviceCachingAllocator, SimDevice};
use criterion::{BenchmarkId, Criterion, Throughput};
use tensormem_pickle::Value;

/// Device memory of both allocators: an 80 GiB GPU.
const DEVICE_MEMORY: usize = 80 << 30;

/// The snapshots, relative to this crate's manifest.
const SNAPSHOTS: &str = "../../../shared/data/snapshots";

/// The history-bearing shared snapshots, smallest first.
const TRACES: [&str; 6] = [
    "lm_small_forward_from_empty",
    "lm_small_forward_bf16",
    "gpt2small_trainstep_steady",
    "lm2.7b_ctx128_forward_fp32",
    "lm2.7b_ctx512_forward_bf16",
    "lm2.7b_ctx128_trainstep_fp32",
];

/// Sizes of the warm-pair benchmark: small pool, the small/large boundary, a 20 MiB segment.
const WARM_SIZES: [(&str, usize); 3] = [("512B", 512), ("1MiB", 1 << 20), ("20MiB", 20 << 20)];

/// The allocation unit of both allocators (PyTorch's kMinBlockSize, cubecl-cuda's alignment).
const ALIGN: u64 = 512;

// ------------------------------------------------------------------------------------------
// Traces
// ------------------------------------------------------------------------------------------

/// One request of a recorded trace: an `alloc` or a `free_requested` entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Event {
    /// `alloc`: `size` requested bytes, handed out at `addr`.
    Alloc { addr: u64, size: u64 },
    /// `free_requested` of the block at `addr`.
    Free { addr: u64 },
}

/// Reads the alloc/free sequence of one snapshot pickle: its `alloc` and `free_requested`
/// trace entries, in order, over all devices (every shared history has one device).
fn load_trace(path: &Path) -> Result<Vec<Event>, String> {
    let fail = |what: &dyn std::fmt::Display| format!("{}: {what}", path.display());
    let bytes = std::fs::read(path).map_err(|e| fail(&e))?;
    let snapshot = tensormem_pickle::decode(&bytes).map_err(|e| fail(&e))?;
    let mut events = Vec::new();
    // Very old snapshots are a bare list of segments: no history.
    let Some(devices) = snapshot.get("device_traces").and_then(Value::as_list) else {
        return Ok(events);
    };
    for device in devices {
        let entries = device
            .as_list()
            .ok_or_else(|| fail(&"a device trace that is not a list"))?;
        for entry in entries {
            let int = |key: &str| {
                entry
                    .get(key)
                    .and_then(Value::as_i64)
                    .and_then(|v| u64::try_from(v).ok())
                    .ok_or_else(|| fail(&format!("a trace entry without a valid {key:?}")))
            };
            match entry.get("action").and_then(Value::as_str) {
                Some("alloc") => events.push(Event::Alloc {
                    addr: int("addr")?,
                    size: int("size")?,
                }),
                Some("free_requested") => events.push(Event::Free { addr: int("addr")? }),
                _ => {}
            }
        }
    }
    Ok(events)
}

/// One replay step. Blocks are named by slot (an index into a table of live handles) so that
/// the timed loop spends nothing on address lookups.
#[derive(Clone, Copy, Debug)]
enum Op {
    Alloc { size: usize, slot: u32 },
    Free { slot: u32 },
}

/// A trace ready to replay from an empty allocator.
struct Trace {
    name: &'static str,
    ops: Vec<Op>,
    /// Number of slots (one per `alloc`).
    slots: usize,
    /// Frees of blocks the trace never allocated (live before history started): skipped.
    skipped_frees: usize,
    /// Peak over the sequence of the live requested bytes, each rounded up to 512.
    live_lower_bound: u64,
}

impl Trace {
    fn new(name: &'static str, events: &[Event]) -> Trace {
        let mut live: HashMap<u64, (u32, u64)> = HashMap::new();
        let mut ops = Vec::with_capacity(events.len());
        let (mut slots, mut skipped_frees) = (0u32, 0);
        let (mut live_bytes, mut live_lower_bound) = (0u64, 0u64);
        for &event in events {
            match event {
                Event::Alloc { addr, size } => {
                    let rounded = size.max(1).next_multiple_of(ALIGN);
                    if let Some((_, old)) = live.insert(addr, (slots, rounded)) {
                        // An inconsistent trace: the old block stays live, unreachable.
                        live_bytes -= old;
                    }
                    live_bytes += rounded;
                    live_lower_bound = live_lower_bound.max(live_bytes);
                    ops.push(Op::Alloc {
                        size: size as usize,
                        slot: slots,
                    });
                    slots += 1;
                }
                Event::Free { addr } => match live.remove(&addr) {
                    Some((slot, rounded)) => {
                        live_bytes -= rounded;
                        ops.push(Op::Free { slot });
                    }
                    None => skipped_frees += 1,
                },
            }
        }
        Trace {
            name,
            ops,
            slots: slots as usize,
            skipped_frees,
            live_lower_bound,
        }
    }

    fn allocs(&self) -> usize {
        self.slots
    }

    fn frees(&self) -> usize {
        self.ops.len() - self.slots
    }
}

/// The history-bearing shared snapshots that are present, or why there are none.
fn load_traces() -> Result<Vec<Trace>, String> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(SNAPSHOTS);
    if !dir.is_dir() {
        return Err(format!("{} not found", dir.display()));
    }
    let mut traces = Vec::new();
    for name in TRACES {
        let path = dir.join(format!("{name}.pickle"));
        if !path.is_file() {
            eprintln!("alloc bench: {} not found, skipped", path.display());
            continue;
        }
        traces.push(Trace::new(name, &load_trace(&path)?));
    }
    Ok(traces)
}

// ------------------------------------------------------------------------------------------
// Ours
// ------------------------------------------------------------------------------------------

fn new_allocator() -> DeviceCachingAllocator<SimDevice> {
    DeviceCachingAllocator::new(
        SimDevice::address_only(0, DEVICE_MEMORY),
        AllocatorConfig::default(),
    )
    .expect("a simulated device reports its memory")
}

/// Replays `trace` on `alloc`; `ptrs` has one entry per slot.
fn replay_ours(
    alloc: &mut DeviceCachingAllocator<SimDevice>,
    trace: &Trace,
    ptrs: &mut [DevicePtr],
) {
    for &op in &trace.ops {
        match op {
            Op::Alloc { size, slot } => {
                let a = alloc
                    .malloc(size, StreamId::DEFAULT)
                    .unwrap_or_else(|e| panic!("{}: malloc({size}): {e}", trace.name));
                ptrs[slot as usize] = a.ptr;
            }
            Op::Free { slot } => {
                alloc
                    .free(black_box(ptrs[slot as usize]))
                    .unwrap_or_else(|e| panic!("{}: free: {e}", trace.name));
            }
        }
    }
}

/// Wall time of one replay from an empty allocator. Building the allocator is not timed, and
/// the previous replay's allocator (`keep`) is dropped only after the new one is built:
/// dropping it first lets the C heap hand its top pages back to the OS, and the next replay
/// would pay page faults on first touch (an artifact of building one allocator per replay;
/// the peer is timed the same way).
fn time_ours(trace: &Trace, keep: &mut Option<DeviceCachingAllocator<SimDevice>>) -> Duration {
    let mut alloc = new_allocator();
    drop(keep.take());
    let mut ptrs = vec![0; trace.slots];
    let start = Instant::now();
    replay_ours(&mut alloc, trace, &mut ptrs);
    let elapsed = start.elapsed();
    *keep = Some(black_box(alloc));
    elapsed
}

/// Peak reserved bytes of one replay.
fn peak_reserved_ours(trace: &Trace) -> u64 {
    let mut alloc = new_allocator();
    let mut ptrs = vec![0; trace.slots];
    replay_ours(&mut alloc, trace, &mut ptrs);
    alloc.stats().reserved_bytes[StatType::Aggregate as usize].peak as u64
}

// ------------------------------------------------------------------------------------------
// The peer: cubecl-runtime's memory management
// ------------------------------------------------------------------------------------------

#[cfg(feature = "bench-peer-cubecl")]
mod peer {
    //! cubecl-runtime 0.10's `MemoryManagement` over a byte-counting storage.

    use std::collections::HashMap;
    use std::sync::Arc;

    use cubecl_ir::MemoryDeviceProperties;
    use cubecl_runtime::logging::ServerLogger;
    use cubecl_runtime::memory_management::{
        ManagedMemoryHandle, MemoryConfiguration, MemoryManagement, MemoryManagementOptions,
    };
    use cubecl_runtime::server::IoError;
    use cubecl_runtime::storage::{ComputeStorage, StorageHandle, StorageId, StorageUtilization};

    use super::{ALIGN, DEVICE_MEMORY, Op, Trace};

    /// A storage that hands out ids and counts bytes; no memory behind it.
    #[derive(Default)]
    pub struct CountingStorage {
        sizes: HashMap<StorageId, u64>,
        current: u64,
        /// The most bytes held at once.
        pub peak: u64,
    }

    impl ComputeStorage for CountingStorage {
        type Resource = ();

        fn alignment(&self) -> usize {
            ALIGN as usize
        }

        fn get(&mut self, _handle: &StorageHandle) {}

        fn alloc(&mut self, size: u64) -> Result<StorageHandle, IoError> {
            let id = StorageId::new();
            self.sizes.insert(id, size);
            self.current += size;
            self.peak = self.peak.max(self.current);
            Ok(StorageHandle::new(
                id,
                StorageUtilization { offset: 0, size },
            ))
        }

        fn dealloc(&mut self, id: StorageId) {
            if let Some(size) = self.sizes.remove(&id) {
                self.current -= size;
            }
        }

        fn flush(&mut self) {}
    }

    pub type Peer = MemoryManagement<CountingStorage>;

    /// cubecl-cuda's main GPU memory management: `MemoryConfiguration::SubSlices` (the default),
    /// `max_page_size` = device memory / 4, alignment 512.
    pub fn new_peer() -> Peer {
        let properties = MemoryDeviceProperties {
            max_page_size: DEVICE_MEMORY as u64 / 4,
            alignment: ALIGN,
        };
        MemoryManagement::from_configuration(
            CountingStorage::default(),
            &properties,
            MemoryConfiguration::SubSlices,
            Arc::new(ServerLogger::default()),
            MemoryManagementOptions::new("Main GPU Memory"),
        )
    }

    /// Replays `trace` on `mm`; `handles` has one entry per slot. A free drops the handle.
    pub fn replay(mm: &mut Peer, trace: &Trace, handles: &mut [Option<ManagedMemoryHandle>]) {
        for &op in &trace.ops {
            match op {
                Op::Alloc { size, slot } => {
                    let h = mm
                        .reserve(size as u64)
                        .unwrap_or_else(|e| panic!("{}: reserve({size}): {e}", trace.name));
                    handles[slot as usize] = Some(h);
                }
                Op::Free { slot } => drop(handles[slot as usize].take()),
            }
        }
    }

    /// The memory management of the previous replay and its handles.
    pub type Kept = (Peer, Vec<Option<ManagedMemoryHandle>>);

    /// Wall time of one replay from an empty memory management (setup and teardown untimed;
    /// the previous one is dropped after the new one is built, as for ours).
    pub fn time(trace: &Trace, keep: &mut Option<Kept>) -> std::time::Duration {
        let mut mm = new_peer();
        drop(keep.take());
        let mut handles = vec![None; trace.slots];
        let start = std::time::Instant::now();
        replay(&mut mm, trace, &mut handles);
        let elapsed = start.elapsed();
        *keep = Some(std::hint::black_box((mm, handles)));
        elapsed
    }

    /// Peak reserved bytes of one replay, as `memory_usage().bytes_reserved` reports it
    /// (checked against the storage's own count).
    pub fn peak_reserved(trace: &Trace) -> u64 {
        let mut mm = new_peer();
        let mut handles = vec![None; trace.slots];
        replay(&mut mm, trace, &mut handles);
        // Without an explicit cleanup pages are never returned: the final figure is the peak.
        let reported = mm.memory_usage().bytes_reserved;
        let counted = mm.storage().peak;
        assert_eq!(
            reported, counted,
            "{}: memory_usage vs storage count",
            trace.name
        );
        reported
    }
}

// ------------------------------------------------------------------------------------------
// Benchmarks
// ------------------------------------------------------------------------------------------

/// Total time and iterations of the criterion samples of one benchmark.
#[derive(Default, Clone, Copy)]
struct Tally {
    time: Duration,
    iters: u64,
}

impl Tally {
    fn add(&mut self, time: Duration, iters: u64) {
        self.time += time;
        self.iters += iters;
    }

    fn ns_per_iter(&self) -> Option<f64> {
        (self.iters > 0).then(|| self.time.as_nanos() as f64 / self.iters as f64)
    }
}

/// The tallies of every benchmark that ran, for the tables printed after criterion's output.
struct Results {
    /// Per warm-pair size: ours, then the peer.
    warm: Vec<(Tally, Tally)>,
    /// Per trace: ours, then the peer.
    replay: Vec<(Tally, Tally)>,
}

/// Times `iters` calls of `pair` (criterion's `iter_custom`), adding them to `tally`.
fn time_pairs(iters: u64, tally: &mut Tally, mut pair: impl FnMut()) -> Duration {
    let start = Instant::now();
    for _ in 0..iters {
        pair();
    }
    let time = start.elapsed();
    tally.add(time, iters);
    time
}

fn bench_warm_pair(c: &mut Criterion, results: &mut Results) {
    let mut group = c.benchmark_group("warm_pair");
    for ((label, size), (tally, _)) in WARM_SIZES.into_iter().zip(&mut results.warm) {
        group.bench_function(BenchmarkId::from_parameter(label), |b| {
            let mut alloc = new_allocator();
            let a = alloc
                .malloc(size, StreamId::DEFAULT)
                .expect("warm-up malloc");
            alloc.free(a.ptr).expect("warm-up free");
            b.iter_custom(|iters| {
                time_pairs(iters, tally, || {
                    let a = alloc
                        .malloc(black_box(size), StreamId::DEFAULT)
                        .expect("warm malloc");
                    alloc.free(black_box(a.ptr)).expect("warm free");
                })
            });
        });
    }
    group.finish();

    #[cfg(feature = "bench-peer-cubecl")]
    {
        let mut group = c.benchmark_group("warm_pair_peer");
        for ((label, size), (_, tally)) in WARM_SIZES.into_iter().zip(&mut results.warm) {
            group.bench_function(BenchmarkId::from_parameter(label), |b| {
                let mut mm = peer::new_peer();
                drop(mm.reserve(size as u64).expect("warm-up reserve"));
                b.iter_custom(|iters| {
                    time_pairs(iters, tally, || {
                        let handle = mm.reserve(black_box(size as u64)).expect("reserve");
                        drop(black_box(handle));
                    })
                });
            });
        }
        group.finish();
    }
}

fn bench_replay(c: &mut Criterion, traces: &[Trace], results: &mut Results) {
    let mut group = c.benchmark_group("replay");
    for (trace, (tally, _)) in traces.iter().zip(&mut results.replay) {
        group.throughput(Throughput::Elements(trace.ops.len() as u64));
        group.bench_function(BenchmarkId::from_parameter(trace.name), |b| {
            b.iter_custom(|iters| {
                let mut keep = None;
                let time: Duration = (0..iters).map(|_| time_ours(trace, &mut keep)).sum();
                tally.add(time, iters);
                time
            });
        });
    }
    group.finish();

    #[cfg(feature = "bench-peer-cubecl")]
    {
        let mut group = c.benchmark_group("replay_peer");
        for (trace, (_, tally)) in traces.iter().zip(&mut results.replay) {
            group.throughput(Throughput::Elements(trace.ops.len() as u64));
            group.bench_function(BenchmarkId::from_parameter(trace.name), |b| {
                b.iter_custom(|iters| {
                    let mut keep = None;
                    let time: Duration = (0..iters).map(|_| peer::time(trace, &mut keep)).sum();
                    tally.add(time, iters);
                    time
                });
            });
        }
        group.finish();
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / (1u64 << 20) as f64)
}

fn opt(value: Option<f64>, unit: &str) -> String {
    value.map_or("-".into(), |v| format!("{v:.1}{unit}"))
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "NOT met" }
}

/// The side-by-side tables and the targets, for the benchmarks that ran (a criterion filter
/// may skip some).
fn print_tables(traces: &[Trace], results: &Results, measuring: bool) {
    let ran = |t: &(Tally, Tally)| t.0.iters > 0 || t.1.iters > 0;
    if !results.warm.iter().chain(&results.replay).any(ran) {
        return;
    }
    println!();
    if !measuring {
        println!("(test mode: one run of each, not a measurement; run `cargo bench` for figures)");
    }
    let peer_built = cfg!(feature = "bench-peer-cubecl");
    let mut warm_worst: Option<f64> = None;
    if results.warm.iter().any(ran) {
        println!("warm alloc+free pair, ns (mean of every timed iteration, warm-up included)");
        println!("{:<8} {:>9} {:>9} {:>7}", "size", "ours", "peer", "ratio");
        for ((label, _), (ours, peer)) in WARM_SIZES.iter().zip(&results.warm) {
            let (ours, peer) = (ours.ns_per_iter(), peer.ns_per_iter());
            if let Some(o) = ours {
                warm_worst = Some(warm_worst.map_or(o, |w| w.max(o)));
            }
            let ratio = ours.zip(peer).map(|(o, p)| p / o);
            println!(
                "{label:<8} {:>9} {:>9} {:>7}",
                opt(ours, ""),
                opt(peer, ""),
                opt(ratio, "x")
            );
        }
    }

    let mut largest_rate = None;
    let mut worst_ratio: Option<f64> = None;
    if results.replay.iter().any(ran) {
        println!();
        println!(
            "alloc/free replay from empty, {} GiB device (ns/pair = 2 x ns/event; MiB = 2^20 B)",
            DEVICE_MEMORY >> 30
        );
        println!(
            "{:<29} {:>6} {:>8} {:>8} {:>6} {:>10} {:>10} {:>9} {:>9} {:>9}",
            "trace",
            "events",
            "ours ns",
            "peer ns",
            "ratio",
            "ours Mev/s",
            "peer Mev/s",
            "ours peak",
            "peer peak",
            "live peak"
        );
        for (trace, (ours, peer)) in traces.iter().zip(&results.replay) {
            let events = trace.ops.len() as f64;
            let ours_ns = ours.ns_per_iter();
            let peer_ns = peer.ns_per_iter();
            let ratio = ours_ns.zip(peer_ns).map(|(o, p)| p / o);
            if let Some(r) = ratio {
                worst_ratio = Some(worst_ratio.map_or(r, |w| w.min(r)));
            }
            let rate = |ns: Option<f64>| ns.map(|ns| events / ns * 1e3);
            if trace.name == TRACES[TRACES.len() - 1] {
                largest_rate = rate(ours_ns);
            }
            #[cfg(feature = "bench-peer-cubecl")]
            let peer_peak = mib(peer::peak_reserved(trace));
            #[cfg(not(feature = "bench-peer-cubecl"))]
            let peer_peak = "-".to_string();
            println!(
                "{:<29} {:>6} {:>8} {:>8} {:>6} {:>10} {:>10} {:>9} {:>9} {:>9}",
                trace.name,
                trace.ops.len(),
                opt(ours_ns.map(|ns| 2.0 * ns / events), ""),
                opt(peer_ns.map(|ns| 2.0 * ns / events), ""),
                opt(ratio, "x"),
                opt(rate(ours_ns), ""),
                opt(rate(peer_ns), ""),
                mib(peak_reserved_ours(trace)),
                peer_peak,
                mib(trace.live_lower_bound),
            );
        }
        println!("(Mev/s: million events per second; peaks in MiB; live peak: the lower bound,");
        println!(" the peak of the live requests each rounded up to 512 B)");
        for trace in traces.iter().filter(|t| t.skipped_frees > 0) {
            println!(
                "({}: {} allocs, {} frees; {} frees of blocks from before the history skipped)",
                trace.name,
                trace.allocs(),
                trace.frees(),
                trace.skipped_frees
            );
        }
    }

    if !measuring {
        return;
    }
    println!();
    if let Some(w) = warm_worst {
        println!(
            "target: warm pair well under 100 ns: slowest size {w:.1} ns, {}",
            verdict(w < 100.0)
        );
    }
    if let Some(r) = largest_rate {
        println!(
            "target: > 5 M events/s on {}: {r:.2} M, {}",
            TRACES[TRACES.len() - 1],
            verdict(r > 5.0)
        );
    }
    match worst_ratio {
        Some(r) => println!(
            "target: >= 5x faster per pair than the peer on every trace: worst {r:.1}x, {}",
            verdict(r >= 5.0)
        ),
        None if !peer_built => println!("(peer: run with `--features bench-peer-cubecl`)"),
        None => {}
    }
}

fn main() {
    // Criterion's own rule: without `--bench` (as under `cargo test`), or with `--test`, every
    // benchmark runs once.
    let args: Vec<String> = std::env::args().collect();
    let measuring = args.iter().any(|a| a == "--bench") && !args.iter().any(|a| a == "--test");
    let mut c = Criterion::default().configure_from_args();
    let traces = load_traces().unwrap_or_else(|why| {
        eprintln!("alloc bench: replay benchmarks skipped: {why}");
        Vec::new()
    });
    let mut results = Results {
        warm: vec![Default::default(); WARM_SIZES.len()],
        replay: vec![Default::default(); traces.len()],
    };
    bench_warm_pair(&mut c, &mut results);
    if !traces.is_empty() {
        bench_replay(&mut c, &traces, &mut results);
    }
    c.final_summary();
    print_tables(&traces, &results, measuring);
}
