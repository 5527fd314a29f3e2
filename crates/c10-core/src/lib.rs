//! PyTorch's c10 core memory types in Rust: devices, owning data pointers, allocators, byte
//! storages and scalar types.
//!
//! # Layering
//!
//! Memory reaches a tensor through five layers, each owning the next, exactly as in c10/ATen:
//!
//! ```text
//! Tensor          (not in this crate) shape, strides, offset, dtype; holds a Storage
//!   -> Storage        shared handle, Arc<StorageImpl>            (c10::Storage)
//!     -> StorageImpl  bytes: DataPtr + nbytes + allocator + device (c10::StorageImpl)
//!       -> DataPtr    owning pointer: data, context, deleter      (c10::DataPtr)
//!         -> Allocator  where the bytes came from, per device type (c10::Allocator)
//! ```
//!
//! * [`Allocator`] hands out [`DataPtr`]s; [`CpuAllocator`] is the host implementation (64-byte
//!   aligned, as c10's `alloc_cpu`). A process-wide registry maps each [`DeviceType`] to one
//!   allocator ([`set_allocator`] / [`get_allocator`], as c10's `SetAllocator` / `GetAllocator`);
//!   the CPU slot is filled with a `CpuAllocator` from the start.
//! * A [`DataPtr`] frees its allocation exactly once, when dropped, through its deleter.
//! * A [`StorageImpl`] is an untyped byte buffer: one `DataPtr`, its size in bytes, the allocator
//!   to resize with, and the [`Device`]. [`Storage`] shares it (`Arc`), [`WeakStorage`] observes
//!   it (`Weak`); see [`storage`] for how this maps to c10's `intrusive_ptr` and why mutable byte
//!   access is `unsafe` unless the handle is unique.
//! * [`ScalarType`] and [`Element`] describe how a tensor reads those bytes.
//!
//! Every fallible call returns [`Result`] with the crate's single [`Error`] enum.
//!
//! # Example
//!
//! ```
//! use c10_core::{get_allocator, Device, DeviceType, Storage};
//!
//! let device: Device = "cuda:0".parse()?;
//! assert_eq!(device, Device::cuda(0));
//!
//! let cpu = get_allocator(DeviceType::Cpu)?;
//! let storage = Storage::new(16, cpu, false)?;
//! let alias = storage.clone();
//! assert_eq!(storage.use_count(), 2);
//! assert!(alias.is_alias_of(&storage));
//! # Ok::<(), c10_core::Error>(())
//! ```

pub mod allocator;
pub mod cpu_allocator;
pub mod data_ptr;
pub mod device;
pub mod error;
pub mod scalar_type;
pub mod storage;

pub use allocator::{
    Allocator, allocator_priority, get_allocator, get_cpu_allocator, set_allocator,
};
pub use cpu_allocator::{ALIGNMENT, CpuAllocator};
pub use data_ptr::{DataPtr, DeleterFn, RawContext};
pub use device::{Device, DeviceIndex, DeviceType};
pub use error::{Error, Result};
pub use scalar_type::{Bool, Element, ScalarType};
pub use storage::{Storage, StorageImpl, WeakStorage};
