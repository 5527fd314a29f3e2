//! Blocks, the block arena and the free-block pools (PyTorch's `Block` and `BlockPool`).
//!
//! A segment (one `cudaMalloc`, or one expandable virtual range) is tiled by blocks linked
//! through `prev`/`next` in address order. Blocks live in an arena and are named by [`BlockId`]
//! instead of raw pointers. A pool keeps its free, mapped blocks ordered by
//! `(stream, size, rank, address)` for best fit (`rank` is the segment's registration counter
//! under torch 2.15's rules, 0 under 2.7's), and (for expandable segments) its unmapped blocks
//! ordered by `(stream, address)`.

use std::num::NonZeroU32;

use crate::device::{DevicePtr, StreamId};

/// Index of a block in the [`BlockArena`]. Ids are reused after a block is deleted.
///
/// Held as the index plus one, so that `Option<BlockId>` (a block's `prev` and `next`) is 4
/// bytes in one register, `None` being 0; [`BlockId::new`] and [`BlockId::raw`] convert. The
/// order is the index's.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct BlockId(NonZeroU32);

impl BlockId {
    /// The id of slot `index` (below `u32::MAX`).
    #[inline(always)]
    pub(crate) const fn new(index: u32) -> BlockId {
        match NonZeroU32::new(index.wrapping_add(1)) {
            Some(n) => BlockId(n),
            None => panic!("block index out of range"),
        }
    }

    /// The slot index.
    #[inline(always)]
    pub(crate) const fn raw(self) -> u32 {
        self.0.get() - 1
    }
}

impl std::fmt::Debug for BlockId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BlockId({})", self.raw())
    }
}

/// One block of device memory (PyTorch's `Block`).
#[derive(Clone, Debug)]
pub(crate) struct Block {
    /// Start address.
    pub(crate) ptr: DevicePtr,
    /// Size in bytes (a multiple of 512).
    pub(crate) size: usize,
    /// Bytes the user asked for when this block was last allocated (unrounded).
    pub(crate) requested_size: usize,
    /// The owner's tag of an allocated block ([`crate::DeviceCachingAllocator::set_block_tag`]),
    /// cleared when the block is freed; no PyTorch counterpart.
    pub(crate) tag: Option<u64>,
    /// The allocation stream: only requests on this stream may use the block.
    pub(crate) stream: StreamId,
    /// Whether the block belongs to the small pool.
    pub(crate) small: bool,
    /// Handed out to a user and not yet freed.
    pub(crate) allocated: bool,
    /// Backed by physical memory (always true outside expandable segments).
    pub(crate) mapped: bool,
    /// The neighbour at lower addresses in the same segment.
    pub(crate) prev: Option<BlockId>,
    /// The neighbour at higher addresses in the same segment.
    pub(crate) next: Option<BlockId>,
    /// Outstanding stream events that must complete before the block is really free.
    pub(crate) event_count: u32,
    /// Streams other than `stream` that used the block (`record_stream`); usually none (an
    /// empty `Vec` allocates nothing).
    pub(crate) stream_uses: Vec<StreamId>,
    /// The pool's search counter when the block last entered the pool (for GC ages).
    pub(crate) gc_count_base: u64,
    /// The expandable segment this block belongs to, if any.
    pub(crate) expandable: Option<u32>,
    /// Orders equal-size free blocks before their address: the registration counter of the
    /// block's segment under torch 2.15's rules (PyTorch's `registration_counter`: each new
    /// segment takes the next value, blocks split from it keep it), 0 under 2.7's.
    pub(crate) rank: u64,
    /// The slot of the pool table the block's segment belongs to: 0 for the default pools, `k`
    /// for a private pool (PyTorch's `Block::pool`, pointing at the default pools' or a
    /// `PrivatePool`'s `BlockPool`).
    pub(crate) pool: u32,
    /// In use in the [`BlockArena`] (false for a deleted block's slot awaiting reuse).
    live: bool,
}

