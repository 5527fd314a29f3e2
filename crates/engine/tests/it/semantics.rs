//! MXNet's tests 2–6 on every engine: readers run in parallel, writers in push order, a read
//! never overtakes a queued write, `wait_for_var` cases, versions; plus priorities, routing of
//! `FnProperty` kinds to per-device workers and their streams, operators, `Async` inline.

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use engine::{
    Completion, Context, Engine, EngineConfig, EngineExt, EngineKind, FnProperty, PushOptions,
    RunContext, Stream, StreamKind, StreamProvider, Var,
};

fn ok() -> engine::OpResult {
    Ok(())
}

/// Waits until `counter` reaches `n`, giving up after 10 s; returns whether it did.
fn wait_until(counter: &AtomicUsize, n: usize) -> bool {
    let start = std::time::Instant::now();
    while counter.load(Ordering::SeqCst) < n {
        if start.elapsed() > Duration::from_secs(10) {
            return false;
        }
        std::thread::yield_now();
    }
    true
}

#[test]
fn readers_of_one_variable_run_in_parallel() {
    common::no_hang(|| {
        for workers in [2, 4] {
            for (name, engine) in common::threaded(workers) {
                let v = engine.new_variable();
                let arrived = Arc::new(AtomicUsize::new(0));
                let all_met = Arc::new(AtomicUsize::new(0));
                for _ in 0..workers {
                    let (arrived, all_met) = (Arc::clone(&arrived), Arc::clone(&all_met));
                    engine
                        .push_sync(
                            move |_| {
                                // Each reader waits for all the others: only parallel readers
                                // can all get past this point.
                                arrived.fetch_add(1, Ordering::SeqCst);
                                if wait_until(&arrived, workers) {
                                    all_met.fetch_add(1, Ordering::SeqCst);
                                }
                                Ok(())
                            },
                            std::slice::from_ref(&v),
                            &[],
                            PushOptions::default(),
                        )
                        .unwrap();
                }
                engine.wait_for_all().unwrap();
                assert_eq!(
                    all_met.load(Ordering::SeqCst),
                    workers,
                    "{name}: readers serialised"
                );
            }
        }
    });
}

#[test]
fn writers_of_one_variable_run_in_push_order() {
    common::no_hang(|| {
        for (name, engine) in common::all_engines() {
            let v = engine.new_variable();
            let log = Arc::new(Mutex::new(Vec::new()));
            for i in 0..300 {
                let log = Arc::clone(&log);
                engine
                    .push_sync(
                        move |_| {
                            log.lock().unwrap().push(i);
                            Ok(())
                        },
                        &[],
                        std::slice::from_ref(&v),
                        PushOptions::default(),
                    )
                    .unwrap();
            }
            engine.wait_for_all().unwrap();
            assert_eq!(*log.lock().unwrap(), (0..300).collect::<Vec<_>>(), "{name}");
            assert_eq!(v.version(), 300, "{name}");
        }
    });
}

#[test]
fn a_read_pushed_after_a_queued_write_never_overtakes_it() {
    common::no_hang(|| {
        for (name, engine) in common::threaded(4) {
            let v = engine.new_variable();
            let gate = Arc::new(AtomicBool::new(false));
            let written = Arc::new(AtomicBool::new(false));
            let overtaken = Arc::new(AtomicUsize::new(0));
            // A long-running reader holds the variable, so the write queues behind it.
            let g = Arc::clone(&gate);
            engine
                .push_sync(
                    move |_| {
                        while !g.load(Ordering::SeqCst) {
                            std::thread::yield_now();
                        }
                        Ok(())
                    },
                    std::slice::from_ref(&v),
                    &[],
                    PushOptions::default(),
                )
                .unwrap();
            let w = Arc::clone(&written);
            engine
                .push_sync(
                    move |_| {
                        w.store(true, Ordering::SeqCst);
                        Ok(())
                    },
                    &[],
                    std::slice::from_ref(&v),
                    PushOptions::default(),
                )
                .unwrap();
            for _ in 0..8 {
                let (w, o) = (Arc::clone(&written), Arc::clone(&overtaken));
                engine
                    .push_sync(
                        move |_| {
                            if !w.load(Ordering::SeqCst) {
                                o.fetch_add(1, Ordering::SeqCst);
                            }
                            Ok(())
                        },
                        std::slice::from_ref(&v),
                        &[],
                        PushOptions::default(),
                    )
                    .unwrap();
            }
            // Idle workers are free to run the later reads now: they must not.
            std::thread::sleep(Duration::from_millis(20));
            assert!(
                !written.load(Ordering::SeqCst),
                "{name}: write ran before the read"
            );
            gate.store(true, Ordering::SeqCst);
            engine.wait_for_all().unwrap();
            assert_eq!(overtaken.load(Ordering::SeqCst), 0, "{name}");
            assert_eq!(v.version(), 1, "{name}");
        }
    });
}

