//! [`Tensor`] and [`TensorImpl`]: a cheap shared handle over an immutable description (storage,
//! layout, dtype, version counter), as ATen's `Tensor` / c10's `TensorImpl`.
//!
//! # Bridges
//!
//! ```text
//! Tensor ──Arc──> TensorImpl { layout, dtype, version ──Arc──> VersionCounter (shared by views) }
//!                     │
//!                     └──Arc──> StorageCell { data lock, Storage ──Arc──> StorageImpl ──> DataPtr }
//! ```
//!
//! * Cloning a [`Tensor`] bumps a reference count ([`Tensor::use_count`]); PyTorch's deep
//!   `clone()` is [`Tensor::deep_clone`].
//! * A view is a new `TensorImpl` with another [`Layout`] over the same `StorageCell` and the
//!   same [`VersionCounter`] (PyTorch shares `VariableVersion` between a tensor and its views).
//!   In-place operations bump that counter ([`TensorImpl::version`], PyTorch's `_version`).
//! * A `TensorImpl` never changes after it is made (no `resize_`/`set_`), so its metadata needs
//!   no lock. Only the bytes change.
//!
//! # Why the storage sits behind a lock
//!
//! PyTorch leaves data races on tensor bytes to the user. Rust cannot: two threads writing the
//! same `f32` through clones of one `Tensor` would be undefined behaviour reachable from safe
//! code. So, as candle puts its storage behind an `RwLock`, every storage shared by tensors has
//! one **data lock** (in its `StorageCell`, shared by all views): kernels take it for reading on
//! their inputs and for writing on their output, one acquisition per distinct storage and in
//! address order (so `a.add_(&a)` does not deadlock on itself and two threads cannot deadlock on
//! each other). Reads use `read_recursive`, so a live [`crate::access::SliceGuard`] never blocks
//! another reader of the same storage on the same thread.
//!
//! A c10 [`Storage`] enters a tensor only through `aten` (which makes each cell) or through
//! [`Tensor::from_storage`], which requires the storage to be uniquely owned: there is never a
//! second cell, with a second lock, over the same bytes. Tensors only hold non-resizable
//! storages, so the bytes cannot move or shrink under a kernel.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use c10_core::{Device, ScalarType, Storage};
use parking_lot::RwLock;

use crate::error::{Error, Result};
use crate::layout::{self, Layout};

/// A storage shared by tensors, with the data lock that serialises writers of its bytes (see the
/// [module docs](self)).
pub(crate) struct StorageCell {
    pub(crate) storage: Storage,
    pub(crate) data_lock: RwLock<()>,
}

impl StorageCell {
    pub(crate) fn new(storage: Storage) -> Arc<StorageCell> {
        Arc::new(StorageCell {
            storage,
            data_lock: RwLock::new(()),
        })
    }
}

/// The version counter of a tensor and all its views, as PyTorch's `VariableVersion`: in-place
/// operations bump it so that autograd (and the engine) can detect that saved values changed.
/// Cloning shares the counter.
#[derive(Clone, Debug, Default)]
pub struct VersionCounter(Arc<AtomicU64>);

impl VersionCounter {
    /// A new counter at 0.
    pub fn new() -> Self {
        VersionCounter::default()
    }

    /// The current version, as PyTorch's `VariableVersion::current_version()`.
    pub fn current(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    /// Adds one, as PyTorch's `VariableVersion::bump()`.
    pub(crate) fn bump(&self) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }

    /// Whether both handles are the same counter (a tensor and its view).
    pub fn is_shared_with(&self, other: &VersionCounter) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// The description of a tensor: its storage, [`Layout`] (sizes, strides, storage offset, all in
/// elements), scalar type and version counter, as c10's `TensorImpl`. Reach it through a
/// [`Tensor`], which dereferences to it.
///
/// Invariant: the layout lies inside the storage
/// (`layout.required_storage_elements() * itemsize <= storage.nbytes()`).
pub struct TensorImpl {
    cell: Arc<StorageCell>,
    layout: Layout,
    dtype: ScalarType,
    version: VersionCounter,
}

impl TensorImpl {
    /// The storage, as c10's `TensorImpl::storage()`.
    pub fn storage(&self) -> &Storage {
        &self.cell.storage
    }

    /// The layout (sizes, strides, offset).
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The sizes, as c10's `sizes()` (`t.shape`).
    pub fn sizes(&self) -> &[i64] {
        self.layout.sizes()
    }

