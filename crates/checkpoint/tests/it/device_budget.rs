//! DTR under a device-memory budget: the device's capacity is the budget, the caching
//! allocator's misses drive eviction.
//!
//! - hand-built: a full segment of ten 2 MiB tensors and a 5 MiB request, where the heuristic's
//!   one-at-a-time choice frees scattered blocks and the window frees three neighbours; an
//!   in-place update that keeps its address;
//! - the hard budget on every shared log: reserved bytes never pass the device's capacity, for
//!   every strategy at ratios 0.1 .. 1.0 on PyTorch's default allocator, and for `window` with
//!   expandable segments, Coop's partition and in-place updates (CI, debug build, about 40 s);
//!   on every log of the recorded corpus at two budgets; `window-deficit` and `window-move`
//!   (a fragmentation miss answered by one copy) on the hand-built segment; the moving
//!   strategies holding a window's free blocks so that its copy lands outside (nothing
//!   evictable: `window` runs out of memory there); `window-move-all` planning a small-pool
//!   miss for a whole 2 MiB small segment; `window-move-ahead` making one window for a
//!   request and the next one of the log;
//! - `#[ignore]`d, run by `cargo xtask soak` in release: the full grid (every strategy and
//!   layout at ratios 0.05 .. 1.0) and the figures for `window` on the default
//!   allocator: per log the smallest budget completing with overhead <= 1.5 within 0.05 of the
//!   allocator-blind ideal, and overheads at ratios >= 0.5 within 1.10x of the blind run.

use crate::support;

use c10_cuda::config::AllocatorConfig;
use checkpoint::sweep::{self, DeviceOptions, Sweep, SweepOptions};
use checkpoint::{
    AllocatorBackend, Config, Heuristic, OpSpec, OutputSpec, Runtime, Status, Strategy,
    budget_for_ratio, log, sim,
};

const MIB: u64 = 1 << 20;

/// A runtime with h_DTR^eq and `strategy` on a fresh simulated device of `capacity` bytes under
/// PyTorch's default allocator settings.
fn dtr_eq_on_device(strategy: Strategy, capacity: u64) -> Runtime<AllocatorBackend> {
    let backend = AllocatorBackend::on_device(AllocatorConfig::default(), capacity).unwrap();
    Runtime::new(
        backend,
        Config {
            heuristic: Heuristic::DtrEq,
            strategy,
            ..Config::default()
        },
    )
}

/// A runtime on a 22 MiB device (a 2 MiB small segment for the constant, a 20 MiB large
/// segment for ten 2 MiB tensors) with `strategy`, holding the ten tensors: `t1`, `t4`, `t7`
/// cost 1 ns, the others 10^6 ns.
fn full_device(strategy: Strategy) -> (Runtime<AllocatorBackend>, Vec<checkpoint::TensorId>) {
    let mut rt = dtr_eq_on_device(strategy, 22 * MIB);
    let c = rt.checkpoint(1024).unwrap();
    let ts = (0..10)
        .map(|i| {
            let cost = if i % 3 == 1 { 1 } else { 1_000_000 };
            rt.compute(OpSpec {
                cost,
                args: &[c],
                outputs: &[OutputSpec::fresh(2 * MIB)],
            })
            .unwrap()
            .get(0)
        })
        .collect();
    assert_eq!(rt.backend().allocator().reserved_bytes() as u64, 22 * MIB);
    (rt, ts)
}

/// The 5 MiB request made by an op reading the constant.
fn five_mib(rt: &mut Runtime<AllocatorBackend>) {
    let c = checkpoint::TensorId(0);
    rt.compute(OpSpec {
        cost: 10,
        args: &[c],
        outputs: &[OutputSpec::fresh(5 * MIB)],
    })
    .unwrap();
}

