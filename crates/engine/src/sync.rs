//! The synchronisation shim: every lock and atomic of the engine's core comes from here, so that
//! building with `RUSTFLAGS="--cfg loom"` swaps in loom's model-checked versions (the pattern of
//! tokio's `src/loom/` module). Normal builds use `parking_lot` locks and `std` atomics.
//!
//! Only the lock-level core (variables, op counters, the pending-op counter, error slots) goes
//! through the shim. Thread spawning, thread-locals and `Arc` stay on `std`: loom's `Arc` cannot
//! hold unsized values, and the worker pools are not part of the loom models.

#[cfg(loom)]
mod imp {
    pub(crate) use loom::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize};

    /// A mutex whose `lock` cannot fail (loom's poisoning is unwrapped).
    #[derive(Debug)]
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    /// The guard of [`Mutex`].
    pub(crate) type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Mutex(loom::sync::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock().expect("loom mutex poisoned")
        }

        pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
            self.0.try_lock().ok()
        }
    }

    /// A condition variable over [`Mutex`].
    #[derive(Debug)]
    pub(crate) struct Condvar(loom::sync::Condvar);

    impl Condvar {
        pub(crate) fn new() -> Self {
            Condvar(loom::sync::Condvar::new())
        }

        pub(crate) fn wait<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
            self.0.wait(guard).expect("loom mutex poisoned")
        }

        /// Loom has no clock: a timed wait is an untimed one (the models never rely on time).
        pub(crate) fn wait_for<'a, T>(
            &self,
            guard: MutexGuard<'a, T>,
            _timeout: std::time::Duration,
        ) -> MutexGuard<'a, T> {
            self.wait(guard)
        }

        pub(crate) fn notify_one(&self) {
            self.0.notify_one();
        }

        pub(crate) fn notify_all(&self) {
            self.0.notify_all();
        }
    }
}

#[cfg(not(loom))]
mod imp {
    pub(crate) use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize};

    /// A mutex whose `lock` cannot fail (`parking_lot`: no poisoning).
    pub(crate) type Mutex<T> = parking_lot::Mutex<T>;

    /// The guard of [`Mutex`].
    pub(crate) type MutexGuard<'a, T> = parking_lot::MutexGuard<'a, T>;

    /// A condition variable over [`Mutex`], with loom's by-value `wait` signature.
    #[derive(Debug, Default)]
    pub(crate) struct Condvar(parking_lot::Condvar);

    impl Condvar {
        pub(crate) fn new() -> Self {
            Condvar(parking_lot::Condvar::new())
        }

        pub(crate) fn wait<'a, T>(&self, mut guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
            self.0.wait(&mut guard);
            guard
        }

        /// Waits at most `timeout` (spurious and timed-out wake-ups both return the guard).
        pub(crate) fn wait_for<'a, T>(
            &self,
            mut guard: MutexGuard<'a, T>,
            timeout: std::time::Duration,
        ) -> MutexGuard<'a, T> {
            let _ = self.0.wait_for(&mut guard, timeout);
            guard
        }

        pub(crate) fn notify_one(&self) {
            self.0.notify_one();
        }

        pub(crate) fn notify_all(&self) {
            self.0.notify_all();
        }
    }
}

pub(crate) use imp::*;
pub(crate) use std::sync::atomic::Ordering;

/// Whether spinning before sleeping makes sense: never under loom (a spin loop would multiply
/// the interleavings to explore without adding any).
pub(crate) const SPIN_ALLOWED: bool = !cfg!(loom);

#[cfg(loom)]
pub(crate) use loom::thread_local;
#[cfg(not(loom))]
pub(crate) use std::thread_local;
