//! `engine-bench`: runs one standard workload (W1..W4) on an engine and prints one JSON line
//! per timed pass.
//!
//! ```text
//! cargo run --release -p engine --example engine-bench -- W3 3 [--threads 2]
//!     [--engine naive|pooled|per-device] [--verify]
//! ```
//!
//! Without `--engine`, the engine comes from `TENSORMEM_ENGINE_TYPE` (default per-device).
//! One untimed warm-up pass of a tenth of the tasks runs first. Each task's body is one atomic
//! increment, so only scheduling is measured. `--verify` makes every task check that it runs
//! in push order against its variables (a writer never concurrent with another user). Exits
//! non-zero if the counter differs from the number of tasks or a check failed.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use engine::workloads::Workload;
use engine::{Engine, EngineConfig, EngineExt, EngineKind, PushOptions, Var};

/// Per-variable progress, for `--verify`.
#[derive(Default)]
struct VarCheck {
    writes_done: AtomicU64,
    reads_done: AtomicU64,
    readers: AtomicU64,
    writer: AtomicBool,
}

/// What a task expects to see on one of its variables when it starts.
#[derive(Clone, Copy)]
struct Expect {
    var: u32,
    write: bool,
    writes_before: u64,
    reads_before: u64,
}

struct Verifier {
    vars: Vec<VarCheck>,
    failures: AtomicU64,
}

