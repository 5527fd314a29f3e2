//! Pinned (page-locked) host memory for tensors: PyTorch's `Tensor.pin_memory()` and
//! `Tensor.is_pinned()` over c10-cuda's pinned host caching allocator
//! ([`c10_host_alloc::host_allocator::CachingHostAllocator`], PyTorch's `CachingHostAllocator`), and
//! the pinned staging blocks that copies to a device go through.
//!
//! There is one host allocator per accelerator, made on first use with the pinned knobs of
//! `PYTORCH_CUDA_ALLOC_CONF` (`pinned_use_cuda_host_register`, `pinned_num_register_threads`,
//! `pinned_use_background_threads`):
//! - CUDA: `cuMemHostAlloc` / `cuMemHostRegister` memory with device 0's events;
//! - the simulated device: page-aligned host memory with the events of the installed `sim:0`
//!   ([`crate::sim::install`] must have run).
//!
//! Pinned tensors are CPU tensors (as in PyTorch). Staging: a host-to-CUDA copy (`to`, `copy_`,
//! [`Tensor::sync_copy_from_cpu`]) first writes a pinned block and copies from it, and MXNet's
//! `SyncCopyFromCPU` / `SyncCopyToCPU` ([`Tensor::sync_copy_from_cpu`],
//! [`Tensor::sync_copy_to_cpu`], which engine-ndarray's `NDArray` sync copies call) stage through
//! a pinned block on the simulated device too. Those copies are synchronous, so the block goes
//! back to the cache as soon as the copy returns (no event is recorded); code that copies
//! asynchronously from a pinned tensor records the stream with [`record_pinned_stream`]
//! (PyTorch's `CachingHostAllocator_recordEvent`) so the block is not reused before the copy ran.

use std::collections::BTreeMap;
use std::sync::Arc;

use c10_core::{Allocator, Device, DeviceType, Storage};
use c10_cuda::config::AllocatorConfig;
use c10_cuda::device::StreamId;
use c10_cuda_driver::CudaPinnedMemory;
use c10_host_alloc::host_allocator::{CachingHostAllocator, HostAllocatorConfig};
use c10_host_alloc::pinned_memory::SimPinnedMemory;
use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::tensor::Tensor;

static CUDA_HOST: Mutex<Option<CachingHostAllocator<CudaPinnedMemory>>> = Mutex::new(None);
static SIM_HOST: Mutex<Option<CachingHostAllocator<SimPinnedMemory>>> = Mutex::new(None);

/// The pinned knobs of `PYTORCH_CUDA_ALLOC_CONF` (defaults when it is unset).
fn host_config(op: &'static str) -> Result<HostAllocatorConfig> {
    let config = AllocatorConfig::from_env().map_err(|e| Error::InvalidArgument {
        op,
        message: e.to_string(),
    })?;
    Ok(HostAllocatorConfig::from_alloc_config(&config))
}

/// The pinned host allocator for CUDA (made on first use over the CUDA front's device 0).
///
/// # Errors
/// [`Error::CudaUnavailable`] without a GPU; [`Error::InvalidArgument`] for a bad
/// `PYTORCH_CUDA_ALLOC_CONF`.
pub fn cuda_host_allocator() -> Result<CachingHostAllocator<CudaPinnedMemory>> {
    let mut slot = CUDA_HOST.lock();
    if let Some(host) = slot.as_ref() {
        return Ok(host.clone());
    }
    let front = crate::device_copy::cuda_front()?;
    let pinned = CudaPinnedMemory::new(front, 0).map_err(|source| Error::Device {
        op: "pin_memory",
        source,
    })?;
    let host = CachingHostAllocator::new(pinned, host_config("pin_memory")?);
    *slot = Some(host.clone());
    Ok(host)
}

/// The pinned host allocator for the simulated device (made on first use, with `sim:0`'s
/// events).
///
/// # Errors
/// [`Error::UnsupportedDevice`] when no simulated device is installed; [`Error::InvalidArgument`]
/// for a bad `PYTORCH_CUDA_ALLOC_CONF`.
pub fn sim_host_allocator() -> Result<CachingHostAllocator<SimPinnedMemory>> {
    let mut slot = SIM_HOST.lock();
    if let Some(host) = slot.as_ref() {
        return Ok(host.clone());
    }
    let device = crate::sim::installed_device(0).ok_or(Error::UnsupportedDevice {
        op: "pin_memory",
        device: Device::sim(0),
        reason: "no simulated device is installed (call aten::sim::install first)",
    })?;
    let host = CachingHostAllocator::new(SimPinnedMemory::new(device), host_config("pin_memory")?);
    *slot = Some(host.clone());
    Ok(host)
}

/// The c10-core allocator of pinned blocks for copies to `device_type` (CUDA or the simulated
/// device).
fn pinned_allocator(op: &'static str, device_type: DeviceType) -> Result<Arc<dyn Allocator>> {
    match device_type {
        DeviceType::Cuda => Ok(Arc::new(cuda_host_allocator()?.allocator())),
        DeviceType::Sim => Ok(Arc::new(sim_host_allocator()?.allocator())),
        _ => Err(Error::UnsupportedDevice {
            op,
            device: Device::new(device_type, None),
            reason: "pinned memory is for copies to an accelerator (cuda or sim)",
        }),
    }
}

