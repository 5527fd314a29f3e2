//! Sharing a tensor's bytes with another process: [`Tensor::share_ipc`] and
//! [`Tensor::from_ipc`], what `torch.multiprocessing`'s `reduce_tensor` / `rebuild_cuda_tensor`
//! do for CUDA tensors (`storage._share_cuda_()`, `UntypedStorage._new_shared_cuda`).
//!
//! The producer shares the tensor's storage through its caching allocator
//! ([`c10_cuda::CachingAllocator::share_storage`]: the segment, the block's offset in it, and a
//! reference counter that keeps the block alive until the consumers are done; see
//! [`c10_cuda_ipc`] for the rule); the [`IpcTensor`] adds the tensor's geometry (sizes, strides,
//! storage offset, dtype) and the storage's size, as `rebuild_cuda_tensor`'s arguments do. The
//! consumer opens it on a device of its own: a tensor over the shared bytes, whose storage is
//! not resizable (PyTorch's point 2 of Note [CUDA IPC and the caching allocator]: a resize would
//! write past the storage into the producer's neighbouring blocks).
//!
//! Backends: the simulated device installed with [`crate::sim::install_shareable`] (memory in
//! `memfd_create` regions; the consumer needs [`crate::sim::install`] too, for a `sim` device
//! to put the tensor on) and CUDA. Synchronising the processes' accesses is the caller's job.
//!
//! ```
//! use aten::{Tensor, TensorOptions};
//! use aten::ipc::IpcTensor;
//! use c10_core::Device;
//!
//! aten::sim::install_shareable(1, 64 << 20)?;
//! let t = Tensor::arange(0.0, 6.0, 1.0, TensorOptions::new().device(Device::sim(0)))?;
//! let bytes = t.share_ipc()?.to_bytes(); // send these to another process
//! // ... in the other process (here the same one):
//! let shared = Tensor::from_ipc(&IpcTensor::from_bytes(&bytes)?, Device::sim(0))?;
//! assert_eq!(shared.to_vec::<f32>()?, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
//! # Ok::<(), aten::Error>(())
//! ```

use std::str::FromStr;

use c10_core::{DeviceType, ScalarType, Storage};
use c10_cuda_ipc::{IpcError, IpcFront, IpcHandle};

use crate::error::{Error, Result};
use crate::tensor::Tensor;
use c10_core::Device;

/// The first bytes of an encoded [`IpcTensor`].
const MAGIC: &[u8; 8] = b"TMTENSOR";

/// The encoding version of [`IpcTensor::to_bytes`].
const VERSION: u8 = 1;

/// A tensor as another process can open it: the storage's IPC handle and the tensor's geometry
/// (`rebuild_cuda_tensor`'s arguments).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpcTensor {
    /// The producer's device type (`cuda` or `sim`).
    pub device_type: DeviceType,
    /// The element type.
    pub dtype: ScalarType,
    /// Sizes, in elements.
    pub sizes: Vec<i64>,
    /// Strides, in elements.
    pub strides: Vec<i64>,
    /// The tensor's offset in its storage, in elements.
    pub storage_offset: i64,
    /// Bytes of the storage (PyTorch's `storage_size_bytes`).
    pub storage_nbytes: u64,
    /// The storage's block; `None` for a storage without bytes (PyTorch sends no handle then).
    pub handle: Option<IpcHandle>,
}

fn malformed(message: impl Into<String>) -> Error {
    Error::Ipc {
        op: "from_ipc",
        source: IpcError::Malformed(message.into()),
    }
}

/// A little-endian reader over [`IpcTensor`] bytes.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, what: &str, n: usize) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            return Err(malformed(format!(
                "truncated tensor: {what} needs {n} bytes at byte {}",
                self.at
            )));
        };
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        let b = self.take(what, 4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(what, 8)?);
        Ok(u64::from_le_bytes(a))
    }

    fn i64(&mut self, what: &str) -> Result<i64> {
        Ok(self.u64(what)? as i64)
    }

    fn text(&mut self, what: &str) -> Result<&'a str> {
        let len = self.take(what, 1)?[0] as usize;
        std::str::from_utf8(self.take(what, len)?)
            .map_err(|_| malformed(format!("{what} is not UTF-8")))
    }
}

