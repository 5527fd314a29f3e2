//! [`StorageImpl`], the untyped byte buffer under a tensor, and [`Storage`] / [`WeakStorage`],
//! the shared handles to it, as c10's `StorageImpl`, `Storage` and `weak_intrusive_ptr`.
//!
//! # Reference counting: `intrusive_ptr` → `Arc`
//!
//! c10 keeps a `StorageImpl` alive with `c10::intrusive_ptr<StorageImpl>` (the count lives inside
//! the object) and observes it with `c10::weak_intrusive_ptr`. Here the same roles are played by
//! `Arc<StorageImpl>` ([`Storage`]) and `Weak<StorageImpl>` ([`WeakStorage`]):
//!
//! * [`Storage::use_count`] is `Arc::strong_count`, the same number as c10's `use_count()`;
//! * [`Storage::weak_count`] is `Arc::weak_count`, which counts only `Weak` handles. c10's
//!   `weak_use_count()` also counts all strong references together as **one** extra weak
//!   reference (while any strong reference exists), so c10's number is ours plus one whenever
//!   `use_count() > 0`;
//! * when the last strong handle drops, the `StorageImpl` is destroyed at once (its [`DataPtr`]
//!   deleter runs); weak handles then fail to [`WeakStorage::upgrade`], as c10's `lock()` returns
//!   an empty pointer. (c10 calls `release_resources()` at this point; with `Arc` the value is
//!   dropped, and only the allocation of the control block waits for the last weak handle.)
//!
//! # Shared mutable bytes
//!
//! The bytes of a storage are behind a raw pointer and may be shared by many handles (and many
//! tensor views) at once. Rust's aliasing rules forbid a `&mut [u8]` while any other reference to
//! the same bytes exists, so safe mutable access is only offered when the handle is the unique
//! owner: [`Storage::try_bytes_mut`] takes `&mut self` and succeeds only if there is no other
//! strong or weak handle (as `Arc::get_mut`). Otherwise access goes through the raw pointer
//! ([`StorageImpl::data_ptr`]) or the `unsafe` [`StorageImpl::as_bytes`], whose contract is that
//! the caller serialises writers: no one writes the bytes (or resizes the storage) while the slice
//! is alive. This is PyTorch's model too: a data race on tensor data is the user's problem, and
//! the library only keeps its own metadata consistent. Here the metadata (data pointer and size)
//! sits behind a `parking_lot::RwLock`, so [`StorageImpl::resize`] and
//! [`StorageImpl::set_nbytes`] on a shared storage are themselves race-free.
//!
//! Host access ([`StorageImpl::as_bytes`], [`Storage::try_bytes_mut`]) is only given for
//! storages whose bytes are host memory ([`StorageImpl::is_host_accessible`]: a
//! [`DeviceType::Cpu`] storage, or one whose allocator says so with
//! [`Allocator::host_accessible`]); device bytes cannot be dereferenced on the host.

use std::fmt;
use std::sync::{Arc, Weak};

use parking_lot::RwLock;

use crate::allocator::Allocator;
use crate::data_ptr::DataPtr;
use crate::device::{Device, DeviceType};
use crate::error::{Error, Result};

/// The mutable part of a storage: the allocation and the logical size.
struct State {
    data_ptr: DataPtr,
    /// The logical size in bytes (c10's `nbytes()`); at most `capacity`.
    nbytes: usize,
    /// Bytes the current `data_ptr` is valid for.
    capacity: usize,
}

/// An untyped, device-tagged byte buffer with its allocator, as c10's `StorageImpl`.
///
/// Reach it through a [`Storage`] (which dereferences to it).
pub struct StorageImpl {
    state: RwLock<State>,
    device: Device,
    allocator: Option<Arc<dyn Allocator>>,
    resizable: bool,
}

impl StorageImpl {
    /// The size in bytes, as c10's `StorageImpl::nbytes()`.
    pub fn nbytes(&self) -> usize {
        self.state.read().nbytes
    }

