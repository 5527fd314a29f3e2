//! Host access to tensor bytes, the crate's `unsafe` core: the data locks, the checks that make
//! a storage's bytes readable on the host, and the typed raw-pointer loops every kernel runs.
//!
//! # Safety argument
//!
//! The kernels read and write tensor elements through raw pointers. That is sound because every
//! pointer they use comes from a [`Src`] or [`Dst`], and one of those can only be made by an
//! [`Access`] that has checked and locked everything first:
//!
//! 1. **The bytes are host memory.** A CPU storage's bytes are host memory by c10-core's
//!    `Allocator` contract, and so are those of a storage on any device whose allocator says so
//!    (`Allocator::host_accessible`, a promise of that `unsafe` trait, read through
//!    `StorageImpl::is_host_accessible`). Any other simulated-device storage is used only after
//!    [`crate::sim::is_host_range`] confirmed that its whole byte range lies inside a live segment
//!    of a host-backed [`c10_cuda::SimDevice`] (device address == host address), or inside
//!    simulated memory another process shared with this one (an open IPC mapping, which the
//!    storage's `DataPtr` keeps open). Any other device is refused.
//! 2. **Every element is inside the storage.** `TensorImpl` guarantees its layout fits its
//!    storage; layouts made for broadcasting (stride 0) are checked again here. Storages in
//!    tensors are never resizable, and the [`Access`] borrows the tensors, so the allocation stays
//!    alive and does not move.
//! 3. **The pointer is aligned** for the element type (checked; c10's allocators align to 64
//!    bytes and simulated segments to 512, so this never fails for aten's own tensors).
//! 4. **No data race.** The [`Access`] holds each involved storage's data lock, for writing if any
//!    operand writes to it, else for reading, until every `Src`/`Dst` borrowed from it is gone.
//! 5. **No reference aliasing.** Inputs and outputs may share a storage (`a.add_(&a)`), so the
//!    loops never make `&`/`&mut` references to elements: they use `ptr::read`/`ptr::write`, which
//!    are sound on overlapping locations. (Slices are only made by [`with_bytes`],
//!    [`with_bytes_mut`] and the slice guards, each over a single locked tensor.)
//! 6. **Initialised reads.** Every storage aten creates is written before it is read (creation
//!    functions fill it; kernels write every element of their fresh output first);
//!    [`crate::Tensor::from_storage`] is `unsafe` for that reason.

use std::any::TypeId;
use std::marker::PhantomData;
use std::sync::Arc;

use c10_core::{DeviceType, Element};
use parking_lot::{RwLockReadGuard, RwLockWriteGuard};

use crate::access::{SliceGuard, SliceGuardMut};
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::strided_index::for_each_row;
use crate::tensor::{StorageCell, Tensor, TensorImpl};

/// The host address of a tensor's storage bytes, after checking that they are host memory
/// (CPU, a storage whose allocator says its bytes are host memory, or a host-backed simulated
/// device of [`crate::sim`]) and that the layout fits them.
///
/// # Errors
/// [`Error::UnsupportedDevice`] for CUDA, meta, or a simulated storage that is not host-backed
/// memory known to [`crate::sim`], unless the storage's allocator says its bytes are host
/// memory.
pub(crate) fn host_base(op: &'static str, t: &TensorImpl) -> Result<*mut u8> {
    let storage = t.storage();
    let ptr = storage.data_ptr();
    let nbytes = storage.nbytes();
    if storage.is_host_accessible() {
        // CPU, or an allocator's promise (`Allocator::host_accessible`, module docs 1).
        return Ok(ptr);
    }
    match t.device().device_type() {
        DeviceType::Cpu => Ok(ptr),
        DeviceType::Sim => {
            if nbytes == 0 || crate::sim::is_host_range(t.device(), ptr as u64, nbytes) {
                Ok(ptr)
            } else {
                Err(Error::UnsupportedDevice {
                    op,
                    device: t.device(),
                    reason: "its bytes are not host-backed memory of a simulated device installed \
                             with aten::sim::install, and its allocator does not say they are \
                             host memory (Allocator::host_accessible)",
                })
            }
        }
        DeviceType::Cuda | DeviceType::Meta => Err(Error::UnsupportedDevice {
            op,
            device: t.device(),
            reason: "this operation runs on host memory only (cpu, a host-backed sim device, or \
                     an allocator whose bytes are host memory); move the tensor with \
                     .to(Device::cpu()) first",
        }),
    }
}

