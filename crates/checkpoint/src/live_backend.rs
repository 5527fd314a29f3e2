//! The live [`Backend`]: storages are `aten` tensors on a caching-allocator device, an operator
//! is a closure rerun on its (rematerialized) inputs, its cost is measured, and memory is the
//! allocator's own `allocated_bytes.all.current`.
//!
//! The runtime core decides what to run, evict and free; this backend
//! - keeps one `aten::Tensor` per defined [`TensorId`] and, per [`StorageId`], the tensors that
//!   hold its bytes (a base and its views), dropping them all when the core evicts the storage
//!   (the caching allocator gets the block back at once: nothing else holds the tensor);
//! - runs a call's closure, checks that the outputs are what the call declared (shape, dtype,
//!   device, bytes, aliasing), and measures its time in ns ([`std::time::Instant`]);
//! - reports the allocator's allocated bytes as the figure the hard budget applies to
//!   ([`Backend::allocated_bytes`]) and charges each fresh output what the allocator will add
//!   ([`LiveBackend`]'s [`Backend::charged_bytes`]: `round_size`, plus the largest remainder
//!   a large block may keep unsplit);
//! - after every run, fails with [`LiveError::BudgetExceeded`] if the allocator's allocated
//!   bytes went past the budget, and, with the debug check on, hashes every output and fails
//!   with [`LiveError::RematMismatch`] when a recomputed value differs from the first one.
//!
//! Under a device-memory budget ([`crate::live::LiveConfig::device_budget`]: the device's
//! capacity is the budget) nothing is counted: before a call runs, the core reserves each
//! declared output with the allocator's `try_malloc` ([`Backend::try_allocate`]), evicting on
//! a miss (between allocator calls, never inside one), and the backend hands the reserved
//! blocks back just before the closure runs (the front's thread caches settled before, not
//! after: a waiting block freed beside them could change the best fit), so that the closure's
//! own allocations, of the same sizes in the same order, are served from exactly those blocks
//! without a miss. After the run each fresh output's block is tagged with its storage for the
//! window plans.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use aten::Tensor;
use c10_core::{Device, ScalarType};
use c10_cuda::config::AllocatorConfig;
use c10_cuda::device::{DeviceMemory, DevicePtr, StreamId};
use c10_cuda::sizes::{SMALL_SIZE, is_small, round_size};
use c10_cuda::stats::StatType;
use c10_cuda::{CachingAllocator, MallocOutcome, Miss, RoomOptions};

use crate::backend::{AllocOutcome, AllocRequest, Backend, RunRequest};
use crate::error::BoxError;
use crate::graph::{StorageId, TensorId};
use crate::live::LiveError;

/// An operator as the live backend reruns it: inputs in, outputs out (fresh tensors, or views
/// of inputs as declared). It must be deterministic and must not allocate on the device beyond
/// its outputs (one kernel per call): the budget makes room for the declared outputs only.
pub type OpFn = Rc<dyn Fn(&[Tensor]) -> aten::Result<Vec<Tensor>>>;

/// One declared output of a live call: what shape inference says the closure returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutputMeta {
    /// Sizes in elements.
    pub shape: Vec<i64>,
    /// Element type.
    pub dtype: ScalarType,
    /// `Some(i)`: a view sharing the storage of input `i`; `None`: a fresh contiguous tensor.
    pub alias: Option<usize>,
}

impl OutputMeta {
    /// A fresh contiguous output.
    pub fn fresh(shape: &[i64], dtype: ScalarType) -> Self {
        OutputMeta {
            shape: shape.to_vec(),
            dtype,
            alias: None,
        }
    }

    /// A view of input `index`.
    pub fn view_of(index: usize, shape: &[i64], dtype: ScalarType) -> Self {
        OutputMeta {
            shape: shape.to_vec(),
            dtype,
            alias: Some(index),
        }
    }

    /// Elements.
    pub fn numel(&self) -> u64 {
        self.shape.iter().map(|&s| s.max(0) as u64).product()
    }

