//! Small named blocking primitives (as rayon-core's `latch.rs`): [`Latch`], a one-shot gate a
//! waiter sleeps on, and [`PendingOps`], the count of pushed but unfinished ops that
//! `wait_for_all` waits to reach zero.

use std::time::Duration;

use crate::sync::{AtomicBool, AtomicUsize, Condvar, Mutex, Ordering};

/// A one-shot gate: `set` once, `wait` until set. Used by `wait_for_var` / `wait_to_write`,
/// whose waiter sits in a variable's FIFO and is released by the completing thread (no helper
/// op, no worker needed).
#[derive(Debug)]
pub(crate) struct Latch {
    set: AtomicBool,
    lock: Mutex<()>,
    cv: Condvar,
}

impl Latch {
    pub(crate) fn new() -> Self {
        Latch {
            set: AtomicBool::new(false),
            lock: Mutex::new(()),
            cv: Condvar::new(),
        }
    }

    /// Opens the gate and wakes every waiter.
    pub(crate) fn set(&self) {
        let _guard = self.lock.lock();
        self.set.store(true, Ordering::Release);
        self.cv.notify_all();
    }

    /// Whether the gate is open.
    pub(crate) fn is_set(&self) -> bool {
        self.set.load(Ordering::Acquire)
    }

    /// Blocks until the gate is open.
    pub(crate) fn wait(&self) {
        if self.is_set() {
            return;
        }
        let mut guard = self.lock.lock();
        while !self.is_set() {
            guard = self.cv.wait(guard);
        }
    }
}

/// The number of ops pushed and not yet completed, with a wait for zero (`wait_for_all`;
/// MXNet's `pending_` and `finished_cv_`).
///
/// `add` happens before an op is registered, `sub` after it completed (workers may batch
/// their `sub`s, so the count may lag above the truth, never below it).
#[derive(Debug)]
pub(crate) struct PendingOps {
    count: AtomicUsize,
    waiters: AtomicUsize,
    lock: Mutex<()>,
    cv: Condvar,
}

impl PendingOps {
    pub(crate) fn new() -> Self {
        PendingOps {
            count: AtomicUsize::new(0),
            waiters: AtomicUsize::new(0),
            lock: Mutex::new(()),
            cv: Condvar::new(),
        }
    }

    /// Counts `n` new ops.
    pub(crate) fn add(&self, n: usize) {
        self.count.fetch_add(n, Ordering::SeqCst);
    }

    /// Counts `n` ops as done; wakes the waiters when the count reaches zero.
    pub(crate) fn sub(&self, n: usize) {
        if n == 0 {
            return;
        }
        let before = self.count.fetch_sub(n, Ordering::SeqCst);
        debug_assert!(before >= n, "pending op count underflow");
        if before == n && self.waiters.load(Ordering::SeqCst) > 0 {
            let _guard = self.lock.lock();
            self.cv.notify_all();
        }
    }

    /// The current count (an upper bound while workers hold unflushed completions).
    pub(crate) fn get(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    /// Blocks until the count is zero.
    pub(crate) fn wait_zero(&self) {
        if self.get() == 0 {
            return;
        }
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let mut guard = self.lock.lock();
        while self.get() != 0 {
            // The timeout is a safety net only (a missed wake-up would cost 100 ms, not a hang).
            guard = self.cv.wait_for(guard, Duration::from_millis(100));
        }
        drop(guard);
        self.waiters.fetch_sub(1, Ordering::SeqCst);
    }
}
