//! A campaign: many generated scripts, each run by the oracle and by us on every core, counted
//! as agreeing, deliberately different (per fix) or diverging; diverging ones are shrunk.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use c10_cuda::rules::TorchVersion;

use crate::check::{Outcome, classify};
use crate::compare::Divergence;
use crate::generate::{self, Shape};
use crate::oracle::{Oracle, OracleError};
use crate::script::Script;
use crate::shrink::shrink;
use crate::trace::Line;

/// What to run.
#[derive(Clone, Debug)]
pub struct Campaign {
    /// The version whose oracle and rules are compared.
    pub version: TorchVersion,
    /// Number of scripts.
    pub cases: u64,
    /// The first case's index (to split a campaign, or resume one).
    pub first_case: u64,
    /// Seed of the generator.
    pub seed: u64,
    /// Worker threads (each runs one oracle process at a time).
    pub jobs: usize,
    /// Ops per script.
    pub shape: Shape,
    /// How many diverging scripts to shrink and print (the rest are only counted).
    pub shrink_at_most: usize,
    /// Candidates tried per shrink.
    pub shrink_budget: usize,
    /// Progress lines on stderr (every ten seconds).
    pub progress: bool,
}

/// A diverging script, as found and shrunk.
#[derive(Clone, Debug)]
pub struct Found {
    /// The case index.
    pub case: u64,
    /// The first divergence of the generated script.
    pub divergence: Divergence,
    /// The smallest script that still diverges.
    pub shrunk: Script,
    /// Its divergence.
    pub shrunk_divergence: Divergence,
}

/// The counts of a campaign.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Scripts run.
    pub cases: u64,
    /// Ops in them.
    pub ops: u64,
    /// Scripts on which every compared decision agreed.
    pub agreeing: u64,
    /// Scripts that differ only by our deliberate fixes, per fix name.
    pub deliberate: BTreeMap<&'static str, u64>,
    /// Scripts that differ only by our deliberate fixes (each counted once).
    pub deliberate_cases: u64,
    /// Scripts that diverge.
    pub diverging: u64,
    /// Scripts on which PyTorch went on with memory it freed (from that op on nothing is
    /// compared; before it everything agreed), per defect of [`crate::check::PYTORCH_DEFECTS`].
    pub pytorch_defects: BTreeMap<&'static str, u64>,
    /// The first case of each defect.
    pub first_defect_case: BTreeMap<&'static str, u64>,
    /// Scripts the oracle died on (a signal) and then ran on a rerun (see [`CRASH_RERUNS`]);
    /// they are counted by the outcome of the run that finished.
    pub crashed_then_ran: u64,
    /// The first of them.
    pub first_crash_case: Option<u64>,
    /// Scripts the oracle could not run, with the first message.
    pub oracle_failures: u64,
    /// The first oracle failure's message.
    pub first_oracle_failure: Option<String>,
    /// The diverging scripts shrunk and kept.
    pub found: Vec<Found>,
    /// Wall time.
    pub elapsed: Duration,
}

impl Report {
    /// The summary line: cases, ops, agreeing, deliberate differences (per fix), divergences,
    /// time and rate.
    pub fn summary(&self, version: TorchVersion) -> String {
        let per_fix: Vec<String> = self
            .deliberate
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        let defects: Vec<String> = self
            .pytorch_defects
            .iter()
            .map(|(k, v)| format!("{k} {v}, first case {}", self.first_defect_case[k]))
            .collect();
        format!(
            "oracle torch {}: {} cases, {} ops, {} agreeing, {} deliberate differences{}, {} \
             PyTorch defects{}, {} divergences, {} oracle failures{}; {:.0} s ({:.1} cases/s)",
            version.checked_release(),
            self.cases,
            self.ops,
            self.agreeing,
            self.deliberate_cases,
            if per_fix.is_empty() {
                String::new()
            } else {
                format!(" ({})", per_fix.join(", "))
            },
            self.pytorch_defects.values().sum::<u64>(),
            if defects.is_empty() {
                String::new()
            } else {
                format!(" ({})", defects.join("; "))
            },
            self.diverging,
            self.oracle_failures,
            match self.first_crash_case {
                Some(case) => format!(
                    " ({} scripts crashed the oracle and ran on a rerun, first case {case})",
                    self.crashed_then_ran
                ),
                None => String::new(),
            },
            secs,
            self.cases as f64 / secs
        )
    }
}