    /// Bytes of a fresh contiguous tensor of this shape and dtype (0 for a view).
    pub fn nbytes(&self) -> u64 {
        if self.alias.is_some() {
            0
        } else {
            self.numel() * self.dtype.item_size() as u64
        }
    }
}

/// The caching allocator's figures for one device, in bytes (PyTorch's
/// `allocated_bytes.all.*` and `reserved_bytes.all.*`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryFigures {
    /// `allocated_bytes.all.current`: bytes of blocks handed out (rounded block sizes).
    pub allocated: u64,
    /// `allocated_bytes.all.peak` since the allocator's last `reset_peak_stats`.
    pub allocated_peak: u64,
    /// `reserved_bytes.all.current`: bytes of segments taken from the device.
    pub reserved: u64,
    /// `reserved_bytes.all.peak` since the last `reset_peak_stats`.
    pub reserved_peak: u64,
}

/// Reads a device's figures from a caching allocator of any device kind, and reaches its
/// owner-side API (`try_malloc`, tags, `plan_room`) for a device-memory budget.
trait StatsSource {
    /// Gives the blocks waiting in the front's thread caches back to the allocators
    /// (`settle_thread_caches`).
    fn settle(&self);
    /// The figures as the raw allocator has them now: a block waiting in a thread cache
    /// counts as allocated.
    fn figures_raw(&self, device: u8) -> MemoryFigures;
    /// The figures once the thread caches are settled: blocks the user freed may wait in the
    /// front's thread caches (another thread's lock held a moment puts this one in contended
    /// mode); the raw allocator counts them as allocated, and the budget must not.
    fn figures(&self, device: u8) -> MemoryFigures {
        self.settle();
        self.figures_raw(device)
    }
    fn config(&self, device: u8) -> AllocatorConfig;
    /// The device's total memory (its capacity).
    fn capacity(&self, device: u8) -> Result<u64, c10_cuda::Error>;
    /// `try_malloc` on the default stream: the block's address, or the miss.
    fn try_malloc(
        &self,
        device: u8,
        bytes: usize,
    ) -> Result<Result<DevicePtr, Miss>, c10_cuda::Error>;
    fn free(&self, device: u8, ptr: DevicePtr) -> Result<(), c10_cuda::Error>;
    fn set_tag(&self, device: u8, ptr: DevicePtr, tag: u64) -> Result<(), c10_cuda::Error>;
    /// `plan_room`'s tags for `miss`, or `None` when no plan exists.
    fn plan(
        &self,
        device: u8,
        miss: &Miss,
        options: RoomOptions,
        cost: &mut dyn FnMut(u64) -> Option<f64>,
    ) -> Option<Vec<u64>>;
}

impl<D: DeviceMemory> StatsSource for CachingAllocator<D> {
    fn settle(&self) {
        self.settle_thread_caches();
    }

    fn figures_raw(&self, device: u8) -> MemoryFigures {
        self.with_device(device, |d| {
            let s = d.stats();
            let a = &s.allocated_bytes[StatType::Aggregate as usize];
            let r = &s.reserved_bytes[StatType::Aggregate as usize];
            MemoryFigures {
                allocated: a.current.max(0) as u64,
                allocated_peak: a.peak.max(0) as u64,
                reserved: r.current.max(0) as u64,
                reserved_peak: r.peak.max(0) as u64,
            }
        })
        .unwrap_or_default()
    }

    fn config(&self, device: u8) -> AllocatorConfig {
        self.with_device(device, |d| d.config().clone())
            .unwrap_or_default()
    }

    fn capacity(&self, device: u8) -> Result<u64, c10_cuda::Error> {
        self.with_device(device, |d| d.device().mem_get_info())?
            .map(|i| i.total as u64)
            .map_err(c10_cuda::Error::from)
    }