impl IpcTensor {
    /// The tensor as bytes: `TMTENSOR`, a version, the device type and dtype names, the
    /// geometry and storage size (little endian) and the storage's [`IpcHandle::to_bytes`].
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.push(VERSION);
        for text in [self.device_type.to_string(), self.dtype.name().to_string()] {
            out.push(text.len() as u8);
            out.extend_from_slice(text.as_bytes());
        }
        out.extend_from_slice(&(self.sizes.len() as u32).to_le_bytes());
        for v in self.sizes.iter().chain(&self.strides) {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.storage_offset.to_le_bytes());
        out.extend_from_slice(&self.storage_nbytes.to_le_bytes());
        match &self.handle {
            None => out.push(0),
            Some(h) => {
                out.push(1);
                let bytes = h.to_bytes();
                out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
                out.extend_from_slice(&bytes);
            }
        }
        out
    }

    /// Decodes [`IpcTensor::to_bytes`]'s output (the encoding only; whether the memory still
    /// exists is for [`Tensor::from_ipc`] to find out).
    ///
    /// # Errors
    /// [`Error::Ipc`] with [`IpcError::Malformed`] for anything that is not such an encoding.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let mut r = Reader { bytes, at: 0 };
        if r.take("magic", MAGIC.len())? != MAGIC {
            return Err(malformed("not an IPC tensor (bad magic)"));
        }
        let version = r.take("version", 1)?[0];
        if version != VERSION {
            return Err(malformed(format!(
                "IPC tensor version {version}, expected {VERSION}"
            )));
        }
        let device_type = DeviceType::from_str(r.text("device type")?)
            .map_err(|e| malformed(format!("device type: {e}")))?;
        let dtype =
            ScalarType::from_str(r.text("dtype")?).map_err(|e| malformed(format!("dtype: {e}")))?;
        let ndim = r.u32("dimensions")? as usize;
        if ndim > 64 {
            return Err(malformed(format!("{ndim} dimensions")));
        }
        let sizes = (0..ndim)
            .map(|_| r.i64("size"))
            .collect::<Result<Vec<_>>>()?;
        let strides = (0..ndim)
            .map(|_| r.i64("stride"))
            .collect::<Result<Vec<_>>>()?;
        let storage_offset = r.i64("storage offset")?;
        let storage_nbytes = r.u64("storage bytes")?;
        let handle = match r.take("handle flag", 1)?[0] {
            0 => None,
            1 => {
                let len = r.u32("handle length")? as usize;
                let raw = r.take("handle", len)?;
                Some(IpcHandle::from_bytes(raw).map_err(|source| Error::Ipc {
                    op: "from_ipc",
                    source,
                })?)
            }
            other => return Err(malformed(format!("handle flag {other}"))),
        };
        if r.at != bytes.len() {
            return Err(malformed(format!("{} trailing bytes", bytes.len() - r.at)));
        }
        Ok(IpcTensor {
            device_type,
            dtype,
            sizes,
            strides,
            storage_offset,
            storage_nbytes,
            handle,
        })
    }
}

