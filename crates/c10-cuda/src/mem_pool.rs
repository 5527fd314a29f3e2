//! RAII handles for private pools on the thread-safe front: [`MemPool`] is PyTorch's
//! `torch.cuda.MemPool` (made with use count 1, destroyed as `~MemPool` destroys it) and
//! [`PoolGuard`] is `torch.cuda.use_mem_pool(pool)` (`beginAllocateToPool` for the calling
//! thread when made, `endAllocateToPool` + `releasePool` when dropped).
//!
//! The raw calls ([`crate::DeviceCachingAllocator::begin_allocate_to_pool`] and friends) are
//! PyTorch's internal API: each begin adds a user that only a `release_pool` takes away, and a
//! pool with users is never emptied, so one missing release keeps its segments reserved for the
//! life of the process. With the handles the calls always pair up, in PyTorch's order, whatever
//! path leaves the scope.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::device::DeviceMemory;
use crate::error::{Error, Result};
use crate::front::CachingAllocator;
use crate::private_pool::{MempoolId, PoolError, StreamFilter};

/// The counter of user-made pool ids (`(0, n)`, as PyTorch's `MemPool` numbers them from its
/// `uid_` counter; shared by all fronts of the process, like PyTorch's).
static NEXT_POOL: AtomicU64 = AtomicU64::new(1);

/// A private memory pool of one device of a front (PyTorch's `torch.cuda.MemPool`). Blocks are
/// allocated from it only inside [`MemPool::use_pool`]; dropping it takes its user away and
/// frees its unused segments (`~MemPool`: torch 2.15 also turns `use_on_oom` off; torch 2.7
/// needs no other user left, see [`crate::DeviceCachingAllocator::delete_mem_pool`]). Blocks
/// still allocated from it stay valid; their segments go back to the device once they are freed
/// and the cache is emptied.
pub struct MemPool<D: DeviceMemory> {
    front: Arc<CachingAllocator<D>>,
    device: u8,
    id: MempoolId,
}

impl<D: DeviceMemory> MemPool<D> {
    /// A new pool on `device` with the next id `(0, n)` (`torch.cuda.MemPool()`), use count 1.
    ///
    /// # Errors
    /// [`crate::Error::InvalidDevice`]; [`crate::PoolError::NotLive`] if the id is taken by a
    /// pool that is being freed (only when ids are also chosen by hand: [`MemPool::with_id`]).
    pub fn new(front: &Arc<CachingAllocator<D>>, device: u8) -> Result<Self> {
        let id = MempoolId::new(0, NEXT_POOL.fetch_add(1, Ordering::Relaxed));
        MemPool::with_id(front, device, id)
    }

    /// The pool `id` on `device`: made with use count 1, or one more user of a live pool with
    /// that id (PyTorch's `createOrIncrefPool`).
    ///
    /// # Errors
    /// [`crate::Error::InvalidDevice`]; [`crate::PoolError::DefaultId`] for `(0, 0)`;
    /// [`crate::PoolError::NotLive`] for a pool with that id at use count 0 or less.
    pub fn with_id(front: &Arc<CachingAllocator<D>>, device: u8, id: MempoolId) -> Result<Self> {
        front.with_device(device, |a| a.create_or_incref_pool(id))??;
        Ok(MemPool {
            front: Arc::clone(front),
            device,
            id,
        })
    }

    /// The pool's id.
    pub fn id(&self) -> MempoolId {
        self.id
    }

    /// The device index.
    pub fn device(&self) -> u8 {
        self.device
    }

    /// Its users (`MemPool.use_count()`): 1 for this handle, plus one per live [`PoolGuard`]
    /// and per other handle of the same id.
    ///
    /// # Errors
    /// [`crate::PoolError::NotFound`] once the allocator has forgotten it (not while this
    /// handle lives).
    pub fn use_count(&self) -> Result<i64> {
        self.front
            .with_device(self.device, |a| a.pool_use_count(self.id))?
    }

    /// Allocations of the calling thread on this device come from the pool until the guard drops
    /// (`with torch.cuda.use_mem_pool(pool):`; the filter is the thread's, as PyTorch's).
    ///
    /// # Errors
    /// [`crate::PoolError::AlreadyRecording`] when the pool is begun already (PyTorch refuses
    /// nested `use_mem_pool` of one pool too); the use count is then restored.
    pub fn use_pool(&self) -> Result<PoolGuard<'_, D>> {
        self.use_pool_with(StreamFilter::current_thread())
    }

    /// [`MemPool::use_pool`] with another filter: every allocation on the device
    /// ([`StreamFilter::All`]) or those on one stream (what a CUDA graph capture routes).
    ///
    /// # Errors
    /// As [`MemPool::use_pool`].
    pub fn use_pool_with(&self, filter: StreamFilter) -> Result<PoolGuard<'_, D>> {
        let begun = self
            .front
            .with_device(self.device, |a| a.begin_allocate_to_pool(self.id, filter))?;
        if let Err(e) = begun {
            if matches!(e, Error::Pool(PoolError::AlreadyRecording { .. })) {
                // PyTorch's begin adds the user before it refuses: take it back, so that the
                // refusal leaks nothing.
                let _ = self
                    .front
                    .with_device(self.device, |a| a.release_pool(self.id));
            }
            return Err(e);
        }
        Ok(PoolGuard {
            pool: self,
            done: false,
        })
    }
}

impl<D: DeviceMemory> Drop for MemPool<D> {
    fn drop(&mut self) {
        // `~MemPool` cannot report errors either; the allocator refuses a bad call without
        // changing state (torch 2.7 with other users left: PyTorch would abort).
        let _ = self
            .front
            .with_device(self.device, |a| a.delete_mem_pool(self.id));
    }
}

impl<D: DeviceMemory> fmt::Debug for MemPool<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemPool")
            .field("device", &self.device)
            .field("id", &self.id)
            .finish()
    }
}

/// A pool in use (`torch.cuda.use_mem_pool`): made by [`MemPool::use_pool`]; dropping it (or
/// [`PoolGuard::finish`]) ends the routing (`endAllocateToPool`) and takes the user it added
/// away (`releasePool`).
#[must_use = "the pool is used only while the guard lives"]
pub struct PoolGuard<'a, D: DeviceMemory> {
    pool: &'a MemPool<D>,
    done: bool,
}

impl<D: DeviceMemory> PoolGuard<'_, D> {
    /// The pool in use.
    pub fn pool(&self) -> &MemPool<D> {
        self.pool
    }

    /// Ends the use now and reports what dropping would ignore.
    ///
    /// # Errors
    /// [`crate::PoolError::NotRecording`] if something ended the routing behind the guard's
    /// back (the release still runs); an error of the release.
    pub fn finish(mut self) -> Result<()> {
        self.done = true;
        self.end()
    }

    fn end(&self) -> Result<()> {
        let (pool, id) = (self.pool, self.pool.id);
        let ended = pool
            .front
            .with_device(pool.device, |a| a.end_allocate_to_pool(id))?;
        let released = pool
            .front
            .with_device(pool.device, |a| a.release_pool(id))?;
        ended.and(released)
    }
}

impl<D: DeviceMemory> Drop for PoolGuard<'_, D> {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.end();
        }
    }
}

impl<D: DeviceMemory> fmt::Debug for PoolGuard<'_, D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolGuard")
            .field("pool", &self.pool.id)
            .finish()
    }
}
