//! Routes every storage through c10-cuda's caching allocator on an address-only simulated
//! device, so a simulated run reports reserved bytes and fragmentation beside the allocated
//! bytes the budget counts, or (with a device-memory budget) runs on a device whose capacity
//! is the budget.
//!
//! Counting (the default, [`AllocatorBackend::new`]): the budget still counts the storages'
//! own bytes (as simrd and the prototype's `allocated_bytes.all.current` do), so statuses and
//! overheads are those of the plain simulator; what this adds is how much memory the device
//! really gives up. DTR frees tensors at scattered addresses, so free bytes sit in split
//! segments the next large request cannot use, and the caching allocator reserves more (Coop's
//! observation).
//!
//! Device budget ([`AllocatorBackend::on_device`]): the simulated device has the budget as its
//! capacity, so reserved bytes can never pass it; every storage is allocated with the
//! allocator's `try_malloc` and its block tagged with the storage's id, and a miss is answered
//! by the core's eviction strategy ([`crate::device_budget`]) through
//! [`Backend::plan_room`] (the allocator's `plan_room` over the tagged blocks). Optionally
//! Coop's partition: storages cheap to recompute per byte take the low end of a split block,
//! expensive ones the high end ([`c10_cuda::Placement`]).

use c10_cuda::config::AllocatorConfig;
use c10_cuda::device::{DevicePtr, StreamId};
use c10_cuda::segment_view::BlockState;
use c10_cuda::sizes::round_size;
use c10_cuda::{
    DeviceCachingAllocator, MallocOutcome, Miss, Placement, Pool, RoomKind, RoomOptions, RoomPlan,
    SimDevice,
};

use crate::backend::{AllocOutcome, AllocRequest, Backend, Moved, RunRequest};
use crate::error::BoxError;
use crate::graph::StorageId;
use crate::move_plan::{self, Block, Segment, Slot};

/// What the allocator saw during a run. Bytes throughout.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocatorReport {
    /// Peak of the allocator's `allocated_bytes.all` (block sizes, rounded up to 512 bytes or
    /// left unsplit).
    pub peak_allocated_bytes: u64,
    /// Peak of `reserved_bytes.all` (segments taken from the device).
    pub peak_reserved_bytes: u64,
    /// Allocated bytes at the moment reserved bytes peaked.
    pub allocated_at_reserved_peak: u64,
    /// Largest `reserved - allocated` seen, bytes.
    pub max_unused_reserved_bytes: u64,
    /// Device allocations (`cudaMalloc` calls).
    pub device_mallocs: u64,
    /// Allocation requests served: the storages' (and a run's duplicates'), and the copies of
    /// blocks moved out of the way by a move plan carried out. The holds of a move plan (free
    /// blocks allocated for the time of its copies, `move_plan.rs`) are not counted: nothing
    /// is stored in them; nor are the copies of a plan rolled back (a copy the allocator put
    /// elsewhere than replayed). The peaks above (allocated, reserved, allocated at the
    /// reserved peak, unused reserved) include the holds and the rolled-back copies: they were
    /// allocated for a while.
    pub requests: u64,
}

impl AllocatorReport {
    /// Fragmentation at the reserved peak: the share of reserved bytes not allocated,
    /// `1 - allocated / reserved` (0 when nothing was reserved).
    pub fn fragmentation(&self) -> f64 {
        if self.peak_reserved_bytes == 0 {
            0.0
        } else {
            1.0 - self.allocated_at_reserved_peak as f64 / self.peak_reserved_bytes as f64
        }
    }
}

/// A [`Backend`] that allocates every storage from a [`DeviceCachingAllocator`] over
/// [`SimDevice::address_only`] and returns each call's logged cost.
pub struct AllocatorBackend {
    alloc: DeviceCachingAllocator<SimDevice>,
    ptrs: Vec<DevicePtr>,
    report: AllocatorReport,
    accounting: bool,
    device: Option<DeviceBudget>,
}

