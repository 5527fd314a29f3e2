//! MXNet's test 8, the error matrix: propagation along a chain, delivered once, later writers
//! of a poisoned variable skipped, `wait_for_all` reports the first and clears, `NoSkip` runs,
//! errors from async completions, panics, dropped completions; the naive engine reports from
//! the push itself.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use engine::{Engine, EngineError, EngineExt, EngineKind, FnProperty, PushOptions, Var};

fn fail(msg: &'static str) -> impl FnOnce(&mut engine::RunContext<'_>) -> engine::OpResult {
    move |_| Err(msg.into())
}

fn counter_op(
    c: &Arc<AtomicUsize>,
) -> impl FnOnce(&mut engine::RunContext<'_>) -> engine::OpResult + use<> {
    let c = Arc::clone(c);
    move |_| {
        c.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

fn message(e: &EngineError) -> String {
    e.to_string()
}

fn push(engine: &dyn Engine, f: impl engine::SyncFn, reads: &[Var], writes: &[Var]) {
    engine
        .push_sync(f, reads, writes, PushOptions::default().name("step"))
        .unwrap();
}

#[test]
fn an_error_propagates_along_a_chain_and_is_delivered_once() {
    common::no_hang(|| {
        for (name, engine) in common::threaded(2) {
            let (a, b, c) = (
                engine.new_variable(),
                engine.new_variable(),
                engine.new_variable(),
            );
            let ran = Arc::new(AtomicUsize::new(0));
            push(&*engine, fail("boom"), &[], std::slice::from_ref(&a));
            push(
                &*engine,
                counter_op(&ran),
                std::slice::from_ref(&a),
                std::slice::from_ref(&b),
            ); // skipped
            push(
                &*engine,
                counter_op(&ran),
                std::slice::from_ref(&b),
                std::slice::from_ref(&c),
            ); // skipped
            let err = engine.wait_for_var(&c).unwrap_err();
            assert!(message(&err).contains("boom"), "{name}: {err}");
            assert!(err.is_op_failure());
            assert_eq!(ran.load(Ordering::SeqCst), 0, "{name}: skipped ops ran");
            // Delivered once: every variable sharing it is now clean.
            engine.wait_for_var(&a).unwrap();
            engine.wait_for_var(&b).unwrap();
            engine.throw(&c).unwrap();
            engine.wait_for_all().unwrap();
            // Versions still advance for skipped writers (the write completed, with an error).
            assert_eq!((a.version(), b.version(), c.version()), (1, 1, 1), "{name}");
            // Clean again: later ops run.
            push(
                &*engine,
                counter_op(&ran),
                std::slice::from_ref(&a),
                std::slice::from_ref(&c),
            );
            engine.wait_for_var(&c).unwrap();
            assert_eq!(ran.load(Ordering::SeqCst), 1, "{name}");
        }
    });
}

#[test]
fn a_later_writer_of_a_poisoned_variable_is_skipped_and_no_skip_runs() {
    common::no_hang(|| {
        for (name, engine) in common::threaded(2) {
            let a = engine.new_variable();
            let ran = Arc::new(AtomicUsize::new(0));
            let no_skip = Arc::new(AtomicUsize::new(0));
            push(&*engine, fail("first"), &[], std::slice::from_ref(&a));
            push(&*engine, counter_op(&ran), &[], std::slice::from_ref(&a));
            engine
                .push_sync(
                    counter_op(&no_skip),
                    std::slice::from_ref(&a),
                    &[],
                    PushOptions::default().prop(FnProperty::NoSkip),
                )
                .unwrap();
            let err = engine.throw(&a);
            // `throw` does not wait: the error may or may not be there yet; wait then check.
            let err = match err {
                Err(e) => e,
                Ok(()) => engine.wait_for_var(&a).unwrap_err(),
            };
            assert!(message(&err).contains("first"), "{name}: {err}");
            engine.wait_for_all().unwrap();
            assert_eq!(ran.load(Ordering::SeqCst), 0, "{name}: poisoned writer ran");
            assert_eq!(
                no_skip.load(Ordering::SeqCst),
                1,
                "{name}: NoSkip op skipped"
            );
        }
    });
}

#[test]
fn wait_for_all_reports_the_first_error_and_clears_all() {
    common::no_hang(|| {
        for (name, engine) in common::threaded(1) {
            let (a, b) = (engine.new_variable(), engine.new_variable());
            push(&*engine, fail("one"), &[], std::slice::from_ref(&a));
            engine.wait_for_var(&a).unwrap_err(); // make "one" first, and deliver it
            push(&*engine, fail("two"), &[], std::slice::from_ref(&a));
            push(&*engine, fail("three"), &[], std::slice::from_ref(&b));
            let err = engine.wait_for_all().unwrap_err();
            let text = message(&err);
            assert!(
                text.contains("two") || text.contains("three"),
                "{name}: {text}"
            );
            // Cleared everywhere.
            engine.wait_for_all().unwrap();
            engine.wait_for_var(&a).unwrap();
            engine.throw(&b).unwrap();
        }
    });
}

#[test]
fn async_errors_panics_and_dropped_completions_are_op_failures() {
    common::no_hang(|| {
        for (name, engine) in common::all_engines() {
            let naive = engine.kind() == EngineKind::Naive;
            let (a, b, c) = (
                engine.new_variable(),
                engine.new_variable(),
                engine.new_variable(),
            );
            let r1 = engine.push_async(
                |_, done| {
                    std::thread::spawn(move || done.complete(Err("async failure".into())));
                },
                &[],
                std::slice::from_ref(&a),
                PushOptions::default().name("async"),
            );
            let r2 = engine.push_sync(
                |_| panic!("kaboom"),
                &[],
                std::slice::from_ref(&b),
                PushOptions::default().name("panicky"),
            );
            let r3 = engine.push_async(
                |_, done| drop(done),
                &[],
                std::slice::from_ref(&c),
                PushOptions::default().name("lost"),
            );
            let (e1, e2, e3) = if naive {
                // The naive engine reports from the push itself.
                (r1.unwrap_err(), r2.unwrap_err(), r3.unwrap_err())
            } else {
                r1.unwrap();
                r2.unwrap();
                r3.unwrap();
                (
                    engine.wait_for_var(&a).unwrap_err(),
                    engine.wait_for_var(&b).unwrap_err(),
                    engine.wait_for_var(&c).unwrap_err(),
                )
            };
            assert!(
                matches!(e1, EngineError::OpFailed { op: "async", .. }),
                "{name}: {e1}"
            );
            assert!(message(&e1).contains("async failure"));
            assert!(
                matches!(&e2, EngineError::OpPanicked { op: "panicky", message } if message == "kaboom"),
                "{name}: {e2}"
            );
            assert!(
                matches!(e3, EngineError::CompletionDropped { op: "lost" }),
                "{name}: {e3}"
            );
            engine.wait_for_all().unwrap();
        }
    });
}

#[test]
fn error_messages_name_the_op_and_the_cause() {
    let engine = common::build(EngineKind::PerDevice, 1);
    let v = engine.new_variable();
    engine
        .push_sync(
            fail("disk full"),
            &[],
            std::slice::from_ref(&v),
            PushOptions::default().name("save"),
        )
        .unwrap();
    let err = engine.wait_for_var(&v).unwrap_err();
    assert_eq!(err.to_string(), "op `save` failed: disk full");
    engine
        .delete_variable(&v, engine::Context::cpu(), None)
        .unwrap();
    let err = engine
        .push_sync(
            |_| Ok(()),
            std::slice::from_ref(&v),
            &[],
            PushOptions::default(),
        )
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "variable {} was deleted (delete_variable) and cannot be used by a new op",
            v.id()
        )
    );
}