/// Checks one script against a running oracle: `Ok(None)` when the oracle and we both refuse
/// it (a configuration neither accepts). A script no PyTorch program can produce
/// ([`crate::api::check`]) is not given to the oracle: it is a divergence of the generator
/// (its `what` says so), never produced by [`generate::script`].
///
/// # Errors
/// [`OracleError`] when the oracle fails on a script our side runs, or cannot run at all.
pub fn check_script(oracle: &Oracle, script: &Script) -> Result<Option<Outcome>, OracleError> {
    check_script_counting(oracle, script).0
}

/// How many more times a script is given to the oracle after it died of a signal. PyTorch
/// 2.7.1 reads freed memory in `release_available_cached_blocks` (`release_block(*cur,
/// context); totalReleased += (*cur)->size;`, with `max_split_size_mb` set, when a failed
/// device allocation releases several oversize blocks), which crashes only for some address
/// layouts (ASLR): a rerun shows the decisions it makes when it does not crash.
pub const CRASH_RERUNS: u32 = 8;

/// The oracle's output, run again (up to [`CRASH_RERUNS`] times) while it dies of a signal;
/// and how many times it died.
fn run_oracle(oracle: &Oracle, script: &Script) -> (Result<Vec<Line>, OracleError>, u32) {
    let mut crashes = 0;
    loop {
        match oracle.run(script) {
            Err(OracleError::Failed { status, .. })
                if status.contains("signal") && crashes < CRASH_RERUNS =>
            {
                crashes += 1;
            }
            other => return (other, crashes),
        }
    }
}

/// [`check_script`], and how many times the oracle died of a signal before a run of it
/// finished (see [`CRASH_RERUNS`]; 0 when no run finished: then the script is judged as one
/// the oracle refused).
///
/// # Errors
/// As [`check_script`].
pub fn check_script_counting(
    oracle: &Oracle,
    script: &Script,
) -> (Result<Option<Outcome>, OracleError>, u32) {
    if let Err(e) = crate::api::check(script) {
        let d = Divergence {
            step: 0,
            what: "not a script a PyTorch program can produce".into(),
            theirs: "not run".into(),
            ours: e.to_string(),
        };
        return (Ok(Some(Outcome::Diverge(d))), 0);
    }
    let (theirs, crashes) = run_oracle(oracle, script);
    let crashes = if theirs.is_ok() { crashes } else { 0 };
    (compare_with(oracle, script, theirs), crashes)
}

/// The outcome of `script` given the oracle's run of it.
fn compare_with(
    oracle: &Oracle,
    script: &Script,
    theirs: Result<Vec<Line>, OracleError>,
) -> Result<Option<Outcome>, OracleError> {
    let theirs = match theirs {
        Ok(t) => t,
        Err(OracleError::Failed { status, stderr }) => {
            // A configuration the allocator rejects: ours must reject it too.
            return match crate::driver::run_noting(script, c10_cuda::Rules::new(oracle.version)) {
                Err(_) => Ok(None),
                // PyTorch went on with a pool it had erased: it read freed memory.
                Ok((_, notes)) if notes.erased_pool_with_live_blocks.is_some() => {
                    Ok(Some(Outcome::PytorchDefect(ERASED_POOL)))
                }
                Ok(_) => Ok(Some(Outcome::Diverge(Divergence {
                    step: 0,
                    what: "the oracle refused the script".into(),
                    theirs: format!("exited with {status}: {stderr}"),
                    ours: "ran".into(),
                }))),
            };
        }
        Err(e) => return Err(e),
    };
    match classify(script, &theirs, oracle.version) {
        Ok(Outcome::Diverge(d)) => {
            // A divergence from the op on which PyTorch erased a pool whose blocks live.
            let erased = crate::driver::run_noting(script, c10_cuda::Rules::new(oracle.version))
                .ok()
                .and_then(|(_, notes)| notes.erased_pool_with_live_blocks);
            Ok(Some(match erased {
                Some(at) if d.step + 1 >= at => Outcome::PytorchDefect(ERASED_POOL),
                _ => Outcome::Diverge(d),
            }))
        }
        Ok(o) => Ok(Some(o)),
        Err(e) => Ok(Some(Outcome::Diverge(Divergence {
            step: 0,
            what: "our driver refused the script".into(),
            theirs: "ran".into(),
            ours: e.to_string(),
        }))),
    }
}

