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

/// One shard of the map of tracked blocks: address -> what it serves and where it is.
#[repr(align(128))]
#[derive(Default)]
struct Tracked(Mutex<HashMap<DevicePtr, (Key, State), FxBuildHasher>>);

/// What a cached block serves: the same device, stream and requested size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Key {
    pub device: u8,
    pub stream: StreamId,
    pub size: usize,
}

/// A tracked block: handed out in contended mode (`Owned`), or waiting in a slot (`Cached`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Owned,
    Cached,
}

/// One thread's slot, on its own cache lines.
#[repr(align(128))]
#[derive(Default)]
struct Slot {
    /// Operations left in contended mode (0: not contended); read without the lock.
    contended: AtomicU32,
    /// The blocks waiting here.
    free: Mutex<Vec<(Key, DevicePtr)>>,
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

/// The per-thread caches of one front.
pub(crate) struct ThreadCaches {
    slots: Box<[Slot]>,
    /// Tracked blocks by address (every block handed out in contended mode and not freed since,
    /// and every block waiting in a slot).
    tracked: Box<[Tracked]>,
    /// Number of tracked blocks: while 0, frees and `record_stream` skip the map.
    count: AtomicUsize,
    /// Slots in contended mode: while 0, allocations skip the slots.
    contended_slots: AtomicUsize,
    /// History or trace trackers on: no caching at all.
    bypass: AtomicBool,
}

static NEXT_SLOT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static SLOT_INDEX: usize = NEXT_SLOT.fetch_add(1, Ordering::Relaxed) % SLOTS;
}

impl ThreadCaches {
    pub(crate) fn new() -> Self {
        ThreadCaches {
            slots: (0..SLOTS).map(|_| Slot::default()).collect(),
            tracked: (0..SHARDS).map(|_| Tracked::default()).collect(),
            count: AtomicUsize::new(0),
            contended_slots: AtomicUsize::new(0),
            bypass: AtomicBool::new(false),
        }
    }

    fn slot(&self) -> &Slot {
        &self.slots[SLOT_INDEX.with(|i| *i)]
    }

    fn shard(&self, ptr: DevicePtr) -> &Mutex<HashMap<DevicePtr, (Key, State), FxBuildHasher>> {
        &self.tracked[((ptr >> 9) as usize) % SHARDS].0
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

    /// Whether a free or `record_stream` must consult the map.
    #[inline(always)]
    pub(crate) fn tracking(&self) -> bool {
        self.count.load(Ordering::Relaxed) != 0
    }

    /// A failed `try_lock`: the calling thread enters contended mode.
    pub(crate) fn contended(&self) {
        if self.bypass.load(Ordering::Relaxed) {
            return;
        }
        let slot = self.slot();
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

    /// Takes every block out of `slot` (and out of the map).
    fn drain(&self, slot: &Slot) -> Vec<(Key, DevicePtr)> {
        let blocks = std::mem::take(&mut *slot.free.lock());
        for (_, ptr) in &blocks {
            if self.shard(*ptr).lock().remove(ptr).is_some() {
                self.count.fetch_sub(1, Ordering::Relaxed);
            }
        }
        blocks
    }

    /// Every slot's blocks, to free to the allocator (`empty_cache`, out-of-memory retry).
    pub(crate) fn drain_all(&self) -> Vec<(Key, DevicePtr)> {
        self.slots.iter().flat_map(|s| self.drain(s)).collect()
    }

    /// An allocation in contended mode: a waiting block of the same key, if any, and the blocks
    /// to free to the allocator if contended mode just ended.
    pub(crate) fn take(&self, key: Key) -> (Option<DevicePtr>, Vec<(Key, DevicePtr)>) {
        let slot = self.slot();
        if slot.contended.load(Ordering::Relaxed) == 0 {
            return (None, Vec::new());
        }
        let found = {
            let mut free = slot.free.lock();
            free.iter()
                .rposition(|(k, _)| *k == key)
                .map(|i| free.swap_remove(i).1)
        };
        if let Some(ptr) = found
            && let Some(entry) = self.shard(ptr).lock().get_mut(&ptr)
        {
            entry.1 = State::Owned;
        }
        (found, self.tick(slot))
    }

    /// A block the allocator just handed out for `key`: tracked when the caller is in
    /// contended mode, so that its free may keep it.
    pub(crate) fn handed_out(&self, ptr: DevicePtr, key: Key) {
        if key.size > MAX_SIZE || self.slot().contended.load(Ordering::Relaxed) == 0 {
            return;
        }
        if self
            .shard(ptr)
            .lock()
            .insert(ptr, (key, State::Owned))
            .is_none()
        {
            self.count.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A free while blocks are tracked (see [`ThreadCaches::tracking`]): what to do with it,
    /// and the blocks to free to the allocator if the caller's contended mode just ended.
    pub(crate) fn free(&self, ptr: DevicePtr) -> (Freed, Vec<(Key, DevicePtr)>) {
        let slot = self.slot();
        let contended = slot.contended.load(Ordering::Relaxed) != 0;
        let outcome = {
            let mut shard = self.shard(ptr).lock();
            match shard.get(&ptr).copied() {
                None => Freed::Allocator,
                Some((_, State::Cached)) => Freed::Twice,
                Some((key, State::Owned)) => {
                    let mut free = slot.free.lock();
                    if contended && free.len() < MAX_CACHED && !self.bypass.load(Ordering::Relaxed)
                    {
                        free.push((key, ptr));
                        shard.insert(ptr, (key, State::Cached));
                        Freed::Cached
                    } else {
                        shard.remove(&ptr);
                        self.count.fetch_sub(1, Ordering::Relaxed);
                        Freed::Allocator
                    }
                }
            }
        };
        let done = if contended {
            self.tick(slot)
        } else {
            Vec::new()
        };
        (outcome, done)
    }

    /// `record_stream` of a tracked block: it must reach the allocator's free (which records
    /// the stream's event), so it is no longer tracked. False when it waits in a slot (the user
    /// freed it: an unknown pointer).
    pub(crate) fn untrack(&self, ptr: DevicePtr) -> bool {
        let mut shard = self.shard(ptr).lock();
        match shard.get(&ptr) {
            Some((_, State::Cached)) => false,
            Some((_, State::Owned)) => {
                shard.remove(&ptr);
                self.count.fetch_sub(1, Ordering::Relaxed);
                true
            }
            None => true,
        }
    }
}