#[test]
fn the_heuristic_alone_frees_scattered_blocks_and_the_window_three_neighbours() {
    // Callback: h_DTR^eq evicts by c / (m * staleness), all sizes equal: first the three
    // 1 ns tensors (t1, t4, t7: three separate 2 MiB holes, no 5 MiB block), then the stalest
    // expensive ones, t0 (t0+t1 = 4 MiB) and t2 (t0..t2 = 6 MiB): five evictions, one miss each.
    let (mut rt, ts) = full_device(Strategy::Callback);
    five_mib(&mut rt);
    let evicted: Vec<usize> = (0..10)
        .filter(|&i| !rt.is_defined(ts[i]).unwrap())
        .collect();
    assert_eq!(evicted, [0, 1, 2, 4, 7]);
    assert_eq!((rt.profile().evictions, rt.profile().misses), (5, 5));
    // Window: every run of three neighbours covers 5 MiB and holds one cheap tensor and two
    // expensive ones; the run whose expensive ones are stalest, t0..t2, costs least. Releasing
    // the segment (all ten) costs more. One miss, three evictions, exactly the run.
    let (mut rt, ts) = full_device(Strategy::Window);
    five_mib(&mut rt);
    let evicted: Vec<usize> = (0..10)
        .filter(|&i| !rt.is_defined(ts[i]).unwrap())
        .collect();
    assert_eq!(evicted, [0, 1, 2]);
    assert_eq!((rt.profile().evictions, rt.profile().misses), (3, 1));
    assert!(rt.profile().scanned_blocks >= 11);
    // Never more than the device.
    assert!(rt.backend().report().peak_reserved_bytes <= 22 * MIB);
}

#[test]
fn deficit_first_evicts_as_the_blind_run_then_makes_a_window() {
    // The constant, ten 2 MiB tensors and the 5 MiB request pass the 22 MiB device by
    // 3 MiB + 1 KiB: first the heuristic's two cheapest (t1, t4, as the blind run would), which
    // fit the bytes but leave two scattered 2 MiB holes; the retry misses on contiguity alone,
    // and the window then takes the run around the hole whose expensive neighbours are
    // stalest, t0 and t2. Two misses, four evictions (callback: five, window: three).
    let (mut rt, ts) = full_device(Strategy::WindowDeficit);
    five_mib(&mut rt);
    let evicted: Vec<usize> = (0..10)
        .filter(|&i| !rt.is_defined(ts[i]).unwrap())
        .collect();
    assert_eq!(evicted, [0, 1, 2, 4]);
    assert_eq!((rt.profile().evictions, rt.profile().misses), (4, 2));
    assert!(rt.backend().report().peak_reserved_bytes <= 22 * MIB);
}

#[test]
fn a_fragmentation_miss_moves_one_tensor_instead_of_evicting() {
    // t1, t4 and t7 are released (eager eviction frees their blocks): 6 MiB free in three
    // separate 2 MiB holes, and a 4 MiB request fits the bytes but no block. Moving a
    // neighbour of a hole elsewhere merges two blocks: the copy goes where best fit puts it,
    // the lowest 2 MiB hole (t1's), so the windows t0+t1 and t1+t2 do not work (their copy
    // would land inside them) and t3+t4 does: t3 moves to t1's address. No eviction, one copy
    // of 2 MiB charged on the clock (launch 1000 ns + 4 MiB read and written at 650 B/ns).
    let (mut rt, ts) = full_device(Strategy::WindowMove);
    for i in [1, 4, 7] {
        rt.release(ts[i]).unwrap();
    }
    let before = rt.clock();
    rt.compute(OpSpec {
        cost: 10,
        args: &[checkpoint::TensorId(0)],
        outputs: &[OutputSpec::fresh(4 * MIB)],
    })
    .unwrap();
    let p = *rt.profile();
    assert_eq!(
        (p.evictions, p.misses, p.moves, p.moved_bytes),
        (0, 1, 1, 2 * MIB)
    );
    assert_eq!(p.move_ns, 1000 + (4 * MIB).div_ceil(650));
    assert_eq!(rt.clock() - before, 10 + p.move_ns);
    let defined: Vec<usize> = (0..10).filter(|&i| rt.is_defined(ts[i]).unwrap()).collect();
    assert_eq!(defined, [0, 2, 3, 5, 6, 8, 9]);
    assert!(rt.backend().report().peak_reserved_bytes <= 22 * MIB);
    // The window strategy evicts for the same miss.
    let (mut rt, ts) = full_device(Strategy::Window);
    for i in [1, 4, 7] {
        rt.release(ts[i]).unwrap();
    }
    rt.compute(OpSpec {
        cost: 10,
        args: &[checkpoint::TensorId(0)],
        outputs: &[OutputSpec::fresh(4 * MIB)],
    })
    .unwrap();
    assert_eq!((rt.profile().evictions, rt.profile().moves), (1, 0));
}

