//! The simulated driver: replays a parsed operator log through the runtime core, with costs
//! from `TIME` and sizes from `MEMORY`, following simrd's log semantics (`parse_file` and
//! `Graph.get_closure`):
//! - `CONSTANT`: a pinned constant; `COPY`: one more reference; `RELEASE`: one fewer;
//! - `CALL`: one call, aliases sharing their argument's storage with size 0;
//! - `MUTATE`: copy-on-write, a new call writing a fresh copy of each mutated storage; the name
//!   moves to the new version and the old one is released;
//! - at the end every tensor still referenced is rematerialized if needed and pinned (simrd's
//!   `OutputCondition.REMATERIALIZE`), which can itself run out of memory or thrash.

use crate::backend::{Backend, NullBackend};
use crate::device_budget::Strategy;
use crate::error::Error;
use crate::graph::TensorId;
use crate::heuristic::Heuristic;
use crate::log::{Event, Log};
use crate::profile::Profile;
use crate::runtime::{Config, OpSpec, OutputSpec, ReleasePolicy, Runtime};

/// How a simulated run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    /// The whole log ran under the budget.
    Ok,
    /// Nothing evictable was left for an allocation (simrd's `MemoryError`).
    Oom,
    /// Rematerialization compute passed the limit (simrd's "thrashed").
    Thrash,
}

impl Status {
    /// `OK`, `OOM` or `THRASH`.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "OK",
            Status::Oom => "OOM",
            Status::Thrash => "THRASH",
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A log the runtime refused for a reason other than memory (a reference-count underflow, a
/// backend failure), with the line of the event.
#[derive(Debug, thiserror::Error)]
#[error("line {line}: {source}")]
pub struct SimError {
    /// 1-based line of the event (0 for the final pins).
    pub line: usize,
    /// The runtime's error.
    #[source]
    pub source: Error,
}

/// The result of one simulated run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunResult {
    /// How it ended.
    pub status: Status,
    /// Simulated time at the end, ns (1 + compute including rematerialization; simrd's
    /// `clock`).
    pub clock: u64,
    /// The counters.
    pub profile: Profile,
    /// Line of the event that stopped a failed run (0: the final pins).
    pub stopped_at: Option<usize>,
}

impl RunResult {
    /// simrd's overhead: `clock / baseline_compute` (for OK runs; `None` otherwise).
    pub fn overhead(&self, baseline_compute_ns: u64) -> Option<f64> {
        (self.status == Status::Ok && baseline_compute_ns > 0)
            .then(|| self.clock as f64 / baseline_compute_ns as f64)
    }
}

/// The unbudgeted run's figures (simrd's baseline: `RuntimeV1` with no budget, banishing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Baseline {
    /// Peak memory in bytes (the no-eviction peak budgets are ratios of).
    pub peak_bytes: u64,
    /// Compute of all calls, ns: the sum of `TIME` over `CALL` and `MUTATE`.
    pub compute_ns: u64,
}

/// Replays `log` through `rt`. Memory and thrashing stops are errors here
/// ([`Error::OutOfMemory`], [`Error::Thrashing`]); see [`run`] for statuses.
///
/// # Errors
/// The first runtime error with its line.
pub fn replay<B: Backend>(log: &Log, rt: &mut Runtime<B>) -> Result<(), SimError> {
    const UNBOUND: TensorId = TensorId(u32::MAX);
    let mut bind = vec![UNBOUND; log.names.len()];
    let mut args: Vec<TensorId> = Vec::new();
    let mut outs: Vec<OutputSpec> = Vec::new();
    let mut idx: Vec<usize> = Vec::new();
    let ahead = if rt.config().strategy == Strategy::WindowMoveAhead {
        look_ahead(log)
    } else {
        Vec::new()
    };
    for (i, located) in log.events.iter().enumerate() {
        if let Some(&a) = ahead.get(i) {
            rt.set_ahead(a);
        }
        let line = located.line;
        let at = |source: Error| SimError { line, source };
        match &located.event {
            Event::Annotate(_) => {}
            Event::Constant { name, bytes } => {
                bind[*name as usize] = rt.constant(*bytes).map_err(at)?;
            }
            Event::Copy { dst, src } => {
                let t = bind[*src as usize];
                rt.get(t).map_err(at)?;
                bind[*dst as usize] = t;
            }
            Event::CopyFrom { dst, src } => {
                let old = bind[*dst as usize];
                let t = bind[*src as usize];
                bind[*dst as usize] = t;
                rt.release(old).map_err(at)?;
                rt.get(t).map_err(at)?;
            }
            Event::Release { name } => {
                rt.release(bind[*name as usize]).map_err(at)?;
            }
            Event::Call {
                args: a,
                results,
                time_ns,
                ..
            } => {
                args.clear();
                args.extend(a.iter().map(|&n| bind[n as usize]));
                outs.clear();
                outs.extend(results.iter().map(|r| match r.alias {
                    Some(i) => OutputSpec::alias_of(i as usize),
                    None => OutputSpec::fresh(r.bytes),
                }));
                let o = rt
                    .compute(OpSpec {
                        cost: *time_ns,
                        args: &args,
                        outputs: &outs,
                    })
                    .map_err(at)?;
                for (k, r) in results.iter().enumerate() {
                    bind[r.name as usize] = o.get(k);
                }
            }
            Event::Mutate {
                args: a,
                mutated,
                time_ns,
                ..
            } => {
                args.clear();
                args.extend(a.iter().map(|&n| bind[n as usize]));
                idx.clear();
                idx.extend(mutated.iter().map(|&m| m as usize));
                let o = rt.mutate(*time_ns, &args, &idx).map_err(at)?;
                for (k, &m) in mutated.iter().enumerate() {
                    bind[a[m as usize] as usize] = o.get(k);
                }
            }
        }
    }
    // simrd pins every output still referenced, in name order, rematerializing as needed.
    for &t in &bind {
        if t != UNBOUND
            && rt
                .ext_refs(t)
                .map_err(|source| SimError { line: 0, source })?
                > 0
        {
            rt.pin(t).map_err(|source| SimError { line: 0, source })?;
        }
    }
    Ok(())
}

