//! The simulated device as a tensor device: c10-cuda's caching allocator over host-backed
//! [`SimDevice`]s, so the whole stack (tensor -> caching allocator -> device) runs on a CPU.
//!
//! A host-backed simulated device's addresses are host pointers, so aten runs its CPU kernels
//! directly on the bytes of `sim:N` tensors, after checking (on every access) that the storage's
//! whole byte range lies inside a live segment of one of the devices installed here
//! ([`SimDevice::is_host_range`]). Storages from any other `Sim` allocator (an address-only
//! device, say) are refused with [`crate::Error::UnsupportedDevice`], unless that allocator says
//! its bytes are host memory (c10-core's `Allocator::host_accessible`, which a user's own
//! host-backed allocator returns `true` from; then no check of this module is needed).
//!
//! ```
//! use aten::{Tensor, TensorOptions};
//! use c10_core::Device;
//!
//! let front = aten::sim::install(1, 64 << 20)?; // sim:0, 64 MiB
//! let t = Tensor::ones(&[256], TensorOptions::new().device(Device::sim(0)))?;
//! let stats = front.memory_stats(0)?;
//! assert_eq!(stats["allocated_bytes.all.current"], 1024); // 256 f32 = 1 KiB
//! drop(t);
//! assert_eq!(front.memory_stats(0)?["allocated_bytes.all.current"], 0);
//! # Ok::<(), aten::Error>(())
//! ```

use std::sync::Arc;

use c10_core::{Device, DeviceType};
use c10_cuda::config::AllocatorConfig;
use c10_cuda::device::DeviceMemory;
use c10_cuda::{CachingAllocator, SimDevice};
use parking_lot::RwLock;

use crate::device::{normalize_device, set_device_allocator};
use crate::error::Result;

/// Every host-backed device ever installed (handles share state with the allocator's), and the
/// latest front.
struct Installed {
    devices: Vec<SimDevice>,
    front: Option<Arc<CachingAllocator<SimDevice>>>,
}

static INSTALLED: RwLock<Installed> = RwLock::new(Installed {
    devices: Vec::new(),
    front: None,
});

/// Installs `device_count` host-backed simulated devices of `capacity` bytes each behind one
/// caching allocator with the default configuration, and registers `sim:0..device_count` with
/// aten ([`crate::set_device_allocator`]) and `sim:0` with c10-core's registry (priority 0, so
/// an allocator registered with a higher priority keeps the c10 slot). Returns the front, for
/// `memory_stats()`, `memory_summary()`, `empty_cache()` and so on.
///
/// Installing again replaces the allocators for new tensors; tensors made before keep their
/// blocks (each block holds its allocator) and stay usable.
///
/// # Errors
/// [`crate::Error::Cuda`] from [`CachingAllocator::new`].
pub fn install(device_count: u8, capacity: usize) -> Result<Arc<CachingAllocator<SimDevice>>> {
    install_with_config(device_count, capacity, AllocatorConfig::default())
}

/// [`install`] with an allocator configuration (PYTORCH_CUDA_ALLOC_CONF's settings).
///
/// # Errors
/// As [`install`].
pub fn install_with_config(
    device_count: u8,
    capacity: usize,
    config: AllocatorConfig,
) -> Result<Arc<CachingAllocator<SimDevice>>> {
    install_devices(device_count, capacity, config, false)
}

/// [`install`] with devices whose memory lives in shareable `memfd_create` regions
/// ([`SimDevice::with_shareable_memory`], Linux only), so that their tensors can be shared with
/// other processes ([`crate::Tensor::share_ipc`]). Each live segment holds a file descriptor.
///
/// # Errors
/// As [`install`].
pub fn install_shareable(
    device_count: u8,
    capacity: usize,
) -> Result<Arc<CachingAllocator<SimDevice>>> {
    install_devices(device_count, capacity, AllocatorConfig::default(), true)
}

fn install_devices(
    device_count: u8,
    capacity: usize,
    config: AllocatorConfig,
    shareable: bool,
) -> Result<Arc<CachingAllocator<SimDevice>>> {
    let devices: Vec<SimDevice> = (0..device_count)
        .map(|i| SimDevice::host_backed(i, capacity).with_shareable_memory(shareable))
        .collect();
    let front = Arc::new(CachingAllocator::new(devices.clone(), config)?);
    let mut installed = INSTALLED.write();
    installed.devices.extend(devices);
    for i in 0..device_count {
        set_device_allocator(Device::sim(i), Arc::new(front.allocator(i)?))?;
    }
    if device_count > 0 {
        c10_core::set_allocator(DeviceType::Sim, Arc::new(front.allocator(0)?), 0)?;
    }
    installed.front = Some(Arc::clone(&front));
    Ok(front)
}

/// Makes `front` (one [`install`] returned earlier) the allocator of new `sim:` tensors again,
/// after a later [`install`] replaced it.
///
/// # Errors
/// [`crate::Error::Cuda`] when the front has no device.
pub fn reinstall(front: &Arc<CachingAllocator<SimDevice>>) -> Result<()> {
    let indices = front.device_indices();
    let mut installed = INSTALLED.write();
    for &i in &indices {
        set_device_allocator(Device::sim(i), Arc::new(front.allocator(i)?))?;
    }
    if let Some(&first) = indices.first() {
        c10_core::set_allocator(DeviceType::Sim, Arc::new(front.allocator(first)?), 0)?;
    }
    installed.front = Some(Arc::clone(front));
    Ok(())
}

/// The front from the latest [`install`], if any.
pub fn installed() -> Option<Arc<CachingAllocator<SimDevice>>> {
    INSTALLED.read().front.clone()
}

/// The device with `index` of the latest [`install`], if any.
pub(crate) fn installed_device(index: u8) -> Option<SimDevice> {
    INSTALLED
        .read()
        .devices
        .iter()
        .rev()
        .find(|d| d.index() == index)
        .cloned()
}

/// Whether `[ptr, ptr + len)` lies in live host-backed memory of an installed simulated device
/// with `device`'s index, or in simulated memory another process shared with this one
/// ([`c10_cuda_ipc::is_open_host_range`]; such a storage holds the mapping open).
pub(crate) fn is_host_range(device: Device, ptr: u64, len: usize) -> bool {
    let index = normalize_device(device).index().unwrap_or(0);
    INSTALLED
        .read()
        .devices
        .iter()
        .any(|d| d.index() == index && d.is_host_range(ptr, len))
        || c10_cuda_ipc::is_open_host_range(ptr, len)
}