/// Segment A (24 MiB) `[free 12][t 4][free 8]`, segment B (30 MiB) `[u 20][free 10]` and the
/// constant's 2 MiB small segment on a 56 MiB device with `strategy`; then an op reading `t`
/// and `u` (both locked: nothing is evictable) asks for 24 MiB. Returns the runtime and
/// whether the op completed.
fn held_window(strategy: Strategy) -> (Runtime<AllocatorBackend>, bool) {
    let mut rt = dtr_eq_on_device(strategy, 56 * MIB);
    let c = rt.checkpoint(1024).unwrap();
    let fresh = |rt: &mut Runtime<AllocatorBackend>, bytes: u64, args: &[checkpoint::TensorId]| {
        rt.compute(OpSpec {
            cost: 1_000_000,
            args,
            outputs: &[OutputSpec::fresh(bytes)],
        })
        .unwrap()
        .get(0)
    };
    let x = fresh(&mut rt, 24 * MIB, &[c]);
    let z = fresh(&mut rt, 30 * MIB, &[c]);
    rt.release(x).unwrap();
    rt.release(z).unwrap();
    let y = fresh(&mut rt, 12 * MIB, &[c]);
    let t = fresh(&mut rt, 4 * MIB, &[c]);
    let u = fresh(&mut rt, 20 * MIB, &[c]);
    rt.release(y).unwrap();
    assert_eq!(rt.backend().allocator().reserved_bytes() as u64, 56 * MIB);
    let done = rt
        .compute(OpSpec {
            cost: 10,
            args: &[t, u],
            outputs: &[OutputSpec::fresh(24 * MIB)],
        })
        .is_ok();
    (rt, done)
}

#[test]
fn a_window_whose_copy_would_land_inside_it_holds_its_free_blocks() {
    // The only 24 MiB window is segment A, and its copy's best fit is A's own 8 MiB block:
    // without holds no move plan exists and nothing is evictable (`window` runs out of
    // memory). Holding A's 12 and 8 MiB blocks sends t to B's 10 MiB block; A merges.
    let (_, done) = held_window(Strategy::Window);
    assert!(!done, "window has nothing to evict");
    for strategy in [Strategy::WindowMove, Strategy::WindowMoveAll] {
        let (rt, done) = held_window(strategy);
        assert!(done, "{strategy}");
        let p = *rt.profile();
        assert_eq!(
            (p.evictions, p.misses, p.moves, p.moved_bytes),
            (0, 1, 1, 4 * MIB),
            "{strategy}"
        );
        let report = rt.backend().report();
        assert!(report.peak_reserved_bytes <= 56 * MIB);
        // Requests: the constant, x, z, y, t, u, the 24 MiB output and t's copy; the two
        // holds are not requests.
        assert_eq!(report.requests, 8, "{strategy}");
    }
}

/// Two 2 MiB small segments on a 4 MiB device with `strategy`: the constant and three
/// 512 KiB tensors in the first, four in the second (each costs 10^6 ns); then four ops ask
/// for 512 KiB each. Returns the misses, the evictions and which of the seven were evicted.
fn small_segments(strategy: Strategy) -> (u64, u64, Vec<usize>) {
    let mut rt = dtr_eq_on_device(strategy, 4 * MIB);
    let c = rt.checkpoint(1024).unwrap();
    let half = |rt: &mut Runtime<AllocatorBackend>, cost: u64| {
        rt.compute(OpSpec {
            cost,
            args: &[c],
            outputs: &[OutputSpec::fresh(MIB / 2)],
        })
        .unwrap()
        .get(0)
    };
    let ts: Vec<_> = (0..7).map(|_| half(&mut rt, 1_000_000)).collect();
    assert_eq!(rt.backend().allocator().reserved_bytes() as u64, 4 * MIB);
    for _ in 0..4 {
        half(&mut rt, 10);
    }
    assert!(rt.backend().report().peak_reserved_bytes <= 4 * MIB);
    let evicted = (0..7).filter(|&i| !rt.is_defined(ts[i]).unwrap()).collect();
    (rt.profile().misses, rt.profile().evictions, evicted)
}

