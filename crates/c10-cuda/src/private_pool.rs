//! Private memory pools: what `torch.cuda.MemPool` + `torch.cuda.use_mem_pool` and CUDA graph
//! captures allocate from (PyTorch's `MempoolId_t`, `PrivatePool`, `beginAllocateToPool`,
//! `endAllocateToPool`, `releasePool`, `createOrIncrefPool`, `getPoolUseCount`, torch 2.15's
//! `setUseOnOOM` / `setNoSplit`, and the pool-scoped `emptyCache(mempool_id)` /
//! `snapshot(mempool_id)`).
//!
//! A private pool has its own small and large block pools (`BlockPool`s). While a pool is *begun* for a
//! stream filter, allocations on the streams the filter accepts come from the pool's blocks and
//! new segments of its own; its free blocks never serve anyone else, and the default pools'
//! free blocks never serve it. Frees return a block to the pool its segment belongs to. A pool
//! counts its users (`use_count`: a `MemPool` holds 1, each begin adds 1, `releasePool` takes 1)
//! and its device allocations (`cudaMalloc_count`); at use count 0 it is *freeable*: the next
//! `empty_cache` releases its unused segments, and once it holds none the pool is forgotten.
//!
//! The bookkeeping lives here (`PrivatePools`, one per device allocator); the allocator's
//! paths consult it only when a pool exists: with no pool begun, a malloc pays one predictable
//! branch (in the allocator's `params`).
//!
//! The two PyTorch versions differ (each checked against the real allocators with
//! torch-oracle; [`crate::rules::TorchVersion`]):
//! - torch 2.7 treats any begun pool as a CUDA graph capture underway (`captures_underway`):
//!   malloc does not process stream events and skips the release-everything retry, a free that
//!   must wait for other streams defers recording its events until no pool is begun (and
//!   forgets the streams recorded during the "capture"), and a global `empty_cache` fails
//!   PyTorch's assertion `captures_underway.empty()`. torch 2.15 does none of that for begun
//!   pools (only a real capture, `markCaptureBegin`, would).
//! - When two begun pools accept a stream, 2.7 gives the allocation to the one begun first,
//!   2.15 to the one begun last.
//! - 2.15's pools have `use_on_oom` (a request that fails in the default pools takes a free
//!   block of such a pool, right after the first device allocation failed, before any cached
//!   segment is released; never with expandable segments) and `no_split` (blocks of the pool are never split), and it reports
//!   `reserved_bytes_by_private_pools` in `memory_stats()`.

use std::collections::BTreeMap;

use crate::allocator::{DeviceCachingAllocator, Params};
use crate::block::BlockId;
use crate::device::{DeviceMemory, StreamId};
use crate::error::{Error, Result};
use crate::pool_table::Route;
use crate::snapshot::DeviceSnapshot;
use crate::stats::{decrease, increase};

pub use crate::pool_types::{MempoolId, PoolError, StreamFilter};

/// A private pool's state (for reports and tests).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolInfo {
    /// The pool's id.
    pub id: MempoolId,
    /// Its users (PyTorch's `use_count`; negative after an unbalanced `releasePool`, which
    /// PyTorch allows after asserting).
    pub use_count: i64,
    /// Device allocations not yet given back (PyTorch's `cudaMalloc_count`: one per segment
    /// allocated, or per request that mapped expandable pages; one less per segment freed or
    /// per unmapping).
    pub device_allocations: i64,
    /// Whether `empty_cache` may free its unused segments (use count 0:
    /// `graph_pools_freeable`).
    pub freeable: bool,
    /// Whether it is begun (allocations are routed to it).
    pub begun: bool,
    /// torch 2.15's `no_split`: its blocks are never split.
    pub no_split: bool,
    /// torch 2.15's `use_on_oom`: a failed default-pool request may take its free blocks.
    pub use_on_oom: bool,
    /// Bytes of device memory its segments hold.
    pub reserved: usize,
}

impl<D: DeviceMemory> DeviceCachingAllocator<D> {
    fn pool_slot(&self, id: MempoolId) -> Result<u32> {
        if id.is_default() {
            return Err(PoolError::DefaultId.into());
        }
        self.pools.slot_of(id).ok_or_else(|| {
            PoolError::NotFound {
                device: self.device.index(),
                id,
            }
            .into()
        })
    }