impl Block {
    #[inline(always)]
    pub(crate) fn new(ptr: DevicePtr, size: usize, stream: StreamId, small: bool) -> Self {
        Block {
            ptr,
            size,
            requested_size: 0,
            tag: None,
            stream,
            small,
            allocated: false,
            mapped: true,
            prev: None,
            next: None,
            event_count: 0,
            stream_uses: Vec::new(),
            gc_count_base: 0,
            expandable: None,
            rank: 0,
            pool: 0,
            live: true,
        }
    }

    /// A new block at `[ptr, ptr + size)` cut from `self`'s segment: it inherits what belongs
    /// to the segment (the stream, the small or large pool, the pool slot, the expandable
    /// segment and the rank) and the mapping state of the range it was cut from; the rest is a
    /// new block's (free, no events, no links: [`BlockArena::splice`] links it). The one place
    /// a split decides what a piece inherits (PyTorch makes the piece with its segment's stream
    /// and pool and copies `expandable_segment_` and `registration_counter`).
    #[inline(always)]
    pub(crate) fn piece(&self, ptr: DevicePtr, size: usize) -> Self {
        Block {
            mapped: self.mapped,
            expandable: self.expandable,
            rank: self.rank,
            pool: self.pool,
            ..Block::new(ptr, size, self.stream, self.small)
        }
    }

    /// Part of a segment that has other blocks (PyTorch's `is_split`).
    #[inline(always)]
    pub(crate) fn is_split(&self) -> bool {
        self.prev.is_some() || self.next.is_some()
    }

    /// Free and not waiting for stream events: may be handed out or merged.
    #[inline(always)]
    pub(crate) fn is_idle(&self) -> bool {
        // No events and no stream uses, tested together.
        !self.allocated && (self.event_count as usize | self.stream_uses.len()) == 0
    }

    /// [`Self::is_idle`]; `PLAIN`: no stream event is outstanding and no free deferred (the
    /// allocator's `plain`), so a block that is not allocated has no events and no stream
    /// uses (a free takes them), and only `allocated` is read.
    #[inline(always)]
    pub(crate) fn is_idle_in<const PLAIN: bool>(&self) -> bool {
        if PLAIN {
            debug_assert!(self.allocated || self.is_idle());
            !self.allocated
        } else {
            self.is_idle()
        }
    }
}

/// The arena owning every block of one device allocator. Deleted slots are chained through
/// their `next` field for reuse.
#[derive(Debug, Default)]
pub(crate) struct BlockArena {
    slots: Vec<Block>,
    /// The most recently deleted slot, whose `next` names the one deleted before it.
    free: Option<BlockId>,
}

impl BlockArena {
    /// An empty arena with room for `n` blocks.
    pub(crate) fn with_capacity(n: usize) -> Self {
        BlockArena {
            slots: Vec::with_capacity(n),
            free: None,
        }
    }

    #[inline(always)]
    pub(crate) fn insert(&mut self, mut block: Block) -> BlockId {
        block.live = true;
        match self.free {
            Some(id) => {
                self.free = self.slot_mut(id).next;
                let slot = self.slot_mut(id);
                // A deleted slot holds nothing to drop: `remove` emptied its `stream_uses`.
                debug_assert!(slot.stream_uses.capacity() == 0);
                std::mem::forget(std::mem::replace(slot, block));
                id
            }
            None => {
                self.slots.push(block);
                BlockId::new((self.slots.len() - 1) as u32)
            }
        }
    }

    /// Inserts `block` between `before` and `after` in its segment's list and returns its id
    /// (PyTorch's `Block::splice`): `before`'s `next` and `after`'s `prev` name it.
    #[inline(always)]
    pub(crate) fn splice(
        &mut self,
        mut block: Block,
        before: Option<BlockId>,
        after: Option<BlockId>,
    ) -> BlockId {
        debug_assert!(before.is_none_or(|b| self.get(b).next == after));
        debug_assert!(after.is_none_or(|a| self.get(a).prev == before));
        block.prev = before;
        block.next = after;
        let id = self.insert(block);
        if let Some(b) = before {
            self.get_mut(b).next = Some(id);
        }
        if let Some(a) = after {
            self.get_mut(a).prev = Some(id);
        }
        id
    }