    fn try_malloc(
        &self,
        device: u8,
        bytes: usize,
    ) -> Result<Result<DevicePtr, Miss>, c10_cuda::Error> {
        // Waiting blocks would hold device memory the miss could have used.
        self.settle_thread_caches();
        self.with_device(device, |d| d.try_malloc(bytes, StreamId::DEFAULT))?
            .map(|o| match o {
                MallocOutcome::Allocated(a) => Ok(a.ptr),
                MallocOutcome::Miss(m) => Err(m),
            })
    }

    fn free(&self, device: u8, ptr: DevicePtr) -> Result<(), c10_cuda::Error> {
        self.with_device(device, |d| d.free(ptr))?
    }

    fn set_tag(&self, device: u8, ptr: DevicePtr, tag: u64) -> Result<(), c10_cuda::Error> {
        self.with_device(device, |d| d.set_block_tag(ptr, tag))?
    }

    fn plan(
        &self,
        device: u8,
        miss: &Miss,
        options: RoomOptions,
        cost: &mut dyn FnMut(u64) -> Option<f64>,
    ) -> Option<Vec<u64>> {
        self.settle_thread_caches();
        self.with_device(device, |d| d.plan_room(miss, options, cost))
            .ok()
            .flatten()
            .map(|p| p.tags)
    }
}

/// What the live backend has seen (see [`crate::live::LiveProfile`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LiveCounters {
    /// Highest allocator `allocated_bytes.all.current` seen after a run, bytes.
    pub peak_allocated: u64,
    /// Highest allocator `reserved_bytes.all.current` seen after a run, bytes.
    pub peak_reserved: u64,
    /// Outputs hashed on their first computation (debug check).
    pub hashed: u64,
    /// Recomputed outputs whose hash was compared with the first one (debug check).
    pub remat_checked: u64,
    /// Wall-clock time inside op closures, ns (program calls and rematerializations).
    pub op_wall_ns: u64,
}

/// One recorded call.
pub(crate) struct LiveOp {
    pub name: String,
    /// `None` once a constant ran (constants are pinned and never rerun).
    pub f: Option<OpFn>,
    pub outputs: Vec<OutputMeta>,
    /// Bytes each fresh output's storage may hold (the declared size; an adopted constant's
    /// whole storage).
    pub bytes: Vec<u64>,
    /// A constant (no inputs, no cost): its closure hands an existing tensor over or copies a
    /// host tensor to the device.
    pub constant: bool,
}

/// The live [`Backend`]: aten tensors on one device of a caching allocator.
pub struct LiveBackend {
    stats: Arc<dyn StatsSourceSync>,
    device: Device,
    index: u8,
    alloc_config: AllocatorConfig,
    pub(crate) budget: Option<u64>,
    pub(crate) check: bool,
    pub(crate) measure: bool,
    pub(crate) ops: Vec<LiveOp>,
    values: Vec<Option<Tensor>>,
    members: Vec<Vec<TensorId>>,
    hashes: Vec<Option<u64>>,
    /// Charged bytes of a tensor being adopted as a constant: it is already allocated, so
    /// the budget check before its "allocation" must not count it twice.
    pub(crate) staged_charge: u64,
    pub(crate) counters: LiveCounters,
    /// The device's capacity when it is the budget (a device-memory budget).
    pub(crate) device_capacity: Option<u64>,
    /// Blocks reserved for the next run's outputs, in allocation order.
    reserved: Vec<DevicePtr>,
    last_miss: Option<Miss>,
}

trait StatsSourceSync: StatsSource + Send + Sync {}
impl<T: StatsSource + Send + Sync> StatsSourceSync for T {}

