//! The synchronisation shim: every lock and atomic of the engine's core comes from here, so that
//! building with `RUSTFLAGS="--cfg loom"` swaps in loom's model-checked versions (the pattern of
//! tokio's `src/loom/` module). Normal builds use `parking_lot` locks and `std` atomics.
//!
//! Only the lock-level core (variables, op counters, the pending-op counter, error slots, the
//! naive engine's re-entrant lock) goes through the shim. Thread spawning, thread-locals and `Arc` stay on `std`: loom's `Arc` cannot
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

    /// A re-entrant mutex (as `parking_lot::ReentrantMutex`, which normal builds use): one
    /// thread at a time holds it, and the holder may lock it again; the data is shared (`&T`)
    /// with the holding thread only.
    pub(crate) struct ReentrantMutex<T> {
        mutex: loom::sync::Mutex<()>,
        /// The holder's [`thread_token`], 0 when free. Only the holder stores its own token
        /// (and clears it before unlocking), so reading one's own token means holding it.
        owner: AtomicUsize,
        data: T,
    }

    // SAFETY: `data` is reached only through a guard, guards exist only on the thread that
    // holds the mutex (they are not `Send`), and `&T` cannot leave that thread when `T` is not
    // `Sync`; so `T` is used by one thread at a time, which needs only `T: Send`.
    unsafe impl<T: Send> Sync for ReentrantMutex<T> {}

    /// The guard of [`ReentrantMutex`]: the outermost one of a thread unlocks it.
    pub(crate) struct ReentrantMutexGuard<'a, T> {
        lock: &'a ReentrantMutex<T>,
        outer: Option<loom::sync::MutexGuard<'a, ()>>,
        _not_send: std::marker::PhantomData<*const ()>,
    }

    loom::thread_local! {
        static TOKEN: std::cell::Cell<usize> = std::cell::Cell::new(0);
    }

    /// A non-zero number unique to the calling (loom) thread.
    fn thread_token() -> usize {
        TOKEN.with(|t| {
            if t.get() == 0 {
                // Not part of the model, as the engine's `next_id`.
                static NEXT: std::sync::atomic::AtomicUsize =
                    std::sync::atomic::AtomicUsize::new(1);
                t.set(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
            }
            t.get()
        })
    }

    impl<T> ReentrantMutex<T> {
        pub(crate) fn new(data: T) -> Self {
            ReentrantMutex {
                mutex: loom::sync::Mutex::new(()),
                owner: AtomicUsize::new(0),
                data,
            }
        }

        pub(crate) fn lock(&self) -> ReentrantMutexGuard<'_, T> {
            use loom::sync::atomic::Ordering;
            let me = thread_token();
            let outer = if self.owner.load(Ordering::Relaxed) == me {
                None
            } else {
                let guard = self.mutex.lock().expect("loom mutex poisoned");
                self.owner.store(me, Ordering::Relaxed);
                Some(guard)
            };
            ReentrantMutexGuard {
                lock: self,
                outer,
                _not_send: std::marker::PhantomData,
            }
        }

        pub(crate) fn is_locked(&self) -> bool {
            self.owner.load(loom::sync::atomic::Ordering::Relaxed) != 0
        }
    }

    impl<T> std::ops::Deref for ReentrantMutexGuard<'_, T> {
        type Target = T;

        fn deref(&self) -> &T {
            &self.lock.data
        }
    }

    impl<T> Drop for ReentrantMutexGuard<'_, T> {
        fn drop(&mut self) {
            if let Some(guard) = self.outer.take() {
                self.lock
                    .owner
                    .store(0, loom::sync::atomic::Ordering::Relaxed);
                drop(guard);
            }
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

    /// A re-entrant mutex: one thread at a time holds it, the holder may lock it again, the
    /// data is shared (`&T`) with the holding thread only (`parking_lot`).
    pub(crate) type ReentrantMutex<T> = parking_lot::ReentrantMutex<T>;

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
