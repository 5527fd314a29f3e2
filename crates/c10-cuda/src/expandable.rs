//! Expandable segments (`expandable_segments:True`): one virtual range per (stream, pool),
//! physical pages mapped on demand (PyTorch's `ExpandableSegment`, `map_block`,
//! `unmap_block`, `try_allocate_expandable_block`).
//!
//! Pages are 2 MiB in the small pool and 20 MiB in the large pool. A segment reserves 9/8 of
//! the device's memory as address space so pages can be mapped past ranges that stay in use.

use crate::accounting::DeviceCall;
use crate::allocator::{DeviceCachingAllocator, Params};
use crate::block::{AddrKey, Block, BlockId, SizeKey};
use crate::device::{DeviceMemory, StreamId};
use crate::error::Result;
use crate::expandable_segment::ExpandableSegment;
use crate::sizes::{LARGE_BUFFER, SMALL_BUFFER};

impl<D: DeviceMemory> DeviceCachingAllocator<D> {
    fn allocatable(&self, id: Option<BlockId>) -> bool {
        id.is_some_and(|id| self.blocks.get(id).is_idle())
    }

    /// Finds an unmapped range (possibly preceded by a free mapped block) with room for `size`
    /// bytes on `stream`; `None` when a new segment is needed (the search of PyTorch's
    /// `find_expandable_block`).
    pub(crate) fn find_expandable_candidate(
        &self,
        stream: StreamId,
        small: bool,
        size: usize,
        pool: u32,
    ) -> Option<BlockId> {
        let pool = self.block_pool(pool, small);
        let lower = AddrKey {
            stream,
            ptr: 0,
            id: BlockId::new(0),
        };
        for key in pool.unmapped.range(lower..) {
            if key.stream != stream {
                break;
            }
            let mut c = key.id;
            let prev = self.blocks.get(c).prev;
            if self.allocatable(prev) {
                c = prev.expect("allocatable implies some");
            }
            // Does [c, ...) hold `size` bytes of idle blocks?
            let mut bytes = 0;
            let mut cur = Some(c);
            while bytes < size && self.allocatable(cur) {
                let b = self.blocks.get(cur.expect("allocatable implies some"));
                bytes += b.size;
                cur = b.next;
            }
            if bytes >= size {
                return Some(c);
            }
        }
        None
    }

    /// Bytes [`Self::try_allocate_expandable_block`] would map for `size` bytes starting at
    /// `candidate` (or in a new segment, when `None`): whole pages, as `map_block` maps them.
    pub(crate) fn expandable_bytes_to_map(
        &self,
        candidate: Option<BlockId>,
        small: bool,
        size: usize,
    ) -> usize {
        let page = if small { SMALL_BUFFER } else { LARGE_BUFFER };
        let pages = |bytes: usize| bytes.div_ceil(page) * page;
        let Some(c) = candidate else {
            return pages(size);
        };
        let b = self.blocks.get(c);
        let (mut have, mut need, mut next) = (b.size, 0, b.next);
        if !b.mapped {
            let m = pages(b.size.min(size));
            (have, need) = (m, m);
            if m < b.size {
                next = Some(c); // the unmapped rest of `c` follows
            }
        }
        loop {
            // Mapped pages merge with an idle mapped successor.
            while let Some(n) = next.map(|n| self.blocks.get(n)) {
                if !(n.mapped && n.is_idle()) || have >= size {
                    break;
                }
                have += n.size;
                next = n.next;
            }
            if have >= size {
                return need;
            }
            let Some(n) = next.map(|n| self.blocks.get(n)) else {
                return need;
            };
            let unmapped_left = if next == Some(c) {
                n.size - have
            } else {
                n.size
            };
            let m = pages((size - have).min(unmapped_left));
            need += m;
            have += m;
            if m < unmapped_left {
                return need;
            }
            next = n.next;
        }
    }