impl LiveBackend {
    /// A backend on `device` (index `index` of `front`).
    pub(crate) fn new<D: DeviceMemory + 'static>(
        front: Arc<CachingAllocator<D>>,
        device: Device,
        index: u8,
    ) -> Self {
        let alloc_config = front.config(index);
        Self::with_source(front, alloc_config, device, index)
    }

    /// A backend over `stats`, whose allocator config is `alloc_config`.
    fn with_source(
        stats: Arc<dyn StatsSourceSync>,
        alloc_config: AllocatorConfig,
        device: Device,
        index: u8,
    ) -> Self {
        LiveBackend {
            stats,
            device,
            index,
            alloc_config,
            budget: None,
            check: false,
            measure: true,
            ops: Vec::new(),
            values: Vec::new(),
            members: Vec::new(),
            hashes: Vec::new(),
            staged_charge: 0,
            counters: LiveCounters::default(),
            device_capacity: None,
            reserved: Vec::new(),
            last_miss: None,
        }
    }

    /// Makes the device's capacity the budget (a device-memory budget), builder style.
    ///
    /// # Errors
    /// When the device cannot report its memory.
    pub(crate) fn on_device_budget(mut self) -> Result<Self, c10_cuda::Error> {
        self.device_capacity = Some(self.stats.capacity(self.index)?);
        Ok(self)
    }

    /// Hands the blocks reserved for a run back to the allocator, the last reserved first, so
    /// that its state is as before the reservations and the run's allocations of the same
    /// sizes in the same order land in them.
    fn release_reserved(&mut self) -> Result<(), LiveError> {
        while let Some(ptr) = self.reserved.pop() {
            self.stats
                .free(self.index, ptr)
                .map_err(|e| LiveError::Internal {
                    message: format!("freeing a reserved block: {e}"),
                })?;
        }
        Ok(())
    }

    /// Just before a run: settles the front's thread caches, then hands the reserved blocks
    /// back, and returns the figures then without settling again. Settling after the blocks
    /// are back could free waiting blocks next to them and change the allocator's best fit,
    /// so that the run's outputs would not land in exactly the reserved blocks.
    fn hand_back_for_run(&mut self) -> Result<MemoryFigures, LiveError> {
        self.stats.settle();
        self.release_reserved()?;
        Ok(self.stats.figures_raw(self.index))
    }

    fn reserve(&mut self, bytes: u64) -> Result<AllocOutcome, BoxError> {
        if bytes == 0 {
            return Ok(AllocOutcome::Done);
        }
        match self.stats.try_malloc(self.index, bytes as usize)? {
            Ok(ptr) => {
                self.reserved.push(ptr);
                Ok(AllocOutcome::Done)
            }
            Err(miss) => {
                self.last_miss = Some(miss);
                Ok(AllocOutcome::Miss)
            }
        }
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The allocator's figures for the device now.
    pub fn figures(&self) -> MemoryFigures {
        self.stats.figures(self.index)
    }

    /// The counters so far.
    pub fn counters(&self) -> LiveCounters {
        self.counters
    }

    /// The value of `t` if it is in memory.
    pub fn value(&self, t: TensorId) -> Option<&Tensor> {
        self.values.get(t.index()).and_then(Option::as_ref)
    }

    /// The bytes the allocator adds for a request of `bytes`: `round_size`, plus, for the
    /// large pool, the most an unsplit cached block may hold beyond it (1 MiB, or
    /// `max_non_split_rounding` above `max_split_size`).
    pub fn charge_for(&self, bytes: u64) -> u64 {
        if bytes == 0 {
            return 0;
        }
        let cfg = &self.alloc_config;
        let r = round_size(bytes as usize, cfg);
        let slack = if is_small(r) || cfg.expandable_segments {
            0
        } else if r >= cfg.max_split_size_or_max() {
            cfg.max_non_split_rounding
        } else {
            SMALL_SIZE
        };
        r.saturating_add(slack) as u64
    }

    fn check_output(
        &self,
        name: &str,
        k: usize,
        meta: &OutputMeta,
        declared: u64,
        out: &Tensor,
        inputs: &[Tensor],
    ) -> Result<(), LiveError> {
        let mismatch = |message: String| LiveError::OutputMismatch {
            op: name.to_string(),
            output: k,
            message,
        };
        if out.sizes() != meta.shape.as_slice() || out.dtype() != meta.dtype {
            return Err(mismatch(format!(
                "declared {:?} {:?}, got {:?} {:?}",
                meta.shape,
                meta.dtype,
                out.sizes(),
                out.dtype()
            )));
        }
        if aten::normalize_device(out.device()) != self.device {
            return Err(mismatch(format!(
                "on {}, not on the runtime's device {}",
                out.device(),
                self.device
            )));
        }
        match meta.alias {
            Some(i) => {
                if !inputs.get(i).is_some_and(|x| out.is_alias_of(x)) {
                    return Err(mismatch(format!("declared a view of input {i}, got none")));
                }
            }
            None => {
                if let Some(i) = inputs.iter().position(|x| out.is_alias_of(x)) {
                    return Err(mismatch(format!(
                        "declared fresh, but it shares the storage of input {i}"
                    )));
                }
                let bytes = out.storage().nbytes() as u64;
                if bytes > declared {
                    return Err(mismatch(format!(
                        "its storage holds {bytes} bytes, {declared} were declared"
                    )));
                }
            }
        }
        Ok(())
    }

    fn run_live(&mut self, req: &RunRequest<'_>) -> Result<u64, LiveError> {
        let op_index = req.op.index();
        let (name, f, constant) = {
            let op = &self.ops[op_index];
            let f = op.f.clone().ok_or_else(|| LiveError::Internal {
                message: format!("call {} ({}) has no rematerializer left", req.op, op.name),
            })?;
            (op.name.clone(), f, op.constant)
        };
        let mut inputs = Vec::with_capacity(req.args.len());
        for &a in req.args {
            let v = self.value(a).cloned().ok_or_else(|| LiveError::Internal {
                message: format!("input {a} of {name} is not in memory"),
            })?;
            inputs.push(v);
        }
        let before = self.hand_back_for_run()?;
        let start = Instant::now();
        let outs = f(&inputs).map_err(|source| LiveError::Op {
            op: name.clone(),
            source,
        })?;
        let ns = start.elapsed().as_nanos() as u64;
        self.counters.op_wall_ns += ns;
        if outs.len() != req.outputs.len() {
            return Err(LiveError::OutputMismatch {
                op: name,
                output: outs.len(),
                message: format!(
                    "{} outputs declared, {} returned",
                    req.outputs.len(),
                    outs.len()
                ),
            });
        }
        {
            let op = &self.ops[op_index];
            for (k, out) in outs.iter().enumerate() {
                self.check_output(&name, k, &op.outputs[k], op.bytes[k], out, &inputs)?;
            }
        }
        drop(inputs);
        let after = self.figures();
        if let Some(budget) = self.budget {
            let rose_past =
                after.allocated_peak > budget && after.allocated_peak > before.allocated_peak;
            if after.allocated > budget || rose_past {
                return Err(LiveError::BudgetExceeded {
                    op: name,
                    allocated: if rose_past {
                        after.allocated_peak
                    } else {
                        after.allocated
                    },
                    budget,
                });
            }
        }
        if self.check {
            for (&t, out) in req.outputs.iter().zip(&outs) {
                let h = hash_tensor(out)?;
                let slot = grow(&mut self.hashes, t.index());
                match *slot {
                    None => {
                        *slot = Some(h);
                        self.counters.hashed += 1;
                    }
                    Some(first) if first != h => {
                        return Err(LiveError::RematMismatch {
                            op: name,
                            tensor: t,
                            first,
                            now: h,
                        });
                    }
                    Some(_) => self.counters.remat_checked += 1,
                }
            }
        }
        if let Some(capacity) = self.device_capacity {
            if after.reserved > capacity {
                return Err(LiveError::Internal {
                    message: format!(
                        "{name}: {} bytes reserved on a device of {capacity} bytes",
                        after.reserved
                    ),
                });
            }
            // Tag each fresh output's block with its storage, for the window plans.
            let op = &self.ops[op_index];
            for (k, (&t, &s)) in req.outputs.iter().zip(req.output_storages).enumerate() {
                if op.outputs[k].alias.is_none() && !req.duplicates.contains(&t) && !constant {
                    let ptr = outs[k].storage().data_ptr() as DevicePtr;
                    // A block the allocator did not hand out (a zero-byte tensor) has no tag.
                    let _ = self.stats.set_tag(self.index, ptr, u64::from(s.0));
                }
            }
        }
        for ((&t, &s), out) in req.outputs.iter().zip(req.output_storages).zip(outs) {
            if req.duplicates.contains(&t) {
                continue; // a recomputed copy of a value already in memory: discarded
            }
            *grow(&mut self.values, t.index()) = Some(out);
            let m = grow(&mut self.members, s.index());
            if !m.contains(&t) {
                m.push(t);
            }
        }
        self.counters.peak_allocated = self.counters.peak_allocated.max(after.allocated);
        self.counters.peak_reserved = self.counters.peak_reserved.max(after.reserved);
        if constant {
            // Constants are pinned: the closure (and any host tensor it holds) is not needed.
            self.ops[op_index].f = None;
            self.staged_charge = 0;
            return Ok(0);
        }
        Ok(if self.measure {
            ns.max(1)
        } else {
            req.known_cost
        })
    }
}