    /// Cuts an allocated block of `size` bytes (`requested` bytes asked for) off the low end of
    /// free block `src`, which keeps the rest (its id, `size` bytes fewer, starting `size` bytes
    /// higher): the new block is [`Self::splice`] of `src.piece(src.ptr, size)` made allocated,
    /// linked between `src`'s `prev` and `src` (PyTorch's split in `alloc_found_block`, the
    /// remainder keeping the found block's place). Returns the new block's id and the
    /// remainder. A reused slot held a deleted block, which was idle (no tag, no events, no
    /// stream uses: `remove` is only given idle blocks), so only the fields that differ from a
    /// piece's are written there; debug builds compare the slot with the piece. The slots are
    /// borrowed once for the whole cut, so their base address is read once. `PLAIN`: no
    /// expandable segment was ever made (the allocator's `plain`), so every block, and every
    /// deleted slot, is mapped and outside them: those two fields are neither read nor written.
    #[inline(always)]
    pub(crate) fn split_off_low<const PLAIN: bool>(
        &mut self,
        src: BlockId,
        size: usize,
        requested: usize,
    ) -> (BlockId, &mut Block) {
        debug_assert!(size < self.get(src).size, "a split leaves a remainder");
        let Some(id) = self.free else {
            let s = self.get(src);
            let mut block = s.piece(s.ptr, size);
            block.allocated = true;
            block.requested_size = requested;
            let before = s.prev;
            let id = self.splice(block, before, Some(src));
            let r = self.get_mut(src);
            r.ptr += size as u64;
            r.size -= size;
            return (id, r);
        };
        #[cfg(debug_assertions)]
        let expected = {
            let s = self.get(src);
            let mut b = s.piece(s.ptr, size);
            (b.allocated, b.requested_size, b.prev, b.next) = (true, requested, s.prev, Some(src));
            format!("{b:?}")
        };
        let (i, j) = (id.raw() as usize, src.raw() as usize);
        debug_assert!(i < self.slots.len() && j < self.slots.len() && i != j);
        self.free = self.slot_mut(id).next;
        let slots = self.slots.as_mut_slice();
        // SAFETY: `j < slots.len()`: `src` came from this arena (see `get`).
        let s = unsafe { slots.get_unchecked(j) };
        // What a piece inherits (`Block::piece`).
        let (ptr, stream, small, rank, pool, before) =
            (s.ptr, s.stream, s.small, s.rank, s.pool, s.prev);
        let (mapped, expandable) = if PLAIN {
            debug_assert!(s.mapped && s.expandable.is_none());
            (true, None)
        } else {
            (s.mapped, s.expandable)
        };
        // SAFETY: `i < slots.len()`: the free list holds ids of this arena's deleted slots.
        let slot = unsafe { slots.get_unchecked_mut(i) };
        debug_assert!(!slot.live && slot.tag.is_none() && slot.event_count == 0);
        debug_assert!(slot.stream_uses.capacity() == 0);
        slot.ptr = ptr;
        slot.size = size;
        slot.requested_size = requested;
        slot.stream = stream;
        slot.small = small;
        slot.allocated = true;
        if PLAIN {
            debug_assert!(slot.mapped && slot.expandable.is_none());
        } else {
            slot.mapped = mapped;
            slot.expandable = expandable;
        }
        slot.prev = before;
        slot.next = Some(src);
        slot.gc_count_base = 0;
        slot.rank = rank;
        slot.pool = pool;
        slot.live = true;
        #[cfg(debug_assertions)]
        assert_eq!(format!("{slot:?}"), expected);
        if let Some(b) = before {
            debug_assert!((b.raw() as usize) < slots.len());
            // SAFETY: `b` is a live block's link, an id of this arena (see `get`).
            unsafe { slots.get_unchecked_mut(b.raw() as usize) }.next = Some(id);
        }
        // SAFETY: as above, `j < slots.len()`.
        let r = unsafe { slots.get_unchecked_mut(j) };
        r.ptr += size as u64;
        r.size -= size;
        r.prev = Some(id);
        (id, r)
    }