/// The state of a device-memory budget.
struct DeviceBudget {
    capacity: u64,
    partition: bool,
    room: RoomOptions,
    /// Sum and count of `log2` cost densities seen (the partition's threshold is their mean).
    log_density_sum: f64,
    densities: u64,
    last_miss: Option<Miss>,
    /// The kind of the last plan [`Backend::plan_room`] returned (what its victims vacate).
    last_plan: Option<RoomKind>,
    /// [`Backend::look_ahead`]'s bytes: the next large-pool request known to follow.
    ahead: u64,
    scratch: Option<DevicePtr>,
}

/// Capacity of the simulated device: large enough that the device never refuses (the budget
/// is the limit; the report shows what the allocator reserved).
pub const DEVICE_CAPACITY: usize = 1 << 40;

impl AllocatorBackend {
    /// An allocator with PyTorch's default settings on a 1 TiB address-only device.
    ///
    /// # Errors
    /// When the allocator cannot be created (it cannot, on a simulated device).
    pub fn new() -> Result<Self, c10_cuda::Error> {
        Self::with_config(AllocatorConfig::default())
    }

    /// An allocator with `config` on a 1 TiB address-only device.
    ///
    /// # Errors
    /// When the allocator cannot be created.
    pub fn with_config(config: AllocatorConfig) -> Result<Self, c10_cuda::Error> {
        let device = SimDevice::address_only(0, DEVICE_CAPACITY);
        Ok(AllocatorBackend {
            alloc: DeviceCachingAllocator::new(device, config)?,
            ptrs: Vec::new(),
            report: AllocatorReport::default(),
            accounting: false,
            device: None,
        })
    }

    /// An allocator with `config` on an address-only device of `capacity` bytes that is the
    /// budget: allocations that do not fit miss ([`Backend::try_allocate`]) and the core evicts
    /// ([`Backend::device_capacity`] is `Some(capacity)`).
    ///
    /// # Errors
    /// When the allocator cannot be created.
    pub fn on_device(config: AllocatorConfig, capacity: u64) -> Result<Self, c10_cuda::Error> {
        let device = SimDevice::address_only(0, usize::try_from(capacity).unwrap_or(usize::MAX));
        Ok(AllocatorBackend {
            alloc: DeviceCachingAllocator::new(device, config)?,
            ptrs: Vec::new(),
            report: AllocatorReport::default(),
            accounting: false,
            device: Some(DeviceBudget {
                capacity,
                partition: false,
                room: RoomOptions::default(),
                log_density_sum: 0.0,
                densities: 0,
                last_miss: None,
                last_plan: None,
                ahead: 0,
                scratch: None,
            }),
        })
    }

    /// Coop's partition under a device budget, builder style: a storage whose compute per byte
    /// is below the running geometric mean of those allocated so far takes the low end of a
    /// split block, the others the high end. No effect without a device budget.
    pub fn with_partition(mut self, on: bool) -> Self {
        if let Some(d) = &mut self.device {
            d.partition = on;
        }
        self
    }

    /// Which kinds of plan the allocator may propose on a miss (windows inside segments,
    /// whole segments or pages given back), builder style. No effect without a device budget.
    pub fn with_room_options(mut self, room: RoomOptions) -> Self {
        if let Some(d) = &mut self.device {
            d.room = room;
        }
        self
    }

    /// Makes the budget count the allocator's `allocated_bytes` (block sizes) instead of the
    /// storages' own bytes, as the live driver does ([`crate::live_backend`]), builder style.
    /// Each allocation is charged its rounded size (`round_size`); a large block the allocator
    /// leaves unsplit can hold up to 1 MiB more, which the live driver charges up front
    /// ([`crate::live_backend::LiveBackend::charge_for`]).
    pub fn with_allocator_accounting(mut self, on: bool) -> Self {
        self.accounting = on;
        self
    }

