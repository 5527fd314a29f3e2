//! loom models of the per-variable state machine, through the real code (`Tracker` drives the
//! threaded engines' registration and completion paths): concurrent appends and completions
//! of reads and writes never let a writer overlap another user, never lose or duplicate an op,
//! and leave the right version.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p engine --release --test loom`
//! (`cargo xtask loom`).

#![cfg(loom)]

use loom::sync::Arc;
use loom::sync::atomic::{AtomicUsize, Ordering};

use engine::{PushOptions, Task, Tracker, Var};

/// Shared checker: readers/writers currently inside an op body, ops run.
struct Check {
    readers: AtomicUsize,
    writers: AtomicUsize,
    ran: AtomicUsize,
}

impl Check {
    fn new() -> Arc<Self> {
        Arc::new(Check {
            readers: AtomicUsize::new(0),
            writers: AtomicUsize::new(0),
            ran: AtomicUsize::new(0),
        })
    }
}

fn reader(check: &Arc<Check>, var: &Var) -> Task {
    let c = Arc::clone(check);
    Task::sync(
        move |_| {
            c.readers.fetch_add(1, Ordering::SeqCst);
            assert_eq!(
                c.writers.load(Ordering::SeqCst),
                0,
                "a read overlapped a write"
            );
            c.readers.fetch_sub(1, Ordering::SeqCst);
            c.ran.fetch_add(1, Ordering::SeqCst);
            Ok(())
        },
        std::slice::from_ref(var),
        &[],
        PushOptions::default(),
    )
}

fn writer(check: &Arc<Check>, var: &Var) -> Task {
    let c = Arc::clone(check);
    Task::sync(
        move |_| {
            assert_eq!(
                c.writers.fetch_add(1, Ordering::SeqCst),
                0,
                "two writes overlapped"
            );
            assert_eq!(
                c.readers.load(Ordering::SeqCst),
                0,
                "a write overlapped a read"
            );
            c.writers.fetch_sub(1, Ordering::SeqCst);
            c.ran.fetch_add(1, Ordering::SeqCst);
            Ok(())
        },
        &[],
        std::slice::from_ref(var),
        PushOptions::default(),
    )
}

fn bounded() -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b
}

/// Two threads each push a write then a read on one variable and run whatever is ready; the
/// main thread runs the rest. Every interleaving of appends and completions is explored.
#[test]
fn concurrent_writes_and_reads_on_one_variable() {
    bounded().check(|| {
        let tracker = Arc::new(Tracker::new());
        let var = tracker.new_variable();
        let check = Check::new();
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let (t, v, c) = (Arc::clone(&tracker), var.clone(), Arc::clone(&check));
                loom::thread::spawn(move || {
                    t.push(writer(&c, &v)).unwrap();
                    t.push(reader(&c, &v)).unwrap();
                    t.run_all();
                })
            })
            .collect();
        for th in threads {
            th.join().unwrap();
        }
        tracker.run_all();
        assert_eq!(check.ran.load(Ordering::SeqCst), 4);
        assert_eq!(tracker.pending(), 0);
        assert_eq!(var.version(), 2);
    });
}

/// Reads granted together complete on different threads while a write waits behind them: the
/// last read to complete (whichever thread) grants the write exactly once.
#[test]
fn the_last_completing_read_grants_the_queued_write() {
    bounded().check(|| {
        let tracker = Arc::new(Tracker::new());
        let var = tracker.new_variable();
        let check = Check::new();
        tracker.push(reader(&check, &var)).unwrap();
        tracker.push(reader(&check, &var)).unwrap();
        tracker.push(writer(&check, &var)).unwrap();
        let r1 = tracker.pop_ready().expect("first read granted at once");
        let r2 = tracker.pop_ready().expect("second read granted at once");
        assert!(
            tracker.pop_ready().is_none(),
            "the write must wait for the reads"
        );
        let t = Arc::clone(&tracker);
        let th = loom::thread::spawn(move || t.run(r1));
        tracker.run(r2);
        th.join().unwrap();
        let w = tracker.pop_ready().expect("the write is granted once");
        assert!(tracker.pop_ready().is_none());
        tracker.run(w);
        assert_eq!(check.ran.load(Ordering::SeqCst), 3);
        assert_eq!((var.version(), tracker.pending()), (1, 0));
    });
}

/// A write completes on one thread while another thread appends a read: the read is either
/// granted at once (after the write completed) or released by the completion, never both
/// and never lost.
#[test]
fn a_read_appended_while_a_write_completes() {
    bounded().check(|| {
        let tracker = Arc::new(Tracker::new());
        let var = tracker.new_variable();
        let check = Check::new();
        tracker.push(writer(&check, &var)).unwrap();
        let w = tracker.pop_ready().unwrap();
        let (t, v, c) = (Arc::clone(&tracker), var.clone(), Arc::clone(&check));
        let th = loom::thread::spawn(move || t.push(reader(&c, &v)).unwrap());
        tracker.run(w);
        th.join().unwrap();
        assert_eq!(tracker.run_all(), 1);
        assert_eq!(check.ran.load(Ordering::SeqCst), 2);
        assert_eq!((var.version(), tracker.pending()), (1, 0));
    });
}