#[test]
fn wait_for_var_returns_at_once_without_pending_writes_and_blocks_on_one() {
    common::no_hang(|| {
        for (name, engine) in common::threaded(2) {
            let v = engine.new_variable();
            engine.wait_for_var(&v).unwrap(); // fresh variable
            // Only a (blocked) reader pending: returns at once.
            let gate = Arc::new(AtomicBool::new(false));
            let g = Arc::clone(&gate);
            engine
                .push_sync(
                    move |_| {
                        while !g.load(Ordering::SeqCst) {
                            std::thread::yield_now();
                        }
                        Ok(())
                    },
                    std::slice::from_ref(&v),
                    &[],
                    PushOptions::default(),
                )
                .unwrap();
            engine.wait_for_var(&v).unwrap();
            assert_eq!(v.version(), 0, "{name}");
            // A pending write (queued behind the reader): wait_for_var returns only after it.
            let done = Arc::new(AtomicBool::new(false));
            let d = Arc::clone(&done);
            engine
                .push_sync(
                    move |_| {
                        d.store(true, Ordering::SeqCst);
                        Ok(())
                    },
                    &[],
                    std::slice::from_ref(&v),
                    PushOptions::default(),
                )
                .unwrap();
            let release = {
                let gate = Arc::clone(&gate);
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(20));
                    gate.store(true, Ordering::SeqCst);
                })
            };
            engine.wait_for_var(&v).unwrap();
            assert!(
                done.load(Ordering::SeqCst),
                "{name}: returned before the write"
            );
            assert_eq!(v.version(), 1, "{name}");
            release.join().unwrap();
            // wait_to_write also waits for readers.
            let gate2 = Arc::new(AtomicBool::new(false));
            let read_done = Arc::new(AtomicBool::new(false));
            let (g2, rd) = (Arc::clone(&gate2), Arc::clone(&read_done));
            engine
                .push_sync(
                    move |_| {
                        while !g2.load(Ordering::SeqCst) {
                            std::thread::yield_now();
                        }
                        rd.store(true, Ordering::SeqCst);
                        Ok(())
                    },
                    std::slice::from_ref(&v),
                    &[],
                    PushOptions::default(),
                )
                .unwrap();
            let opener = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                gate2.store(true, Ordering::SeqCst);
            });
            engine.wait_to_write(&v).unwrap();
            assert!(
                read_done.load(Ordering::SeqCst),
                "{name}: wait_to_write ignored a reader"
            );
            opener.join().unwrap();
            engine.wait_for_all().unwrap();
        }
    });
}

#[test]
fn reads_leave_the_version_and_writes_bump_it() {
    common::no_hang(|| {
        for (name, engine) in common::all_engines() {
            let v = engine.new_variable();
            for _ in 0..10 {
                engine
                    .push_sync(
                        |_| ok(),
                        std::slice::from_ref(&v),
                        &[],
                        PushOptions::default(),
                    )
                    .unwrap();
            }
            engine.wait_for_all().unwrap();
            assert_eq!(v.version(), 0, "{name}: reads");
            for _ in 0..10 {
                engine
                    .push_sync(
                        |_| ok(),
                        &[],
                        std::slice::from_ref(&v),
                        PushOptions::default(),
                    )
                    .unwrap();
            }
            engine.wait_for_var(&v).unwrap();
            assert_eq!(v.version(), 10, "{name}: writes");
        }
    });
}