#[test]
fn a_small_pool_miss_makes_room_for_a_whole_small_segment() {
    // The device is full of small segments and no free small block holds 512 KiB. `window`
    // plans for the request's 512 KiB: each of the four requests misses and evicts one
    // tensor, the stalest, t0..t3 (spread over both segments). `window-move-all` plans for
    // the 2 MiB segment the allocator would create (`alloc_size`): the first miss empties the
    // second segment (t3..t6, no copy can land outside it), and the next three requests are
    // served from it without a miss.
    assert_eq!(small_segments(Strategy::Window), (4, 4, vec![0, 1, 2, 3]));
    assert_eq!(
        small_segments(Strategy::WindowMoveAll),
        (1, 4, vec![3, 4, 5, 6])
    );
}

/// A log on a 22 MiB device: a 1 KiB constant (its 2 MiB small segment), ten 2 MiB tensors
/// `t0..t9` filling a 20 MiB segment (10^6 ns each), then two calls of 5 MiB each (`a`, `b`)
/// before any release; the ten are released at the end (not pinned). Returns the status, the
/// misses, the evictions and the reserved peak under `strategy`.
fn two_requests(strategy: Strategy) -> (Status, u64, u64, u64) {
    let mut w = checkpoint::LogWriter::new(Vec::new());
    w.constant("c", 1024).unwrap();
    let names: Vec<String> = (0..10).map(|i| format!("t{i}")).collect();
    for n in &names {
        w.call("f", &["c"], &[(n.as_str(), 2 * MIB, None)], 1_000_000)
            .unwrap();
    }
    w.call("g", &["c"], &[("a", 5 * MIB, None)], 10).unwrap();
    w.call("h", &["c"], &[("b", 5 * MIB, None)], 10).unwrap();
    for n in &names {
        w.release(n).unwrap();
    }
    let lg = log::parse(&String::from_utf8(w.into_inner().unwrap()).unwrap()).unwrap();
    let options = sim::SimOptions {
        strategy,
        ..sim::SimOptions::default()
    };
    let backend = AllocatorBackend::on_device(AllocatorConfig::default(), 22 * MIB).unwrap();
    let (r, b) = sim::run(&lg, &options, backend).unwrap();
    (
        r.status,
        r.profile.misses,
        r.profile.evictions,
        b.report().peak_reserved_bytes,
    )
}

#[test]
fn look_ahead_makes_one_window_for_the_next_request_too() {
    // `window-move-all` plans `a` alone: the three stalest tensors (t0..t2, 6 MiB; the 1 MiB
    // left is not split off), and `b` misses again and evicts t3..t5: two misses, six
    // evictions. `window-move-ahead` knows `b` follows `a` before any release and plans both
    // at once: t0..t4 (10 MiB) costs less than t0..t2 twice (b's own plan now), so `a` takes
    // 5 MiB of the window, `b` the other 5 without a miss: one miss, five evictions.
    assert_eq!(
        two_requests(Strategy::WindowMoveAll),
        (Status::Ok, 2, 6, 22 * MIB)
    );
    assert_eq!(
        two_requests(Strategy::WindowMoveAhead),
        (Status::Ok, 1, 5, 22 * MIB)
    );
}

#[test]
fn nothing_to_evict_is_out_of_memory() {
    // 3 MiB is a large-pool request: its 20 MiB segment does not fit on a 4 MiB device.
    let backend = AllocatorBackend::on_device(AllocatorConfig::default(), 4 * MIB).unwrap();
    let mut rt = Runtime::new(backend, Config::default());
    let e = rt.checkpoint(3 * MIB).unwrap_err();
    assert!(
        matches!(e, checkpoint::Error::OutOfMemory { requested, budget, .. } if requested == 3 * MIB && budget == 4 * MIB),
        "{e}"
    );
    // On 24 MiB it fits, but 30 MiB more cannot: the constant is pinned, nothing else exists.
    let backend = AllocatorBackend::on_device(AllocatorConfig::default(), 24 * MIB).unwrap();
    let mut rt = Runtime::new(backend, Config::default());
    let c = rt.checkpoint(3 * MIB).unwrap();
    let e = rt
        .compute(OpSpec {
            cost: 1,
            args: &[c],
            outputs: &[OutputSpec::fresh(30 * MIB)],
        })
        .unwrap_err();
    assert!(
        matches!(e, checkpoint::Error::OutOfMemory { requested, budget, .. } if requested == 30 * MIB && budget == 24 * MIB),
        "{e}"
    );
}

