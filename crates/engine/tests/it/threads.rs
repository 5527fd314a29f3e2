//! Pushes and waits from several threads at once, on every engine (naive included): writers of
//! one variable pushed at the same moment never overlap, a wait from one thread waits for the
//! op another thread's push is running, shared variables lose no update, and an op body that
//! pushes to its own engine keeps working while other threads push. No timing assertions: the
//! checks are counters and orderings (a bounded wait only widens the window in which a broken
//! engine would show the overlap).

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Condvar, Mutex};
use std::time::Duration;

use engine::workloads::SplitMix64;
use engine::{EngineExt, EngineKind, PushOptions, Var};

/// How long an op body holds its variables to let a broken engine start a conflicting op
/// meanwhile. Correctness never depends on it.
const WINDOW: Duration = Duration::from_millis(20);

/// Counts op bodies running at once and remembers the most seen.
#[derive(Default)]
struct Overlap {
    running: AtomicUsize,
    most: AtomicUsize,
    /// Bodies started so far, with a condition variable to wait for the next one.
    started: Mutex<usize>,
    cv: Condvar,
}

impl Overlap {
    /// Enters a body; returns the number of bodies started before this one.
    fn enter(&self) -> usize {
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        let mut started = self.started.lock().unwrap();
        *started += 1;
        self.cv.notify_all();
        *started - 1
    }

    /// Holds the body until `n` bodies have started or [`WINDOW`] passes: a conflicting body
    /// that starts meanwhile is counted as overlapping.
    fn hold_until_started(&self, n: usize) {
        let started = self.started.lock().unwrap();
        let _ = self
            .cv
            .wait_timeout_while(started, WINDOW, |s| *s < n)
            .unwrap();
    }

    fn leave(&self) {
        self.running.fetch_sub(1, Ordering::SeqCst);
    }
}

#[test]
fn writers_of_one_variable_pushed_at_once_from_two_threads_never_overlap() {
    common::no_hang(|| {
        for (name, engine) in common::all_engines() {
            let v = engine.new_variable();
            let overlap = Arc::new(Overlap::default());
            // A plain read-modify-write: concurrent writers would lose increments.
            let cell = Arc::new(AtomicU64::new(0));
            let rounds = 4;
            for round in 0..rounds {
                let barrier = Arc::new(Barrier::new(2));
                std::thread::scope(|s| {
                    for _ in 0..2 {
                        let (engine, v, barrier) = (&engine, v.clone(), Arc::clone(&barrier));
                        let (overlap, cell) = (Arc::clone(&overlap), Arc::clone(&cell));
                        s.spawn(move || {
                            barrier.wait();
                            engine
                                .push_sync(
                                    move |_| {
                                        overlap.enter();
                                        let before = cell.load(Ordering::SeqCst);
                                        overlap.hold_until_started(2 * round + 2);
                                        cell.store(before + 1, Ordering::SeqCst);
                                        overlap.leave();
                                        Ok(())
                                    },
                                    &[],
                                    std::slice::from_ref(&v),
                                    PushOptions::default(),
                                )
                                .unwrap();
                            engine.wait_for_var(&v).unwrap();
                        });
                    }
                });
            }
            assert_eq!(
                overlap.most.load(Ordering::SeqCst),
                1,
                "{name}: two writers of one variable ran at once"
            );
            assert_eq!(cell.load(Ordering::SeqCst), 2 * rounds as u64, "{name}");
            assert_eq!(v.version(), 2 * rounds as u64, "{name}");
        }
    });
}

/// Which wait the main thread makes while another thread's op runs.
#[derive(Debug, Clone, Copy)]
enum Wait {
    /// `wait_for_var` on a variable the running op writes.
    ForVar,
    /// `wait_to_write` on a variable the running op reads.
    ToWrite,
    /// `wait_for_all`.
    ForAll,
}

#[test]
fn waits_wait_for_the_op_another_thread_is_running() {
    common::no_hang(|| {
        for wait in [Wait::ForVar, Wait::ToWrite, Wait::ForAll] {
            for (name, engine) in common::all_engines() {
                let v = engine.new_variable();
                let (started_tx, started_rx) = std::sync::mpsc::channel::<()>();
                // Never sent: the op's body holds until WINDOW passes.
                let (_release_tx, release_rx) = std::sync::mpsc::channel::<()>();
                let done = Arc::new(AtomicBool::new(false));
                let pusher = {
                    let (engine, v, done) = (Arc::clone(&engine), v.clone(), Arc::clone(&done));
                    std::thread::spawn(move || {
                        let (reads, writes) = match wait {
                            Wait::ToWrite => (vec![v], vec![]),
                            Wait::ForVar | Wait::ForAll => (vec![], vec![v]),
                        };
                        engine
                            .push_sync(
                                move |_| {
                                    started_tx.send(()).unwrap();
                                    let _ = release_rx.recv_timeout(WINDOW);
                                    done.store(true, Ordering::SeqCst);
                                    Ok(())
                                },
                                &reads,
                                &writes,
                                PushOptions::default(),
                            )
                            .unwrap();
                    })
                };
                started_rx.recv().unwrap();
                match wait {
                    Wait::ForVar => engine.wait_for_var(&v).unwrap(),
                    Wait::ToWrite => engine.wait_to_write(&v).unwrap(),
                    Wait::ForAll => engine.wait_for_all().unwrap(),
                }
                assert!(
                    done.load(Ordering::SeqCst),
                    "{name}: {wait:?} returned while another thread's op was running"
                );
                pusher.join().unwrap();
            }
        }
    });
}