    /// Makes the private pool `id` with use count 1, or adds a user to it (PyTorch's
    /// `createOrIncrefPool`, torch 2.7's `ensureExistsAndIncrefPool`; what
    /// `torch.cuda.MemPool()` calls).
    ///
    /// # Errors
    /// [`PoolError::DefaultId`] for `(0, 0)`; [`PoolError::NotLive`] when the pool exists with
    /// use count 0 or less (it is freeable, or was released too often).
    pub fn create_or_incref_pool(&mut self, id: MempoolId) -> Result<()> {
        if id.is_default() {
            return Err(PoolError::DefaultId.into());
        }
        match self.pools.slot_of(id) {
            None => {
                self.pools.create(id);
            }
            Some(k) => {
                let p = self.pools.pool_mut(k);
                if p.use_count <= 0 {
                    return Err(PoolError::NotLive {
                        id,
                        use_count: p.use_count,
                    }
                    .into());
                }
                p.use_count += 1;
            }
        }
        Ok(())
    }

    /// From now on, allocations the filter accepts come from the private pool `id` (PyTorch's
    /// `beginAllocateToPool(device, mempool_id, filter)`: what `torch.cuda.use_mem_pool` and a
    /// CUDA graph capture do). Makes the pool if it does not exist (use count 1), else adds a
    /// user ([`Self::create_or_incref_pool`]).
    ///
    /// # Errors
    /// [`PoolError::DefaultId`]; [`PoolError::NotLive`] for an existing pool at use count 0 or
    /// less; [`PoolError::AlreadyRecording`] when it is begun already (its use count was
    /// incremented, as in PyTorch).
    pub fn begin_allocate_to_pool(&mut self, id: MempoolId, filter: StreamFilter) -> Result<()> {
        self.create_or_incref_pool(id)?;
        if self.pools.begun.iter().any(|(b, _)| *b == id) {
            return Err(PoolError::AlreadyRecording { id }.into());
        }
        self.pools.begun.push((id, filter));
        self.refresh_plain();
        Ok(())
    }

    /// Stops routing allocations to the private pool `id` (PyTorch's `endAllocateToPool`). The
    /// use count is unchanged: [`Self::release_pool`] balances the begin.
    ///
    /// # Errors
    /// [`PoolError::NotRecording`] when it is not begun.
    pub fn end_allocate_to_pool(&mut self, id: MempoolId) -> Result<()> {
        match self.pools.begun.iter().position(|(b, _)| *b == id) {
            Some(i) => {
                self.pools.begun.remove(i);
                self.refresh_plain();
                Ok(())
            }
            None => Err(PoolError::NotRecording { id }.into()),
        }
    }

    /// Takes one user from the private pool `id` (PyTorch's `releasePool`: a graph's reset or
    /// the end of `use_mem_pool`). At use count 0 the pool becomes freeable: the next
    /// [`Self::empty_cache`] (or [`Self::empty_cache_pool`]) frees its unused segments, and
    /// once it holds none the pool is forgotten.
    ///
    /// # Errors
    /// [`PoolError::NotFound`]; [`PoolError::ReleasedTooOften`] when the count goes below 0 (it
    /// stays decremented, as in PyTorch).
    pub fn release_pool(&mut self, id: MempoolId) -> Result<()> {
        let k = self.pool_slot(id)?;
        let p = self.pools.pool_mut(k);
        p.use_count -= 1;
        let uc = p.use_count;
        if uc < 0 {
            return Err(PoolError::ReleasedTooOften { id, use_count: uc }.into());
        }
        if uc == 0 {
            self.pools.freeable.insert(id);
        }
        Ok(())
    }

    /// The private pool's users (PyTorch's `getPoolUseCount`, `MemPool.use_count()`).
    ///
    /// # Errors
    /// [`PoolError::NotFound`] for a pool never made or already forgotten.
    pub fn pool_use_count(&self, id: MempoolId) -> Result<i64> {
        let k = self.pool_slot(id)?;
        Ok(self.pools.pool(k).use_count)
    }

    /// torch 2.15's `setUseOnOOM(device, mempool_id, use_on_oom)` (`MemPool(use_on_oom=True)`):
    /// whether a request that fails in the default pools may take a free block of this pool.
    /// Such pools are tried in PyTorch's hash-set order, right after the first device
    /// allocation failed (before any cached segment is released); the setting belongs to the
    /// id, so it outlives the pool if the id is made again.
    ///
    /// # Errors
    /// [`PoolError::Unsupported`] under torch 2.7's rules; [`PoolError::DefaultId`].
    pub fn set_use_on_oom(&mut self, id: MempoolId, use_on_oom: bool) -> Result<()> {
        if !self.rules.version.has_mem_pool_options() {
            return Err(PoolError::Unsupported {
                what: "setUseOnOOM",
                version: self.rules.version,
            }
            .into());
        }
        if id.is_default() {
            return Err(PoolError::DefaultId.into());
        }
        if use_on_oom {
            self.pools.use_on_oom.insert(id);
        } else {
            self.pools.use_on_oom.remove(id);
        }
        Ok(())
    }

