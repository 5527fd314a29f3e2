//! [`OpLock`]: the naive engine's one re-entrant lock. An op runs while its pushing thread holds
//! it, so ops pushed from different threads never overlap, while an op body that pushes (or
//! waits) on the same engine re-enters it at once, as MXNet's `NaiveEngine` runs nested pushes
//! inline.

use std::cell::Cell;
use std::marker::PhantomData;

use crate::sync::{AtomicUsize, Mutex, MutexGuard, Ordering};

/// A re-entrant mutual-exclusion lock without data (as `parking_lot::ReentrantMutex<()>`, built
/// on the [`crate::sync`] shim so that the loom models check it).
///
/// One thread at a time holds it; the holder may enter it again (each nested [`OpGuard`] is a
/// no-op), and it is released when the outermost guard is dropped.
#[derive(Debug)]
pub(crate) struct OpLock {
    mutex: Mutex<()>,
    /// The [`thread_token`] of the holding thread; 0 when free. Written only by the holder
    /// (its own token while holding, 0 before releasing), so a thread that reads its own token
    /// here holds the lock, whatever the ordering.
    owner: AtomicUsize,
}

/// Holds an [`OpLock`] until dropped: the outermost guard of a thread releases the lock, a
/// nested one does nothing. Not `Send`: it must be dropped on the thread that entered.
#[must_use = "the lock is released when the guard is dropped"]
pub(crate) struct OpGuard<'a> {
    lock: &'a OpLock,
    /// The mutex guard, for the outermost entry only.
    outer: Option<MutexGuard<'a, ()>>,
    _not_send: PhantomData<*const ()>,
}

crate::sync::thread_local! {
    /// This thread's token (0 until first asked for).
    #[allow(clippy::missing_const_for_thread_local)] // loom's macro takes no `const {}`
    static TOKEN: Cell<usize> = Cell::new(0);
}

/// A non-zero number unique to the calling thread among the threads of the process that ever
/// asked for one.
fn thread_token() -> usize {
    TOKEN.with(|t| {
        let mut token = t.get();
        if token == 0 {
            // A process-wide source, not part of any loom model (as `next_id`).
            static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);
            token = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            t.set(token);
        }
        token
    })
}

impl OpLock {
    /// A free lock.
    pub(crate) fn new() -> Self {
        OpLock {
            mutex: Mutex::new(()),
            owner: AtomicUsize::new(0),
        }
    }

    /// Takes the lock, blocking while another thread holds it; returns at once when this
    /// thread holds it already (a nested entry).
    pub(crate) fn enter(&self) -> OpGuard<'_> {
        let me = thread_token();
        // Only this thread ever stores `me`, and it clears it before releasing: reading `me`
        // means this thread holds the lock now (Relaxed suffices, as in lock_api's
        // `ReentrantMutex`).
        if self.owner.load(Ordering::Relaxed) == me {
            return OpGuard {
                lock: self,
                outer: None,
                _not_send: PhantomData,
            };
        }
        let guard = self.mutex.lock();
        self.owner.store(me, Ordering::Relaxed);
        OpGuard {
            lock: self,
            outer: Some(guard),
            _not_send: PhantomData,
        }
    }

    /// Whether some thread holds the lock now (a snapshot).
    pub(crate) fn is_held(&self) -> bool {
        self.owner.load(Ordering::Relaxed) != 0
    }
}

impl Drop for OpGuard<'_> {
    fn drop(&mut self) {
        if let Some(guard) = self.outer.take() {
            self.lock.owner.store(0, Ordering::Relaxed);
            drop(guard);
        }
    }
}