#[test]
fn sixteen_threads_pushing_on_shared_variables_lose_no_update() {
    common::no_hang(|| {
        let (threads, per_thread, nvars) = (16, 10_000, 4);
        for (name, engine) in common::all_engines() {
            let vars: Vec<Var> = (0..nvars).map(|_| engine.new_variable()).collect();
            let cells: Arc<Vec<AtomicU64>> =
                Arc::new((0..nvars).map(|_| AtomicU64::new(0)).collect());
            let torn_reads = Arc::new(AtomicUsize::new(0));
            std::thread::scope(|s| {
                for t in 0..threads {
                    let (engine, vars) = (&engine, &vars);
                    let (cells, torn_reads) = (Arc::clone(&cells), Arc::clone(&torn_reads));
                    s.spawn(move || {
                        let mut rng = SplitMix64::new(t as u64 + 1);
                        for _ in 0..per_thread {
                            let w = (rng.next_u64() % nvars as u64) as usize;
                            let r = (rng.next_u64() % nvars as u64) as usize;
                            let (cells, torn_reads) = (Arc::clone(&cells), Arc::clone(&torn_reads));
                            engine
                                .push_sync(
                                    move |_| {
                                        // A plain read-modify-write of the written variable,
                                        // and a read variable that must not change meanwhile.
                                        let seen = cells[r].load(Ordering::SeqCst);
                                        let before = cells[w].load(Ordering::SeqCst);
                                        std::thread::yield_now();
                                        cells[w].store(before + 1, Ordering::SeqCst);
                                        if r != w && cells[r].load(Ordering::SeqCst) != seen {
                                            torn_reads.fetch_add(1, Ordering::SeqCst);
                                        }
                                        Ok(())
                                    },
                                    std::slice::from_ref(&vars[r]),
                                    std::slice::from_ref(&vars[w]),
                                    PushOptions::default(),
                                )
                                .unwrap();
                        }
                    });
                }
            });
            engine.wait_for_all().unwrap();
            let total: u64 = cells.iter().map(|c| c.load(Ordering::SeqCst)).sum();
            assert_eq!(total, (threads * per_thread) as u64, "{name}: lost updates");
            let versions: u64 = vars.iter().map(Var::version).sum();
            assert_eq!(versions, total, "{name}: versions");
            for (i, v) in vars.iter().enumerate() {
                assert_eq!(
                    v.version(),
                    cells[i].load(Ordering::SeqCst),
                    "{name}: var {i}"
                );
            }
            assert_eq!(
                torn_reads.load(Ordering::SeqCst),
                0,
                "{name}: a read variable changed under its reader"
            );
        }
    });
}

#[test]
fn ops_that_push_from_inside_keep_working_while_other_threads_push() {
    common::no_hang(|| {
        let (threads, per_thread) = (4, 200);
        for (name, engine) in common::all_engines() {
            let naive = engine.kind() == EngineKind::Naive;
            let (v, w) = (engine.new_variable(), engine.new_variable());
            let cells = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
            let not_inline = Arc::new(AtomicUsize::new(0));
            std::thread::scope(|s| {
                for _ in 0..threads {
                    let (engine, v, w) = (Arc::clone(&engine), v.clone(), w.clone());
                    let (cells, not_inline) = (Arc::clone(&cells), Arc::clone(&not_inline));
                    s.spawn(move || {
                        for _ in 0..per_thread {
                            let (e, vv, ww) = (Arc::clone(&engine), v.clone(), w.clone());
                            let (cells, not_inline) = (Arc::clone(&cells), Arc::clone(&not_inline));
                            engine
                                .push_sync(
                                    move |_| {
                                        let before = cells[0].load(Ordering::SeqCst);
                                        cells[0].store(before + 1, Ordering::SeqCst);
                                        // A nested op writing this op's variable and another.
                                        let c = Arc::clone(&cells);
                                        e.push_sync(
                                            move |_| {
                                                for cell in c.iter() {
                                                    let before = cell.load(Ordering::SeqCst);
                                                    cell.store(before + 1, Ordering::SeqCst);
                                                }
                                                Ok(())
                                            },
                                            &[],
                                            &[vv.clone(), ww],
                                            PushOptions::default(),
                                        )?;
                                        // The naive engine ran it inside the push (MXNet's
                                        // semantics), so its wait here returns at once.
                                        if naive {
                                            e.wait_for_var(&vv)?;
                                            if cells[0].load(Ordering::SeqCst) != before + 2 {
                                                not_inline.fetch_add(1, Ordering::SeqCst);
                                            }
                                        }
                                        Ok(())
                                    },
                                    &[],
                                    std::slice::from_ref(&v),
                                    PushOptions::default(),
                                )
                                .unwrap();
                        }
                    });
                }
            });
            engine.wait_for_all().unwrap();
            let ops = (threads * per_thread) as u64;
            assert_eq!(
                cells[0].load(Ordering::SeqCst),
                2 * ops,
                "{name}: lost updates"
            );
            assert_eq!(cells[1].load(Ordering::SeqCst), ops, "{name}: lost updates");
            assert_eq!(
                (v.version(), w.version()),
                (2 * ops, ops),
                "{name}: versions"
            );
            assert_eq!(
                not_inline.load(Ordering::SeqCst),
                0,
                "{name}: nested op not inline"
            );
        }
    });
}
