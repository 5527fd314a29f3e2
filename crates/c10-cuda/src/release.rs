//! Returning memory: stream events, empty_cache, oversize release and garbage collection.
//!
//! PyTorch's `process_events`, `synchronize_and_free_events`, `release_block`,
//! `release_blocks`, `release_cached_blocks`, `release_available_cached_blocks` and
//! `garbage_collect_cached_blocks`, as `impl` blocks of [`DeviceCachingAllocator`].

use crate::accounting::DeviceCall;
use crate::allocator::{DeviceCachingAllocator, Params};
use crate::block::{BlockId, SizeKey};
use crate::device::DeviceMemory;
use crate::error::Result;
use crate::pool_table::DEFAULT_SLOT;

impl<D: DeviceMemory> DeviceCachingAllocator<D> {
    /// Releases every cached block that is a whole segment back to the device, after waiting
    /// for all outstanding stream events (PyTorch's `emptyCache`). Expandable segments unmap
    /// their wholly free pages. Segments with a live block stay: that is "reserved but
    /// unallocated" memory.
    ///
    /// # Errors
    /// [`crate::Error::Device`] when synchronizing or freeing fails.
    ///
    /// Private pools: the segments of pools released to use count 0 are freed too (and a pool
    /// left with none is forgotten); those of pools in use are kept. Under torch 2.7's rules a
    /// begun pool counts as a CUDA graph capture, and this fails with
    /// [`crate::private_pool::PoolError::CaptureUnderway`] (nothing freed); under 2.15's it
    /// frees the default pools' segments and leaves the begun pool's.
    pub fn empty_cache(&mut self) -> Result<()> {
        self.release_cached_blocks(None).map(drop)
    }

    /// Frees blocks whose stream events have completed, per stream in FIFO order, stopping at
    /// the first incomplete event of each stream (PyTorch's `process_events`).
    #[inline(always)]
    pub(crate) fn process_events(&mut self) -> Result<()> {
        // No outstanding event and no deferred block, tested together.
        if (self.events.streams_waiting() | self.pools.deferred.len()) == 0 {
            return Ok(());
        }
        self.process_outstanding_events()
    }

    /// [`Self::process_events`] with events or deferred frees outstanding; brings
    /// [`Self::plain`] up to date after, whatever happened.
    #[cold]
    #[inline(never)]
    fn process_outstanding_events(&mut self) -> Result<()> {
        let processed = self.process_events_now();
        self.refresh_plain();
        processed
    }

    fn process_events_now(&mut self) -> Result<()> {
        if self.capture_underway() {
            // torch 2.7: no event queries while a pool (a "capture") is begun.
            return Ok(());
        }
        if !self.pools.deferred.is_empty() {
            self.insert_deferred_events()?;
        }
        for stream in self.events.streams() {
            while let Some((event, id)) = self.events.front(stream) {
                if !self.device.query_event(event)? {
                    break;
                }
                self.events.pop_front(stream);
                self.device.destroy_event(event);
                self.complete_event(id);
            }
        }
        Ok(())
    }

    fn complete_event(&mut self, id: BlockId) {
        let b = self.blocks.get_mut(id);
        b.event_count -= 1;
        if b.event_count == 0 {
            self.free_block(id);
        }
    }

    /// Waits for every outstanding event and frees the blocks they held
    /// (PyTorch's `synchronize_and_free_events`; counts `num_sync_all_streams`).
    ///
    /// With `pool`, only the events of that private pool's blocks (torch 2.15's
    /// `synchronize_and_free_events(context, pool)`). Under torch 2.7's rules a begun pool is a
    /// capture: this fails (after counting, as PyTorch's assertion does); else the events of
    /// frees deferred during the "capture" are recorded first.
    pub(crate) fn synchronize_and_free_events(&mut self, pool: Option<u32>) -> Result<()> {
        let synchronized = self.synchronize_events_now(pool);
        self.refresh_plain();
        synchronized
    }