impl Verifier {
    fn start(&self, e: &Expect) {
        let v = &self.vars[e.var as usize];
        let ok = if e.write {
            !v.writer.swap(true, Ordering::SeqCst)
                && v.readers.load(Ordering::SeqCst) == 0
                && v.writes_done.load(Ordering::SeqCst) == e.writes_before
                && v.reads_done.load(Ordering::SeqCst) == e.reads_before
        } else {
            v.readers.fetch_add(1, Ordering::SeqCst);
            !v.writer.load(Ordering::SeqCst)
                && v.writes_done.load(Ordering::SeqCst) == e.writes_before
        };
        if !ok {
            self.failures.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn end(&self, e: &Expect) {
        let v = &self.vars[e.var as usize];
        if e.write {
            v.writes_done.fetch_add(1, Ordering::SeqCst);
            v.writer.store(false, Ordering::SeqCst);
        } else {
            v.reads_done.fetch_add(1, Ordering::SeqCst);
            v.readers.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

fn expectations(w: &Workload) -> Vec<Vec<Expect>> {
    let mut writes = vec![0u64; w.nvars];
    let mut reads = vec![0u64; w.nvars];
    w.tasks()
        .map(|t| {
            let mut out = Vec::with_capacity(t.reads.len() + 1);
            if let Some(v) = t.write {
                out.push(Expect {
                    var: v,
                    write: true,
                    writes_before: writes[v as usize],
                    reads_before: reads[v as usize],
                });
            }
            for &r in t.reads {
                out.push(Expect {
                    var: r,
                    write: false,
                    writes_before: writes[r as usize],
                    reads_before: reads[r as usize],
                });
            }
            if let Some(v) = t.write {
                writes[v as usize] += 1;
            }
            for &r in t.reads {
                reads[r as usize] += 1;
            }
            out
        })
        .collect()
}

/// User + system CPU seconds of this process so far.
fn cpu_seconds() -> f64 {
    // SAFETY: `getrusage` only writes the zeroed struct we pass, which lives for the call.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

struct Pass {
    push_s: f64,
    wait_s: f64,
    cpu_s: f64,
    ran: u64,
}

fn run_pass(
    engine: &dyn Engine,
    w: &Workload,
    verify: Option<&'static Verifier>,
) -> Result<Pass, String> {
    let vars: Vec<Var> = (0..w.nvars).map(|_| engine.new_variable()).collect();
    // Variable lists are built before the clock starts: only pushing is timed.
    let lists: Vec<(Vec<Var>, Vec<Var>)> = w
        .tasks()
        .map(|t| {
            let reads = t.reads.iter().map(|&r| vars[r as usize].clone()).collect();
            let writes = t.write.iter().map(|&v| vars[v as usize].clone()).collect();
            (reads, writes)
        })
        .collect();
    let expects: Option<Vec<Vec<Expect>>> = verify.map(|_| expectations(w));
    let counter: &'static AtomicU64 = Box::leak(Box::new(AtomicU64::new(0)));
    let opts = PushOptions::default().name("bench");
    let cpu0 = cpu_seconds();
    let t0 = Instant::now();
    match (verify, expects) {
        (Some(verifier), Some(expects)) => {
            for ((reads, writes), exp) in lists.iter().zip(expects) {
                engine
                    .push_sync(
                        move |_| {
                            exp.iter().for_each(|e| verifier.start(e));
                            counter.fetch_add(1, Ordering::Relaxed);
                            exp.iter().for_each(|e| verifier.end(e));
                            Ok(())
                        },
                        reads,
                        writes,
                        opts,
                    )
                    .map_err(|e| e.to_string())?;
            }
        }
        _ => {
            for (reads, writes) in &lists {
                engine
                    .push_sync(
                        move |_| {
                            counter.fetch_add(1, Ordering::Relaxed);
                            Ok(())
                        },
                        reads,
                        writes,
                        opts,
                    )
                    .map_err(|e| e.to_string())?;
            }
        }
    }
    let t1 = Instant::now();
    engine.wait_for_all().map_err(|e| e.to_string())?;
    let t2 = Instant::now();
    let cpu1 = cpu_seconds();
    Ok(Pass {
        push_s: (t1 - t0).as_secs_f64(),
        wait_s: (t2 - t1).as_secs_f64(),
        cpu_s: cpu1 - cpu0,
        ran: counter.load(Ordering::SeqCst),
    })
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: engine-bench W1|W2|W3|W4 REPS [--threads N] [--engine naive|pooled|per-device] [--verify]";
    let (Some(name), Some(reps)) = (
        args.first(),
        args.get(1).and_then(|r| r.parse::<usize>().ok()),
    ) else {
        eprintln!("{usage}");
        return ExitCode::from(2);
    };
    let Some(workload) = Workload::by_name(name) else {
        eprintln!("engine-bench: unknown workload {name:?}\n{usage}");
        return ExitCode::from(2);
    };
    let mut config = match EngineConfig::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("engine-bench: {e}");
            return ExitCode::from(2);
        }
    };
    let mut verify = false;
    let mut rest = args[2..].iter();
    while let Some(a) = rest.next() {
        match a.as_str() {
            "--threads" => match rest.next().and_then(|n| n.parse().ok()) {
                Some(n) => config.cpu_workers = n,
                None => {
                    eprintln!("{usage}");
                    return ExitCode::from(2);
                }
            },
            "--engine" => match rest.next().map(|k| k.parse::<EngineKind>()) {
                Some(Ok(k)) => config.kind = k,
                _ => {
                    eprintln!("{usage}");
                    return ExitCode::from(2);
                }
            },
            "--verify" => verify = true,
            _ => {
                eprintln!("{usage}");
                return ExitCode::from(2);
            }
        }
    }
    let engine = match config.build() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("engine-bench: {e}");
            return ExitCode::from(2);
        }
    };
    let checksum = workload.checksum();
    let make_verifier = |w: &Workload| -> Option<&'static Verifier> {
        verify.then(|| {
            &*Box::leak(Box::new(Verifier {
                vars: (0..w.nvars).map(|_| VarCheck::default()).collect(),
                failures: AtomicU64::new(0),
            }))
        })
    };
    let warm = workload.prefix(workload.len() / 10);
    let mut failed = false;
    match run_pass(&*engine, &warm, make_verifier(&warm)) {
        Ok(p) if p.ran == warm.len() as u64 => {}
        Ok(p) => {
            eprintln!(
                "engine-bench: warm-up ran {} of {} tasks",
                p.ran,
                warm.len()
            );
            failed = true;
        }
        Err(e) => {
            eprintln!("engine-bench: warm-up failed: {e}");
            return ExitCode::FAILURE;
        }
    }
    for rep in 0..reps {
        let verifier = make_verifier(&workload);
        let pass = match run_pass(&*engine, &workload, verifier) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("engine-bench: pass {rep} failed: {e}");
                return ExitCode::FAILURE;
            }
        };
        let n = workload.len() as f64;
        let total = pass.push_s + pass.wait_s;
        println!(
            "{{\"workload\":\"{}\",\"engine\":\"{}\",\"threads\":{},\"rep\":{},\"ntasks\":{},\"checksum\":\"{:016x}\",\"push_s\":{:.6},\"wait_s\":{:.6},\"total_s\":{:.6},\"us_per_task\":{:.4},\"push_us_per_task\":{:.4},\"tasks_per_s\":{:.0},\"cpu_s\":{:.4}}}",
            workload.name,
            engine.kind(),
            config.cpu_workers,
            rep,
            workload.len(),
            checksum,
            pass.push_s,
            pass.wait_s,
            total,
            total / n * 1e6,
            pass.push_s / n * 1e6,
            n / total,
            pass.cpu_s
        );
        if pass.ran != workload.len() as u64 {
            eprintln!(
                "engine-bench: counter {} != {} tasks",
                pass.ran,
                workload.len()
            );
            failed = true;
        }
        if let Some(v) = verifier {
            let f = v.failures.load(Ordering::SeqCst);
            if f > 0 {
                eprintln!("engine-bench: {f} push-order violations");
                failed = true;
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
