//! Moving tensors between devices: [`Tensor::to`], and the seed's synchronous host copies
//! [`Tensor::sync_copy_from_cpu`] / [`Tensor::sync_copy_to_cpu`] (MXNet's `SyncCopyFromCPU` /
//! `SyncCopyToCPU`, whose sizes must match exactly).
//!
//! * CPU <-> host-backed simulated device (and `sim:i` <-> `sim:j`): both sides are host memory
//!   (checked), so the strided copy kernel moves the elements directly.
//! * CPU <-> CUDA: c10-cuda's [`CudaDevice::copy_htod`] / [`CudaDevice::copy_dtoh`] (cudarc's
//!   synchronous `cuMemcpyHtoD_v2` / `cuMemcpyDtoH_v2`) on the device's caching allocator, staged
//!   through a contiguous host buffer. The first CUDA request probes for a driver and a device
//!   ([`c10_cuda_driver::probe`], which never panics) and installs a caching allocator over every
//!   GPU ([`cuda_front`]); without one, [`Error::CudaUnavailable`] says what the probe found.
//!   A CUDA *destination* must be contiguous; a CUDA source may have any layout (the bytes its
//!   layout spans are copied, then viewed on the host).
//! * Pinned staging ([`crate::pinned`]): host-to-CUDA copies go through a pinned block of the
//!   CUDA host allocator (or straight from the source when it is a pinned contiguous tensor of
//!   the destination's shape and dtype), and the sync copies stage through a pinned block on the
//!   simulated device and from CUDA too. Where no pinned block can be had, pageable memory
//!   stages instead.

use std::sync::Arc;

use c10_core::{Device, DeviceType, Element};
use c10_cuda::CachingAllocator;
use c10_cuda::config::AllocatorConfig;
use c10_cuda_driver::{CudaDevice, probe};
use parking_lot::Mutex;

use crate::copy::copy_kernel;
use crate::device::{normalize_device, set_device_allocator};
use crate::error::{Error, Result};
use crate::host::{self, Access};
use crate::layout::Layout;
use crate::tensor::Tensor;

static CUDA: Mutex<Option<Arc<CachingAllocator<CudaDevice>>>> = Mutex::new(None);

/// The caching allocator over every CUDA device, installed on first use (as PyTorch initialises
/// CUDA lazily) and registered with aten for `cuda:0..n`.
///
/// # Errors
/// [`Error::CudaUnavailable`] with the probe's finding when no driver or no device is usable;
/// [`Error::Device`] when a device cannot be opened.
pub fn cuda_front() -> Result<Arc<CachingAllocator<CudaDevice>>> {
    let mut slot = CUDA.lock();
    if let Some(front) = slot.as_ref() {
        return Ok(Arc::clone(front));
    }
    let found = probe();
    if !found.is_available() {
        return Err(Error::CudaUnavailable {
            reason: found.to_string(),
        });
    }
    let count = u8::try_from(found.devices()).unwrap_or(u8::MAX);
    let devices = (0..count)
        .map(CudaDevice::new)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| Error::Device {
            op: "cuda init",
            source,
        })?;
    let front = Arc::new(CachingAllocator::new(devices, AllocatorConfig::default())?);
    for i in 0..count {
        set_device_allocator(Device::cuda(i), Arc::new(front.allocator(i)?))?;
    }
    *slot = Some(Arc::clone(&front));
    Ok(front)
}

/// The CUDA front and device index of a CUDA tensor.
fn cuda_of(t: &Tensor) -> Result<(Arc<CachingAllocator<CudaDevice>>, u8)> {
    let front = cuda_front()?;
    Ok((front, normalize_device(t.device()).index().unwrap_or(0)))
}