fn grow<T: Default>(v: &mut Vec<T>, i: usize) -> &mut T {
    if v.len() <= i {
        v.resize_with(i + 1, T::default);
    }
    &mut v[i]
}

/// FNV-1a over bytes (64-bit).
fn fnv1a(hash: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(hash, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn hash_as<T: c10_core::Element>(t: &Tensor) -> Result<u64, LiveError> {
    let values = t.to_vec::<T>().map_err(|source| LiveError::Op {
        op: "hash check".into(),
        source,
    })?;
    let mut h = 0xcbf2_9ce4_8422_2325;
    for &s in t.sizes() {
        h = fnv1a(h, &s.to_le_bytes());
    }
    Ok(fnv1a(h, bytemuck::cast_slice(&values)))
}

/// A hash of `t`'s shape and elements in logical order (the debug check's fingerprint).
///
/// # Errors
/// [`LiveError::Op`] when the elements cannot be read (a complex dtype, a device whose bytes
/// are not host memory).
pub fn hash_tensor(t: &Tensor) -> Result<u64, LiveError> {
    match t.dtype() {
        ScalarType::Float => hash_as::<f32>(t),
        ScalarType::Double => hash_as::<f64>(t),
        ScalarType::Long => hash_as::<i64>(t),
        ScalarType::Int => hash_as::<i32>(t),
        ScalarType::Short => hash_as::<i16>(t),
        ScalarType::Char => hash_as::<i8>(t),
        ScalarType::Byte => hash_as::<u8>(t),
        ScalarType::Bool => hash_as::<c10_core::Bool>(t),
        ScalarType::Half => hash_as::<half::f16>(t),
        ScalarType::BFloat16 => hash_as::<half::bf16>(t),
        other => Err(LiveError::Internal {
            message: format!("the hash check cannot read {other} tensors"),
        }),
    }
}

impl Backend for LiveBackend {
    fn allocate(&mut self, _storage: StorageId, _bytes: u64) -> Result<(), BoxError> {
        // The op's kernel allocates its outputs; the core already made room for them.
        Ok(())
    }

    fn free(&mut self, storage: StorageId, _bytes: u64) -> Result<(), BoxError> {
        if let Some(m) = self.members.get_mut(storage.index()) {
            for t in std::mem::take(m) {
                if let Some(v) = self.values.get_mut(t.index()) {
                    *v = None;
                }
            }
        }
        Ok(())
    }

    fn run(&mut self, request: RunRequest<'_>) -> Result<u64, BoxError> {
        self.run_live(&request).map_err(|e| Box::new(e) as BoxError)
    }

    fn allocated_bytes(&self) -> Option<u64> {
        Some(self.figures().allocated.saturating_sub(self.staged_charge))
    }

    fn charged_bytes(&self, bytes: u64) -> u64 {
        self.charge_for(bytes)
    }

    fn device_capacity(&self) -> Option<u64> {
        self.device_capacity
    }

    fn try_allocate(&mut self, request: AllocRequest) -> Result<AllocOutcome, BoxError> {
        if self.device_capacity.is_none() || self.staged_charge > 0 {
            // Counting budget, or a device tensor adopted as a constant (already allocated).
            return Ok(AllocOutcome::Done);
        }
        self.reserve(request.bytes)
    }

    fn try_allocate_scratch(&mut self, bytes: u64) -> Result<AllocOutcome, BoxError> {
        if self.device_capacity.is_none() {
            return Ok(AllocOutcome::Done);
        }
        // The recomputed copies are allocated by the run like its other outputs.
        self.reserve(bytes)
    }

    fn free_scratch(&mut self) -> Result<(), BoxError> {
        // The run already handed its reservations back; this returns those of a run that
        // failed before it started.
        self.release_reserved().map_err(|e| Box::new(e) as BoxError)
    }

    fn plan_room(
        &mut self,
        cost: &dyn Fn(StorageId) -> Option<f64>,
        byte_credit: f64,
        whole_segment: bool,
        out: &mut Vec<StorageId>,
    ) -> Result<u64, BoxError> {
        let Some(mut miss) = self.last_miss else {
            return Ok(0);
        };
        if whole_segment {
            miss = crate::backend::whole_segment(miss);
        }
        let options = RoomOptions {
            byte_credit,
            ..RoomOptions::default()
        };
        let mut lookup = |tag: u64| u32::try_from(tag).ok().and_then(|t| cost(StorageId(t)));
        if let Some(tags) = self.stats.plan(self.index, &miss, options, &mut lookup) {
            out.extend(tags.iter().map(|&t| StorageId(t as u32)));
        }
        Ok(0)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// A source that records the calls the backend makes.
    #[derive(Default)]
    struct Recorder(Mutex<Vec<String>>);

    impl Recorder {
        fn note(&self, what: String) {
            self.0.lock().unwrap().push(what);
        }
    }

    impl StatsSource for Recorder {
        fn settle(&self) {
            self.note("settle".into());
        }
        fn figures_raw(&self, _: u8) -> MemoryFigures {
            self.note("figures".into());
            MemoryFigures::default()
        }
        fn config(&self, _: u8) -> AllocatorConfig {
            AllocatorConfig::default()
        }
        fn capacity(&self, _: u8) -> Result<u64, c10_cuda::Error> {
            Ok(0)
        }
        fn try_malloc(&self, _: u8, _: usize) -> Result<Result<DevicePtr, Miss>, c10_cuda::Error> {
            unreachable!("not reserved in this test")
        }
        fn free(&self, _: u8, ptr: DevicePtr) -> Result<(), c10_cuda::Error> {
            self.note(format!("free {ptr}"));
            Ok(())
        }
        fn set_tag(&self, _: u8, _: DevicePtr, _: u64) -> Result<(), c10_cuda::Error> {
            Ok(())
        }
        fn plan(
            &self,
            _: u8,
            _: &Miss,
            _: RoomOptions,
            _: &mut dyn FnMut(u64) -> Option<f64>,
        ) -> Option<Vec<u64>> {
            None
        }
    }

    #[test]
    fn thread_caches_settle_before_the_reserved_blocks_go_back() {
        // Settling after the reserved blocks are back could free waiting blocks beside them
        // and move the run's best fits out of them: settle first, read the figures raw.
        let rec = Arc::new(Recorder::default());
        let mut b =
            LiveBackend::with_source(rec.clone(), AllocatorConfig::default(), Device::cpu(), 0);
        b.reserved = vec![0x1000, 0x2000];
        b.hand_back_for_run().unwrap();
        assert_eq!(
            *rec.0.lock().unwrap(),
            ["settle", "free 8192", "free 4096", "figures"]
        );
    }
}