/// Whether the tensor's bytes can be read on the host (CPU, host-backed sim, or an allocator
/// that says its bytes are host memory).
pub(crate) fn is_host_accessible(t: &TensorImpl) -> bool {
    host_base("", t).is_ok()
}

/// One held data lock.
enum Guard<'a> {
    Read(#[allow(dead_code)] RwLockReadGuard<'a, ()>),
    Write(#[allow(dead_code)] RwLockWriteGuard<'a, ()>),
}

/// The data locks of every storage an operation touches, taken once each, in address order,
/// for writing where any operand writes. Operands ([`Src`], [`Dst`]) borrow it.
pub(crate) struct Access<'a> {
    /// Locked cells (by address) and whether the lock is held for writing.
    locked: Vec<(*const StorageCell, bool)>,
    _guards: Vec<Guard<'a>>,
}

impl<'a> Access<'a> {
    /// Checks that every tensor is host-accessible, then takes the data locks: for writing on
    /// the storages of `writes`, for reading on the others.
    ///
    /// # Errors
    /// Those of [`host_base`].
    pub(crate) fn lock(
        op: &'static str,
        reads: &[&'a Tensor],
        writes: &[&'a Tensor],
    ) -> Result<Self> {
        let mut cells: Vec<(&'a Arc<StorageCell>, bool)> =
            Vec::with_capacity(reads.len() + writes.len());
        for (tensors, write) in [(reads, false), (writes, true)] {
            for t in tensors {
                host_base(op, t)?;
                let cell = t.cell();
                match cells.iter_mut().find(|(c, _)| Arc::ptr_eq(c, cell)) {
                    Some(entry) => entry.1 |= write,
                    None => cells.push((cell, write)),
                }
            }
        }
        cells.sort_by_key(|(c, _)| Arc::as_ptr(c) as usize);
        let mut guards = Vec::with_capacity(cells.len());
        for (cell, write) in &cells {
            guards.push(if *write {
                Guard::Write(cell.data_lock.write())
            } else {
                Guard::Read(cell.data_lock.read_recursive())
            });
        }
        Ok(Access {
            locked: cells.iter().map(|(c, w)| (Arc::as_ptr(c), *w)).collect(),
            _guards: guards,
        })
    }

    fn holds(&self, t: &TensorImpl, write: bool) -> bool {
        let ptr = Arc::as_ptr(t.cell());
        self.locked.iter().any(|&(c, w)| c == ptr && (w || !write))
    }

    /// Checks an operand and returns its typed base pointer (the storage's first element).
    fn operand<T: Element>(
        &self,
        op: &'static str,
        t: &TensorImpl,
        layout: &Layout,
        write: bool,
    ) -> Result<*mut T> {
        assert!(
            self.holds(t, write),
            "{op}: internal error: operand's storage is not locked for {}",
            if write { "writing" } else { "reading" }
        );
        if t.dtype() != T::SCALAR_TYPE {
            return Err(Error::DtypeMismatch {
                op,
                expected: T::SCALAR_TYPE,
                actual: t.dtype(),
            });
        }
        let base = host_base(op, t)?;
        let required = layout
            .required_storage_elements()
            .saturating_mul(size_of::<T>() as u64);
        if required > t.storage().nbytes() as u64 {
            return Err(Error::OutOfStorageBounds {
                op,
                sizes: layout.sizes().to_vec(),
                strides: layout.strides().to_vec(),
                offset: layout.storage_offset(),
                itemsize: size_of::<T>(),
                required: usize::try_from(required).unwrap_or(usize::MAX),
                available: t.storage().nbytes(),
            });
        }
        if (base as usize) % align_of::<T>() != 0 {
            return Err(Error::InvalidArgument {
                op,
                message: format!(
                    "storage address {base:p} is not aligned for {} elements",
                    t.dtype()
                ),
            });
        }
        Ok(base.cast())
    }

    /// `t` as a typed input with its own layout.
    ///
    /// # Errors
    /// [`Error::DtypeMismatch`] if `T` is not `t`'s element type; those of [`host_base`].
    pub(crate) fn src<'s, T: Element>(
        &'s self,
        op: &'static str,
        t: &Tensor,
    ) -> Result<Src<'s, T>> {
        self.src_as(op, t, t.layout().clone())
    }

    /// `t` as a typed input read through another layout over its storage (an expanded one, for
    /// broadcasting); the layout is checked against the storage.
    ///
    /// # Errors
    /// As [`Access::src`], and [`Error::OutOfStorageBounds`].
    pub(crate) fn src_as<'s, T: Element>(
        &'s self,
        op: &'static str,
        t: &Tensor,
        layout: Layout,
    ) -> Result<Src<'s, T>> {
        let base = self.operand::<T>(op, t, &layout, false)?;
        Ok(Src {
            base,
            layout,
            _access: PhantomData,
        })
    }

    /// `t` as a typed output (its storage must be locked for writing).
    ///
    /// # Errors
    /// As [`Access::src`].
    pub(crate) fn dst<'s, T: Element>(
        &'s self,
        op: &'static str,
        t: &Tensor,
    ) -> Result<Dst<'s, T>> {
        self.dst_as(op, t, t.layout().clone())
    }

    /// `t` as a typed output written through another layout over its storage (its own,
    /// permuted into memory order); the layout is checked against the storage.
    ///
    /// # Errors
    /// As [`Access::src_as`].
    pub(crate) fn dst_as<'s, T: Element>(
        &'s self,
        op: &'static str,
        t: &Tensor,
        layout: Layout,
    ) -> Result<Dst<'s, T>> {
        let base = self.operand::<T>(op, t, &layout, true)?;
        Ok(Dst {
            base,
            layout,
            _access: PhantomData,
        })
    }
}

