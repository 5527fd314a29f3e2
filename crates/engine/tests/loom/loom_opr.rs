//! loom model of the op counter guard (`reads + writes + 1`): an op registering on two
//! variables while other threads complete the ops that hold them starts exactly once, only
//! after both are released, never half-registered.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p engine --release --test loom`
//! (`cargo xtask loom`).

#![cfg(loom)]

use loom::sync::Arc;
use loom::sync::atomic::{AtomicUsize, Ordering};

use engine::{PushOptions, Task, Tracker};

fn bounded() -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b
}

#[test]
fn a_multi_variable_op_starts_once_after_its_holders_complete() {
    bounded().check(|| {
        let tracker = Arc::new(Tracker::new());
        let (x, y) = (tracker.new_variable(), tracker.new_variable());
        let done = Arc::new(AtomicUsize::new(0)); // bit 0: a ran, bit 1: b ran
        let c_runs = Arc::new(AtomicUsize::new(0));
        let d = Arc::clone(&done);
        tracker
            .push(Task::sync(
                move |_| {
                    d.fetch_or(1, Ordering::SeqCst);
                    Ok(())
                },
                &[],
                std::slice::from_ref(&x),
                PushOptions::default(),
            ))
            .unwrap();
        let d = Arc::clone(&done);
        tracker
            .push(Task::sync(
                move |_| {
                    d.fetch_or(2, Ordering::SeqCst);
                    Ok(())
                },
                &[],
                std::slice::from_ref(&y),
                PushOptions::default(),
            ))
            .unwrap();
        let a = tracker.pop_ready().unwrap();
        let b = tracker.pop_ready().unwrap();
        // Thread 1 registers c (reads x, writes y) while thread 2 completes a and b.
        let (t, xx, yy) = (Arc::clone(&tracker), x.clone(), y.clone());
        let (d, runs) = (Arc::clone(&done), Arc::clone(&c_runs));
        let pusher = loom::thread::spawn(move || {
            let task = Task::sync(
                move |_| {
                    assert_eq!(
                        d.load(Ordering::SeqCst),
                        3,
                        "c started before a and b completed"
                    );
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                },
                &[xx],
                &[yy],
                PushOptions::default(),
            );
            t.push(task).unwrap();
        });
        let t = Arc::clone(&tracker);
        let completer = loom::thread::spawn(move || {
            t.run(a);
            t.run(b);
        });
        pusher.join().unwrap();
        completer.join().unwrap();
        tracker.run_all();
        assert_eq!(c_runs.load(Ordering::SeqCst), 1);
        assert_eq!((x.version(), y.version(), tracker.pending()), (1, 2, 0));
    });
}