    /// The raw data pointer (null for zero bytes), as c10's `StorageImpl::mutable_data()`.
    ///
    /// Reading or writing through it is `unsafe` and the caller's responsibility: it is valid for
    /// [`StorageImpl::nbytes`] bytes until the storage is resized or dropped, and concurrent
    /// writers must be serialised by the caller (see the [module docs](self)).
    pub fn data_ptr(&self) -> *mut u8 {
        self.state.read().data_ptr.get()
    }

    /// The device the bytes live on, as c10's `StorageImpl::device()`.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The device type, as c10's `StorageImpl::device_type()`.
    pub fn device_type(&self) -> DeviceType {
        self.device.device_type()
    }

    /// Whether [`StorageImpl::resize`] and [`StorageImpl::set_nbytes`] are allowed, as c10's
    /// `StorageImpl::resizable()`.
    pub fn resizable(&self) -> bool {
        self.resizable
    }

    /// The allocator that made (and resizes) the bytes, if any, as c10's
    /// `StorageImpl::allocator()`.
    pub fn allocator(&self) -> Option<&Arc<dyn Allocator>> {
        self.allocator.as_ref()
    }

    /// Sets the logical size to `nbytes` without reallocating, as c10's
    /// `StorageImpl::set_nbytes()`. The new size must fit the current allocation.
    ///
    /// # Errors
    /// [`Error::NotResizable`] when the storage is not resizable; [`Error::ExceedsCapacity`] when
    /// `nbytes` is larger than the current allocation (use [`StorageImpl::resize`] to grow).
    pub fn set_nbytes(&self, nbytes: usize) -> Result<()> {
        let mut state = self.state.write();
        if !self.resizable {
            return Err(Error::NotResizable {
                nbytes: state.nbytes,
                requested: nbytes,
            });
        }
        if nbytes > state.capacity {
            return Err(Error::ExceedsCapacity {
                requested: nbytes,
                capacity: state.capacity,
            });
        }
        state.nbytes = nbytes;
        Ok(())
    }

    /// Reallocates to exactly `nbytes` bytes with the storage's allocator, copying the first
    /// `min(old, new)` bytes with [`Allocator::copy_data`] and freeing the old allocation, as
    /// ATen's `resize_bytes_cpu`. New bytes beyond the old size are uninitialised (unless the
    /// allocator zero-fills). Raw pointers obtained earlier are invalidated.
    ///
    /// # Errors
    /// [`Error::NotResizable`] when the storage is not resizable, [`Error::MissingAllocator`] when
    /// it has no allocator, and the allocator's errors (the storage is then unchanged).
    pub fn resize(&self, nbytes: usize) -> Result<()> {
        let mut state = self.state.write();
        if !self.resizable {
            return Err(Error::NotResizable {
                nbytes: state.nbytes,
                requested: nbytes,
            });
        }
        let allocator = self.allocator.as_ref().ok_or(Error::MissingAllocator)?;
        let new_data = allocator.allocate(nbytes)?;
        let copy = state.nbytes.min(nbytes);
        // SAFETY: the old pointer is valid for `state.nbytes >= copy` bytes and the new one for
        // `nbytes >= copy` bytes (allocator contract); they are distinct live allocations, so they
        // do not overlap; the write lock keeps other handles from resizing meanwhile.
        unsafe { allocator.copy_data(new_data.get(), state.data_ptr.get(), copy) };
        // The old allocation is freed here, when the replaced `DataPtr` drops.
        state.data_ptr = new_data;
        state.nbytes = nbytes;
        state.capacity = nbytes;
        Ok(())
    }

    /// Whether the bytes are host memory the CPU may read and write through
    /// [`StorageImpl::data_ptr`]: the storage is on [`DeviceType::Cpu`], or its allocator says so
    /// ([`Allocator::host_accessible`]).
    pub fn is_host_accessible(&self) -> bool {
        self.device.is_cpu()
            || self
                .allocator
                .as_ref()
                .is_some_and(|allocator| allocator.host_accessible())
    }