/// A typed, checked, locked input: the storage's first element and a layout over it.
pub(crate) struct Src<'s, T> {
    base: *mut T,
    layout: Layout,
    _access: PhantomData<&'s T>,
}

/// A typed, checked output locked for writing.
pub(crate) struct Dst<'s, T> {
    base: *mut T,
    layout: Layout,
    _access: PhantomData<&'s mut T>,
}

impl<T: Copy> Src<'_, T> {
    /// The layout the operand is read through.
    pub(crate) fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The address of element `[0, ..., 0]` (for GEMM, which takes pointers and strides). Valid
    /// for the layout's elements while the [`Access`] lives.
    pub(crate) fn first_element(&self) -> *const T {
        self.base
            .wrapping_offset(self.layout.storage_offset() as isize)
    }

    /// Calls `f` on every element in row-major order.
    pub(crate) fn for_each(&self, mut f: impl FnMut(T)) {
        let l = &self.layout;
        for_each_row(
            l.sizes(),
            [l.strides()],
            [l.storage_offset()],
            |off, len, st| {
                // SAFETY: the Access holds this storage's lock and checked that `base` is aligned
                // host memory covering every element of `layout` (module docs, 1-4); `for_each_row`
                // only yields offsets of those elements; elements are read by value (5).
                unsafe {
                    let p = self.base.offset(off[0] as isize);
                    for i in 0..len as isize {
                        f(p.offset(i * st[0] as isize).read());
                    }
                }
            },
        );
    }

    /// Calls `f(element, k)` on every element in row-major order, where `k` is the element's
    /// offset in a second, virtual layout of the same sizes with strides `other` (used to index
    /// an accumulator for reductions).
    pub(crate) fn for_each_with(&self, other: &[i64], mut f: impl FnMut(T, usize)) {
        let l = &self.layout;
        for_each_row(
            l.sizes(),
            [l.strides(), other],
            [l.storage_offset(), 0],
            |off, len, st| {
                // SAFETY: as in `for_each` (only this operand is dereferenced).
                unsafe {
                    let p = self.base.offset(off[0] as isize);
                    for i in 0..len as i64 {
                        f(
                            p.offset((i * st[0]) as isize).read(),
                            (off[1] + i * st[1]) as usize,
                        );
                    }
                }
            },
        );
    }

    /// The elements in row-major order.
    pub(crate) fn to_vec(&self) -> Vec<T> {
        let mut out = Vec::with_capacity(self.layout.numel());
        self.for_each(|v| out.push(v));
        out
    }
}