    /// [`Self::synchronize_and_free_events`] before [`Self::plain`] is brought up to date.
    fn synchronize_events_now(&mut self, pool: Option<u32>) -> Result<()> {
        self.accounting.kept_mut().num_sync_all_streams += 1;
        if self.capture_underway() {
            return Err(crate::pool_types::PoolError::CaptureUnderway {
                begun: self.pools.begun.len(),
            }
            .into());
        }
        if !self.pools.deferred.is_empty() {
            self.insert_deferred_events()?;
        }
        for (stream, event, id) in self.events.take_all() {
            if let Some(k) = pool {
                if self.blocks.get(id).pool != k {
                    self.events.push(stream, event, id);
                    continue;
                }
            }
            self.device.synchronize_event(event)?;
            self.device.destroy_event(event);
            self.complete_event(id);
        }
        Ok(())
    }

    /// `cudaFree`s a free block that is a whole segment (PyTorch's `release_block`).
    /// Returns false (and does nothing) for a block that is part of a split segment.
    pub(crate) fn release_block(&mut self, id: BlockId) -> Result<bool> {
        let b = self.blocks.get(id);
        debug_assert!(b.expandable.is_none() && b.is_idle());
        if b.is_split() {
            return Ok(false);
        }
        let (ptr, size, stream, small, pool) = (b.ptr, b.size, b.stream, b.small, b.pool);
        let key = SizeKey::of(id, b);
        self.device.free(ptr, size)?;
        self.block_pool_mut(pool, small).blocks.remove(&key);
        self.blocks.remove(id);
        self.account(DeviceCall::Free, pool, small, ptr, size, stream)?;
        Ok(true)
    }

    /// Frees every whole-segment free block of a pool and unmaps the free pages of expandable
    /// segments (PyTorch's `release_blocks`).
    fn release_blocks(&mut self, pool: u32, small: bool) -> Result<()> {
        let keys: Vec<SizeKey> = self.block_pool_mut(pool, small).blocks.iter().collect();
        let mut to_unmap = Vec::new();
        for key in keys {
            let b = self.blocks.get(key.id);
            if b.expandable.is_some() {
                to_unmap.push(key.id);
            } else if !b.is_split() {
                self.release_block(key.id)?;
            }
        }
        for id in to_unmap {
            let id = self.unmap_block(id)?;
            let b = self.blocks.get(id);
            if !b.mapped && !b.is_split() {
                self.release_expandable_segment(id)?;
            }
        }
        // Segments reserved for a request whose pages could not be mapped were never mapped,
        // so the loop above never sees them (PyTorch leaks them: each failing request larger
        // than every segment's free room reserves 9/8 of the device in address space, until
        // the reservation itself fails). Release those wholly unmapped segments too
        // (`Fixes::release_unmapped_segments`).
        if !self.rules.fixes.release_unmapped_segments {
            return Ok(());
        }
        let never_mapped: Vec<BlockId> = self
            .block_pool(pool, small)
            .unmapped
            .iter()
            .filter(|k| !self.blocks.get(k.id).is_split())
            .map(|k| k.id)
            .collect();
        for id in never_mapped {
            self.release_expandable_segment(id)?;
        }
        Ok(())
    }

    /// Synchronizes all events, then releases every cached whole segment of both default pools
    /// and of every freeable private pool, forgetting a freeable pool left with no segment
    /// (PyTorch's `release_cached_blocks(context, mempool_id)`). With `only = Some(id)`: that
    /// private pool only, if it is freeable, after its own blocks' events.
    pub(crate) fn release_cached_blocks(
        &mut self,
        only: Option<crate::pool_types::MempoolId>,
    ) -> Result<bool> {
        if only.is_none() {
            self.synchronize_and_free_events(None)?;
            self.release_blocks(DEFAULT_SLOT, false)?;
            self.release_blocks(DEFAULT_SLOT, true)?;
        }
        if self.pools.is_empty() {
            return Ok(true);
        }
        for id in self.freeable_pools() {
            if let Some(want) = only {
                if want != id {
                    continue;
                }
                let k = self.pools.slot_of(id);
                self.synchronize_and_free_events(k)?;
            }
            let k = self.freeable_slot(id)?;
            self.release_blocks(k, true)?;
            self.release_blocks(k, false)?;
            self.forget_pool_if_empty(id);
        }
        if only.is_none() {
            self.release_orphans()?;
        }
        Ok(true)
    }