    /// The figures so far.
    pub fn report(&self) -> AllocatorReport {
        let mut r = self.report;
        r.device_mallocs = self.alloc.stats().num_device_alloc.max(0) as u64;
        r
    }

    /// The allocator (for its stats, summary or snapshot).
    pub fn allocator(&self) -> &DeviceCachingAllocator<SimDevice> {
        &self.alloc
    }

    fn malloc(&mut self, bytes: u64) -> Result<DevicePtr, BoxError> {
        let a = self.alloc.malloc(bytes as usize, StreamId::DEFAULT)?;
        self.note_malloc();
        Ok(a.ptr)
    }

    /// Counts a served request and updates the peaks.
    fn note_malloc(&mut self) {
        self.report.requests += 1;
        self.note_peaks();
    }

    /// Updates the peaks.
    fn note_peaks(&mut self) {
        let allocated = self.alloc.allocated_bytes() as u64;
        let reserved = self.alloc.reserved_bytes() as u64;
        let r = &mut self.report;
        r.peak_allocated_bytes = r.peak_allocated_bytes.max(allocated);
        if reserved > r.peak_reserved_bytes {
            r.peak_reserved_bytes = reserved;
            r.allocated_at_reserved_peak = allocated;
        }
        r.max_unused_reserved_bytes = r.max_unused_reserved_bytes.max(reserved - allocated);
    }

    /// `try_malloc` under the device budget, the placement from `compute_ns` per byte when
    /// the partition is on.
    fn try_device_malloc(
        &mut self,
        bytes: u64,
        compute_ns: u64,
    ) -> Result<Option<DevicePtr>, BoxError> {
        let d = self.device.as_mut().expect("a device budget");
        let placement = if d.partition {
            let density = ((compute_ns as f64 + 1.0) / (bytes as f64 + 1.0)).log2();
            d.log_density_sum += density;
            d.densities += 1;
            if density <= d.log_density_sum / d.densities as f64 {
                Placement::Low
            } else {
                Placement::High
            }
        } else {
            Placement::Low
        };
        match self
            .alloc
            .try_malloc_placed(bytes as usize, StreamId::DEFAULT, placement)?
        {
            MallocOutcome::Allocated(a) => {
                self.note_malloc();
                Ok(Some(a.ptr))
            }
            MallocOutcome::Miss(m) => {
                self.device.as_mut().expect("a device budget").last_miss = Some(m);
                Ok(None)
            }
        }
    }

    /// The look-ahead plan ([`Backend::look_ahead`]) for `miss`, followed by a large-pool request
    /// of `ahead` bytes: the cheapest plan for both at once (a window of the two rounded sizes,
    /// or a release of the segments the allocator would take for both), kept when it costs no
    /// more than the plan for `miss` alone plus what the next request would cost if planned
    /// alone now (0 when a cached free block or the device's free bytes already serve it; no
    /// plan for it alone keeps the joint plan), else the plan for `miss` alone. `None` when
    /// there is no joint plan (the caller plans `miss` alone), and when the two rounded sizes
    /// reach `max_split_size`: the merged block would be oversize, which the missed request
    /// refuses when it is below `max_split_size` and takes whole, unsplit, when it is not.
    fn plan_ahead(
        &self,
        miss: &Miss,
        ahead: usize,
        options: RoomOptions,
        lookup: impl FnMut(u64) -> Option<f64> + Copy,
    ) -> Option<RoomPlan> {
        // The next request as the allocator sizes it (rounded, and its segment's size).
        let next = Miss {
            request: self.alloc.request(ahead, miss.request.stream),
            ..*miss
        };
        if next.request.pool != Pool::Large {
            return None;
        }
        let (first, second) = (miss.request, next.request);
        let mut both = *miss;
        both.request.requested = first.requested.saturating_add(ahead);
        both.request.size = first.size.saturating_add(second.size);
        if both.request.size >= self.alloc.config().max_split_size_or_max() {
            return None;
        }
        // The segments a release must make room for: the first request's, and the second's
        // unless the rest of the first one's holds it (a split leaves more than 1 MiB there).
        both.request.alloc_size = if first.alloc_size.saturating_sub(first.size) >= second.size {
            first.alloc_size
        } else {
            first.alloc_size.saturating_add(second.alloc_size)
        };
        let joint = self.alloc.plan_room(&both, options, lookup)?;
        let Some(alone) = self.alloc.plan_room(miss, options, lookup) else {
            return Some(joint);
        };
        let served = next.request.alloc_size <= miss.device_free
            || self.alloc.segments().any(|seg| {
                seg.pool == next.request.pool
                    && seg.stream == next.request.stream
                    && seg
                        .blocks()
                        .any(|b| b.state == BlockState::Free && b.size >= next.request.size)
            });
        let (infinite, finite) = if served {
            (0, 0.0)
        } else {
            match self.alloc.plan_room(&next, options, lookup) {
                Some(p) => (p.cost.infinite, p.cost.finite),
                None => return Some(joint),
            }
        };
        let infinite = alone.cost.infinite.saturating_add(infinite);
        let finite = alone.cost.finite + finite;
        let dearer = joint
            .cost
            .infinite
            .cmp(&infinite)
            .then(joint.cost.finite.total_cmp(&finite))
            .is_gt();
        Some(if dearer { alone } else { joint })
    }