impl<T: Copy> Dst<'_, T> {
    /// The address of element `[0, ..., 0]`, for GEMM's output.
    pub(crate) fn first_element(&self) -> *mut T {
        self.base
            .wrapping_offset(self.layout.storage_offset() as isize)
    }

    /// The layout written through.
    pub(crate) fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Writes `next()` to every element in row-major order.
    pub(crate) fn assign(&self, mut next: impl FnMut() -> T) {
        let l = &self.layout;
        for_each_row(
            l.sizes(),
            [l.strides()],
            [l.storage_offset()],
            |off, len, st| {
                // SAFETY: as in `Src::for_each`, with the storage locked for writing (4); elements
                // are written by value through the raw pointer (5).
                unsafe {
                    let p = self.base.offset(off[0] as isize);
                    for i in 0..len as isize {
                        p.offset(i * st[0] as isize).write(next());
                    }
                }
            },
        );
    }

    /// Writes `value` to every element.
    pub(crate) fn fill(&self, value: T) {
        self.assign(|| value);
    }
}

/// `out[i] = f(a[i])` for every multi-index `i` (the layouts must have the same sizes).
///
/// # Panics
/// If the sizes differ (an internal bug).
pub(crate) fn map1<A: Copy + 'static, O: Copy + 'static>(
    out: &Dst<'_, O>,
    a: &Src<'_, A>,
    mut f: impl FnMut(A) -> O,
) {
    let (lo, la) = (&out.layout, &a.layout);
    assert_eq!(lo.sizes(), la.sizes(), "map1: operands of different sizes");
    let in_place = TypeId::of::<A>() == TypeId::of::<O>()
        && a.base.cast::<u8>() == out.base.cast::<u8>()
        && la == lo;
    for_each_row(
        lo.sizes(),
        [lo.strides(), la.strides()],
        [lo.storage_offset(), la.storage_offset()],
        |off, len, st| {
            // SAFETY: both operands were checked and locked by their Access (module docs 1-4),
            // share the iterated sizes (asserted), and `for_each_row` only yields offsets of
            // their elements; reads and writes go through raw pointers, so `a` may alias `out`
            // (5): each element is read before its own write.
            unsafe {
                let po = out.base.offset(off[0] as isize);
                let pa = a.base.offset(off[1] as isize);
                if st == [1, 1] && in_place {
                    // `a` is `out`: one pointer, so the loop vectorises (see `map2`).
                    for i in 0..len {
                        let p = po.add(i);
                        p.write(f(same::<O, A>(p.read())));
                    }
                } else if st == [1, 1] {
                    for i in 0..len {
                        po.add(i).write(f(pa.add(i).read()));
                    }
                } else {
                    let (so, sa) = (st[0] as isize, st[1] as isize);
                    for i in 0..len as isize {
                        po.offset(i * so).write(f(pa.offset(i * sa).read()));
                    }
                }
            }
        },
    );
}