    /// The strides in elements, as c10's `strides()` (`t.stride()`).
    pub fn strides(&self) -> &[i64] {
        self.layout.strides()
    }

    /// The size of dimension `dim` (negative counts from the end), as `t.size(dim)`.
    ///
    /// # Errors
    /// [`Error::DimOutOfRange`].
    pub fn size(&self, dim: i64) -> Result<i64> {
        let d = layout::wrap_dim("size", dim, self.dim())?;
        // A 0-d tensor accepts dim 0/-1 in `wrap_dim` but has no size to report.
        self.sizes().get(d).copied().ok_or(Error::DimOutOfRange {
            op: "size",
            dim,
            ndim: 0,
        })
    }

    /// The stride (in elements) of dimension `dim`, as `t.stride(dim)`.
    ///
    /// # Errors
    /// [`Error::DimOutOfRange`].
    pub fn stride(&self, dim: i64) -> Result<i64> {
        let d = layout::wrap_dim("stride", dim, self.dim())?;
        self.strides().get(d).copied().ok_or(Error::DimOutOfRange {
            op: "stride",
            dim,
            ndim: 0,
        })
    }

    /// The offset of the first element in the storage, in elements, as `t.storage_offset()`.
    pub fn storage_offset(&self) -> i64 {
        self.layout.storage_offset()
    }

    /// The number of dimensions, as `t.dim()`.
    pub fn dim(&self) -> usize {
        self.layout.dim()
    }

    /// The number of elements, as `t.numel()`.
    pub fn numel(&self) -> usize {
        self.layout.numel()
    }

    /// The element type, as c10's `scalar_type()` (`t.dtype`).
    pub fn dtype(&self) -> ScalarType {
        self.dtype
    }

    /// Bytes per element, as `t.element_size()` / `t.itemsize`.
    pub fn element_size(&self) -> usize {
        self.dtype.item_size()
    }

    /// The device of the storage, as `t.device`.
    pub fn device(&self) -> Device {
        self.cell.storage.device()
    }

    /// Whether the layout is row-major contiguous, as `t.is_contiguous()`.
    pub fn is_contiguous(&self) -> bool {
        self.layout.is_contiguous()
    }

    /// The bytes the elements occupy, `numel * element_size`, as `t.nbytes`.
    pub fn nbytes(&self) -> usize {
        self.numel() * self.element_size()
    }

    /// The address of the first element (storage data + offset · itemsize), as `t.data_ptr()`.
    /// For a CUDA tensor it is a device address. Reading or writing through it is `unsafe` and
    /// the caller's business; the crate's own kernels take the storage's data lock first.
    pub fn data_ptr(&self) -> *mut u8 {
        self.cell
            .storage
            .data_ptr()
            .wrapping_add(self.storage_offset() as usize * self.element_size())
    }

    /// The version of the data, bumped by every in-place operation on this tensor or any view of
    /// it, as PyTorch's `t._version`.
    pub fn version(&self) -> u64 {
        self.version.current()
    }

    /// The version counter (shared with views).
    pub fn version_counter(&self) -> &VersionCounter {
        &self.version
    }

    pub(crate) fn cell(&self) -> &Arc<StorageCell> {
        &self.cell
    }
}

/// An n-dimensional array with PyTorch's semantics: a shared handle ([`Clone`] is a reference
/// count bump) to a [`TensorImpl`], as ATen's `at::Tensor`.
///
/// ```
/// use aten::Tensor;
/// let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
/// let t = a.t()?; // a view: same storage, strides swapped
/// assert!(t.is_alias_of(&a));
/// assert_eq!(t.strides(), [1, 2]);
/// assert_eq!(t.contiguous()?.to_vec::<f32>()?, [1.0, 3.0, 2.0, 4.0]);
/// assert_eq!(a.to_string(), "tensor([[1., 2.],\n        [3., 4.]])");
/// # Ok::<(), aten::Error>(())
/// ```
#[derive(Clone)]
pub struct Tensor(Arc<TensorImpl>);

impl std::ops::Deref for Tensor {
    type Target = TensorImpl;