    /// The allocator's segments and blocks for [`move_plan`]: an allocated block is movable
    /// when it holds storage `s` (its tag, and the storage's address) and `movable(s)`.
    fn layout(&self, movable: &dyn Fn(StorageId) -> bool) -> (Vec<Segment>, Vec<Block>) {
        let mut segs = Vec::new();
        let mut blocks = Vec::new();
        for seg in self.alloc.segments() {
            let first = blocks.len();
            for b in seg.blocks() {
                let slot = match (b.state, b.tag) {
                    (BlockState::Free, _) => Slot::Free,
                    (BlockState::Allocated, Some(tag)) => match u32::try_from(tag) {
                        Ok(t)
                            if self.ptrs.get(t as usize) == Some(&b.ptr)
                                && movable(StorageId(t)) =>
                        {
                            Slot::Movable {
                                tag,
                                requested: b.requested,
                            }
                        }
                        _ => Slot::Fixed,
                    },
                    _ => Slot::Fixed,
                };
                blocks.push(Block {
                    ptr: b.ptr,
                    size: b.size,
                    slot,
                });
            }
            if blocks.len() > first {
                segs.push(Segment {
                    pool: seg.pool,
                    stream: seg.stream,
                    expandable: seg.expandable,
                    first,
                    end: blocks.len(),
                });
            }
        }
        (segs, blocks)
    }

    /// Makes the copies of `plan` (its holds and every copy first, while the originals still
    /// hold the vacated addresses, then the frees of the originals and the holds). Returns
    /// false, with nothing changed, when the allocator put a copy elsewhere than replayed (in a
    /// vacated range, or nowhere).
    fn execute(&mut self, plan: &move_plan::MovePlan) -> Result<bool, BoxError> {
        let mut copies: Vec<DevicePtr> = Vec::with_capacity(plan.moves.len());
        let mut ok = true;
        for m in &plan.moves {
            match self
                .alloc
                .try_malloc_placed(m.requested, StreamId::DEFAULT, Placement::Low)?
            {
                MallocOutcome::Allocated(a) => {
                    // Counted in `requests` once the plan is carried out.
                    self.note_peaks();
                    copies.push(a.ptr);
                    if m.tag != move_plan::HOLD && plan.inside(a.ptr) {
                        ok = false;
                        break;
                    }
                }
                MallocOutcome::Miss(_) => {
                    ok = false;
                    break;
                }
            }
        }
        if !ok {
            for p in copies {
                self.alloc.free(p)?;
            }
            return Ok(false);
        }
        for (m, &to) in plan.moves.iter().zip(&copies) {
            if m.tag == move_plan::HOLD {
                self.alloc.free(to)?;
                continue;
            }
            self.alloc.set_block_tag(to, m.tag)?;
            self.alloc.free(m.from)?;
            self.ptrs[m.tag as usize] = to;
            self.report.requests += 1;
        }
        Ok(true)
    }