    /// torch 2.15's `setNoSplit(device, mempool_id)` (`MemPool(no_split=True)`): the pool's
    /// blocks are never split (a request takes a whole free block or a whole new segment).
    /// The setting belongs to the pool: a pool made again under the same id splits.
    ///
    /// # Errors
    /// [`PoolError::Unsupported`] under torch 2.7's rules; [`PoolError::NotFound`].
    pub fn set_no_split(&mut self, id: MempoolId) -> Result<()> {
        if !self.rules.version.has_mem_pool_options() {
            return Err(PoolError::Unsupported {
                what: "setNoSplit",
                version: self.rules.version,
            }
            .into());
        }
        let k = self.pool_slot(id)?;
        self.pools.pool_mut(k).no_split = true;
        Ok(())
    }

    /// Releases the unused segments of the private pool `id` if it is freeable (use count 0),
    /// after waiting for the events of its blocks only (PyTorch's `emptyCache(mempool_id)`,
    /// `MemPool.empty_cache()`; torch 2.7's `emptyCache()` under the pool's `MemPoolContext`).
    /// A pool that is not freeable is left alone; the default pools are never touched.
    ///
    /// # Errors
    /// torch 2.7: [`PoolError::CaptureUnderway`] when the pool is freeable and a pool is begun;
    /// [`PoolError::FreeableInUse`]; [`crate::Error::Device`].
    pub fn empty_cache_pool(&mut self, id: MempoolId) -> Result<()> {
        self.release_cached_blocks(Some(id)).map(drop)
    }

    /// What a `MemPool`'s destructor does to the allocator (`del pool`). torch 2.15:
    /// `setUseOnOOM(false)`, [`Self::release_pool`], [`Self::empty_cache_pool`], at any use
    /// count. torch 2.7: it needs use count 1 (else [`PoolError::DestructorInUse`], nothing
    /// changed: PyTorch would abort), then releases the pool and empties it.
    ///
    /// # Errors
    /// As the calls it makes.
    pub fn delete_mem_pool(&mut self, id: MempoolId) -> Result<()> {
        if self.rules.version.mem_pool_destructor_needs_sole_use() {
            let use_count = self.pool_use_count(id)?;
            if use_count != 1 {
                return Err(PoolError::DestructorInUse { id, use_count }.into());
            }
        } else {
            self.set_use_on_oom(id, false)?;
        }
        self.release_pool(id)?;
        self.empty_cache_pool(id)
    }

    /// The segments and blocks of the private pool `id` only (PyTorch's
    /// `snapshot(mempool_id)`, `MemPool.snapshot()`), and the history. A pool that does not
    /// exist has no segments. The segments of a forgotten pool that outlived it (an orphaned
    /// slot: see [`PoolError::NoAllocationCounted`]) still carry its id in a full snapshot,
    /// but they are not the pool's: a pool made again with the same id starts with none
    /// (PyTorch reads the erased pool's memory there).
    pub fn snapshot_pool(&mut self, id: MempoolId) -> DeviceSnapshot {
        let mut snap = self.snapshot();
        // The live pool's blocks, by address: a segment is the pool's when one of them is in it.
        let mut own: Vec<crate::device::DevicePtr> = match self.pools.slot_of(id) {
            Some(k) => self
                .blocks
                .iter()
                .filter(|(_, b)| b.pool == k)
                .map(|(_, b)| b.ptr)
                .collect(),
            None => Vec::new(),
        };
        own.sort_unstable();
        snap.segments.retain(|s| {
            let first = own.partition_point(|&p| p < s.address);
            s.segment_pool_id == id
                && own
                    .get(first)
                    .is_some_and(|&p| p < s.address + s.total_size)
        });
        snap
    }