    /// Deletes a block (its slot is reused by a later insert).
    #[inline(always)]
    pub(crate) fn remove(&mut self, id: BlockId) {
        let free = self.free;
        let slot = self.slot_mut(id);
        debug_assert!(slot.live, "block id refers to a live block");
        slot.live = false;
        // Only idle blocks are deleted (merged away or released), and an idle block's
        // `stream_uses` was taken by `insert_events` (or never pushed to): nothing to drop,
        // as `insert` expects.
        debug_assert!(
            slot.stream_uses.capacity() == 0,
            "deleting a block with stream uses"
        );
        slot.next = free;
        self.free = Some(id);
    }

    #[inline(always)]
    pub(crate) fn get(&self, id: BlockId) -> &Block {
        let i = id.raw() as usize;
        debug_assert!(i < self.slots.len(), "block id {i} not from this arena");
        // SAFETY: `i < self.slots.len()`. Every `BlockId` the allocator holds was returned by
        // `insert` (or `iter`) of this arena, the one place ids are made from slot indices (the
        // free index and the pointer map only hand back ids they were given; the other
        // `BlockId::new(0)`s are search bounds that are never looked up), and `slots` never shrinks:
        // deleted slots stay and are reused. A stale id (of a deleted block) still names a slot
        // in bounds. Debug builds check the bound above and liveness below.
        let b = unsafe { self.slots.get_unchecked(i) };
        debug_assert!(b.live, "block id refers to a live block");
        b
    }

    #[inline(always)]
    pub(crate) fn get_mut(&mut self, id: BlockId) -> &mut Block {
        let b = self.slot_mut(id);
        debug_assert!(b.live, "block id refers to a live block");
        b
    }

    /// The slot of `id`, live or deleted, mutable.
    #[inline(always)]
    fn slot_mut(&mut self, id: BlockId) -> &mut Block {
        let i = id.raw() as usize;
        debug_assert!(i < self.slots.len(), "block id {i} not from this arena");
        // SAFETY: `i < self.slots.len()`, as in `get`: ids come only from this arena's
        // `insert`/`iter` (the free list holds deleted slots' ids) and `slots` never shrinks.
        unsafe { self.slots.get_unchecked_mut(i) }
    }

    /// Every live block with its id, in id order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (BlockId, &Block)> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, b)| b.live)
            .map(|(i, b)| (BlockId::new(i as u32), b))
    }
}

/// Best-fit key of a free block: `(stream, size, rank, address)` (PyTorch's
/// `BlockComparatorSize`; `rank` is [`Block::rank`], 0 for every block under torch 2.7's rules).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct SizeKey {
    pub(crate) stream: StreamId,
    pub(crate) size: usize,
    pub(crate) rank: u64,
    pub(crate) ptr: DevicePtr,
    pub(crate) id: BlockId,
}

impl SizeKey {
    /// The smallest key for `(stream, size)`: a lower bound for best-fit searches.
    #[cfg(test)]
    pub(crate) fn lower(stream: StreamId, size: usize) -> Self {
        SizeKey {
            stream,
            size,
            rank: 0,
            ptr: 0,
            id: BlockId::new(0),
        }
    }

    pub(crate) fn of(id: BlockId, b: &Block) -> Self {
        SizeKey {
            stream: b.stream,
            size: b.size,
            rank: b.rank,
            ptr: b.ptr,
            id,
        }
    }
}

/// Key of an unmapped block: `(stream, address)` (PyTorch's `BlockComparatorAddress`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct AddrKey {
    pub(crate) stream: StreamId,
    pub(crate) ptr: DevicePtr,
    pub(crate) id: BlockId,
}

impl AddrKey {
    pub(crate) fn of(id: BlockId, b: &Block) -> Self {
        AddrKey {
            stream: b.stream,
            ptr: b.ptr,
            id,
        }
    }
}