/// The name of [`crate::driver::Notes::erased_pool_with_live_blocks`] in
/// [`crate::check::PYTORCH_DEFECTS`].
const ERASED_POOL: &str = "erased-pool-with-live-blocks";

/// Shrinks a diverging script: the smallest one whose first divergence is of the same kind.
pub fn shrink_divergence(
    oracle: &Oracle,
    script: &Script,
    divergence: &Divergence,
    budget: usize,
) -> (Script, Divergence) {
    let kind = divergence.what.split(':').next().unwrap_or("").to_owned();
    let diverges = |s: &Script| match check_script(oracle, s) {
        Ok(Some(Outcome::Diverge(d))) => Some(d),
        _ => None,
    };
    let (small, _) = shrink(script, budget, |s| {
        diverges(s).is_some_and(|d| d.what.split(':').next() == Some(kind.as_str()))
    });
    let d = diverges(&small).unwrap_or_else(|| divergence.clone());
    (small, d)
}

/// Runs a campaign.
///
/// # Errors
/// [`OracleError::Missing`] when the oracle is not set up.
pub fn run(c: &Campaign) -> Result<Report, OracleError> {
    let oracle = Oracle::find(c.version)?;
    let start = Instant::now();
    let next = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let report = Mutex::new(Report::default());
    let diverging: Mutex<Vec<(u64, Script, Divergence)>> = Mutex::new(Vec::new());
    let done = AtomicU64::new(0);
    std::thread::scope(|scope| {
        for _ in 0..c.jobs.max(1) {
            scope.spawn(|| {
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    if k >= c.cases || stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let case = c.first_case + k;
                    let script = generate::script(c.seed, case, c.version, c.shape);
                    let (outcome, crashes) = check_script_counting(&oracle, &script);
                    let mut r = report.lock().expect("report lock");
                    if crashes > 0 && outcome.as_ref().is_ok_and(Option::is_some) {
                        r.crashed_then_ran += 1;
                        r.first_crash_case.get_or_insert(case);
                    }
                    r.cases += 1;
                    r.ops += script.ops.len() as u64;
                    match outcome {
                        Ok(Some(Outcome::Agree)) | Ok(None) => r.agreeing += 1,
                        Ok(Some(Outcome::Deliberate(names))) => {
                            r.deliberate_cases += 1;
                            for n in names {
                                *r.deliberate.entry(n).or_default() += 1;
                            }
                        }
                        Ok(Some(Outcome::PytorchDefect(name))) => {
                            *r.pytorch_defects.entry(name).or_default() += 1;
                            r.first_defect_case.entry(name).or_insert(case);
                        }
                        Ok(Some(Outcome::Diverge(d))) => {
                            r.diverging += 1;
                            let mut list = diverging.lock().expect("divergence lock");
                            if list.len() < c.shrink_at_most {
                                list.push((case, script, d));
                            }
                        }
                        Err(OracleError::Missing { .. }) => stop.store(true, Ordering::Relaxed),
                        Err(e) => {
                            r.oracle_failures += 1;
                            if r.first_oracle_failure.is_none() {
                                r.first_oracle_failure = Some(format!("case {case}: {e}"));
                            }
                        }
                    }
                    drop(r);
                    done.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        if c.progress {
            scope.spawn(|| {
                let mut last = Instant::now();
                while done.load(Ordering::Relaxed) < c.cases && !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(200));
                    if last.elapsed() >= Duration::from_secs(10) {
                        last = Instant::now();
                        let r = report.lock().expect("report lock");
                        let secs = start.elapsed().as_secs_f64();
                        eprintln!(
                            "  {}/{} cases, {} agreeing, {} deliberate, {} diverging ({:.1} cases/s)",
                            r.cases,
                            c.cases,
                            r.agreeing,
                            r.deliberate_cases,
                            r.diverging,
                            r.cases as f64 / secs
                        );
                        let _ = std::io::stderr().flush();
                    }
                }
            });
        }
    });
    let mut r = report.into_inner().expect("report lock");
    for (case, script, d) in diverging.into_inner().expect("divergence lock") {
        let (shrunk, shrunk_divergence) = shrink_divergence(&oracle, &script, &d, c.shrink_budget);
        r.found.push(Found {
            case,
            divergence: d,
            shrunk,
            shrunk_divergence,
        });
    }
    r.elapsed = start.elapsed();
    Ok(r)
}