    /// Reserves a new expandable segment for `stream`'s pool and returns its one (unmapped)
    /// block (the reservation of PyTorch's `find_expandable_block`).
    fn new_expandable_segment(
        &mut self,
        stream: StreamId,
        small: bool,
        pool: u32,
    ) -> Result<BlockId> {
        let page = if small { SMALL_BUFFER } else { LARGE_BUFFER };
        let address_space = self.accounting.device_total + self.accounting.device_total / 8;
        let pages = address_space.div_ceil(page).max(1);
        let base = self.device.reserve_address_range(pages * page)?;
        let segment = ExpandableSegment {
            base,
            page,
            mapped: vec![false; pages],
        };
        let index = self.blocks.segments.len() as u32;
        let mut block = Block::new(base, segment.size(), stream, small);
        block.mapped = false;
        block.expandable = Some(index);
        block.rank = self.take_registration();
        block.pool = pool;
        self.blocks.segments.push(Some(segment));
        self.plain = false;
        let id = self.blocks.insert(block);
        let key = AddrKey::of(id, self.blocks.get(id));
        self.block_pool_mut(pool, small).unmapped.insert(key);
        Ok(id)
    }

    /// Maps `size` bytes at the start of the unmapped block `id`, merging with free mapped
    /// neighbours (PyTorch's `map_block`). Returns the block id now holding the mapped range,
    /// or `None` when the device is out of memory.
    fn map_block(&mut self, id: BlockId, size: usize) -> Result<Option<BlockId>> {
        let (ptr, block_size, stream, small, seg, bpool) = {
            let b = self.blocks.get(id);
            debug_assert!(!b.mapped && size <= b.size);
            (
                b.ptr,
                b.size,
                b.stream,
                b.small,
                b.expandable.expect("expandable block"),
                b.pool,
            )
        };
        let segment = self.blocks.segments[seg as usize]
            .as_mut()
            .expect("live expandable segment");
        let (mapped_ptr, mapped_size) = segment.map(&self.device, ptr, size)?;
        if mapped_size == 0 {
            return Ok(None);
        }
        debug_assert_eq!(mapped_ptr, ptr);
        let key = AddrKey { stream, ptr, id };
        self.block_pool_mut(bpool, small).unmapped.remove(&key);
        if mapped_size < block_size {
            // to_map -> remaining (unmapped, as `id` still is) -> next
            let b = self.blocks.get(id);
            let (remaining, next) = (
                b.piece(ptr + mapped_size as u64, block_size - mapped_size),
                b.next,
            );
            let rid = self.blocks.splice(remaining, Some(id), next);
            self.blocks.get_mut(id).size = mapped_size;
            let rkey = AddrKey::of(rid, self.blocks.get(rid));
            self.block_pool_mut(bpool, small).unmapped.insert(rkey);
        }
        self.blocks.get_mut(id).mapped = true;
        let prev = self.blocks.get(id).prev;
        self.try_merge_blocks(id, prev);
        let next = self.blocks.get(id).next;
        self.try_merge_blocks(id, next);
        let pool = self.pools.block_pool_mut(bpool, small);
        pool.insert_into_blocks(id, self.blocks.get_mut(id));
        self.account(
            DeviceCall::Map,
            bpool,
            small,
            mapped_ptr,
            mapped_size,
            stream,
        )?;
        Ok(Some(id))
    }

    /// Maps enough pages for a request of `p.size` bytes and returns the free mapped block that
    /// holds them, removed from its pool (PyTorch's `try_allocate_expandable_block`).
    ///
    /// With a memory fraction and [`crate::rules::Fixes::expandable_fraction_limit`], a request
    /// whose pages would take reserved memory past the limit is refused before anything is
    /// reserved or mapped (PyTorch checks only the 2 MiB-rounded request, in `alloc_block`).
    pub(crate) fn try_allocate_expandable_block(&mut self, p: &Params) -> Result<Option<BlockId>> {
        let found = self.find_expandable_candidate(p.stream, p.small, p.size, p.pool);
        if let Some(allowed) = self.accounting.allowed_memory_maximum {
            if self.rules.fixes.expandable_fraction_limit {
                let map = self.expandable_bytes_to_map(found, p.small, p.size);
                if self.reserved_bytes().saturating_add(map) > allowed {
                    return Ok(None);
                }
            }
        }
        let mut candidate = match found {
            Some(c) => c,
            None => {
                let id = self.new_expandable_segment(p.stream, p.small, p.pool)?;
                if self.blocks.get(id).size < p.size
                    && self.rules.version.releases_too_small_new_segment()
                {
                    // torch 2.15: the new segment's address space cannot hold the request.
                    self.release_expandable_segment(id)?;
                    return Ok(None);
                }
                id
            }
        };
        if !self.blocks.get(candidate).mapped {
            let size = self.blocks.get(candidate).size.min(p.size);
            match self.map_block(candidate, size)? {
                Some(id) => candidate = id,
                None => return Ok(None),
            }
        }
        while self.blocks.get(candidate).size < p.size {
            // candidate (free, mapped) -> unmapped -> ...: map more of the unmapped successor.
            let remaining = p.size - self.blocks.get(candidate).size;
            let next = self
                .blocks
                .get(candidate)
                .next
                .expect("an unmapped successor with room was found");
            let size = remaining.min(self.blocks.get(next).size);
            match self.map_block(next, size)? {
                Some(id) => candidate = id,
                None => return Ok(None),
            }
        }
        let key = SizeKey::of(candidate, self.blocks.get(candidate));
        let removed = self.block_pool_mut(p.pool, p.small).blocks.remove(&key);
        debug_assert!(removed);
        Ok(Some(candidate))
    }

