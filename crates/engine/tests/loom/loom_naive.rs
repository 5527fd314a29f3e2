//! loom models of the naive engine used from several threads, through the real engine (its
//! re-entrant op lock comes from the loom shim): writers of one variable pushed from two
//! threads never overlap and lose no update, a wait from another thread returns only after the
//! op running now, and an op body that pushes and waits on its own engine (re-entering the
//! lock) neither deadlocks nor lets another thread's op in.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p engine --release --test loom`
//! (`cargo xtask loom`).

#![cfg(loom)]

use loom::sync::Arc;
use loom::sync::atomic::{AtomicUsize, Ordering};

use engine::{Engine, EngineExt, NaiveEngine, PushOptions, Var};

fn bounded() -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b
}

/// Op bodies running now, and a value updated with plain loads and stores (concurrent writers
/// would lose an update).
struct Check {
    running: AtomicUsize,
    value: AtomicUsize,
}

impl Check {
    fn new() -> Arc<Self> {
        Arc::new(Check {
            running: AtomicUsize::new(0),
            value: AtomicUsize::new(0),
        })
    }

    /// The body of a writer: alone, it adds one.
    fn write(&self) {
        assert_eq!(
            self.running.fetch_add(1, Ordering::SeqCst),
            0,
            "two op bodies ran at once"
        );
        let v = self.value.load(Ordering::SeqCst);
        self.value.store(v + 1, Ordering::SeqCst);
        self.running.fetch_sub(1, Ordering::SeqCst);
    }
}

fn push_writer(engine: &NaiveEngine, check: &Arc<Check>, var: &Var) {
    let c = Arc::clone(check);
    engine
        .push_sync(
            move |_| {
                c.write();
                Ok(())
            },
            &[],
            std::slice::from_ref(var),
            PushOptions::default(),
        )
        .unwrap();
}

#[test]
fn writers_pushed_from_two_threads_never_overlap() {
    bounded().check(|| {
        let engine = Arc::new(NaiveEngine::new());
        let var = engine.new_variable();
        let check = Check::new();
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let (e, v, c) = (Arc::clone(&engine), var.clone(), Arc::clone(&check));
                loom::thread::spawn(move || push_writer(&e, &c, &v))
            })
            .collect();
        for th in threads {
            th.join().unwrap();
        }
        assert_eq!(check.value.load(Ordering::SeqCst), 2);
        assert_eq!((var.version(), engine.num_pending()), (2, 0));
    });
}

#[test]
fn a_wait_from_another_thread_returns_after_the_running_op() {
    bounded().check(|| {
        let engine = Arc::new(NaiveEngine::new());
        let var = engine.new_variable();
        // 1: the op started; 2: it finished.
        let progress = Arc::new(AtomicUsize::new(0));
        let (e, v, p) = (Arc::clone(&engine), var.clone(), Arc::clone(&progress));
        let pusher = loom::thread::spawn(move || {
            e.push_sync(
                move |_| {
                    p.store(1, Ordering::SeqCst);
                    p.store(2, Ordering::SeqCst);
                    Ok(())
                },
                &[],
                &[v],
                PushOptions::default(),
            )
            .unwrap();
        });
        if progress.load(Ordering::SeqCst) >= 1 {
            engine.wait_for_var(&var).unwrap();
            assert_eq!(
                progress.load(Ordering::SeqCst),
                2,
                "wait_for_var returned early"
            );
        }
        pusher.join().unwrap();
        assert_eq!(var.version(), 1);
    });
}

#[test]
fn an_op_that_pushes_and_waits_inside_while_another_thread_pushes() {
    bounded().check(|| {
        let engine = Arc::new(NaiveEngine::new());
        let var = engine.new_variable();
        let check = Check::new();
        let (e, v, c) = (Arc::clone(&engine), var.clone(), Arc::clone(&check));
        let nesting = loom::thread::spawn(move || {
            let (inner, vv, cc) = (Arc::clone(&e), v.clone(), Arc::clone(&c));
            e.push_sync(
                move |_| {
                    // Counted as one body: the nested op runs inside it, on this thread.
                    let v0 = cc.value.load(Ordering::SeqCst);
                    assert_eq!(cc.running.fetch_add(1, Ordering::SeqCst), 0);
                    cc.running.fetch_sub(1, Ordering::SeqCst);
                    push_writer(&inner, &cc, &vv);
                    inner.wait_for_var(&vv).unwrap();
                    assert_eq!(cc.value.load(Ordering::SeqCst), v0 + 1, "another op got in");
                    cc.value.store(v0 + 2, Ordering::SeqCst);
                    Ok(())
                },
                &[],
                &[v],
                PushOptions::default(),
            )
            .unwrap();
        });
        push_writer(&engine, &check, &var);
        nesting.join().unwrap();
        assert_eq!(check.value.load(Ordering::SeqCst), 3);
        assert_eq!(var.version(), 3);
    });
}