    /// The bytes as a shared slice, for host-accessible storages
    /// ([`StorageImpl::is_host_accessible`]); `None` for others.
    ///
    /// # Safety
    /// While the returned slice is alive nobody may write to the bytes (through any handle,
    /// raw pointer or view) and nobody may call [`StorageImpl::resize`] or
    /// [`StorageImpl::set_nbytes`] on this storage. As in PyTorch, serialising writers is the
    /// caller's job.
    pub unsafe fn as_bytes(&self) -> Option<&[u8]> {
        if !self.is_host_accessible() {
            return None;
        }
        let state = self.state.read();
        if state.nbytes == 0 {
            return Some(&[]);
        }
        // SAFETY: a host-accessible storage's data pointer is non-null and valid for `nbytes`
        // host bytes (allocator / `from_data_ptr` contract) until it is resized or dropped;
        // `&self` keeps it from being dropped and the caller promises no resize and no writer
        // while the slice lives.
        Some(unsafe { std::slice::from_raw_parts(state.data_ptr.get(), state.nbytes) })
    }
}

impl fmt::Debug for StorageImpl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state.read();
        f.debug_struct("StorageImpl")
            .field("data_ptr", &state.data_ptr)
            .field("nbytes", &state.nbytes)
            .field("device", &self.device)
            .field("resizable", &self.resizable)
            .field("has_allocator", &self.allocator.is_some())
            .finish()
    }
}

/// A shared handle to a [`StorageImpl`], as c10's `Storage` (an `intrusive_ptr<StorageImpl>`).
///
/// Cloning bumps the reference count; the bytes are freed when the last `Storage` drops.
/// Dereferences to [`StorageImpl`] for size, device and raw access.
#[derive(Clone)]
pub struct Storage(Arc<StorageImpl>);

impl Storage {
    /// Allocates `nbytes` bytes from `allocator` into a new storage, as c10's
    /// `StorageImpl(use_byte_size_t, size_bytes, Allocator*, resizable)`. The bytes are
    /// uninitialised unless the allocator zero-fills.
    ///
    /// # Errors
    /// The allocator's errors ([`Error::OutOfMemory`], [`Error::SizeOverflow`]).
    pub fn new(nbytes: usize, allocator: Arc<dyn Allocator>, resizable: bool) -> Result<Storage> {
        let data_ptr = allocator.allocate(nbytes)?;
        // SAFETY: the `Allocator` contract makes `data_ptr` valid for `nbytes` bytes, exclusively
        // owned, on a device of the allocator's type.
        unsafe { Storage::from_data_ptr(nbytes, data_ptr, Some(allocator), resizable) }
    }

    /// Wraps an existing allocation of `nbytes` bytes, as c10's
    /// `StorageImpl(use_byte_size_t, size_bytes, DataPtr, Allocator*, resizable)`.
    ///
    /// # Errors
    /// [`Error::MissingAllocator`] if `resizable` without an allocator (c10: "For resizable
    /// storage, allocator must be provided"); [`Error::DeviceMismatch`] if the allocator serves a
    /// different device type than `data_ptr` is on.
    ///
    /// # Safety
    /// `data_ptr` must be valid for reads and writes of `nbytes` bytes until it is dropped (null
    /// only if `nbytes == 0`), and for a CPU device, or when `allocator` says its bytes are host
    /// memory ([`Allocator::host_accessible`]), those bytes must be host memory that nothing
    /// outside this storage accesses except through the raw pointer rules of the
    /// [module docs](self); safe code such as [`Storage::try_bytes_mut`] relies on it.
    pub unsafe fn from_data_ptr(
        nbytes: usize,
        data_ptr: DataPtr,
        allocator: Option<Arc<dyn Allocator>>,
        resizable: bool,
    ) -> Result<Storage> {
        if resizable && allocator.is_none() {
            return Err(Error::MissingAllocator);
        }
        let device = data_ptr.device();
        if let Some(allocator) = &allocator {
            if allocator.device_type() != device.device_type() {
                return Err(Error::DeviceMismatch {
                    expected: allocator.device_type(),
                    actual: device.device_type(),
                });
            }
        }
        Ok(Storage(Arc::new(StorageImpl {
            state: RwLock::new(State {
                data_ptr,
                nbytes,
                capacity: nbytes,
            }),
            device,
            allocator,
            resizable,
        })))
    }