/// A device of 1 GiB that misses every request; a move plan for room (with new segments: the
/// last resort) copies one 1 MiB block, up to three times, and the retry still misses.
#[derive(Default)]
struct MissingDevice {
    /// Move plans asked for: without new segments, with them.
    plans: [u32; 2],
}

impl checkpoint::Backend for MissingDevice {
    fn allocate(&mut self, _: checkpoint::StorageId, _: u64) -> Result<(), checkpoint::BoxError> {
        Ok(())
    }

    fn free(&mut self, _: checkpoint::StorageId, _: u64) -> Result<(), checkpoint::BoxError> {
        Ok(())
    }

    fn run(&mut self, request: checkpoint::RunRequest<'_>) -> Result<u64, checkpoint::BoxError> {
        Ok(request.known_cost)
    }

    fn device_capacity(&self) -> Option<u64> {
        Some(1 << 30)
    }

    fn try_allocate(
        &mut self,
        _: checkpoint::AllocRequest,
    ) -> Result<checkpoint::AllocOutcome, checkpoint::BoxError> {
        Ok(checkpoint::AllocOutcome::Miss)
    }

    fn make_room_by_moving(
        &mut self,
        _: &dyn Fn(checkpoint::StorageId) -> bool,
        new_segments: bool,
    ) -> Result<Option<checkpoint::Moved>, checkpoint::BoxError> {
        self.plans[usize::from(new_segments)] += 1;
        Ok(
            (new_segments && self.plans[1] <= 3).then_some(checkpoint::Moved {
                blocks: 1,
                bytes: MIB,
                scanned: 1,
            }),
        )
    }
}

#[test]
fn the_last_resort_move_plan_runs_once_per_allocation() {
    // Nothing to evict and the bytes fit: the moving strategies try their last-resort plan
    // (copies may take new segments) once per allocation; its retry misses again, and the
    // allocation is out of memory instead of asking for another plan. Per allocation: two
    // misses, the ordinary move plan on each (two per allocation before an eviction), the
    // last resort after the first, one 1 MiB copy charged.
    for strategy in [Strategy::WindowMove, Strategy::WindowMoveAll] {
        let mut rt = Runtime::new(
            MissingDevice::default(),
            Config {
                heuristic: Heuristic::DtrEq,
                strategy,
                ..Config::default()
            },
        );
        for k in 1..=2u32 {
            let e = rt.checkpoint(MIB).unwrap_err();
            assert!(
                matches!(e, checkpoint::Error::OutOfMemory { requested, .. } if requested == MIB),
                "{strategy}: {e}"
            );
            assert_eq!(rt.backend().plans, [2 * k, k], "{strategy}");
            let p = *rt.profile();
            assert_eq!(
                (p.misses, p.moves, p.moved_bytes),
                (2 * u64::from(k), u64::from(k), u64::from(k) * MIB),
                "{strategy}"
            );
        }
    }
    // The strategies that do not move never ask.
    let mut rt = Runtime::new(
        MissingDevice::default(),
        Config {
            strategy: Strategy::Window,
            ..Config::default()
        },
    );
    assert!(rt.checkpoint(MIB).is_err());
    assert_eq!(rt.backend().plans, [0, 0]);
    assert_eq!(rt.profile().misses, 1);
}

/// A chain whose last tensor is updated in place once, then read.
fn mutate_log() -> log::Log {
    let mut w = checkpoint::LogWriter::new(Vec::new());
    w.annotate("START").unwrap();
    w.constant("x0", 1024).unwrap();
    w.call("f", &["x0"], &[("x1", 8 << 20, None)], 10).unwrap();
    w.call("g", &["x1"], &[("x2", 8 << 20, None)], 10).unwrap();
    w.release("x1").unwrap();
    w.mutate("relu_", &["x2"], &[0], 5).unwrap();
    w.call("h", &["x2"], &[("x3", 8 << 20, None)], 10).unwrap();
    log::parse(&String::from_utf8(w.into_inner().unwrap()).unwrap()).unwrap()
}

