//! Per-thread caches of small blocks that the front ([`crate::CachingAllocator`]) uses only
//! while its device lock is contended, so that threads stop queueing on one mutex.
//!
//! PyTorch's allocator has one mutex per device, and so does ours: through one front, two busy
//! threads get less total work done than one. The rule here keeps every decision of a run
//! without contention PyTorch's and only changes what happens under contention:
//!
//! - The front takes a device lock with `try_lock` first. A thread whose `try_lock` fails
//!   enters *contended mode* for its next [`CONTENDED_OPS`] allocations and frees (a thread is
//!   mapped to one of [`SLOTS`] slots; threads beyond that share slots).
//! - In contended mode, a free of a small block (request of at most [`MAX_SIZE`] bytes) that
//!   the front handed out in contended mode does not reach the allocator: the block stays
//!   allocated there and waits in the slot (at most [`MAX_CACHED`] blocks); an allocation of
//!   the same size on the same device and stream takes it back without any device lock.
//! - When contended mode ends the slot's blocks are freed to the allocator; `empty_cache` and an
//!   out-of-memory retry free every slot's blocks first.
//! - A slot's state (the blocks it handed out, those waiting in it) is touched only by its own
//!   thread on the fast path; a sharded map (address -> slot) serves the slow paths: a block
//!   freed by another thread goes to the allocator (and leaves its slot), a double free of a
//!   waiting block is refused whoever frees it.
//! - Never while memory history is recorded or a trace tracker is attached (every event must
//!   reach them), and never for a block with a recorded stream (`record_stream` takes it out).
//!
//! What a user can see: the front's statistics, summaries, snapshots and cache info give the
//! waiting blocks back first, so the current figures count only the user's blocks; but a block
//! served from a slot is not an allocation of the allocator, so the cumulative counts
//! (`allocation.allocated`, `allocated_bytes.freed`, ...) leave out the allocations and frees
//! served by the slots, and the peaks may miss a moment when blocks waited. The raw allocator
//! behind [`crate::CachingAllocator::with_device`] sees waiting blocks as allocated. A block
//! only ever serves its own stream, as in PyTorch.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};

use parking_lot::Mutex;
use rustc_hash::FxBuildHasher;

use crate::device::{DevicePtr, StreamId};

/// Slots (one per thread, round-robin).
pub const SLOTS: usize = 64;
/// Allocations and frees a thread stays in contended mode after a failed `try_lock`.
pub const CONTENDED_OPS: u32 = 65536;
/// Blocks one slot holds at most.
pub const MAX_CACHED: usize = 16;
/// The largest request a slot caches (PyTorch's small-pool limit, `kSmallSize`: 1 MiB).
pub const MAX_SIZE: usize = 1 << 20;

/// Shards of the map of tracked blocks: many, each on its own cache lines, so that the blocks
/// of two threads (neighbours in one segment) rarely share a shard and a thread's operations
/// touch lines no other core has written.
const SHARDS: usize = 1024;

/// What a cached block serves: the same device, stream and requested size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Key {
    pub device: u8,
    pub stream: StreamId,
    pub size: usize,
}

/// A slot's blocks: those it handed out in contended mode and not freed since (`owned`), and
/// those waiting in it (`free`). Only its own thread (threads, past [`SLOTS`]) touches it on
/// the fast path.
#[derive(Default)]
struct SlotState {
    owned: HashMap<DevicePtr, Key, FxBuildHasher>,
    free: Vec<(Key, DevicePtr)>,
}

/// One thread's slot, on its own cache lines.
#[repr(align(128))]
#[derive(Default)]
struct Slot {
    /// Operations left in contended mode (0: not contended); read without the lock.
    contended: AtomicU32,
    state: Mutex<SlotState>,
}

/// What a free in contended mode did.
pub(crate) enum Freed {
    /// The block waits in the caller's slot.
    Cached,
    /// The block was freed twice (it waits in a slot already).
    Twice,
    /// Not for the slot: free it to the allocator.
    Allocator,
}

/// One shard of the map of tracked blocks (address -> the slot that tracks it), on its own cache
/// lines. Only the slow paths use it: a block's first hand-out in contended mode, a free or
/// `record_stream` of a block by a thread whose slot does not track it, and draining.
#[repr(align(128))]
#[derive(Default)]
struct Shard(Mutex<HashMap<DevicePtr, usize, FxBuildHasher>>);