#[test]
fn a_variable_in_both_lists_is_a_write_and_repeats_are_ignored() {
    common::no_hang(|| {
        for (name, engine) in common::all_engines() {
            let v = engine.new_variable();
            let log = Arc::new(Mutex::new(Vec::new()));
            for i in 0..50 {
                let log = Arc::clone(&log);
                let both = [v.clone(), v.clone()];
                engine
                    .push_sync(
                        move |_| {
                            log.lock().unwrap().push(i);
                            Ok(())
                        },
                        &both,
                        &both,
                        PushOptions::default(),
                    )
                    .unwrap();
            }
            engine.wait_for_all().unwrap();
            assert_eq!(*log.lock().unwrap(), (0..50).collect::<Vec<_>>(), "{name}");
            assert_eq!(v.version(), 50, "{name}: one write per op");
        }
    });
}

#[test]
fn priorities_order_ready_ops_in_a_worker_queue() {
    common::no_hang(|| {
        for kind in [EngineKind::Pooled, EngineKind::PerDevice] {
            let engine = common::build(kind, 1);
            let gate = Arc::new(AtomicBool::new(false));
            let g = Arc::clone(&gate);
            let blocker = engine.new_variable();
            // Occupy the only worker, then queue independent ops of mixed priorities.
            engine
                .push_sync(
                    move |_| {
                        while !g.load(Ordering::SeqCst) {
                            std::thread::yield_now();
                        }
                        Ok(())
                    },
                    &[],
                    &[blocker],
                    PushOptions::default(),
                )
                .unwrap();
            std::thread::sleep(Duration::from_millis(10));
            let log = Arc::new(Mutex::new(Vec::new()));
            for (i, prio) in [0, 5, -3, 5, 9, 0].into_iter().enumerate() {
                let log = Arc::clone(&log);
                let v = engine.new_variable();
                engine
                    .push_sync(
                        move |_| {
                            log.lock().unwrap().push(i);
                            Ok(())
                        },
                        &[],
                        &[v],
                        PushOptions::default().priority(prio),
                    )
                    .unwrap();
            }
            gate.store(true, Ordering::SeqCst);
            engine.wait_for_all().unwrap();
            assert_eq!(*log.lock().unwrap(), vec![4, 1, 3, 0, 5, 2], "{kind}");
        }
    });
}

/// A stream that records which thread made it, for which context and worker kind.
struct Tagged {
    ctx: Context,
    kind: StreamKind,
    thread: std::thread::ThreadId,
}

