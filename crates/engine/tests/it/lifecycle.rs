//! MXNet's tests 7, 10 and 11 and the hazards: delete_variable / delete_operator with pending
//! ops (no use after free, later pushes refused), stop/start and shutdown with work in flight
//! (nothing lost, no hang), re-entrant waits from inside an op (an error, never a hang).

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use engine::{Context, EngineError, EngineExt, EngineKind, FnProperty, PushOptions};

#[test]
fn delete_variable_runs_after_pending_ops_and_refuses_later_pushes() {
    common::no_hang(|| {
        for (name, engine) in common::all_engines() {
            let v = engine.new_variable();
            let seen = Arc::new(AtomicUsize::new(0));
            for _ in 0..50 {
                let s = Arc::clone(&seen);
                engine
                    .push_sync(
                        move |_| {
                            std::thread::sleep(Duration::from_micros(50));
                            s.fetch_add(1, Ordering::SeqCst);
                            Ok(())
                        },
                        std::slice::from_ref(&v),
                        &[],
                        PushOptions::default(),
                    )
                    .unwrap();
            }
            let at_delete = Arc::new(AtomicUsize::new(usize::MAX));
            let (s, d) = (Arc::clone(&seen), Arc::clone(&at_delete));
            engine
                .delete_variable(
                    &v,
                    Context::cpu(),
                    Some(Box::new(move |_| {
                        d.store(s.load(Ordering::SeqCst), Ordering::SeqCst)
                    })),
                )
                .unwrap();
            assert!(v.is_deleted());
            let err = engine
                .push_sync(
                    |_| Ok(()),
                    &[],
                    std::slice::from_ref(&v),
                    PushOptions::default(),
                )
                .unwrap_err();
            assert!(
                matches!(err, EngineError::VarDeleted { .. }),
                "{name}: {err}"
            );
            let err = engine
                .delete_variable(&v, Context::cpu(), None)
                .unwrap_err();
            assert!(
                matches!(err, EngineError::VarDeleted { .. }),
                "{name}: {err}"
            );
            engine.wait_for_all().unwrap();
            assert_eq!(
                at_delete.load(Ordering::SeqCst),
                50,
                "{name}: deleted before its readers"
            );
            // The handle stays valid memory: reading its version is safe.
            assert_eq!(v.version(), 1, "{name}");
        }
    });
}

#[test]
fn delete_operator_keeps_pending_pushes_and_refuses_new_ones() {
    common::no_hang(|| {
        for (name, engine) in common::all_engines() {
            let v = engine.new_variable();
            let count = Arc::new(AtomicUsize::new(0));
            let c = Arc::clone(&count);
            let op = engine
                .new_operator_fn(
                    move |_, done| {
                        c.fetch_add(1, Ordering::SeqCst);
                        done.ok();
                    },
                    &[],
                    std::slice::from_ref(&v),
                    FnProperty::Normal,
                    "op",
                )
                .unwrap();
            for _ in 0..30 {
                engine.push(&op, Context::cpu(), 0).unwrap();
            }
            engine.delete_operator(&op).unwrap();
            drop(op.clone());
            let err = engine.push(&op, Context::cpu(), 0).unwrap_err();
            assert!(
                matches!(err, EngineError::OperatorDeleted { .. }),
                "{name}: {err}"
            );
            assert!(engine.delete_operator(&op).is_err());
            drop(op);
            engine.wait_for_all().unwrap();
            assert_eq!(count.load(Ordering::SeqCst), 30, "{name}");
        }
    });
}