/// A contiguous pinned CPU tensor of `shape` and `dtype` for copies to `device_type`. Its bytes
/// are initialised (new blocks are zeroed, cached ones hold earlier data) but not set.
pub(crate) fn pinned_empty(
    op: &'static str,
    device_type: DeviceType,
    shape: &[i64],
    dtype: c10_core::ScalarType,
) -> Result<Tensor> {
    let layout = Layout::contiguous(shape)?;
    let nbytes = crate::layout::numel(shape)
        .checked_mul(dtype.item_size())
        .ok_or(Error::InvalidArgument {
            op,
            message: "the pinned buffer does not fit in memory".into(),
        })?;
    let storage = Storage::new(nbytes, pinned_allocator(op, device_type)?, false)?;
    Tensor::from_new_storage(storage, layout, dtype)
}

/// A contiguous CPU tensor to stage a copy to (or from) `device_type` in: pinned when the
/// pinned allocator can give a block, else pageable.
pub(crate) fn staging(
    op: &'static str,
    device_type: DeviceType,
    shape: &[i64],
    dtype: c10_core::ScalarType,
) -> Result<Tensor> {
    match pinned_empty(op, device_type, shape, dtype) {
        Ok(t) => Ok(t),
        Err(_) => Tensor::empty_uninit(shape, dtype, Device::cpu()),
    }
}

/// Which accelerator [`Tensor::pin_memory`] pins for: CUDA when a GPU is usable, else the
/// simulated device when one is installed.
fn accelerator() -> Result<DeviceType> {
    if CUDA_HOST.lock().is_some() || crate::device_copy::cuda_front().is_ok() {
        return Ok(DeviceType::Cuda);
    }
    if crate::sim::installed_device(0).is_some() {
        return Ok(DeviceType::Sim);
    }
    Err(Error::UnsupportedDevice {
        op: "pin_memory",
        device: Device::cpu(),
        reason: "no accelerator: no usable CUDA device and no simulated device installed",
    })
}

/// Marks the pinned block under `tensor` as used by `stream` of `device_type`'s pinned
/// allocator (PyTorch's `CachingHostAllocator_recordEvent`): when the tensor's storage is freed
/// the block is not reused until the work queued on `stream` so far is done. Returns false when
/// the tensor is not pinned by that allocator.
///
/// # Errors
/// Those of [`cuda_host_allocator`] / [`sim_host_allocator`].
pub fn record_pinned_stream(
    tensor: &Tensor,
    device_type: DeviceType,
    stream: StreamId,
) -> Result<bool> {
    let ptr = tensor.storage().data_ptr() as usize;
    match device_type {
        DeviceType::Cuda => Ok(cuda_host_allocator()?.record_event(ptr, stream)),
        DeviceType::Sim => Ok(sim_host_allocator()?.record_event(ptr, stream)),
        _ => Ok(false),
    }
}

/// `torch.cuda.host_memory_stats()` of `device_type`'s pinned allocator (empty when it has
/// not been made yet).
pub fn host_memory_stats(device_type: DeviceType) -> BTreeMap<String, i64> {
    match device_type {
        DeviceType::Cuda => CUDA_HOST
            .lock()
            .as_ref()
            .map(CachingHostAllocator::host_memory_stats),
        DeviceType::Sim => SIM_HOST
            .lock()
            .as_ref()
            .map(CachingHostAllocator::host_memory_stats),
        _ => None,
    }
    .unwrap_or_default()
}

/// Releases the cached pinned blocks of every pinned allocator made so far
/// (`torch._C._host_emptyCache()`).
pub fn empty_pinned_cache() {
    if let Some(h) = CUDA_HOST.lock().as_ref() {
        h.empty_cache();
    }
    if let Some(h) = SIM_HOST.lock().as_ref() {
        h.empty_cache();
    }
}

impl Tensor {
    /// Whether this tensor's bytes are pinned host memory of one of aten's pinned allocators
    /// (PyTorch's `Tensor.is_pinned()`). Only CPU tensors can be.
    pub fn is_pinned(&self) -> bool {
        if self.device().device_type() != DeviceType::Cpu || self.nbytes() == 0 {
            return false;
        }
        let ptr = self.storage().data_ptr() as usize;
        CUDA_HOST.lock().as_ref().is_some_and(|h| h.is_pinned(ptr))
            || SIM_HOST.lock().as_ref().is_some_and(|h| h.is_pinned(ptr))
    }

    /// A copy of this CPU tensor in pinned memory (this tensor itself when it is pinned
    /// already), as `t.pin_memory()`: for CUDA when a GPU is usable, else for the installed
    /// simulated device. The copy is contiguous.
    ///
    /// # Errors
    /// [`Error::UnsupportedDevice`] for a tensor that is not on the CPU, or when there is no
    /// accelerator; allocation errors of the pinned allocator.
    pub fn pin_memory(&self) -> Result<Tensor> {
        self.pin_memory_for(accelerator()?)
    }

    /// [`Tensor::pin_memory`] with the pinned allocator of `device_type` (CUDA or the
    /// simulated device).
    ///
    /// # Errors
    /// As [`Tensor::pin_memory`].
    pub fn pin_memory_for(&self, device_type: DeviceType) -> Result<Tensor> {
        if self.device().device_type() != DeviceType::Cpu {
            return Err(Error::UnsupportedDevice {
                op: "pin_memory",
                device: self.device(),
                reason: "only CPU tensors can be pinned",
            });
        }
        if self.is_pinned() {
            return Ok(self.clone());
        }
        let out = pinned_empty("pin_memory", device_type, self.sizes(), self.dtype())?;
        out.copy_(self)?;
        Ok(out)
    }
}