/// The per-thread caches of one front.
pub(crate) struct ThreadCaches {
    slots: Box<[Slot]>,
    /// Which slot tracks each tracked block.
    tracked: Box<[Shard]>,
    /// Number of tracked blocks: while 0, frees and `record_stream` skip the slots and the map.
    count: AtomicUsize,
    /// Slots in contended mode: while 0, allocations skip the slots.
    contended_slots: AtomicUsize,
    /// Blocks waiting in the slots' free lists: while 0, [`ThreadCaches::any_waiting`] lets
    /// reports and [`crate::CachingAllocator::settle_thread_caches`] skip the slots.
    waiting: AtomicUsize,
    /// History or trace trackers on: no caching at all.
    bypass: AtomicBool,
}

static NEXT_SLOT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static SLOT_INDEX: usize = NEXT_SLOT.fetch_add(1, Ordering::Relaxed) % SLOTS;
}

/// Whether `ptr` waits in `state`'s free list.
fn waiting(state: &SlotState, ptr: DevicePtr) -> bool {
    state.free.iter().any(|&(_, p)| p == ptr)
}

impl ThreadCaches {
    pub(crate) fn new() -> Self {
        ThreadCaches {
            slots: (0..SLOTS).map(|_| Slot::default()).collect(),
            tracked: (0..SHARDS).map(|_| Shard::default()).collect(),
            count: AtomicUsize::new(0),
            contended_slots: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            bypass: AtomicBool::new(false),
        }
    }

    fn slot_index(&self) -> usize {
        SLOT_INDEX.with(|i| *i)
    }

    fn shard(&self, ptr: DevicePtr) -> &Mutex<HashMap<DevicePtr, usize, FxBuildHasher>> {
        &self.tracked[((ptr >> 9) as usize) % SHARDS].0
    }

