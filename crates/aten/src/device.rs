//! Which allocator serves a device: aten's table per device **index** over c10-core's registry
//! per device **type**.
//!
//! c10-core's registry (`set_allocator`/`get_allocator`, as c10's `SetAllocator`) holds one
//! allocator per device type, and c10's `Allocator::allocate` takes no device: PyTorch's CUDA
//! allocator reads the *current device* instead. aten has no current device, so it honours the
//! index with its own table, keyed by the full [`Device`] (`sim:1`, `cuda:0`):
//!
//! 1. [`device_allocator`] looks the device up in the table ([`set_device_allocator`] fills it;
//!    [`crate::sim::install`] registers every simulated index, and the first CUDA request
//!    installs a caching allocator over every GPU, as PyTorch initialises CUDA lazily);
//! 2. otherwise it falls back to c10-core's registry for the type (the CPU slot always holds
//!    c10's `CpuAllocator`), and the allocation is then checked to have landed on the requested
//!    index ([`Error::Core`] with a device mismatch otherwise).
//!
//! A device without an index means index 0 (c10's "current device" with nothing ever set);
//! the CPU has no index ([`normalize_device`]).

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use c10_core::{Allocator, Device, DeviceType, Storage};
use parking_lot::RwLock;

use crate::error::{Error, Result};

static TABLE: LazyLock<RwLock<HashMap<Device, Arc<dyn Allocator>>>> =
    LazyLock::new(|| RwLock::new(HashMap::new()));

/// The canonical form of a device: `cpu` without an index, every other type with one (a missing
/// index means 0).
pub fn normalize_device(device: Device) -> Device {
    match device.device_type() {
        DeviceType::Cpu => Device::cpu(),
        other => Device::new(other, Some(device.index().unwrap_or(0))),
    }
}

/// Registers `allocator` for exactly `device` (after [`normalize_device`]), replacing any
/// earlier one for that device.
///
/// # Errors
/// [`Error::InvalidArgument`] when the allocator serves another device type.
pub fn set_device_allocator(device: Device, allocator: Arc<dyn Allocator>) -> Result<()> {
    let device = normalize_device(device);
    if allocator.device_type() != device.device_type() {
        return Err(Error::InvalidArgument {
            op: "set_device_allocator",
            message: format!(
                "an allocator for {} cannot serve {device}",
                allocator.device_type()
            ),
        });
    }
    TABLE.write().insert(device, allocator);
    Ok(())
}

/// The allocator for `device`: aten's table, then (for CUDA) the lazily installed caching
/// allocator, then c10-core's registry for the device type.
///
/// # Errors
/// [`Error::CudaUnavailable`] for CUDA without a usable GPU; [`Error::Core`] (`allocator for
/// sim is not set`) when nothing serves the type.
pub fn device_allocator(device: Device) -> Result<Arc<dyn Allocator>> {
    let device = normalize_device(device);
    if device.is_cpu() {
        return Ok(c10_core::get_cpu_allocator()?);
    }
    if let Some(allocator) = TABLE.read().get(&device) {
        return Ok(Arc::clone(allocator));
    }
    if device.is_cuda() {
        crate::device_copy::cuda_front()?;
        if let Some(allocator) = TABLE.read().get(&device) {
            return Ok(Arc::clone(allocator));
        }
    }
    Ok(c10_core::get_allocator(device.device_type())?)
}

/// A new non-resizable storage of `nbytes` bytes on `device` (uninitialised unless the
/// allocator zero-fills).
///
/// # Errors
/// Those of [`device_allocator`] and of the allocator; a device mismatch when the allocator put
/// the bytes on another index.
pub(crate) fn allocate(device: Device, nbytes: usize) -> Result<Storage> {
    let device = normalize_device(device);
    let storage = Storage::new(nbytes, device_allocator(device)?, false)?;
    if normalize_device(storage.device()) != device {
        return Err(Error::Core(c10_core::Error::AllocatorFailure {
            device,
            message: format!(
                "the allocator for {} placed the bytes on {}; register one for this index with \
                 aten::set_device_allocator",
                device.device_type(),
                storage.device()
            ),
        }));
    }
    Ok(storage)
}