    /// Every private pool (forgotten ones are gone), by id.
    pub fn private_pools(&self) -> Vec<PoolInfo> {
        let mut reserved: BTreeMap<u32, usize> = BTreeMap::new();
        for (_, b) in self.blocks.iter() {
            if b.mapped {
                *reserved.entry(b.pool).or_default() += b.size;
            }
        }
        self.pools
            .by_id
            .iter()
            .map(|(&id, &k)| {
                let p = self.pools.pool(k);
                PoolInfo {
                    id,
                    use_count: p.use_count,
                    device_allocations: p.malloc_count,
                    freeable: self.pools.freeable.contains(id),
                    begun: self.pools.begun.iter().any(|(b, _)| *b == id),
                    no_split: p.no_split,
                    use_on_oom: self.pools.use_on_oom.contains(id),
                    reserved: reserved.get(&k).copied().unwrap_or(0),
                }
            })
            .collect()
    }

    /// The private pool holding the allocated block at `ptr` (what a snapshot's
    /// `segment_pool_id` says of its segment); `None` when the block is in the default pools or
    /// `ptr` is not an allocated block.
    pub fn block_pool_id(&self, ptr: crate::device::DevicePtr) -> Option<MempoolId> {
        let id = self.blocks.allocated.get(ptr)?;
        let k = self.blocks.get(id).pool;
        self.pools.owner(k).map(|p| p.id)
    }

    /// The begun pools, in begin order (PyTorch's `captures_underway`).
    pub fn begun_pools(&self) -> Vec<MempoolId> {
        self.pools.begun.iter().map(|(id, _)| *id).collect()
    }

    /// Whether a begun pool counts as a CUDA graph capture now (torch 2.7 with a pool begun).
    #[inline]
    pub(crate) fn capture_underway(&self) -> bool {
        !self.pools.begun.is_empty() && self.rules.version.begun_pool_is_capture()
    }

    /// The pool routing of [`Self::params`] when a pool is begun.
    #[cold]
    #[inline(never)]
    pub(crate) fn route(&self, stream: StreamId) -> Route {
        self.pools
            .route(stream, self.rules.version.last_begun_pool_wins())
    }

    /// The error of a request routed to a forgotten pool.
    #[cold]
    pub(crate) fn missing_pool_error(&self, stream: StreamId) -> Error {
        let id = self
            .pools
            .missing_route(stream, self.rules.version.last_begun_pool_wins())
            .unwrap_or_default();
        PoolError::RoutedToMissingPool {
            id,
            stream: stream.0,
        }
        .into()
    }

    /// torch 2.15's last resort before releasing cached segments: a free block of a
    /// `use_on_oom` pool (in PyTorch's order) for a request of the default pools. On a hit,
    /// `p` is routed to that pool.
    ///
    /// # Errors
    /// As PyTorch, which begins each pool for the request: [`PoolError::NotLive`] for such a
    /// pool at use count 0 or less, [`PoolError::AlreadyRecording`] for one that is begun (its
    /// use count stays incremented).
    #[cold]
    #[inline(never)]
    pub(crate) fn use_on_oom_block(&mut self, p: &mut Params) -> Result<Option<BlockId>> {
        for id in self.pools.use_on_oom.ids() {
            // beginAllocateToPool(id, this thread) ... endAllocateToPool, releasePool. A pool
            // forgotten since its id was set is made again (use count 1), and is left freeable
            // (use count 0) by the release, as in PyTorch.
            let k = match self.pools.slot_of(id) {
                Some(k) => k,
                None => {
                    let k = self.pools.create(id);
                    self.pools.pool_mut(k).use_count = 0;
                    self.pools.freeable.insert(id);
                    // A new pool has no blocks to serve the request.
                    continue;
                }
            };
            let begun = self.pools.begun.iter().any(|(b, _)| *b == id);
            let pool = self.pools.pool_mut(k);
            if pool.use_count <= 0 {
                return Err(PoolError::NotLive {
                    id,
                    use_count: pool.use_count,
                }
                .into());
            }
            if begun {
                pool.use_count += 1;
                return Err(PoolError::AlreadyRecording { id }.into());
            }
            if self.config.expandable_segments {
                // torch-oracle: with expandable segments 2.15 begins each pool (so the checks
                // above fail as there) but never serves the request from it.
                continue;
            }
            let mut q = *p;
            q.route_to(k, pool.no_split);
            if let Some(b) = self.get_free_block(&q) {
                *p = q;
                return Ok(Some(b));
            }
        }
        Ok(None)
    }

    /// Bookkeeping of a new device allocation (a segment, or pages mapped for a request) of
    /// the pools of slot `k`: PyTorch's `cudaMalloc_count++` of a private pool (nothing for the
    /// default pools, which have no owner).
    #[inline]
    pub(crate) fn pool_counted_alloc(&mut self, k: u32) {
        if let Some(p) = self.pools.owner_mut(k) {
            p.malloc_count += 1;
        }
    }