/// Copies a CUDA tensor's elements to a new CPU tensor with the same sizes and strides (the
/// bytes its layout spans are fetched with one device-to-host copy), into a pinned block when
/// `pinned`.
fn cuda_to_host(op: &'static str, t: &Tensor, pinned: bool) -> Result<Tensor> {
    if t.device().device_type() != DeviceType::Cuda {
        return Err(Error::UnsupportedDevice {
            op,
            device: t.device(),
            reason: "its bytes are neither host memory nor CUDA memory",
        });
    }
    let itemsize = t.element_size();
    let required = t.layout().required_storage_elements() as usize;
    if required == 0 {
        return Tensor::zeros(t.sizes(), t.options().device(Device::cpu()));
    }
    let first = t.storage_offset() as usize;
    let span = required - first;
    let host = if pinned {
        crate::pinned::staging(op, DeviceType::Cuda, &[span as i64], t.dtype())?
    } else {
        Tensor::empty_uninit(&[span as i64], t.dtype(), Device::cpu())?
    };
    let (front, index) = cuda_of(t)?;
    let src = t.storage().data_ptr() as u64 + (first * itemsize) as u64;
    host::with_bytes_mut(op, &host, |bytes| {
        front.with_device(index, |a| a.device().copy_dtoh(bytes, src))
    })??
    .map_err(|source| Error::Device { op, source })?;
    host.as_strided(t.sizes(), t.strides(), Some(0))
}

/// Writes the contiguous host tensor `src` into the contiguous CUDA tensor `dst` (same byte
/// size).
pub(crate) fn copy_host_to_device(op: &'static str, dst: &Tensor, src: &Tensor) -> Result<()> {
    if dst.device().device_type() != DeviceType::Cuda {
        return Err(Error::UnsupportedDevice {
            op,
            device: dst.device(),
            reason: "its bytes are neither host memory nor CUDA memory",
        });
    }
    if !dst.is_contiguous() {
        return Err(Error::NotContiguous {
            op,
            sizes: dst.sizes().to_vec(),
            strides: dst.strides().to_vec(),
        });
    }
    if dst.nbytes() != src.nbytes() {
        return Err(Error::MemorySizeMismatch {
            op,
            expected: dst.nbytes(),
            actual: src.nbytes(),
        });
    }
    let (front, index) = cuda_of(dst)?;
    let ptr = dst.data_ptr() as u64;
    host::with_bytes(op, src, |bytes| {
        front.with_device(index, |a| a.device().copy_htod(ptr, bytes))
    })??
    .map_err(|source| Error::Device { op, source })
}

/// `dst.copy_(src)` when at least one side is not host memory: stage through the host.
pub(crate) fn copy_across(
    op: &'static str,
    dst: &Tensor,
    src: &Tensor,
    src_layout: Layout,
) -> Result<()> {
    let (src, src_layout) = if host::is_host_accessible(src) {
        (src.clone(), src_layout)
    } else {
        let host = cuda_to_host(op, src, false)?;
        let layout = Layout::from_parts(
            src_layout.sizes().to_vec(),
            src_layout.strides().to_vec(),
            host.storage_offset(),
        );
        (host, layout)
    };
    if host::is_host_accessible(dst) {
        return copy_kernel(op, dst, &src, src_layout);
    }
    // A pinned contiguous source of the destination's shape and dtype is copied from directly.
    if src.is_pinned()
        && src.dtype() == dst.dtype()
        && src_layout == *src.layout()
        && src.sizes() == dst.sizes()
        && src.is_contiguous()
    {
        return copy_host_to_device(op, dst, &src);
    }
    let staged = crate::pinned::staging(op, dst.device().device_type(), dst.sizes(), dst.dtype())?;
    copy_kernel(op, &staged, &src, src_layout)?;
    copy_host_to_device(op, dst, &staged)
}

impl Tensor {
    /// A copy on `device` (this tensor itself if it is already there), as `t.to(device)`. The
    /// copy is contiguous, with the same shape and dtype.
    ///
    /// # Errors
    /// [`Error::CudaUnavailable`] for CUDA without a GPU; allocation errors on the target;
    /// [`Error::UnsupportedDevice`] for devices whose bytes aten cannot reach (meta, an
    /// address-only simulated device).
    pub fn to(&self, device: Device) -> Result<Tensor> {
        let device = normalize_device(device);
        if normalize_device(self.device()) == device {
            return Ok(self.clone());
        }
        let out = Tensor::empty_uninit(self.sizes(), self.dtype(), device)?;
        copy_across("to", &out, self, self.layout().clone())?;
        Ok(out)
    }