    fn slot(&mut self, storage: StorageId) -> &mut DevicePtr {
        let i = storage.index();
        if self.ptrs.len() <= i {
            self.ptrs.resize(i + 1, 0);
        }
        &mut self.ptrs[i]
    }
}

impl Backend for AllocatorBackend {
    fn allocated_bytes(&self) -> Option<u64> {
        self.accounting.then(|| self.alloc.allocated_bytes() as u64)
    }

    fn charged_bytes(&self, bytes: u64) -> u64 {
        round_size(bytes as usize, self.alloc.config()) as u64
    }

    fn allocate(&mut self, storage: StorageId, bytes: u64) -> Result<(), BoxError> {
        let ptr = if bytes == 0 { 0 } else { self.malloc(bytes)? };
        *self.slot(storage) = ptr;
        Ok(())
    }

    fn free(&mut self, storage: StorageId, _bytes: u64) -> Result<(), BoxError> {
        let ptr = self.ptrs.get(storage.index()).copied().unwrap_or(0);
        if ptr != 0 {
            self.alloc.free(ptr)?;
            self.ptrs[storage.index()] = 0;
        }
        Ok(())
    }

    fn run(&mut self, request: RunRequest<'_>) -> Result<u64, BoxError> {
        if request.duplicate_bytes > 0 && self.device.is_none() {
            // The recomputed copies of outputs already in memory live during the run only.
            let p = self.malloc(request.duplicate_bytes)?;
            self.alloc.free(p)?;
        }
        Ok(request.known_cost)
    }

    fn device_capacity(&self) -> Option<u64> {
        self.device.as_ref().map(|d| d.capacity)
    }

    fn try_allocate(&mut self, request: AllocRequest) -> Result<AllocOutcome, BoxError> {
        if self.device.is_none() {
            return self
                .allocate(request.storage, request.bytes)
                .map(|()| AllocOutcome::Done);
        }
        if request.bytes == 0 {
            *self.slot(request.storage) = 0;
            return Ok(AllocOutcome::Done);
        }
        match self.try_device_malloc(request.bytes, request.compute_ns)? {
            Some(ptr) => {
                self.alloc
                    .set_block_tag(ptr, u64::from(request.storage.0))?;
                *self.slot(request.storage) = ptr;
                Ok(AllocOutcome::Done)
            }
            None => Ok(AllocOutcome::Miss),
        }
    }

    fn plan_room(
        &mut self,
        cost: &dyn Fn(StorageId) -> Option<f64>,
        byte_credit: f64,
        whole_segment: bool,
        out: &mut Vec<StorageId>,
    ) -> Result<u64, BoxError> {
        let Some(d) = &self.device else {
            return Ok(0);
        };
        let Some(mut miss) = d.last_miss else {
            return Ok(0);
        };
        if whole_segment {
            miss = crate::backend::whole_segment(miss);
        }
        let options = RoomOptions {
            byte_credit,
            ..d.room
        };
        let lookup = |tag: u64| u32::try_from(tag).ok().and_then(|t| cost(StorageId(t)));
        let ahead = usize::try_from(d.ahead).unwrap_or(usize::MAX);
        let mut plan = None;
        if ahead > 0 && miss.request.pool == Pool::Large {
            plan = self.plan_ahead(&miss, ahead, options, lookup);
        }
        if plan.is_none() {
            plan = self.alloc.plan_room(&miss, options, lookup);
        }
        if let Some(d) = &mut self.device {
            d.last_plan = plan.as_ref().map(|p| p.kind);
        }
        Ok(match plan {
            Some(p) => {
                out.extend(p.tags.iter().map(|&t| StorageId(t as u32)));
                p.scanned as u64
            }
            None => 0,
        })
    }

