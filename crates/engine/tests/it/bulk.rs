//! MXNet's test 9: bulk execution flushes on wait, on a change of device, at the size limit
//! and on a non-bulked push; in-place order holds inside a bulk; a failure inside a bulk skips
//! the rest and marks its written variables.

use crate::common;

use std::sync::{Arc, Mutex};

use engine::{Context, Engine, EngineExt, EngineKind, FnProperty, PushOptions, Var};

fn logger(
    log: &Arc<Mutex<Vec<u32>>>,
    i: u32,
) -> impl FnOnce(&mut engine::RunContext<'_>) -> engine::OpResult + use<> {
    let log = Arc::clone(log);
    move |_| {
        log.lock().unwrap().push(i);
        Ok(())
    }
}

/// Pushes an op that appends `i` to `log` and writes `v`.
fn push_logged(
    engine: &Arc<dyn Engine>,
    log: &Arc<Mutex<Vec<u32>>>,
    i: u32,
    v: &Var,
    options: PushOptions,
) {
    engine
        .push_sync(logger(log, i), &[], std::slice::from_ref(v), options)
        .unwrap();
}

fn engines() -> Vec<(String, Arc<dyn Engine>)> {
    common::threaded(2)
}

#[test]
fn bulk_flushes_at_the_limit_on_wait_and_on_device_change() {
    common::no_hang(|| {
        for (name, engine) in engines() {
            assert_eq!(engine.set_bulk_size(4), 0, "{name}");
            assert_eq!(engine.bulk_size(), 4);
            let v = engine.new_variable();
            let log = Arc::new(Mutex::new(Vec::new()));
            // Three pushes stay in the bulk: nothing pending in the engine yet.
            for i in 0..3 {
                push_logged(&engine, &log, i, &v, PushOptions::default());
            }
            assert_eq!(engine.num_pending(), 0, "{name}: bulk flushed early");
            // The fourth fills it: one merged op.
            push_logged(&engine, &log, 3, &v, PushOptions::default());
            engine.wait_for_var(&v).unwrap();
            assert_eq!(*log.lock().unwrap(), vec![0, 1, 2, 3], "{name}");
            assert_eq!(v.version(), 1, "{name}: one merged write");
            // wait_for_var flushes a partial bulk.
            push_logged(&engine, &log, 4, &v, PushOptions::default());
            engine.wait_for_var(&v).unwrap();
            assert_eq!(log.lock().unwrap().len(), 5, "{name}");
            // A change of device flushes.
            push_logged(&engine, &log, 5, &v, PushOptions::default());
            push_logged(&engine, &log, 6, &v, PushOptions::on(Context::sim(0)));
            // Flushed: op 5 is pending in the engine or has already run (read in that order: an
            // op leaves the pending count only after its body logged). Unflushed, it is neither.
            // (Only `num_pending() >= 1` raced with a fast worker under load.)
            let pending = engine.num_pending();
            let ran = log.lock().unwrap().len();
            assert!(
                pending >= 1 || ran >= 6,
                "{name}: device change did not flush (pending {pending}, ran {ran})"
            );
            // A non-bulked push (Async / prioritised / different property) flushes first.
            push_logged(
                &engine,
                &log,
                7,
                &v,
                PushOptions::default().prop(FnProperty::CPUPrioritized),
            );
            engine.wait_for_all().unwrap();
            assert_eq!(*log.lock().unwrap(), (0..8).collect::<Vec<_>>(), "{name}");
            assert_eq!(engine.set_bulk_size(0), 4);
        }
    });
}

#[test]
fn in_place_order_holds_inside_a_bulk() {
    common::no_hang(|| {
        for (name, engine) in engines() {
            engine.set_bulk_size(16);
            let (a, b) = (engine.new_variable(), engine.new_variable());
            let cell = Arc::new(Mutex::new((1i64, 0i64)));
            for i in 0..10 {
                let c = Arc::clone(&cell);
                // Alternate b = a * 2 (reads a, writes b) and a = b + i (reads b, writes a).
                let (reads, writes): (Vec<Var>, Vec<Var>) = if i % 2 == 0 {
                    (vec![a.clone()], vec![b.clone()])
                } else {
                    (vec![b.clone()], vec![a.clone()])
                };
                engine
                    .push_sync(
                        move |_| {
                            let mut g = c.lock().unwrap();
                            if i % 2 == 0 {
                                g.1 = g.0 * 2;
                            } else {
                                g.0 = g.1 + i;
                            }
                            Ok(())
                        },
                        &reads,
                        &writes,
                        PushOptions::default(),
                    )
                    .unwrap();
            }
            engine.wait_for_all().unwrap();
            let mut want = (1i64, 0i64);
            for i in 0..10 {
                if i % 2 == 0 {
                    want.1 = want.0 * 2;
                } else {
                    want.0 = want.1 + i;
                }
            }
            assert_eq!(*cell.lock().unwrap(), want, "{name}");
            engine.set_bulk_size(0);
        }
    });
}

#[test]
fn a_failure_inside_a_bulk_skips_the_rest_and_marks_its_outputs() {
    common::no_hang(|| {
        for (name, engine) in engines() {
            engine.set_bulk_size(8);
            let (a, b) = (engine.new_variable(), engine.new_variable());
            let log = Arc::new(Mutex::new(Vec::new()));
            push_logged(&engine, &log, 0, &a, PushOptions::default());
            engine
                .push_sync(
                    |_| Err("bulk step failed".into()),
                    &[],
                    std::slice::from_ref(&a),
                    PushOptions::default(),
                )
                .unwrap();
            push_logged(&engine, &log, 2, &b, PushOptions::default());
            let err = engine.wait_for_var(&b).unwrap_err();
            assert!(
                err.to_string().contains("bulk step failed"),
                "{name}: {err}"
            );
            assert_eq!(
                *log.lock().unwrap(),
                vec![0],
                "{name}: the rest of the bulk ran"
            );
            engine.wait_for_all().unwrap();
            engine.set_bulk_size(0);
        }
    });
}

#[test]
fn bulk_is_per_engine_so_another_threads_wait_flushes_it() {
    common::no_hang(|| {
        let engine = common::build(EngineKind::PerDevice, 2);
        engine.set_bulk_size(100);
        let v = engine.new_variable();
        let log = Arc::new(Mutex::new(Vec::new()));
        push_logged(&engine, &log, 1, &v, PushOptions::default());
        let (e, w) = (Arc::clone(&engine), v.clone());
        std::thread::spawn(move || e.wait_for_var(&w).unwrap())
            .join()
            .unwrap();
        assert_eq!(*log.lock().unwrap(), vec![1]);
        // The naive engine records the size and runs everything at once.
        let naive = common::build(EngineKind::Naive, 1);
        assert_eq!(naive.set_bulk_size(10), 0);
        assert_eq!(naive.bulk_size(), 10);
    });
}