impl Tensor {
    /// Shares this tensor's storage with other processes (PyTorch's `reduce_tensor` for a CUDA
    /// tensor, `storage._share_cuda_()`): the storage's block stays allocated until every
    /// consumer that opened it has dropped it, even if this tensor is dropped first (see
    /// [`c10_cuda_ipc`]).
    ///
    /// # Errors
    /// [`Error::UnsupportedDevice`] for CPU and meta tensors; [`Error::Ipc`] when the block cannot
    /// be shared (a simulated device not installed with [`crate::sim::install_shareable`], a
    /// storage from an older [`crate::sim::install`]).
    pub fn share_ipc(&self) -> Result<IpcTensor> {
        let op = "share_ipc";
        let storage = self.storage();
        let handle = if storage.nbytes() == 0 {
            None
        } else {
            let shared = match self.device().device_type() {
                DeviceType::Sim => crate::sim::installed()
                    .ok_or(Error::UnsupportedDevice {
                        op,
                        device: self.device(),
                        reason: "no simulated device is installed",
                    })?
                    .share_storage(storage),
                DeviceType::Cuda => crate::device_copy::cuda_front()?.share_storage(storage),
                _ => {
                    return Err(Error::UnsupportedDevice {
                        op,
                        device: self.device(),
                        reason: "only cuda and sim tensors are shared through IPC handles",
                    });
                }
            };
            Some(shared.map_err(|source| Error::Ipc { op, source })?)
        };
        Ok(IpcTensor {
            device_type: self.device().device_type(),
            dtype: self.dtype(),
            sizes: self.sizes().to_vec(),
            strides: self.strides().to_vec(),
            storage_offset: self.storage_offset(),
            storage_nbytes: storage.nbytes() as u64,
            handle,
        })
    }

    /// A tensor on `device` over bytes another process shared (PyTorch's
    /// `rebuild_cuda_tensor`, `UntypedStorage._new_shared_cuda`): the segment is opened once
    /// per process and closed when its last tensor is dropped; the storage is not resizable.
    ///
    /// # Errors
    /// [`Error::UnsupportedDevice`] when `device` is not of the producer's device type, or
    /// when no simulated device is installed here; [`Error::Ipc`] for a stale handle (the memory or its counter is gone) or a storage that
    /// does not fit in the shared block; layout errors when the geometry does not fit the storage.
    pub fn from_ipc(shared: &IpcTensor, device: Device) -> Result<Tensor> {
        let op = "from_ipc";
        let device = crate::device::normalize_device(device);
        if device.device_type() != shared.device_type {
            return Err(Error::UnsupportedDevice {
                op,
                device,
                reason: "the shared tensor is on another device type",
            });
        }
        let index = device.index().unwrap_or(0);
        let nbytes = usize::try_from(shared.storage_nbytes)
            .map_err(|_| malformed(format!("a storage of {} bytes", shared.storage_nbytes)))?;
        let storage = match &shared.handle {
            None => Storage::new(0, crate::device::device_allocator(device)?, false)?,
            Some(handle) => {
                if shared.storage_nbytes > handle.size {
                    return Err(malformed(format!(
                        "a storage of {} bytes in a block of {}",
                        shared.storage_nbytes, handle.size
                    )));
                }
                let opened = match device.device_type() {
                    DeviceType::Sim => crate::sim::installed()
                        .ok_or(Error::UnsupportedDevice {
                            op,
                            device,
                            reason: "no simulated device is installed (call aten::sim::install)",
                        })?
                        .open_ipc_handle(index, handle),
                    DeviceType::Cuda => {
                        crate::device_copy::cuda_front()?.open_ipc_handle(index, handle)
                    }
                    _ => {
                        return Err(Error::UnsupportedDevice {
                            op,
                            device,
                            reason: "only cuda and sim tensors are shared through IPC handles",
                        });
                    }
                }
                .map_err(|source| Error::Ipc { op, source })?;
                // SAFETY: the DataPtr from open_ipc_handle is valid for the block's `handle.size`
                // bytes (at least `nbytes`, checked above) for as long as it lives, on `device`'s
                // type; it is not a CPU storage, so c10-core never hands out `&mut [u8]` to it.
                unsafe { Storage::from_data_ptr(nbytes, opened, None, false)? }
            }
        };
        // SAFETY: the shared bytes were initialised by the producer (segments start zeroed and
        // every tensor aten makes is written before it is read); the open mapping is page
        // aligned plus a 512-byte multiple, aligned for every dtype.
        unsafe {
            Tensor::from_storage(
                storage,
                &shared.sizes,
                &shared.strides,
                shared.storage_offset,
                shared.dtype,
            )
        }
    }
}
