//! The pool table: slot 0 holds the default pools, slot `k >= 1` a private pool (PyTorch's
//! `large_blocks` / `small_blocks`, and each `PrivatePool`'s pair of `BlockPool`s), with the
//! state PyTorch keeps about private pools, and the routing of a request to a slot ([`Route`]).
//!
//! A block names its pool by its slot ([`crate::block::Block::pool`]). The allocator's paths
//! index the table by slot and never ask whether it is the default one: what only a private
//! pool has (use count, `cudaMalloc_count`, `no_split`) is its slot's `owner` (PyTorch's
//! `BlockPool::owner_PrivatePool`, null for the default pools).

use std::collections::{BTreeMap, BTreeSet};

use crate::block::{AddrKey, Block, BlockId, SizeKey};
use crate::device::StreamId;
use crate::free_index::FreeIndex;
use crate::hash_order::HashOrder;
use crate::pool_types::{MempoolId, StreamFilter};

/// The slot of the default pools.
pub(crate) const DEFAULT_SLOT: u32 = 0;

/// Where a request goes (PyTorch's `AllocParams::pool`, chosen from `captures_underway`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// The pools of `slot` (the default pools: [`DEFAULT_SLOT`]), with its owner's `no_split`.
    Slot {
        /// The slot.
        slot: u32,
        /// torch 2.15's `no_split` of the private pool (false for the default pools).
        no_split: bool,
    },
    /// A begun private pool that was forgotten meanwhile (it was freeable and emptied while
    /// begun): the request is refused ([`crate::pool_types::PoolError::RoutedToMissingPool`]).
    Missing(MempoolId),
}

/// What only a private pool has (PyTorch's `PrivatePool`, less its `BlockPool`s).
#[derive(Debug)]
pub(crate) struct PrivatePool {
    pub(crate) id: MempoolId,
    /// PyTorch's `use_count`.
    pub(crate) use_count: i64,
    /// PyTorch's `cudaMalloc_count`.
    pub(crate) malloc_count: i64,
    /// torch 2.15's `no_split`.
    pub(crate) no_split: bool,
    /// Forgotten while blocks still name it (see [`PoolTable::orphans`]): no longer counted
    /// in `reserved_bytes_by_private_pools` nor in `cudaMalloc_count`.
    pub(crate) orphaned: bool,
}

/// A slot's two free-block pools, large then small.
fn new_block_pools() -> [BlockPool; 2] {
    [BlockPool::new(usize::MAX), BlockPool::small()]
}

/// The pools of one device allocator and the state PyTorch keeps about private pools.
#[derive(Debug)]
pub(crate) struct PoolTable {
    /// The free-block pools of every slot, two per slot: `2k` the large pool of slot `k`,
    /// `2k + 1` its small pool. Slot 0: the default pools. A forgotten private pool's slot is
    /// reused (or kept, orphaned, while blocks still name it).
    block_pools: Vec<BlockPool>,
    /// The owner of each slot (PyTorch's `owner_PrivatePool`): `None` for the default pools
    /// (slot 0) and for a vacant slot.
    owners: Vec<Option<PrivatePool>>,
    /// PyTorch's `graph_pools`: live private pools by id.
    pub(crate) by_id: BTreeMap<MempoolId, u32>,
    /// PyTorch's `graph_pools_freeable`, in its iteration order.
    pub(crate) freeable: HashOrder,
    /// torch 2.15's `use_on_oom_pools` (ids, whether or not the pool exists now).
    pub(crate) use_on_oom: HashOrder,
    /// PyTorch's `captures_underway`: the begun pools and their filters, in begin order.
    pub(crate) begun: Vec<(MempoolId, StreamFilter)>,
    /// torch 2.7's `needs_events_deferred_until_no_capture`: freed blocks whose events wait
    /// until no pool is begun.
    pub(crate) deferred: Vec<BlockId>,
    /// torch 2.7's `block_to_cudagraph_stream_uses`: streams recorded on a block while a pool
    /// was begun (dropped when its deferred events are recorded).
    pub(crate) capture_stream_uses: BTreeMap<BlockId, Vec<StreamId>>,
}

impl Default for PoolTable {
    fn default() -> Self {
        PoolTable {
            block_pools: Vec::from(new_block_pools()),
            owners: vec![None],
            by_id: BTreeMap::new(),
            freeable: HashOrder::default(),
            use_on_oom: HashOrder::default(),
            begun: Vec::new(),
            deferred: Vec::new(),
            capture_stream_uses: BTreeMap::new(),
        }
    }
}

impl PoolTable {
    /// Where the small or large free-block pool of slot `k` is in the table (`2k`, `2k + 1`).
    #[inline(always)]
    pub(crate) fn index_of(k: u32, small: bool) -> usize {
        (k as usize) << 1 | usize::from(small)
    }