#[test]
fn stop_and_start_with_work_in_flight_lose_nothing() {
    common::no_hang(|| {
        for (name, engine) in common::threaded(2) {
            let v = engine.new_variable();
            let count = Arc::new(AtomicUsize::new(0));
            let pushers: Vec<_> = (0..2)
                .map(|_| {
                    let (engine, v, count) = (Arc::clone(&engine), v.clone(), Arc::clone(&count));
                    std::thread::spawn(move || {
                        let mut accepted = 0;
                        for _ in 0..2000 {
                            let c = Arc::clone(&count);
                            let r = engine.push_sync(
                                move |_| {
                                    c.fetch_add(1, Ordering::SeqCst);
                                    Ok(())
                                },
                                &[],
                                std::slice::from_ref(&v),
                                PushOptions::default(),
                            );
                            match r {
                                Ok(()) => accepted += 1,
                                Err(EngineError::Stopped) => {}
                                Err(e) => panic!("unexpected {e}"),
                            }
                        }
                        accepted
                    })
                })
                .collect();
            std::thread::sleep(Duration::from_millis(2));
            engine.stop().unwrap();
            // Stopped: every accepted push ran, new pushes are refused.
            let ran_at_stop = count.load(Ordering::SeqCst);
            assert_eq!(engine.num_pending(), 0, "{name}");
            let err = engine
                .push_sync(|_| Ok(()), &[], &[], PushOptions::default())
                .unwrap_err();
            assert!(matches!(err, EngineError::Stopped), "{name}");
            engine.start();
            let accepted: usize = pushers.into_iter().map(|p| p.join().unwrap()).sum();
            engine.wait_for_all().unwrap();
            assert!(ran_at_stop <= accepted);
            assert_eq!(count.load(Ordering::SeqCst), accepted, "{name}: lost work");
            assert_eq!(v.version() as usize, accepted, "{name}");
        }
    });
}

#[test]
fn dropping_an_engine_with_work_in_flight_runs_everything() {
    common::no_hang(|| {
        for kind in [EngineKind::Pooled, EngineKind::PerDevice, EngineKind::Naive] {
            let count = Arc::new(AtomicUsize::new(0));
            {
                let engine = common::build(kind, 2);
                let v = engine.new_variable();
                for i in 0..500 {
                    let c = Arc::clone(&count);
                    engine
                        .push_async(
                            move |_, done| {
                                if i % 50 == 0 {
                                    std::thread::spawn(move || {
                                        std::thread::sleep(Duration::from_millis(1));
                                        c.fetch_add(1, Ordering::SeqCst);
                                        done.ok();
                                    });
                                } else {
                                    c.fetch_add(1, Ordering::SeqCst);
                                    done.ok();
                                }
                            },
                            &[],
                            std::slice::from_ref(&v),
                            PushOptions::default(),
                        )
                        .unwrap();
                }
            } // dropped here with work in flight
            assert_eq!(count.load(Ordering::SeqCst), 500, "{kind}");
        }
    });
}

#[test]
fn waits_from_inside_an_op_are_errors_not_hangs() {
    common::no_hang(|| {
        for (name, engine) in common::threaded(1) {
            let v = engine.new_variable();
            let results = Arc::new(parking_lot::Mutex::new(Vec::new()));
            let (e, r, w) = (Arc::clone(&engine), Arc::clone(&results), v.clone());
            engine
                .push_sync(
                    move |_| {
                        // Waiting on the variable this op writes would wait on itself.
                        r.lock().push(e.wait_for_var(&w).map_err(|e| e.to_string()));
                        r.lock()
                            .push(e.wait_to_write(&w).map_err(|e| e.to_string()));
                        r.lock().push(e.wait_for_all().map_err(|e| e.to_string()));
                        // Pushing from inside an op works.
                        let pushed = e.push_sync(
                            |_| Ok(()),
                            &[],
                            std::slice::from_ref(&w),
                            PushOptions::default(),
                        );
                        r.lock().push(pushed.map_err(|e| e.to_string()));
                        Ok(())
                    },
                    &[],
                    std::slice::from_ref(&v),
                    PushOptions::default(),
                )
                .unwrap();
            engine.wait_for_all().unwrap();
            let results = results.lock().clone();
            assert_eq!(results.len(), 4, "{name}");
            for r in &results[..3] {
                assert!(
                    r.as_ref().unwrap_err().contains("from inside an op"),
                    "{name}: {r:?}"
                );
            }
            assert!(results[3].is_ok(), "{name}");
            assert_eq!(v.version(), 2, "{name}");
        }
        // Inside an op, the naive engine's waits return at once: the op ran everything before it
        // and its thread holds the engine's lock.
        let naive = common::build(EngineKind::Naive, 1);
        let v = naive.new_variable();
        let n2 = Arc::clone(&naive);
        let w = v.clone();
        let ok = Arc::new(AtomicBool::new(false));
        let o = Arc::clone(&ok);
        naive
            .push_sync(
                move |_| {
                    o.store(
                        n2.wait_for_var(&w).is_ok() && n2.wait_for_all().is_ok(),
                        Ordering::SeqCst,
                    );
                    Ok(())
                },
                &[],
                std::slice::from_ref(&v),
                PushOptions::default(),
            )
            .unwrap();
        assert!(ok.load(Ordering::SeqCst));
    });
}