    /// Unmaps the whole pages of a free mapped expandable block (PyTorch's `unmap_block`).
    /// Partial pages at either end stay mapped as new free blocks. Returns the id of the block
    /// holding the unmapped range (or `id` unchanged when no whole page was inside).
    pub(crate) fn unmap_block(&mut self, id: BlockId) -> Result<BlockId> {
        let (ptr, size, stream, small, seg, prev, next, bpool) = {
            let b = self.blocks.get(id);
            (
                b.ptr,
                b.size,
                b.stream,
                b.small,
                b.expandable.expect("expandable block"),
                b.prev,
                b.next,
                b.pool,
            )
        };
        let segment = self.blocks.segments[seg as usize]
            .as_mut()
            .expect("live expandable segment");
        let (uptr, usize_) = segment.unmap(&self.device, ptr, size, stream)?;
        if usize_ == 0 {
            return Ok(id);
        }
        let key = SizeKey::of(id, self.blocks.get(id));
        self.block_pool_mut(bpool, small).blocks.remove(&key);
        let before = (uptr - ptr) as usize;
        if before > 0 {
            // prev -> before_free (mapped) -> block
            let bf = self.blocks.get(id).piece(ptr, before);
            let bid = self.blocks.splice(bf, prev, Some(id));
            let pool = self.pools.block_pool_mut(bpool, small);
            pool.insert_into_blocks(bid, self.blocks.get_mut(bid));
        }
        let after = size - before - usize_;
        if after > 0 {
            // block -> after_free (mapped) -> next
            let af = self.blocks.get(id).piece(uptr + usize_ as u64, after);
            let aid = self.blocks.splice(af, Some(id), next);
            let pool = self.pools.block_pool_mut(bpool, small);
            pool.insert_into_blocks(aid, self.blocks.get_mut(aid));
        }
        {
            let b = self.blocks.get_mut(id);
            b.ptr = uptr;
            b.size = usize_;
            b.mapped = false;
        }
        let prev = self.blocks.get(id).prev;
        self.try_merge_blocks(id, prev);
        let next = self.blocks.get(id).next;
        self.try_merge_blocks(id, next);
        let key = AddrKey::of(id, self.blocks.get(id));
        self.block_pool_mut(bpool, small).unmapped.insert(key);
        self.account(DeviceCall::Unmap, bpool, small, uptr, usize_, stream)?;
        Ok(id)
    }

    /// Releases the address range of an expandable segment whose only block is `id`, wholly
    /// unmapped (PyTorch's `release_expandable_segment`).
    pub(crate) fn release_expandable_segment(&mut self, id: BlockId) -> Result<()> {
        let b = self.blocks.get(id);
        let seg = b.expandable.expect("expandable block");
        let key = AddrKey::of(id, b);
        let (small, bpool, size) = (b.small, b.pool, b.size);
        let segment = self.blocks.segments[seg as usize]
            .take()
            .expect("live expandable segment");
        debug_assert_eq!(size, segment.size());
        self.block_pool_mut(bpool, small).unmapped.remove(&key);
        self.blocks.remove(id);
        self.device
            .release_address_range(segment.base, segment.size())?;
        Ok(())
    }
}