    /// The small or large free-block pool of slot `k` (a slot this table made: the default
    /// slot, or one [`Self::create`] returned, named by a request's route or a block's `pool`).
    ///
    /// Unchecked in release builds, on the allocator's word: every `k` it passes is such a
    /// slot (see [`Self::block_pool_at`]'s `# Safety`). A checked version costs 8 instructions
    /// per warm 512 B pair through register allocation (callgrind, 637 -> 645), so it stays.
    #[inline(always)]
    pub(crate) fn block_pool_mut(&mut self, k: u32, small: bool) -> &mut BlockPool {
        // SAFETY: `index_of(k, small)` of a slot this table made (the allocator names no other
        // slot: a request's route, or the `pool` of a block made in that slot).
        unsafe { self.block_pool_at(Self::index_of(k, small)) }
    }

    /// The free-block pool at index `i` of the table, unchecked (the malloc path's lookup by
    /// the index a request keeps in its `Params`).
    ///
    /// # Safety
    /// `i` must be [`Self::index_of`] a slot this table made. That holds for every slot the
    /// allocator names: `block_pools` is extended by two with every new slot (`default` makes
    /// slot 0, `create` a vacant slot or one past the last) and never shrinks (a forgotten
    /// pool's slot is reused or kept, its pools replaced in place); a request's route and a
    /// block's `pool` are such slots. Debug builds check the bound.
    #[inline(always)]
    pub(crate) unsafe fn block_pool_at(&mut self, i: usize) -> &mut BlockPool {
        debug_assert!(
            i < self.block_pools.len(),
            "pool index {i} not from this table"
        );
        // SAFETY: the caller guarantees `i < self.block_pools.len()` (see `# Safety`).
        unsafe { self.block_pools.get_unchecked_mut(i) }
    }

    /// The small or large free-block pool of slot `k`.
    #[inline(always)]
    pub(crate) fn block_pool(&self, k: u32, small: bool) -> &BlockPool {
        &self.block_pools[Self::index_of(k, small)]
    }

    /// Both free-block pools of slot `k`: `(large, small)`.
    pub(crate) fn block_pools(&self, k: u32) -> (&BlockPool, &BlockPool) {
        (self.block_pool(k, false), self.block_pool(k, true))
    }

    /// The slot number of a live private pool.
    pub(crate) fn slot_of(&self, id: MempoolId) -> Option<u32> {
        self.by_id.get(&id).copied()
    }

    /// Whether slot `k` holds pools: the default slot, or a private pool (live or orphaned).
    pub(crate) fn slot_in_use(&self, k: u32) -> bool {
        k == DEFAULT_SLOT || self.owner(k).is_some()
    }

    /// The private pool of slot `k`; `None` for the default pools and a vacant slot.
    #[inline]
    pub(crate) fn owner(&self, k: u32) -> Option<&PrivatePool> {
        self.owners.get(k as usize).and_then(Option::as_ref)
    }

    /// The private pool of slot `k`, mutable; `None` for the default pools and a vacant slot.
    #[inline]
    pub(crate) fn owner_mut(&mut self, k: u32) -> Option<&mut PrivatePool> {
        self.owners.get_mut(k as usize).and_then(Option::as_mut)
    }

    /// The private pool in slot `k`, which must hold one.
    #[inline]
    pub(crate) fn pool(&self, k: u32) -> &PrivatePool {
        self.owner(k).expect("a block's private pool exists")
    }

    /// The private pool in slot `k`, which must hold one, mutable.
    #[inline]
    pub(crate) fn pool_mut(&mut self, k: u32) -> &mut PrivatePool {
        self.owner_mut(k).expect("a block's private pool exists")
    }