    /// Bookkeeping of a device release (a segment freed, or pages unmapped) of the pools of
    /// slot `k`: PyTorch's `cudaMalloc_count--` of a private pool after its assertion
    /// (nothing for the default pools).
    #[inline]
    pub(crate) fn pool_counted_release(&mut self, k: u32) -> Result<()> {
        let Some(p) = self.pools.owner_mut(k) else {
            return Ok(());
        };
        if p.orphaned {
            return Ok(());
        }
        if p.malloc_count <= 0 {
            return Err(PoolError::NoAllocationCounted { id: p.id }.into());
        }
        p.malloc_count -= 1;
        Ok(())
    }

    /// `bytes` more (`up`) or fewer reserved by the private pool of slot `k` (torch 2.15's
    /// `reserved_bytes_by_private_pools`; kept under every version, reported by 2.15's);
    /// nothing for the default pools.
    #[inline]
    pub(crate) fn pool_reserved(&mut self, k: u32, small: bool, bytes: usize, up: bool) {
        let Some(p) = self.pools.owner(k) else {
            return;
        };
        if p.orphaned {
            return;
        }
        let id = p.id;
        let arr = self
            .accounting
            .kept_mut()
            .reserved_bytes_by_private_pools
            .entry(id)
            .or_default();
        if up {
            increase(arr, small, bytes as u64);
        } else {
            decrease(arr, small, bytes as u64);
        }
    }

    /// The freeable pools in PyTorch's order.
    pub(crate) fn freeable_pools(&self) -> Vec<MempoolId> {
        self.pools.freeable.ids()
    }

    /// After a freeable pool's segments were released: forgets it if it holds no device
    /// allocation (PyTorch erases it from `graph_pools` and `graph_pools_freeable`). Its
    /// `reserved_bytes_by_private_pools` entry keeps its peak and totals; its current goes to 0.
    pub(crate) fn forget_pool_if_empty(&mut self, id: MempoolId) {
        let Some(k) = self.pools.slot_of(id) else {
            return;
        };
        if self.pools.pool(k).malloc_count != 0 {
            return;
        }
        self.pools.by_id.remove(&id);
        self.pools.freeable.remove(id);
        if let Some(arr) = self
            .accounting
            .kept_mut()
            .reserved_bytes_by_private_pools
            .get_mut(&id)
        {
            for s in arr.iter_mut() {
                // The derived `freed` unchanged (see the note on how the stats are kept).
                s.freed -= s.current;
                s.current = 0;
            }
        }
        // Blocks can outlive the count only through PyTorch's expandable-segment bookkeeping
        // (see PoolError::NoAllocationCounted); then the slot stays, orphaned, for them. A pool
        // still begun keeps its slot too: a request routed to it may be in the middle of its
        // retry chain (PyTorch goes on with the erased pool's memory: its new segment still
        // reports the pool's id); later requests routed to it are refused.
        let begun = self.pools.begun.iter().any(|(b, _)| *b == id);
        if !begun {
            if self.blocks.iter().any(|(_, b)| b.pool == k) {
                self.pools.pool_mut(k).orphaned = true;
            } else {
                self.pools.clear_slot(k);
            }
        }
    }

    /// The freeable pool `id`'s use count, checked to be 0 (PyTorch's assertion in
    /// `release_cached_blocks`).
    pub(crate) fn freeable_slot(&self, id: MempoolId) -> Result<u32> {
        let k = self.pool_slot(id)?;
        let uc = self.pools.pool(k).use_count;
        if uc != 0 {
            return Err(PoolError::FreeableInUse { id, use_count: uc }.into());
        }
        Ok(k)
    }

    /// torch 2.7's `insert_events_deferred_until_no_capture`: records the events of frees made
    /// while a pool was begun, without the streams recorded during that time (their work is
    /// part of the "capture"); a block left with none is free at once.
    #[cold]
    pub(crate) fn insert_deferred_events(&mut self) -> Result<()> {
        let deferred = std::mem::take(&mut self.pools.deferred);
        for id in deferred {
            if let Some(during) = self.pools.capture_stream_uses.remove(&id) {
                self.blocks
                    .get_mut(id)
                    .stream_uses
                    .retain(|s| !during.contains(s));
            }
            self.insert_events(id)?;
            if self.blocks.get(id).event_count == 0 {
                self.free_block(id);
            }
        }
        Ok(())
    }
}