    fn look_ahead(&mut self, bytes: u64) {
        if let Some(d) = &mut self.device {
            d.ahead = bytes;
        }
    }

    fn make_room_by_moving(
        &mut self,
        movable: &dyn Fn(StorageId) -> bool,
        new_segments: bool,
    ) -> Result<Option<Moved>, BoxError> {
        let Some(miss) = self.device.as_ref().and_then(|d| d.last_miss) else {
            return Ok(None);
        };
        let (segs, blocks) = self.layout(movable);
        let Some(plan) = move_plan::plan(&segs, &blocks, &miss, self.alloc.config(), new_segments)
        else {
            return Ok(None);
        };
        Ok(self.execute(&plan)?.then_some(Moved {
            blocks: plan.copies() as u64,
            bytes: plan.bytes,
            scanned: plan.scanned as u64,
        }))
    }

    fn move_out(
        &mut self,
        victims: &mut Vec<StorageId>,
        worth: &dyn Fn(StorageId) -> bool,
    ) -> Result<Moved, BoxError> {
        let Some(kind) = self.device.as_ref().and_then(|d| d.last_plan) else {
            return Ok(Moved::default());
        };
        let want: Vec<u64> = victims
            .iter()
            .filter(|&&v| worth(v))
            .map(|v| u64::from(v.0))
            .collect();
        if want.is_empty() {
            return Ok(Moved::default());
        }
        // Every victim counts as movable for the layout (the segments a release plan vacates
        // are those of all its victims); only those in `want` are moved.
        let (segs, blocks) = self.layout(&|s| victims.contains(&s));
        // What the plan vacates: its window, or every segment holding one of its victims.
        let vacated = match kind {
            RoomKind::Window { start, span, .. } => vec![(start, start + span as u64)],
            RoomKind::Release { .. } | RoomKind::Pages { .. } => segs
                .iter()
                .filter(|sg| {
                    blocks[sg.first..sg.end]
                        .iter()
                        .any(|b| matches!(b.slot, Slot::Movable { .. }))
                })
                .map(|sg| {
                    let last = &blocks[sg.end - 1];
                    (blocks[sg.first].ptr, last.ptr + last.size as u64)
                })
                .collect(),
        };
        let plan = move_plan::movable_victims(&segs, &blocks, &want, vacated, self.alloc.config());
        if plan.moves.is_empty() || !self.execute(&plan)? {
            return Ok(Moved {
                scanned: plan.scanned as u64,
                ..Moved::default()
            });
        }
        victims.retain(|v| !plan.moves.iter().any(|m| m.tag == u64::from(v.0)));
        Ok(Moved {
            blocks: plan.moves.len() as u64,
            bytes: plan.bytes,
            scanned: plan.scanned as u64,
        })
    }

    fn transfer(&mut self, from: StorageId, to: StorageId) -> Result<bool, BoxError> {
        if self.device.is_none() {
            return Ok(false);
        }
        let ptr = self.ptrs.get(from.index()).copied().unwrap_or(0);
        if ptr == 0 {
            return Ok(false);
        }
        self.alloc.set_block_tag(ptr, u64::from(to.0))?;
        self.ptrs[from.index()] = 0;
        *self.slot(to) = ptr;
        Ok(true)
    }

    fn try_allocate_scratch(&mut self, bytes: u64) -> Result<AllocOutcome, BoxError> {
        if self.device.is_none() || bytes == 0 {
            return Ok(AllocOutcome::Done);
        }
        match self.try_device_malloc(bytes, 0)? {
            Some(ptr) => {
                self.device.as_mut().expect("a device budget").scratch = Some(ptr);
                Ok(AllocOutcome::Done)
            }
            None => Ok(AllocOutcome::Miss),
        }
    }