#[test]
fn in_place_updates_keep_the_address() {
    let lg = mutate_log();
    let base = sim::baseline(&lg).unwrap();
    let run = |in_place: bool| {
        let options = sim::SimOptions {
            strategy: Strategy::Window,
            in_place,
            ..sim::SimOptions::default()
        };
        let backend = AllocatorBackend::on_device(AllocatorConfig::default(), 64 * MIB).unwrap();
        let (r, b) = sim::run(&lg, &options, backend).unwrap();
        (r, b.report())
    };
    let (copy, copy_alloc) = run(false);
    let (kept, kept_alloc) = run(true);
    assert_eq!((copy.status, kept.status), (Status::Ok, Status::Ok));
    assert_eq!((copy.profile.in_place, kept.profile.in_place), (0, 1));
    // The copy is one more allocation (the constant, x1, x2, relu_'s copy, x3 against four)
    // and holds x2 and its copy at once: 1 KiB + 2 x 8 MiB; in place, 1 KiB + 8 MiB + x3's 8 MiB.
    assert_eq!((copy_alloc.requests, kept_alloc.requests), (5, 4));
    assert_eq!(copy.profile.peak_bytes, 1024 + 2 * (8 << 20));
    assert_eq!(kept.profile.peak_bytes, 1024 + 2 * (8 << 20));
    // Same compute: the update runs once either way.
    assert_eq!(copy.clock, kept.clock);
    assert_eq!(base.compute_ns, 35);
}

fn device_options(
    strategies: &[Strategy],
    conf: &str,
    partition: bool,
    in_place: bool,
) -> SweepOptions {
    SweepOptions {
        device: Some(DeviceOptions {
            strategies: strategies.to_vec(),
            alloc_conf: AllocatorConfig::parse(conf).unwrap(),
            partition,
            in_place,
        }),
        ..SweepOptions::default()
    }
}

/// Every run's reserved peak within its device's capacity (and the core's own count too).
fn assert_hard(name: &str, sw: &Sweep) {
    for r in &sw.runs {
        let a = r.allocator.expect("allocator figures");
        let s = r.strategy.expect("a strategy");
        assert!(
            a.peak_reserved_bytes <= r.budget_bytes,
            "{name} {s} at {}: reserved {} over the device's {}",
            r.ratio,
            a.peak_reserved_bytes,
            r.budget_bytes
        );
        assert!(
            r.result.profile.peak_bytes <= r.budget_bytes,
            "{name} {s} at {}",
            r.ratio
        );
        assert!(a.peak_allocated_bytes <= a.peak_reserved_bytes);
    }
}

fn hard_budget(strategies: &[Strategy], conf: &str, partition: bool, in_place: bool) {
    let Some(dir) = support::dtr_logs_dir() else {
        return;
    };
    for name in support::LOGS {
        let lg = log::parse_file(&support::log_path(&dir, name)).unwrap();
        let sw = sweep::sweep(&lg, &device_options(strategies, conf, partition, in_place)).unwrap();
        assert_eq!(sw.runs.len(), 10 * strategies.len());
        assert_hard(name, &sw);
        // At the no-eviction peak every log completes.
        for s in strategies {
            let at_one = sw
                .runs
                .iter()
                .find(|r| r.strategy == Some(*s) && r.ratio == 1.0)
                .unwrap();
            assert_eq!(at_one.status(), Status::Ok, "{name} {s} at 1.0");
        }
    }
}

#[test]
fn reserved_never_passes_the_device_on_every_shared_log_default_allocator() {
    hard_budget(&Strategy::ALL, "", false, false);
}

#[test]
fn reserved_never_passes_the_device_on_the_recorded_corpus() {
    // Every corpus log (committed, never skipped) with `window`, `window-deficit` or
    // `window-move-all` in turn, at two budgets each (CI time: debug build).
    for (k, (name, path)) in support::corpus_logs().iter().enumerate() {
        let lg = log::parse_file(path).unwrap();
        let strategy = [
            Strategy::Window,
            Strategy::WindowDeficit,
            Strategy::WindowMoveAll,
        ][k % 3];
        let options = SweepOptions {
            ratios: vec![0.4, 0.8],
            ..device_options(&[strategy], "", false, false)
        };
        let sw = sweep::sweep(&lg, &options).unwrap();
        assert_hard(name, &sw);
    }
}

