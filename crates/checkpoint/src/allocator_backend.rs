//! Routes every storage through c10-cuda's caching allocator on an address-only simulated
//! device, so a simulated run reports reserved bytes and fragmentation beside the allocated
//! bytes the budget counts.
//!
//! The budget still counts the storages' own bytes (as simrd and the prototype's
//! `allocated_bytes.all.current` do), so statuses and overheads are those of the plain
//! simulator; what this adds is how much memory the device really gives up. DTR frees tensors
//! at scattered addresses, so free bytes sit in split segments the next large request cannot
//! use, and the caching allocator reserves more (Coop's observation).

use c10_cuda::config::AllocatorConfig;
use c10_cuda::device::{DevicePtr, StreamId};
use c10_cuda::sizes::round_size;
use c10_cuda::{DeviceCachingAllocator, SimDevice};

use crate::backend::{Backend, RunRequest};
use crate::error::BoxError;
use crate::graph::StorageId;

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
    /// Allocation requests.
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
        })
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
        self.report.requests += 1;
        let allocated = self.alloc.allocated_bytes() as u64;
        let reserved = self.alloc.reserved_bytes() as u64;
        let r = &mut self.report;
        r.peak_allocated_bytes = r.peak_allocated_bytes.max(allocated);
        if reserved > r.peak_reserved_bytes {
            r.peak_reserved_bytes = reserved;
            r.allocated_at_reserved_peak = allocated;
        }
        r.max_unused_reserved_bytes = r.max_unused_reserved_bytes.max(reserved - allocated);
        Ok(a.ptr)
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
        let i = storage.index();
        if self.ptrs.len() <= i {
            self.ptrs.resize(i + 1, 0);
        }
        self.ptrs[i] = if bytes == 0 { 0 } else { self.malloc(bytes)? };
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
        if request.duplicate_bytes > 0 {
            // The recomputed copies of outputs already in memory live during the run only.
            let p = self.malloc(request.duplicate_bytes)?;
            self.alloc.free(p)?;
        }
        Ok(request.known_cost)
    }
}