/// `out[i] = f(a[i], b[i])` for every multi-index `i` (the layouts must have the same sizes;
/// broadcasting is done by the caller with stride-0 layouts).
///
/// # Panics
/// If the sizes differ (an internal bug).
pub(crate) fn map2<A: Copy + 'static, B: Copy, O: Copy + 'static>(
    out: &Dst<'_, O>,
    a: &Src<'_, A>,
    b: &Src<'_, B>,
    mut f: impl FnMut(A, B) -> O,
) {
    let (lo, la, lb) = (&out.layout, &a.layout, &b.layout);
    assert_eq!(lo.sizes(), la.sizes(), "map2: operands of different sizes");
    assert_eq!(lo.sizes(), lb.sizes(), "map2: operands of different sizes");
    // `a` is exactly `out` (same type, storage and layout): the in-place fast path below.
    let in_place = TypeId::of::<A>() == TypeId::of::<O>()
        && a.base.cast::<u8>() == out.base.cast::<u8>()
        && la == lo;
    for_each_row(
        lo.sizes(),
        [lo.strides(), la.strides(), lb.strides()],
        [
            lo.storage_offset(),
            la.storage_offset(),
            lb.storage_offset(),
        ],
        |off, len, st| {
            // SAFETY: as in `map1`, for three operands.
            unsafe {
                let po = out.base.offset(off[0] as isize);
                let pa = a.base.offset(off[1] as isize);
                let pb = b.base.offset(off[2] as isize);
                match st {
                    [1, 1, 1] if in_place => {
                        // `a` is `out` (an in-place op): read and write through one pointer so
                        // the loop vectorises (a runtime overlap check would refuse it).
                        debug_assert_eq!(pa.cast::<O>(), po);
                        for i in 0..len {
                            let p = po.add(i);
                            p.write(f(same::<O, A>(p.read()), pb.add(i).read()));
                        }
                    }
                    [1, 1, 1] => {
                        for i in 0..len {
                            po.add(i).write(f(pa.add(i).read(), pb.add(i).read()));
                        }
                    }
                    [1, 1, 0] => {
                        let y = pb.read();
                        for i in 0..len {
                            po.add(i).write(f(pa.add(i).read(), y));
                        }
                    }
                    [1, 0, 1] => {
                        let x = pa.read();
                        for i in 0..len {
                            po.add(i).write(f(x, pb.add(i).read()));
                        }
                    }
                    _ => {
                        let (so, sa, sb) = (st[0] as isize, st[1] as isize, st[2] as isize);
                        for i in 0..len as isize {
                            po.offset(i * so)
                                .write(f(pa.offset(i * sa).read(), pb.offset(i * sb).read()));
                        }
                    }
                }
            }
        },
    );
}

/// `value` as `B`, for `A` and `B` known to be the same type (checked with `TypeId` by the
/// caller).
#[inline(always)]
fn same<A: Copy + 'static, B: Copy + 'static>(value: A) -> B {
    debug_assert_eq!(TypeId::of::<A>(), TypeId::of::<B>());
    // No `unsafe` needed: `Any` downcasts; the types are equal, so this never fails, and it
    // compiles to nothing.
    *(&value as &dyn std::any::Any)
        .downcast_ref::<B>()
        .expect("same type")
}

/// Runs `f` on the bytes of a contiguous host tensor (`nbytes` bytes from its first element)
/// while holding its storage's data lock for reading.
///
/// # Errors
/// [`Error::NotContiguous`]; those of [`host_base`].
pub(crate) fn with_bytes<R>(op: &'static str, t: &Tensor, f: impl FnOnce(&[u8]) -> R) -> Result<R> {
    check_contiguous(op, t)?;
    let access = Access::lock(op, &[t], &[])?;
    let base = host_base(op, t)?;
    let len = t.nbytes();
    let bytes: &[u8] = if len == 0 {
        &[]
    } else {
        // SAFETY: the tensor is contiguous, so its elements are exactly the `len` bytes from its
        // first element, inside the storage (TensorImpl invariant) of host memory (checked by
        // `host_base`); the read lock keeps writers out until `access` drops after `f`; all
        // bytes are initialised (module docs, 6).
        unsafe {
            std::slice::from_raw_parts(
                base.add(t.storage_offset() as usize * t.element_size()),
                len,
            )
        }
    };
    let r = f(bytes);
    drop(access);
    Ok(r)
}