#[test]
fn reserved_never_passes_the_device_with_expandable_segments() {
    hard_budget(
        &[Strategy::Window],
        "expandable_segments:True",
        false,
        false,
    );
}

#[test]
fn reserved_never_passes_the_device_with_partition_and_in_place() {
    hard_budget(&[Strategy::Window], "", true, true);
}

fn step_ratios() -> Vec<f64> {
    (1..=20).map(|k| k as f64 * 0.05).collect()
}

#[test]
#[ignore = "the full grid, release build: cargo xtask soak"]
fn soak_every_strategy_and_layout_at_005_steps() {
    let Some(dir) = support::dtr_logs_dir() else {
        return;
    };
    for name in support::LOGS {
        let lg = log::parse_file(&support::log_path(&dir, name)).unwrap();
        for (conf, partition, in_place) in [
            ("", false, false),
            ("expandable_segments:True", false, false),
            ("", true, false),
            ("", false, true),
            ("expandable_segments:True", true, true),
            ("max_split_size_mb:64", false, false),
        ] {
            let options = SweepOptions {
                ratios: step_ratios(),
                ..device_options(&Strategy::ALL, conf, partition, in_place)
            };
            let sw = sweep::sweep(&lg, &options).unwrap();
            assert_eq!(sw.runs.len(), 20 * Strategy::ALL.len());
            assert_hard(name, &sw);
        }
    }
}

#[test]
#[ignore = "the issue's figures, release build: cargo xtask soak"]
fn window_on_the_default_allocator_is_near_the_allocator_blind_ideal() {
    let Some(dir) = support::dtr_logs_dir() else {
        return;
    };
    // The targets: within 0.05 of the allocator-blind ideal of the table
    // (simrd's semantics). Our own blind sweep at 0.05 steps finds lower ideals on some logs
    // (LSTM 0.25, Transformer 0.25): the distance to those is printed, not asserted, since the
    // caching allocator's rules (torch 2.15's tie order, the default) move `window` on LSTM from
    // 0.25 under 2.7's rules to 0.35.
    let targets = [
        ("unet", 0.55),
        ("tv_densenet121", 0.35),
        ("lstm", 0.35),
        ("transformer", 0.35),
        ("resnet32", 0.25),
    ];
    for (name, target) in targets {
        let lg = log::parse_file(&support::log_path(&dir, name)).unwrap();
        let base = sim::baseline(&lg).unwrap();
        let blind = sweep::sweep(
            &lg,
            &SweepOptions {
                ratios: step_ratios(),
                ..SweepOptions::default()
            },
        )
        .unwrap();
        let options = SweepOptions {
            ratios: step_ratios(),
            ..device_options(&[Strategy::Window], "", false, false)
        };
        let sw = sweep::sweep(&lg, &options).unwrap();
        assert_hard(name, &sw);
        let (smallest, _) = sweep::smallest_ratio(&sw.runs, 1.5).expect("some budget completes");
        let (ideal, _) = sweep::smallest_ratio(&blind.runs, 1.5).unwrap();
        eprintln!("{name}: window {smallest:.2}, our blind sweep {ideal:.2}, target {target:.2}");
        assert!(
            smallest <= target + 1e-9,
            "{name}: smallest {smallest}, blind {ideal}, target {target}"
        );
        for (r, b) in sw.runs.iter().zip(&blind.runs) {
            assert_eq!(r.budget_bytes, budget_for_ratio(base.peak_bytes, r.ratio));
            if r.ratio >= 0.5 - 1e-9 {
                if let Some(bo) = b.overhead {
                    let o = r.overhead.unwrap_or_else(|| {
                        panic!(
                            "{name} at {}: {} where the blind run completes",
                            r.ratio,
                            r.status()
                        )
                    });
                    assert!(
                        o <= 1.10 * bo,
                        "{name} at {}: {o} against blind {bo}",
                        r.ratio
                    );
                }
            }
        }
    }
}