    fn deref(&self) -> &TensorImpl {
        &self.0
    }
}

impl Tensor {
    /// A tensor over `cell` with `layout`, checking that the layout fits the storage.
    pub(crate) fn from_cell(
        op: &'static str,
        cell: Arc<StorageCell>,
        layout: Layout,
        dtype: ScalarType,
        version: VersionCounter,
    ) -> Result<Tensor> {
        let itemsize = dtype.item_size();
        let required = layout
            .required_storage_elements()
            .saturating_mul(itemsize as u64);
        let available = cell.storage.nbytes();
        if required > available as u64 {
            return Err(Error::OutOfStorageBounds {
                op,
                sizes: layout.sizes().to_vec(),
                strides: layout.strides().to_vec(),
                offset: layout.storage_offset(),
                itemsize,
                required: usize::try_from(required).unwrap_or(usize::MAX),
                available,
            });
        }
        Ok(Tensor(Arc::new(TensorImpl {
            cell,
            layout,
            dtype,
            version,
        })))
    }

    /// A tensor over a storage that `aten` just allocated.
    pub(crate) fn from_new_storage(
        storage: Storage,
        layout: Layout,
        dtype: ScalarType,
    ) -> Result<Tensor> {
        Tensor::from_cell(
            "empty",
            StorageCell::new(storage),
            layout,
            dtype,
            VersionCounter::new(),
        )
    }

    /// A tensor over an existing storage with explicit geometry, as ATen's
    /// `at::empty({0}).set_(storage, offset, sizes, strides)` / `torch.Tensor().set_(...)`.
    ///
    /// The storage must be uniquely owned (no other [`Storage`] or weak handle) and not
    /// resizable, so that this tensor and its views are the only way to its bytes (see the
    /// [module docs](self)).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a shared or resizable storage; the errors of
    /// [`Layout::new`]; [`Error::OutOfStorageBounds`] when the layout reaches past the storage.
    ///
    /// # Safety
    /// Every byte the layout reaches must be initialised (c10's `CpuAllocator::new` does not zero
    /// memory; reading uninitialised bytes as numbers is undefined behaviour in Rust), and for a
    /// CPU storage the data pointer must be aligned for `dtype` (c10's allocators align to 64).
    pub unsafe fn from_storage(
        storage: Storage,
        sizes: &[i64],
        strides: &[i64],
        storage_offset: i64,
        dtype: ScalarType,
    ) -> Result<Tensor> {
        if !storage.is_unique() {
            return Err(Error::InvalidArgument {
                op: "from_storage",
                message: format!(
                    "the storage must be uniquely owned, but it has {} strong and {} weak handles",
                    storage.use_count(),
                    storage.weak_count()
                ),
            });
        }
        if storage.resizable() {
            return Err(Error::InvalidArgument {
                op: "from_storage",
                message: "the storage must not be resizable (its bytes could move under a kernel)"
                    .into(),
            });
        }
        let layout = Layout::new(sizes, strides, storage_offset)?;
        Tensor::from_cell(
            "from_storage",
            StorageCell::new(storage),
            layout,
            dtype,
            VersionCounter::new(),
        )
    }

    /// A view of this tensor with another layout over the same storage, sharing the version
    /// counter, checking the layout fits.
    pub(crate) fn view_with_layout(&self, op: &'static str, layout: Layout) -> Result<Tensor> {
        Tensor::from_cell(
            op,
            Arc::clone(&self.cell),
            layout,
            self.dtype,
            self.version.clone(),
        )
    }

    /// The number of `Tensor` handles to this `TensorImpl`, as `Tensor::use_count()`.
    pub fn use_count(&self) -> usize {
        Arc::strong_count(&self.0)
    }

    /// Whether both tensors see the same storage bytes, as `Tensor::is_alias_of`.
    pub fn is_alias_of(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.cell, &other.cell) || self.storage().is_alias_of(other.storage())
    }

    /// Whether both handles are the same `TensorImpl`, as `Tensor::is_same`.
    pub fn is_same(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// The `TensorImpl`, as `Tensor::unsafeGetTensorImpl()` (safe here: it is immutable).
    pub fn tensor_impl(&self) -> &TensorImpl {
        &self.0
    }

    /// Bumps the version counter shared with every view (after an in-place write).
    pub(crate) fn bump_version(&self) {
        self.version.bump();
    }
}

impl fmt::Debug for TensorImpl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TensorImpl")
            .field("sizes", &self.sizes())
            .field("strides", &self.strides())
            .field("storage_offset", &self.storage_offset())
            .field("dtype", &self.dtype)
            .field("device", &self.device())
            .field("version", &self.version())
            .finish()
    }
}