    /// Global `empty_cache`: releases the cached segments of orphaned slots (see
    /// [`crate::private_pool::PrivatePools::orphans`]) and frees a slot left with no block. A deliberate difference:
    /// PyTorch keeps such blocks in the erased pool's memory for good (they are never released,
    /// and a pool made later at the same address can be served from them).
    fn release_orphans(&mut self) -> Result<()> {
        for k in self.pools.orphans() {
            self.release_blocks(k, true)?;
            self.release_blocks(k, false)?;
            if !self.blocks.iter().any(|(_, b)| b.pool == k) {
                self.pools.clear_slot(k);
            }
        }
        Ok(())
    }

    /// With `max_split_size` set: frees the smallest oversize cached block that covers the
    /// request, or else the largest oversize blocks until enough is freed
    /// (PyTorch's `release_available_cached_blocks`). Skips expandable blocks
    /// (pytorch#123548).
    pub(crate) fn release_available_cached_blocks(&mut self, p: &Params) -> Result<bool> {
        let max_split = self.config.max_split_size_or_max();
        if max_split == usize::MAX {
            return Ok(false);
        }
        let key_size = p.size.max(max_split);
        let pool = self.block_pool(p.pool, p.small);
        let hit = pool.blocks.lower_bound(p.stream, key_size);
        match hit {
            Some(k) if self.blocks.get(k.id).expandable.is_none() => self.release_block(k.id),
            _ => {
                // No single block is large enough: free oversize blocks from the largest down.
                let candidates: Vec<SizeKey> = pool
                    .blocks
                    .range_below_rev(p.stream, key_size)
                    .take_while(|k| k.size >= max_split)
                    .collect();
                let mut released = 0usize;
                for k in candidates {
                    if released >= key_size {
                        break;
                    }
                    if self.blocks.get(k.id).expandable.is_none() && self.release_block(k.id)? {
                        released += k.size;
                    }
                }
                Ok(released >= key_size)
            }
        }
    }

    /// Age-based release of cached large-pool segments when reserved memory exceeds
    /// `garbage_collection_threshold * allowed` (PyTorch's `garbage_collect_cached_blocks`).
    /// Only called with a memory fraction set; does not synchronize.
    pub(crate) fn garbage_collect_cached_blocks(&mut self) -> Result<()> {
        let Some(allowed) = self.accounting.allowed_memory_maximum else {
            return Ok(());
        };
        let threshold = (self.config.garbage_collection_threshold * allowed as f64) as usize;
        let reserved = self.reserved_bytes();
        if reserved <= threshold {
            return Ok(());
        }
        let target = reserved - threshold;
        let large = self.pools.block_pool(DEFAULT_SLOT, false);
        let now = large.get_free_blocks_call_count;
        let age = |b: &crate::block::Block| now - b.gc_count_base;
        let mut total_age: u64 = 0;
        let mut freeable: u64 = 0;
        for k in large.blocks.iter() {
            let b = self.blocks.get(k.id);
            if !b.is_split() {
                total_age += age(b);
                freeable += 1;
            }
        }
        if freeable == 0 {
            return Ok(());
        }
        let mut reclaimed = 0usize;
        let mut block_freed = true;
        while reclaimed < target && block_freed && freeable > 0 {
            let age_threshold = total_age as f64 / freeable as f64;
            block_freed = false;
            let keys: Vec<SizeKey> = self
                .pools
                .block_pool(DEFAULT_SLOT, false)
                .blocks
                .iter()
                .collect();
            for k in keys {
                let b = self.blocks.get(k.id);
                if !b.is_split() && b.expandable.is_none() && age(b) as f64 >= age_threshold {
                    let a = age(b);
                    if self.release_block(k.id)? {
                        block_freed = true;
                        reclaimed += k.size;
                        total_age -= a;
                        freeable -= 1;
                    }
                }
            }
        }
        Ok(())
    }
}
