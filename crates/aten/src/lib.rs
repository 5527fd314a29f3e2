//! PyTorch's ATen tensor in Rust: [`Tensor`] and [`TensorImpl`] over c10-core storages, with
//! PyTorch's layout rules, views, CPU kernels and device copies.
//!
//! # Layering
//!
//! ```text
//! Tensor          shared handle, Arc<TensorImpl>                       (at::Tensor)
//!   -> TensorImpl   layout (sizes, strides, offset), dtype, version  (c10::TensorImpl)
//!     -> Storage      shared handle, Arc<StorageImpl>                (c10::Storage)
//!       -> StorageImpl  bytes: DataPtr + nbytes + allocator + device (c10::StorageImpl)
//!         -> DataPtr      owning pointer with its deleter            (c10::DataPtr)
//!           -> Allocator    CPU, caching allocator on a GPU or on the simulated device
//! ```
//!
//! Tensor/TensorImpl and Storage/StorageImpl are bridges: a cheap handle (clone = reference
//! count) over a shared implementation. As in candle, the [`Layout`] (sizes, strides and offset,
//! with every stride rule) is its own type in [`layout`]; unlike candle, the semantics are
//! PyTorch's: signed sizes and strides in elements, a storage offset, an untyped byte storage
//! from a pluggable allocator, views that share storage and version counter.
//!
//! # Modules
//!
//! | module | what |
//! |---|---|
//! | [`layout`] | [`Layout`] and the stride rules: contiguity, `computeStride`, broadcasting, expansion, the strides of new results |
//! | [`tensor`] | [`Tensor`], [`TensorImpl`], [`VersionCounter`]; why the storage has a data lock |
//! | [`create`] | `empty`, `zeros`, `ones`, `full`, `arange`, `from_vec`, `rand`, `randn`; [`TensorOptions`], [`Generator`] |
//! | [`view`] | `view`, `reshape`, `narrow`, `slice`, `select`, `transpose`, `permute`, `expand`, ... |
//! | [`access`] | `to_vec`, `item`, locked slices ([`SliceGuard`], [`SliceGuardMut`]) |
//! | [`copy`] | `copy_`, `contiguous`, `deep_clone` (PyTorch's `clone`), `to_dtype`, `fill_`, `zero_` |
//! | [`device_copy`] | `to(device)`, `sync_copy_from_cpu` / `sync_copy_to_cpu`, the lazy CUDA allocator |
//! | [`pinned`] | `pin_memory`, `is_pinned`, the pinned host allocators and the staging of copies to a device |
//! | [`ipc`] | `share_ipc` / `from_ipc`: a tensor's bytes shared with another process |
//! | [`ops`] | CPU kernels: [`ops::elementwise`], [`ops::reduce`], [`ops::matmul`], [`ops::softmax`], [`ops::loss`] |
//! | [`promotion`] | type promotion: [`Scalar`], `promote_types`, `result_type`, `can_cast` |
//! | [`strided_index`] | iteration over non-contiguous layouts |
//! | [`device`] | which allocator serves a device index |
//! | [`sim`] | the host-backed simulated device with the caching allocator |
//! | [`display`] | PyTorch's `repr` |
//! | [`error`] | the one [`Error`] enum |
//!
//! # Devices
//!
//! Tensors are created on a device through its allocator ([`device_allocator`]). Kernels run on
//! host memory: the CPU, the host-backed simulated device ([`sim::install`]), whose device
//! addresses are host pointers, so the whole stack runs on a CPU, and any device served by an
//! allocator that says its bytes are host memory (c10-core's `Allocator::host_accessible`,
//! registered with [`set_device_allocator`]: a user's own host-emulated device, unified
//! memory). CUDA tensors can be created
//! and copied (`to`, `copy_`, `sync_copy_*`) through cudarc when a GPU is present; computing on
//! them needs `.to(Device::cpu())` first.
//!
//! # Safety
//!
//! The safe API is sound: kernels hold each storage's data lock (see [`tensor`]) and read and
//! write elements through checked raw pointers in one place (`host.rs`, whose module docs give
//! the argument). As in PyTorch, only raw pointers obtained by the user
//! ([`TensorImpl::data_ptr`]) leave synchronisation to the user, through `unsafe` code.
//!
//! # Semantics
//!
//! Results agree with real PyTorch (checked against torch 2.15.0 on CPU by the differential
//! battery `tests/torch_battery.rs`, whose expected values torch produced): type promotion
//! ([`promotion`]: `int64 + 2.5` is `Float`, `float32 + float64` is `Double`, `int / int` is
//! true division), the layout of results (elementwise outputs follow their inputs' memory order
//! as TensorIterator's; `clone()` and `to(dtype)` preserve the layout; reductions, softmax,
//! losses and matrix products are contiguous), conversions, and `repr()`.
//!
//! # Where aten differs from PyTorch on purpose
//!
//! * [`Tensor::deep_clone`] is PyTorch's `clone()`: Rust's [`Clone::clone`] is the handle copy.
//! * [`Tensor::empty`] returns zeroed memory (reading uninitialised bytes is undefined
//!   behaviour in Rust); kernels still allocate their outputs without filling them.
//! * Float to integer conversion out of the target's range, or of NaN, is undefined in C++;
//!   aten saturates (NaN gives 0) where torch 2.15.0 on x86 gives the `INT_MIN` of a 32- or
//!   64-bit intermediate (`-200.0` to `int8`: torch 56, aten -128; NaN to `int32`: torch
//!   -2147483648, aten 0; `inf` to `uint8`: torch 0, aten 255). In range (and for `uint8`,
//!   within `int64`'s range: `-1.5` gives 255) both agree.
//! * Half and bfloat16 tensors can be created, copied, converted, reduced with `sum` and
//!   printed, and promote to `float32` beside one, but have no arithmetic kernels of their own
//!   (torch: `half + half` is `[2., 4.]` in float16; aten: [`Error::UnsupportedDtype`]).
//! * Integer `matmul` is refused (no GEMM behind it; torch gives `[[14]]` for
//!   `[[1, 2, 3]] @ [[1], [2], [3]]`); `cross_entropy` takes `[N, C]` or `[C]` logits, not
//!   PyTorch's K-dimensional `[N, C, d1, ...]`.
//! * `rand`/`randn` use ChaCha8 streams, not PyTorch's Mersenne Twister, from an explicit
//!   [`Generator`].
//! * The default dtype is always `float32` (no `torch.set_default_dtype`).
//! * Device indices are honoured through aten's own table ([`device`]), since c10's registry is
//!   per device type and aten has no "current device".
//!
//! # Example
//!
//! ```
//! use aten::{Tensor, TensorOptions};
//! use c10_core::ScalarType;
//!
//! let x = Tensor::arange(0.0, 6.0, 1.0, TensorOptions::new())?.view(&[2, 3])?;
//! let w = Tensor::ones(&[3, 2], ScalarType::Float)?;
//! let y = x.matmul(&w)?.relu()?; // [[3, 3], [12, 12]]
//! assert_eq!(y.to_vec::<f32>()?, [3.0, 3.0, 12.0, 12.0]);
//! assert_eq!(y.sum(&[0], false)?.to_string(), "tensor([15., 15.])");
//! # Ok::<(), aten::Error>(())
//! ```

pub mod access;
pub mod copy;
pub mod create;
pub mod device;
pub mod device_copy;
pub mod display;
pub mod error;
mod host;
pub mod ipc;
pub mod layout;
pub mod ops;
pub mod pinned;
pub mod promotion;
mod scalar;
pub mod sim;
pub mod strided_index;
pub mod tensor;
pub mod view;

pub use access::{SliceGuard, SliceGuardMut};
pub use create::{Generator, TensorOptions};
pub use device::{device_allocator, normalize_device, set_device_allocator};
pub use error::{Error, Result};
pub use layout::Layout;
pub use ops::elementwise::RoundingMode;
pub use ops::loss::Reduction;
pub use promotion::Scalar;
pub use strided_index::StridedIndex;
pub use tensor::{Tensor, TensorImpl, VersionCounter};