    /// Copies `data` (row-major) into this tensor, synchronously, as MXNet's
    /// `NDArray::SyncCopyFromCPU`. Works on any layout of a host tensor (CPU, host-backed sim)
    /// and on a contiguous CUDA tensor. Bumps the version counter.
    ///
    /// # Errors
    /// [`Error::DtypeMismatch`] unless `T` is the element type; [`Error::MemorySizeMismatch`]
    /// ("memory size do not match") unless `data` has exactly [`crate::TensorImpl::nbytes`]
    /// bytes; [`Error::MemoryOverlap`] for self-overlapping elements; device errors.
    pub fn sync_copy_from_cpu<T: Element>(&self, data: &[T]) -> Result<()> {
        let op = "sync_copy_from_cpu";
        self.check_host_buffer::<T>(op, size_of_val(data))?;
        crate::copy::check_no_internal_overlap(op, self)?;
        if self.device().device_type() == DeviceType::Sim && host::is_host_accessible(self) {
            // SyncCopyFromCPU on the simulated device: through a pinned staging block.
            let staged = crate::pinned::staging(op, DeviceType::Sim, self.sizes(), self.dtype())?;
            staged.sync_copy_from_cpu(data)?;
            copy_kernel(op, self, &staged, staged.layout().clone())?;
        } else if host::is_host_accessible(self) {
            let access = Access::lock(op, &[], &[self])?;
            let mut values = data.iter().copied();
            access
                .dst::<T>(op, self)?
                .assign(|| values.next().unwrap_or_default());
        } else {
            let src = Tensor::from_slice(data, self.sizes())?;
            copy_across(op, self, &src, src.layout().clone())?;
        }
        self.bump_version();
        Ok(())
    }

    /// Copies this tensor's elements (row-major) into `out`, synchronously, as MXNet's
    /// `NDArray::SyncCopyToCPU`. Works on any layout and device.
    ///
    /// # Errors
    /// [`Error::DtypeMismatch`]; [`Error::MemorySizeMismatch`] unless `out` has exactly
    /// [`crate::TensorImpl::nbytes`] bytes; device errors.
    pub fn sync_copy_to_cpu<T: Element>(&self, out: &mut [T]) -> Result<()> {
        let op = "sync_copy_to_cpu";
        self.check_host_buffer::<T>(op, size_of_val(out))?;
        let host = if self.device().device_type() == DeviceType::Sim
            && host::is_host_accessible(self)
        {
            // SyncCopyToCPU on the simulated device: through a pinned staging block.
            let staged = crate::pinned::staging(op, DeviceType::Sim, self.sizes(), self.dtype())?;
            copy_kernel(op, &staged, self, self.layout().clone())?;
            staged
        } else if host::is_host_accessible(self) {
            self.clone()
        } else {
            cuda_to_host(op, self, true)?
        };
        let access = Access::lock(op, &[&host], &[])?;
        let mut slots = out.iter_mut();
        access.src::<T>(op, &host)?.for_each(|v| {
            if let Some(slot) = slots.next() {
                *slot = v;
            }
        });
        Ok(())
    }

    fn check_host_buffer<T: Element>(&self, op: &'static str, bytes: usize) -> Result<()> {
        if self.dtype() != T::SCALAR_TYPE {
            return Err(Error::DtypeMismatch {
                op,
                expected: self.dtype(),
                actual: T::SCALAR_TYPE,
            });
        }
        if bytes != self.nbytes() {
            return Err(Error::MemorySizeMismatch {
                op,
                expected: self.nbytes(),
                actual: bytes,
            });
        }
        Ok(())
    }
}