impl Stream for Tagged {
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

#[derive(Default)]
struct Recorder(Mutex<Vec<(Context, StreamKind)>>);

impl StreamProvider for Recorder {
    fn new_stream(&self, ctx: Context, kind: StreamKind) -> Box<dyn Stream> {
        self.0.lock().unwrap().push((ctx, kind));
        Box::new(Tagged {
            ctx,
            kind,
            thread: std::thread::current().id(),
        })
    }
}

#[test]
fn per_device_workers_own_their_streams_and_serve_their_kinds() {
    common::no_hang(|| {
        let recorder = Arc::new(Recorder::default());
        let engine = EngineConfig::new(EngineKind::PerDevice)
            .cpu_workers(2)
            .streams(Arc::clone(&recorder) as Arc<dyn StreamProvider>)
            .build()
            .unwrap();
        let cases = [
            (Context::sim(0), FnProperty::Normal, StreamKind::Compute),
            (Context::sim(0), FnProperty::CopyToGPU, StreamKind::Copy),
            (Context::sim(0), FnProperty::CopyFromGPU, StreamKind::Copy),
            (
                Context::sim(1),
                FnProperty::GPUPrioritized,
                StreamKind::Priority,
            ),
            (Context::cuda(0), FnProperty::Normal, StreamKind::Compute),
            (
                Context::cpu(),
                FnProperty::CPUPrioritized,
                StreamKind::Priority,
            ),
            (Context::cpu(), FnProperty::Normal, StreamKind::Compute),
        ];
        let failures = Arc::new(AtomicUsize::new(0));
        for (ctx, prop, kind) in cases {
            for _ in 0..20 {
                let v = engine.new_variable();
                let failures = Arc::clone(&failures);
                engine
                    .push_sync(
                        move |rctx: &mut RunContext<'_>| {
                            let me = std::thread::current().id();
                            let s = rctx.stream().as_any_mut().downcast_mut::<Tagged>();
                            let good = s
                                .is_some_and(|s| s.ctx == ctx && s.kind == kind && s.thread == me)
                                && rctx.ctx() == ctx;
                            if !good {
                                failures.fetch_add(1, Ordering::SeqCst);
                            }
                            Ok(())
                        },
                        &[],
                        &[v],
                        PushOptions::on(ctx).prop(prop),
                    )
                    .unwrap();
            }
        }
        engine.wait_for_all().unwrap();
        assert_eq!(failures.load(Ordering::SeqCst), 0);
        let made = recorder.0.lock().unwrap().clone();
        assert!(made.contains(&(Context::sim(0), StreamKind::Copy)));
        assert!(made.contains(&(Context::sim(1), StreamKind::Priority)));
        // Out-of-range device indices are refused, not silently routed.
        let err = engine
            .push_sync(
                |_| ok(),
                &[],
                &[],
                PushOptions::on(Context::cuda(engine::MAX_DEVICES)),
            )
            .unwrap_err();
        assert!(
            matches!(err, engine::EngineError::DeviceOutOfRange { .. }),
            "{err}"
        );
    });
}

#[test]
fn operators_push_many_times_and_async_ops_complete_from_other_threads() {
    common::no_hang(|| {
        for (name, engine) in common::all_engines() {
            let v = engine.new_variable();
            let count = Arc::new(AtomicUsize::new(0));
            let c = Arc::clone(&count);
            let op = engine
                .new_operator(
                    Box::new(move |_: &mut RunContext<'_>, done: Completion| {
                        let c = Arc::clone(&c);
                        std::thread::spawn(move || {
                            c.fetch_add(1, Ordering::SeqCst);
                            done.ok();
                        });
                    }),
                    &[],
                    std::slice::from_ref(&v),
                    FnProperty::Normal,
                    "incr",
                )
                .unwrap();
            for _ in 0..20 {
                engine.push(&op, Context::cpu(), 0).unwrap();
            }
            engine.wait_for_var(&v).unwrap();
            assert_eq!(count.load(Ordering::SeqCst), 20, "{name}");
            assert_eq!(v.version(), 20, "{name}");
            // An Async op ready at push time runs inline in the pusher.
            let pusher = std::thread::current().id();
            let inline = Arc::new(AtomicBool::new(false));
            let i = Arc::clone(&inline);
            let w = engine.new_variable();
            engine
                .push_async(
                    move |_, done| {
                        i.store(std::thread::current().id() == pusher, Ordering::SeqCst);
                        done.ok();
                    },
                    &[],
                    &[w],
                    PushOptions::default().prop(FnProperty::Async),
                )
                .unwrap();
            assert!(
                inline.load(Ordering::SeqCst),
                "{name}: Async op did not run inline"
            );
            engine.wait_for_all().unwrap();
        }
    });
}

#[test]
fn variables_of_another_engine_are_refused() {
    let a = common::build(EngineKind::PerDevice, 1);
    let b = common::build(EngineKind::Naive, 1);
    let foreign: Var = b.new_variable();
    let err = a
        .push_sync(
            |_| ok(),
            std::slice::from_ref(&foreign),
            &[],
            PushOptions::default(),
        )
        .unwrap_err();
    assert!(
        matches!(err, engine::EngineError::ForeignVar { .. }),
        "{err}"
    );
    assert!(a.wait_for_var(&foreign).is_err());
    let own = a.new_variable();
    assert!(
        b.push_sync(|_| ok(), &[], &[own], PushOptions::default())
            .is_err()
    );
    let _: &dyn Engine = &*a;
}