    /// The number of `Storage` handles to this storage, as c10's `Storage::use_count()`.
    pub fn use_count(&self) -> usize {
        Arc::strong_count(&self.0)
    }

    /// The number of [`WeakStorage`] handles, as `Arc::weak_count`. c10's `weak_use_count()`
    /// reports one more than this (see the [module docs](self)).
    pub fn weak_count(&self) -> usize {
        Arc::weak_count(&self.0)
    }

    /// Whether this is the only handle, strong or weak, as c10's `Storage::unique()` (which
    /// ignores weak handles; this does not, matching `Arc::get_mut`).
    pub fn is_unique(&self) -> bool {
        self.use_count() == 1 && self.weak_count() == 0
    }

    /// A weak handle that does not keep the bytes alive, as c10's `weak_intrusive_ptr`.
    pub fn downgrade(&self) -> WeakStorage {
        WeakStorage(Arc::downgrade(&self.0))
    }

    /// Whether both handles see the same bytes, as c10's `Storage::is_alias_of`: the same
    /// `StorageImpl`, or two storages over the same non-null data pointer.
    pub fn is_alias_of(&self, other: &Storage) -> bool {
        if Arc::ptr_eq(&self.0, &other.0) {
            return true;
        }
        let data = self.data_ptr();
        !data.is_null() && data == other.data_ptr()
    }

    /// The bytes as a mutable slice when this handle is the only one (no other [`Storage`] or
    /// [`WeakStorage`]) and its bytes are host memory ([`StorageImpl::is_host_accessible`]);
    /// otherwise `None`. Safe because unique ownership of the storage means unique access to its
    /// bytes.
    pub fn try_bytes_mut(&mut self) -> Option<&mut [u8]> {
        let storage = Arc::get_mut(&mut self.0)?;
        if !storage.is_host_accessible() {
            return None;
        }
        let state = storage.state.get_mut();
        if state.nbytes == 0 {
            return Some(&mut []);
        }
        // SAFETY: a host-accessible storage's data pointer is non-null and valid for reads and
        // writes of `nbytes` host bytes that nothing else reaches (allocator / `from_data_ptr`
        // contract); `Arc::get_mut` proved this is the only handle, and the slice borrows `self`
        // mutably.
        Some(unsafe { std::slice::from_raw_parts_mut(state.data_ptr.get(), state.nbytes) })
    }
}

impl std::ops::Deref for Storage {
    type Target = StorageImpl;

    fn deref(&self) -> &StorageImpl {
        &self.0
    }
}

impl fmt::Debug for Storage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Storage").field(&*self.0).finish()
    }
}

/// A weak handle to a storage, as c10's `weak_intrusive_ptr<StorageImpl>`: it does not keep the
/// bytes alive and can be upgraded back while some [`Storage`] exists.
#[derive(Clone, Debug)]
pub struct WeakStorage(Weak<StorageImpl>);

impl WeakStorage {
    /// A strong handle if the storage is still alive, as c10's `weak_intrusive_ptr::lock()`.
    pub fn upgrade(&self) -> Option<Storage> {
        self.0.upgrade().map(Storage)
    }

    /// The number of strong handles still alive, as c10's `weak_intrusive_ptr::use_count()`.
    pub fn use_count(&self) -> usize {
        self.0.strong_count()
    }

    /// Whether the storage is gone (no strong handle left), as c10's
    /// `weak_intrusive_ptr::expired()`.
    pub fn expired(&self) -> bool {
        self.use_count() == 0
    }
}