/// Per event, the bytes of the next large-pool request (the first fresh call output, or a
/// constant, over 1 MiB, rounded to 512 bytes; a constant is allocated on the device like a
/// call's output) of the events after it, or 0 when a release, copy-over or mutation comes
/// first ([`Strategy::WindowMoveAhead`]'s look-ahead).
fn look_ahead(log: &Log) -> Vec<u64> {
    let mut out = vec![0u64; log.events.len()];
    let mut next = 0u64;
    for (i, located) in log.events.iter().enumerate().rev() {
        out[i] = next;
        match &located.event {
            Event::Call { results, .. } => {
                if let Some(r) = results
                    .iter()
                    .find(|r| r.alias.is_none() && r.bytes > LARGE_REQUEST)
                {
                    // Saturating: a log's MEMORY may be near u64::MAX.
                    next = r.bytes.checked_next_multiple_of(512).unwrap_or(u64::MAX);
                }
            }
            Event::Constant { bytes, .. } => {
                if *bytes > LARGE_REQUEST {
                    next = bytes.checked_next_multiple_of(512).unwrap_or(u64::MAX);
                }
            }
            Event::Release { .. } | Event::CopyFrom { .. } | Event::Mutate { .. } => next = 0,
            Event::Annotate(_) | Event::Copy { .. } => {}
        }
    }
    out
}

/// Requests above this many bytes go to the caching allocator's large pool (`kSmallSize`).
const LARGE_REQUEST: u64 = 1 << 20;

/// Options of a simulated run.
#[derive(Clone, Debug)]
pub struct SimOptions {
    /// Budget in bytes (`None`: unlimited).
    pub budget: Option<u64>,
    /// The heuristic.
    pub heuristic: Heuristic,
    /// The prototype's sqrt(n) sampling (off in simrd).
    pub sampling: bool,
    /// The prototype's small-tensor filter (off in simrd).
    pub ignore_small_tensors: bool,
    /// What the last release of a storage does (eager eviction in simrd's runs).
    pub release: ReleasePolicy,
    /// Thrashing limit on rematerialization compute, ns.
    pub remat_limit_ns: Option<u64>,
    /// Seed of random choices.
    pub seed: u64,
    /// How to make room on a miss when the backend has a device-memory budget (default
    /// [`Strategy::WindowMoveAll`]).
    pub strategy: Strategy,
    /// In-place updates keep the address under a device budget ([`Config::in_place`]).
    pub in_place: bool,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            budget: None,
            heuristic: Heuristic::DtrEq,
            sampling: false,
            ignore_small_tensors: false,
            release: ReleasePolicy::Eager,
            remat_limit_ns: None,
            seed: 0x5eed,
            strategy: Strategy::default(),
            in_place: false,
        }
    }
}

impl SimOptions {
    /// The runtime configuration these options give (aliased mutation is not refused: the
    /// logs mutate views).
    pub fn config(&self) -> Config {
        Config {
            budget: self.budget,
            heuristic: self.heuristic,
            sampling: self.sampling,
            ignore_small_tensors: self.ignore_small_tensors,
            release: self.release,
            remat_limit_ns: self.remat_limit_ns,
            refuse_aliased_mutation: false,
            seed: self.seed,
            strategy: self.strategy,
            in_place: self.in_place,
        }
    }
}

/// Runs `log` under `options` over `backend`; out of memory and thrashing are statuses.
/// Returns the result and the backend (for its reports).
///
/// # Errors
/// [`SimError`] for anything but memory and thrashing.
pub fn run<B: Backend>(
    log: &Log,
    options: &SimOptions,
    backend: B,
) -> Result<(RunResult, B), SimError> {
    let mut rt = Runtime::new(backend, options.config());
    let (status, stopped_at) = match replay(log, &mut rt) {
        Ok(()) => (Status::Ok, None),
        Err(SimError {
            line,
            source: Error::OutOfMemory { .. },
        }) => (Status::Oom, Some(line)),
        Err(SimError {
            line,
            source: Error::Thrashing { .. },
        }) => (Status::Thrash, Some(line)),
        Err(e) => return Err(e),
    };
    let result = RunResult {
        status,
        clock: rt.clock(),
        profile: *rt.profile(),
        stopped_at,
    };
    Ok((result, rt.into_backend()))
}

