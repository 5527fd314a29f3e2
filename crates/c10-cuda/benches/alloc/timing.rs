//! How every allocator in the side-by-side table is timed: torch-oracle's `--bench` protocol.
//!
//! One untimed replay first, then `runs` times: reset (untimed), one timed replay. Each replay
//! is timed by wall clock and by the thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`, which leaves
//! out the time the thread waited for a core on a loaded machine); the figures are the best and
//! the median replay divided by the trace's allocations: ns per alloc+free pair.

use std::time::Instant;

/// Something that replays one trace again and again.
pub trait Runner {
    /// One replay of the trace (the timed part).
    fn replay(&mut self);
    /// Gets ready for the next replay (untimed).
    fn reset(&mut self);
}

/// ns per pair of a run of replays: best and median, wall clock and thread CPU time.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PerPair {
    pub wall_best: f64,
    pub wall_median: f64,
    pub cpu_best: f64,
    pub cpu_median: f64,
}

/// The calling thread's CPU time in ns (`clock_gettime(CLOCK_THREAD_CPUTIME_ID)`, through libc
/// rather than rustix's vDSO lookup, which valgrind does not support).
fn thread_cpu_ns() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid, writable timespec for the call's duration; the clock id is a
    // constant every Linux kernel supports.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
    t.tv_sec as f64 * 1e9 + t.tv_nsec as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Times `runs` replays of `runner` (after one untimed), as torch-oracle's `run_bench` does;
/// `allocs` is the trace's number of allocations.
pub fn measure(runner: &mut impl Runner, runs: usize, allocs: usize) -> PerPair {
    let (mut wall, mut cpu) = (Vec::with_capacity(runs), Vec::with_capacity(runs));
    runner.replay();
    for _ in 0..runs.max(1) {
        runner.reset();
        let c0 = thread_cpu_ns();
        let t0 = Instant::now();
        runner.replay();
        let t = t0.elapsed();
        let c = thread_cpu_ns() - c0;
        wall.push(t.as_nanos() as f64);
        cpu.push(c);
    }
    let per = allocs.max(1) as f64;
    let best = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min) / per;
    PerPair {
        wall_best: best(&wall),
        cpu_best: best(&cpu),
        wall_median: median(wall) / per,
        cpu_median: median(cpu) / per,
    }
}