/// Runs `f` on the bytes of a contiguous host tensor while holding its storage's data lock for
/// writing. Does not bump the version (the caller does, once the write happened).
///
/// # Errors
/// As [`with_bytes`].
pub(crate) fn with_bytes_mut<R>(
    op: &'static str,
    t: &Tensor,
    f: impl FnOnce(&mut [u8]) -> R,
) -> Result<R> {
    check_contiguous(op, t)?;
    let access = Access::lock(op, &[], &[t])?;
    let base = host_base(op, t)?;
    let len = t.nbytes();
    let bytes: &mut [u8] = if len == 0 {
        &mut []
    } else {
        // SAFETY: as in `with_bytes`; the write lock excludes every other reader and writer of
        // the storage, and no other pointer into it is used while `f` runs, so the exclusive
        // slice is unique (a contiguous layout has no two elements at one address).
        unsafe {
            std::slice::from_raw_parts_mut(
                base.add(t.storage_offset() as usize * t.element_size()),
                len,
            )
        }
    };
    let r = f(bytes);
    drop(access);
    Ok(r)
}

fn check_contiguous(op: &'static str, t: &Tensor) -> Result<()> {
    if t.is_contiguous() {
        Ok(())
    } else {
        Err(Error::NotContiguous {
            op,
            sizes: t.sizes().to_vec(),
            strides: t.strides().to_vec(),
        })
    }
}

/// Checks the element type and contiguity for a typed slice of `t`.
fn check_slice<T: Element>(op: &'static str, t: &Tensor) -> Result<()> {
    if t.dtype() != T::SCALAR_TYPE {
        return Err(Error::DtypeMismatch {
            op,
            expected: T::SCALAR_TYPE,
            actual: t.dtype(),
        });
    }
    check_contiguous(op, t)
}

/// A read-locked typed slice of a contiguous host tensor.
pub(crate) fn slice<'a, T: Element>(op: &'static str, t: &'a Tensor) -> Result<SliceGuard<'a, T>> {
    check_slice::<T>(op, t)?;
    let base = host_base(op, t)?;
    let guard = t.cell().data_lock.read_recursive();
    let data: &'a [T] = if t.numel() == 0 {
        &[]
    } else {
        let first = base.wrapping_add(t.storage_offset() as usize * t.element_size());
        if (first as usize) % align_of::<T>() != 0 {
            return Err(Error::InvalidArgument {
                op,
                message: format!("address {first:p} is not aligned for {}", t.dtype()),
            });
        }
        // SAFETY: contiguous, so the `numel` elements are consecutive from the first one, inside
        // the storage (TensorImpl invariant) of host memory (`host_base`), aligned (checked),
        // initialised (module docs, 6) and of type `T` (checked; `T: Pod`). The storage lives as
        // long as `t` is borrowed ('a). The guard returned with the slice keeps writers out for
        // as long as the slice lives.
        unsafe { std::slice::from_raw_parts(first.cast::<T>(), t.numel()) }
    };
    Ok(SliceGuard::new(guard, data))
}

/// A write-locked typed slice of a contiguous host tensor; bumps the version.
pub(crate) fn slice_mut<'a, T: Element>(
    op: &'static str,
    t: &'a Tensor,
) -> Result<SliceGuardMut<'a, T>> {
    check_slice::<T>(op, t)?;
    let base = host_base(op, t)?;
    let guard = t.cell().data_lock.write();
    let data: &'a mut [T] = if t.numel() == 0 {
        &mut []
    } else {
        let first = base.wrapping_add(t.storage_offset() as usize * t.element_size());
        if (first as usize) % align_of::<T>() != 0 {
            return Err(Error::InvalidArgument {
                op,
                message: format!("address {first:p} is not aligned for {}", t.dtype()),
            });
        }
        // SAFETY: as in `slice`; the write guard returned with the slice excludes every other
        // access to the storage through aten (the kernels, other guards) while it lives, and a
        // contiguous layout has no two elements at one address, so the slice is unique.
        unsafe { std::slice::from_raw_parts_mut(first.cast::<T>(), t.numel()) }
    };
    t.bump_version();
    Ok(SliceGuardMut::new(guard, data))
}