    /// Every slot holding a private pool (live or orphaned), with its number.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u32, &PrivatePool)> {
        self.owners
            .iter()
            .enumerate()
            .filter_map(|(i, p)| p.as_ref().map(|p| (i as u32, p)))
    }

    /// Every slot in use, the default one first, with both its free-block pools.
    pub(crate) fn all_block_pools(&self) -> impl Iterator<Item = (u32, (&BlockPool, &BlockPool))> {
        (0..self.owners.len() as u32)
            .filter(|&k| self.slot_in_use(k))
            .map(|k| (k, self.block_pools(k)))
    }

    /// torch 2.7: `stream` was recorded on block `id` while a pool was begun.
    #[cold]
    pub(crate) fn record_capture_use(&mut self, id: BlockId, stream: StreamId) {
        let uses = self.capture_stream_uses.entry(id).or_default();
        if !uses.contains(&stream) {
            uses.push(stream);
        }
    }

    /// Whether no `use_on_oom` pool id is set (torch 2.15).
    #[inline]
    pub(crate) fn use_on_oom_is_empty(&self) -> bool {
        self.use_on_oom.is_empty()
    }

    /// Whether no private pool exists or ever held a block (the default pools only).
    pub(crate) fn is_empty(&self) -> bool {
        self.owners.iter().all(Option::is_none)
    }

    /// Frees the private slot `k` once no block names it.
    pub(crate) fn clear_slot(&mut self, k: u32) {
        debug_assert_ne!(k, DEFAULT_SLOT);
        self.owners[k as usize] = None;
    }

    /// The orphaned slots, by slot number: pools forgotten (not begun) while blocks still
    /// named them, which only PyTorch's expandable-segment bookkeeping allows (see
    /// [`crate::pool_types::PoolError::NoAllocationCounted`]). The global `empty_cache`
    /// releases their cached segments.
    pub(crate) fn orphans(&self) -> Vec<u32> {
        self.iter()
            .filter(|(_, p)| p.orphaned)
            .map(|(k, _)| k)
            .collect()
    }

    /// The id of the pool in slot `k`, `(0, 0)` for the default pools.
    pub(crate) fn id_of(&self, k: u32) -> MempoolId {
        self.owner(k).map_or(MempoolId::DEFAULT, |p| p.id)
    }

    /// Makes the private pool `id` (use count 1) in a vacant slot; returns the slot.
    pub(crate) fn create(&mut self, id: MempoolId) -> u32 {
        let owner = PrivatePool {
            id,
            use_count: 1,
            malloc_count: 0,
            no_split: false,
            orphaned: false,
        };
        let vacant = self
            .owners
            .iter()
            .skip(1)
            .position(Option::is_none)
            .map(|i| i + 1);
        let k = match vacant {
            Some(i) => {
                self.owners[i] = Some(owner);
                let [large, small] = new_block_pools();
                self.block_pools[2 * i] = large;
                self.block_pools[2 * i + 1] = small;
                i as u32
            }
            None => {
                self.owners.push(Some(owner));
                self.block_pools.extend(new_block_pools());
                self.owners.len() as u32 - 1
            }
        };
        self.by_id.insert(id, k);
        k
    }

    /// The begun pool whose filter accepts an allocation on `stream`: the first begun
    /// (`last_wins`: the last), or none.
    fn begun_for(&self, stream: StreamId, last_wins: bool) -> Option<MempoolId> {
        let hit = if last_wins {
            self.begun.iter().rev().find(|(_, f)| f.accepts(stream))
        } else {
            self.begun.iter().find(|(_, f)| f.accepts(stream))
        };
        hit.map(|(id, _)| *id)
    }

    /// Where an allocation on `stream` goes: the begun pool that accepts it (see
    /// [`Self::begun_for`]), or the default pools.
    #[cold]
    pub(crate) fn route(&self, stream: StreamId, last_wins: bool) -> Route {
        match self.begun_for(stream, last_wins) {
            None => Route::Slot {
                slot: DEFAULT_SLOT,
                no_split: false,
            },
            Some(id) => match self.slot_of(id) {
                Some(k) => Route::Slot {
                    slot: k,
                    no_split: self.pool(k).no_split,
                },
                None => Route::Missing(id),
            },
        }
    }

    /// The begun pool an allocation on `stream` is routed to (for the error of a request
    /// whose pool was forgotten while it was being served).
    pub(crate) fn missing_route(&self, stream: StreamId, last_wins: bool) -> Option<MempoolId> {
        self.begun_for(stream, last_wins)
    }
}

/// A pool of free blocks (PyTorch's `BlockPool`): the small pool or the large pool.
#[derive(Debug)]
pub(crate) struct BlockPool {
    /// Free, mapped blocks in best-fit order.
    pub(crate) blocks: FreeIndex,
    /// Free, unmapped blocks of expandable segments in address order.
    pub(crate) unmapped: BTreeSet<AddrKey>,
    /// Best-fit searches so far (counted only while garbage collection is active).
    pub(crate) get_free_blocks_call_count: u64,
}

impl BlockPool {
    /// An empty pool whose free blocks are usually at most `max_block` bytes (a sizing hint).
    pub(crate) fn new(max_block: usize) -> Self {
        BlockPool {
            blocks: FreeIndex::for_sizes_up_to(max_block),
            unmapped: BTreeSet::new(),
            get_free_blocks_call_count: 0,
        }
    }

    /// An empty small pool: its index's searches are for at most [`crate::sizes::SMALL_SIZE`]
    /// bytes ([`FreeIndex::for_requests_up_to`]).
    pub(crate) fn small() -> Self {
        BlockPool {
            blocks: FreeIndex::for_requests_up_to(crate::sizes::SMALL_SIZE),
            ..BlockPool::new(crate::sizes::SMALL_BUFFER)
        }
    }

    /// Inserts a free mapped block, stamping its GC age base (PyTorch's `insert_into_blocks`).
    #[inline(always)]
    pub(crate) fn insert_into_blocks(&mut self, id: BlockId, b: &mut Block) {
        b.gc_count_base = self.get_free_blocks_call_count;
        self.blocks.insert_absent(SizeKey::of(id, b));
    }

    /// [`Self::insert_into_blocks`] of block `id` (now `b`) that is still in the pool under
    /// `old`: the remainder of a split that kept the split block's id and slot in the index
    /// (PyTorch erases the block, then inserts the remainder).
    #[inline(always)]
    pub(crate) fn rekey_in_blocks(&mut self, old: &SizeKey, id: BlockId, b: &mut Block) {
        b.gc_count_base = self.get_free_blocks_call_count;
        self.blocks.rekey(old, &SizeKey::of(id, b));
    }
}