/// The unbudgeted run (simrd's baseline: no budget, banishing, so constants are freed too when
/// their last name dies).
///
/// # Errors
/// [`SimError`] when the log is inconsistent (a release of a tensor with no reference left),
/// or when its sizes pass u64::MAX bytes ([`Error::OutOfMemory`]: without a budget nothing
/// else runs out of memory).
pub fn baseline(log: &Log) -> Result<Baseline, SimError> {
    let options = SimOptions {
        heuristic: Heuristic::DtrLocal,
        release: ReleasePolicy::Banish,
        ..SimOptions::default()
    };
    let mut rt = Runtime::new(NullBackend, options.config());
    replay(log, &mut rt)?;
    let profile = rt.profile();
    Ok(Baseline {
        peak_bytes: profile.peak_bytes,
        compute_ns: profile.base_compute_ns,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn look_ahead_is_the_next_large_request_before_a_release() {
        let mut w = crate::LogWriter::new(Vec::new());
        w.constant("c", 1024).unwrap();
        w.call("f", &["c"], &[("a", 3 << 20, None)], 1).unwrap();
        w.call("g", &["c"], &[("b", 1 << 20, None)], 1).unwrap();
        w.call(
            "h",
            &["c"],
            &[("d", 1024, None), ("e", (5 << 20) + 1, None)],
            1,
        )
        .unwrap();
        w.release("a").unwrap();
        w.constant("big", (4 << 20) + 1).unwrap();
        w.constant("small", 1 << 20).unwrap();
        w.call("k", &["c"], &[("x", 2 << 20, None)], 1).unwrap();
        let lg = crate::log::parse(&String::from_utf8(w.into_inner().unwrap()).unwrap()).unwrap();
        // Events: c, f, g, h, release, big, small, k. After f: g's 1 MiB is small, h's first
        // large output is e (rounded to 512 bytes); h sees nothing before the release; after
        // the release the 4 MiB constant is the next request (a constant of 1 MiB is small),
        // then k's output; k is the last call.
        assert_eq!(
            look_ahead(&lg),
            [
                3 << 20,
                (5 << 20) + 512,
                (5 << 20) + 512,
                0,
                (4 << 20) + 512,
                2 << 20,
                2 << 20,
                0
            ]
        );
    }

    #[test]
    fn outputs_past_u64_max_bytes_are_out_of_memory_not_a_panic() {
        // One call whose two outputs pass u64::MAX bytes on top of a constant: every run, with
        // and without a budget, stops there with out of memory.
        let mut w = crate::LogWriter::new(Vec::new());
        w.annotate("START").unwrap();
        w.constant("c", 512).unwrap();
        w.call(
            "f",
            &["c"],
            &[("a", u64::MAX - 600, None), ("b", 4096, None)],
            1,
        )
        .unwrap();
        let lg = crate::log::parse(&String::from_utf8(w.into_inner().unwrap()).unwrap()).unwrap();
        let err = baseline(&lg).unwrap_err();
        assert!(
            matches!(
                err.source,
                Error::OutOfMemory {
                    used: 512,
                    requested: u64::MAX,
                    ..
                }
            ),
            "{err}"
        );
        for budget in [None, Some(1 << 30)] {
            let options = SimOptions {
                budget,
                ..SimOptions::default()
            };
            match run(&lg, &options, crate::NullBackend) {
                Ok((r, _)) => assert_eq!(r.status, Status::Oom, "budget {budget:?}"),
                Err(e) => assert!(
                    matches!(e.source, Error::OutOfMemory { .. }),
                    "budget {budget:?}: {e}"
                ),
            }
        }
    }

    #[test]
    fn a_request_near_u64_max_does_not_overflow_the_look_ahead() {
        let mut w = crate::LogWriter::new(Vec::new());
        w.annotate("START").unwrap();
        w.constant("c", 0).unwrap();
        w.call("g", &["c"], &[("b", u64::MAX - 1, None)], 1)
            .unwrap();
        let lg = crate::log::parse(&String::from_utf8(w.into_inner().unwrap()).unwrap()).unwrap();
        assert_eq!(look_ahead(&lg), [u64::MAX, u64::MAX, 0]);
        // Under window-move-ahead on a 64 MiB device: out of memory at g (or an error), no
        // panic.
        let options = SimOptions {
            strategy: Strategy::WindowMoveAhead,
            ..SimOptions::default()
        };
        let backend = crate::AllocatorBackend::on_device(
            c10_cuda::config::AllocatorConfig::default(),
            64 << 20,
        )
        .unwrap();
        match run(&lg, &options, backend) {
            Ok((r, _)) => assert_eq!((r.status, r.stopped_at), (Status::Oom, Some(4))),
            Err(e) => assert_eq!(e.line, 4, "{e}"),
        }
    }
}