    /// Forgets a tracked block (no longer owned by, nor waiting in, any slot).
    fn untracked(&self, ptr: DevicePtr) {
        if self.shard(ptr).lock().remove(&ptr).is_some() {
            self.count.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Turns caching off (history or a trace tracker) or on again.
    pub(crate) fn set_bypass(&self, on: bool) {
        self.bypass.store(on, Ordering::Relaxed);
    }

    /// Whether an allocation of `size` bytes should look at the caller's slot.
    #[inline(always)]
    pub(crate) fn may_serve(&self, size: usize) -> bool {
        self.contended_slots.load(Ordering::Relaxed) != 0
            && size <= MAX_SIZE
            && !self.bypass.load(Ordering::Relaxed)
    }

    /// Whether a free or `record_stream` must consult the slots.
    #[inline(always)]
    pub(crate) fn tracking(&self) -> bool {
        self.count.load(Ordering::Relaxed) != 0
    }

    /// Whether any block waits in a slot (a freed block the raw allocator still counts as
    /// allocated). A block another thread is caching at this moment may not be seen yet.
    #[inline(always)]
    pub(crate) fn any_waiting(&self) -> bool {
        self.waiting.load(Ordering::Relaxed) != 0
    }

    /// A failed `try_lock`: the calling thread enters contended mode.
    pub(crate) fn contended(&self) {
        if self.bypass.load(Ordering::Relaxed) {
            return;
        }
        let slot = &self.slots[self.slot_index()];
        if slot.contended.swap(CONTENDED_OPS, Ordering::Relaxed) == 0 {
            self.contended_slots.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts one operation of a thread in contended mode; returns the blocks to free to the
    /// allocator when this was its last one.
    fn tick(&self, slot: &Slot) -> Vec<(Key, DevicePtr)> {
        let before = slot
            .contended
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| v.checked_sub(1));
        if before != Ok(1) {
            return Vec::new();
        }
        self.contended_slots.fetch_sub(1, Ordering::Relaxed);
        self.drain(slot)
    }

    /// Takes every waiting block out of `slot` (and out of the map).
    fn drain(&self, slot: &Slot) -> Vec<(Key, DevicePtr)> {
        let blocks = std::mem::take(&mut slot.state.lock().free);
        if !blocks.is_empty() {
            self.waiting.fetch_sub(blocks.len(), Ordering::Relaxed);
        }
        for (_, ptr) in &blocks {
            self.untracked(*ptr);
        }
        blocks
    }

    /// Every slot's waiting blocks, to free to the allocator (`empty_cache`, out-of-memory
    /// retry, reports).
    pub(crate) fn drain_all(&self) -> Vec<(Key, DevicePtr)> {
        self.slots.iter().flat_map(|s| self.drain(s)).collect()
    }

    /// An allocation in contended mode: a waiting block of the same key, if any, and the blocks
    /// to free to the allocator if contended mode just ended.
    pub(crate) fn take(&self, key: Key) -> (Option<DevicePtr>, Vec<(Key, DevicePtr)>) {
        let slot = &self.slots[self.slot_index()];
        if slot.contended.load(Ordering::Relaxed) == 0 {
            return (None, Vec::new());
        }
        let found = {
            let mut state = slot.state.lock();
            let found = state
                .free
                .iter()
                .rposition(|(k, _)| *k == key)
                .map(|i| state.free.swap_remove(i).1);
            if let Some(ptr) = found {
                self.waiting.fetch_sub(1, Ordering::Relaxed);
                state.owned.insert(ptr, key);
            }
            found
        };
        (found, self.tick(slot))
    }

    /// A block the allocator just handed out for `key`: tracked when the caller is in
    /// contended mode, so that its free may keep it.
    pub(crate) fn handed_out(&self, ptr: DevicePtr, key: Key) {
        let index = self.slot_index();
        let slot = &self.slots[index];
        if key.size > MAX_SIZE || slot.contended.load(Ordering::Relaxed) == 0 {
            return;
        }
        if self.shard(ptr).lock().insert(ptr, index).is_none() {
            self.count.fetch_add(1, Ordering::Relaxed);
        }
        slot.state.lock().owned.insert(ptr, key);
    }

    /// A free while blocks are tracked (see [`ThreadCaches::tracking`]): what to do with it,
    /// and the blocks to free to the allocator if the caller's contended mode just ended.
    pub(crate) fn free(&self, ptr: DevicePtr) -> (Freed, Vec<(Key, DevicePtr)>) {
        let index = self.slot_index();
        let slot = &self.slots[index];
        let contended = slot.contended.load(Ordering::Relaxed) != 0;
        let mine = {
            let mut state = slot.state.lock();
            match state.owned.remove(&ptr) {
                Some(key) => {
                    if contended
                        && state.free.len() < MAX_CACHED
                        && !self.bypass.load(Ordering::Relaxed)
                    {
                        state.free.push((key, ptr));
                        self.waiting.fetch_add(1, Ordering::Relaxed);
                        Some(Freed::Cached)
                    } else {
                        Some(Freed::Allocator)
                    }
                }
                None if waiting(&state, ptr) => Some(Freed::Twice),
                None => None,
            }
        };
        let outcome = match mine {
            Some(Freed::Allocator) => {
                self.untracked(ptr);
                Freed::Allocator
            }
            Some(other) => other,
            // Not this slot's: another slot may track it (a block freed by another thread).
            None => self.release_elsewhere(ptr, index),
        };
        let done = if contended {
            self.tick(slot)
        } else {
            Vec::new()
        };
        (outcome, done)
    }

    /// A free or `record_stream` of `ptr` by a thread whose slot (`mine`) does not track it:
    /// the slot that does stops tracking it (Allocator), or it waits there (Twice).
    fn release_elsewhere(&self, ptr: DevicePtr, mine: usize) -> Freed {
        let owner = self.shard(ptr).lock().get(&ptr).copied();
        let Some(owner) = owner.filter(|&o| o != mine) else {
            return Freed::Allocator;
        };
        let twice = {
            let mut state = self.slots[owner].state.lock();
            state.owned.remove(&ptr).is_none() && waiting(&state, ptr)
        };
        if twice {
            return Freed::Twice;
        }
        self.untracked(ptr);
        Freed::Allocator
    }

    /// `record_stream` of a tracked block: it must reach the allocator's free (which records
    /// the stream's event), so it is no longer tracked. False when it waits in a slot (the user
    /// freed it: an unknown pointer).
    pub(crate) fn untrack(&self, ptr: DevicePtr) -> bool {
        let index = self.slot_index();
        let mine = {
            let mut state = self.slots[index].state.lock();
            if state.owned.remove(&ptr).is_some() {
                Some(true)
            } else if waiting(&state, ptr) {
                Some(false)
            } else {
                None
            }
        };
        match mine {
            Some(true) => {
                self.untracked(ptr);
                true
            }
            Some(false) => false,
            None => !matches!(self.release_elsewhere(ptr, index), Freed::Twice),
        }
    }
}