    fn free_scratch(&mut self) -> Result<(), BoxError> {
        if let Some(ptr) = self.device.as_mut().and_then(|d| d.scratch.take()) {
            self.alloc.free(ptr)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1 << 20;

    /// A backend on a device of `capacity` bytes under `config`, holding storages `0..` of
    /// `sizes` bytes, allocated in order.
    fn holding(config: &str, capacity: u64, sizes: &[u64]) -> AllocatorBackend {
        let config = AllocatorConfig::parse(config).unwrap();
        let mut b = AllocatorBackend::on_device(config, capacity).unwrap();
        for (i, &bytes) in sizes.iter().enumerate() {
            let storage = StorageId(i as u32);
            let r = AllocRequest {
                storage,
                bytes,
                compute_ns: 1,
            };
            assert_eq!(
                b.try_allocate(r).unwrap(),
                AllocOutcome::Done,
                "storage {i}"
            );
        }
        b
    }

    /// The victims `window-move-ahead` plans for a missed request of `bytes` followed by one
    /// of `ahead` bytes, each storage `i` costing `costs[i]`.
    fn victims(b: &mut AllocatorBackend, bytes: u64, ahead: u64, costs: &[f64]) -> Vec<u32> {
        let storage = StorageId(costs.len() as u32);
        let r = AllocRequest {
            storage,
            bytes,
            compute_ns: 1,
        };
        assert_eq!(b.try_allocate(r).unwrap(), AllocOutcome::Miss);
        b.look_ahead(ahead);
        let mut out = Vec::new();
        let cost = |s: StorageId| costs.get(s.index()).copied();
        b.plan_room(&cost, 0.0, false, &mut out).unwrap();
        let mut v: Vec<u32> = out.iter().map(|s| s.0).collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn the_joint_window_holds_both_rounded_sizes() {
        // roundup_power2_divisions:4, one 20 MiB segment [4 | 4 | 1.5 | 8 | 2.5], the first
        // three cheap. A 4.5 MiB miss followed by 4.5 MiB: each rounds to 5 MiB, so the joint
        // window must span 10 MiB (5 + 4.5 = 9.5 would let the second miss again). The cheap
        // 9.5 MiB window is too short; the 10 MiB ones take an 8 MiB block (1002 against 2 + 2
        // for the two requests planned one at a time): the miss's own plan, [4 | 1.5].
        let costs = [1.0, 1.0, 1.0, 1000.0, 1000.0];
        let sizes = [4 * MB, 4 * MB, 3 * MB / 2, 8 * MB, 5 * MB / 2];
        let mut b = holding("roundup_power2_divisions:4", 20 * MB, &sizes);
        assert_eq!(victims(&mut b, 9 * MB / 2, 9 * MB / 2, &costs), [1, 2]);
    }

    #[test]
    fn the_joint_release_gives_both_segments() {
        // Three 12 MiB segments, two cheap. A 12 MiB miss followed by 12 MiB: each needs its
        // own 12 MiB segment, so the joint release frees two (cost 2, no more than 1 + 1), not
        // the one segment of the miss's own size.
        let costs = [1.0, 1.0, 1000.0];
        let mut b = holding("", 36 * MB, &[12 * MB; 3]);
        assert_eq!(victims(&mut b, 12 * MB, 12 * MB, &costs), [0, 1]);
    }

    #[test]
    fn no_joint_window_reaches_max_split_size() {
        // max_split_size_mb:20, one 20 MiB segment [9.5 | 10.5], both cheap. A 9.5 MiB miss
        // followed by 10.5 MiB: the 20 MiB window would merge into an oversize block, which
        // the 9.5 MiB request refuses. The miss's own plan: its 9.5 MiB block.
        let mut b = holding("max_split_size_mb:20", 20 * MB, &[19 * MB / 2, 21 * MB / 2]);
        assert_eq!(victims(&mut b, 19 * MB / 2, 21 * MB / 2, &[1.0, 1.0]), [0]);
    }
}
