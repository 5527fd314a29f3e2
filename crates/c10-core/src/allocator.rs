//! The [`Allocator`] trait and the per-[`DeviceType`] allocator registry, as c10's
//! `c10/core/Allocator.h` (`Allocator`, `SetAllocator`, `GetAllocator`).
//!
//! The registry holds one allocator per device type, each with a priority. As in c10, a
//! registration replaces the current one only if its priority is **greater than or equal to** the
//! current priority, so a low-priority default never overrides a specialised allocator that was
//! registered first. The CPU slot starts out holding a [`CpuAllocator`] at priority 0 (c10's
//! `REGISTER_ALLOCATOR(kCPU, &g_cpu_alloc)`); the other slots start empty.
//!
//! The registry is a process-wide table behind a `parking_lot::RwLock`, so it is safe to use from
//! any thread; lookups take a read lock and clone an `Arc`.

use std::sync::Arc;

use once_cell::sync::Lazy;
use parking_lot::RwLock;

use crate::cpu_allocator::CpuAllocator;
use crate::data_ptr::{DataPtr, DeleterFn};
use crate::device::DeviceType;
use crate::error::{Error, Result};

/// A source of device memory, as c10's `Allocator`.
///
/// # Safety
/// Implementations promise, for every `Ok(data_ptr)` returned by `allocate(nbytes)`:
///
/// * `data_ptr.device().device_type() == self.device_type()`;
/// * if `nbytes > 0`, `data_ptr.get()` is non-null and points at `nbytes` bytes that are valid for
///   reads and writes on that device until `data_ptr` is dropped, and that nothing else uses
///   (for [`DeviceType::Cpu`] this is host memory that safe code such as
///   [`crate::Storage::try_bytes_mut`] will turn into `&mut [u8]`);
/// * the context and deleter satisfy the contract of [`DataPtr::new`];
/// * if [`Allocator::raw_deleter`] returns `Some(d)`, then `d(ptr)` frees a pointer obtained from
///   [`Allocator::raw_allocate`];
/// * if [`Allocator::host_accessible`] returns `true` (it must give the same answer for the
///   allocator's whole life), the `nbytes` bytes of every such `data_ptr` are host memory,
///   readable and writable through `data_ptr.get()` by the CPU, whatever the device type, with
///   the same exclusivity as CPU memory above (host code such as aten's kernels and
///   [`crate::Storage::try_bytes_mut`] will make slices of them).
///
/// Implementations must be thread safe (`Send + Sync`): the registry shares them between threads.
pub unsafe trait Allocator: Send + Sync {
    /// Allocates `nbytes` bytes, as c10's `Allocator::allocate`. Zero bytes should give
    /// [`DataPtr::null`] on the allocator's device.
    ///
    /// `#[track_caller]`: an allocator that records where its memory goes (c10-cuda's memory
    /// history) sees the location of the call.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] when the device has no room, [`Error::SizeOverflow`] when `nbytes`
    /// cannot describe an allocation.
    #[track_caller]
    fn allocate(&self, nbytes: usize) -> Result<DataPtr>;

    /// The device type this allocator serves.
    fn device_type(&self) -> DeviceType;

    /// Whether the bytes this allocator hands out are host memory that the CPU may read and
    /// write through the data pointer, whatever [`Allocator::device_type`] says: a simulated or
    /// host-emulated device, unified memory, a user's arena on the host. Not in c10 (whose CPU
    /// kernels run only on `kCPU`); host code uses it to decide whether it may touch a storage's
    /// bytes directly ([`crate::StorageImpl::is_host_accessible`]).
    ///
    /// The default is `true` for [`DeviceType::Cpu`] (whose bytes are host memory by the trait's
    /// contract) and `false` otherwise, which is always sound. Returning `true` is a promise
    /// covered by the trait's `# Safety` section, and the answer must not change over the
    /// allocator's life.
    fn host_accessible(&self) -> bool {
        self.device_type() == DeviceType::Cpu
    }

    /// The deleter for pointers from [`Allocator::raw_allocate`], as c10's
    /// `Allocator::raw_deleter()`. `None` (the default) means raw allocation is unsupported.
    fn raw_deleter(&self) -> Option<DeleterFn> {
        None
    }

    /// Allocates `nbytes` bytes and hands back a bare pointer, to be freed with
    /// [`Allocator::raw_deallocate`], as c10's `Allocator::raw_allocate`. Returns null for zero
    /// bytes.
    ///
    /// The default calls [`Allocator::allocate`] and requires a "simple" data pointer (context ==
    /// data) whose deleter is [`Allocator::raw_deleter`].
    ///
    /// # Errors
    /// Those of [`Allocator::allocate`], and [`Error::RawAllocationUnsupported`] when there is no
    /// raw deleter or the data pointer is not simple (it is then freed before returning).
    #[track_caller]
    fn raw_allocate(&self, nbytes: usize) -> Result<*mut u8> {
        let unsupported = |reason| Error::RawAllocationUnsupported {
            device_type: self.device_type(),
            reason,
        };
        let raw_deleter = self
            .raw_deleter()
            .ok_or_else(|| unsupported("the allocator has no raw deleter"))?;
        let mut data_ptr = self.allocate(nbytes)?;
        if data_ptr.is_null() {
            return Ok(std::ptr::null_mut());
        }
        if data_ptr.get().cast() != data_ptr.get_context()
            || data_ptr.cast_context::<u8>(raw_deleter).is_none()
        {
            return Err(unsupported(
                "its data pointers are not simple (context != data, or another deleter)",
            ));
        }
        let data = data_ptr.get();
        // The context is `data` and will be freed by `raw_deallocate` via `raw_deleter`.
        let _ = data_ptr.release_context();
        Ok(data)
    }

    /// Frees a pointer from [`Allocator::raw_allocate`], as c10's `Allocator::raw_deallocate`.
    /// Does nothing for a null pointer.
    ///
    /// # Panics
    /// If the allocator has no [`Allocator::raw_deleter`] (then `raw_allocate` could not have
    /// produced `ptr`).
    ///
    /// # Safety
    /// `ptr` must come from `self.raw_allocate` and must not have been freed already.
    unsafe fn raw_deallocate(&self, ptr: *mut u8) {
        if ptr.is_null() {
            return;
        }
        let deleter = self
            .raw_deleter()
            .expect("raw_deallocate called on an allocator without a raw deleter");
        // SAFETY: the caller guarantees `ptr` came from `raw_allocate`, whose context is `ptr`
        // itself and whose deleter is `raw_deleter` (checked there), and is freed only once.
        unsafe { deleter(ptr.cast()) };
    }

    /// Copies `count` bytes from `src` to `dest`, both allocated by this allocator, as c10's
    /// `Allocator::copy_data`. The default is a host `memcpy`; device allocators must override it.
    ///
    /// # Safety
    /// `src` must be valid for reads and `dest` for writes of `count` bytes, and the two ranges
    /// must not overlap. Either may be null when `count == 0`.
    unsafe fn copy_data(&self, dest: *mut u8, src: *const u8, count: usize) {
        if count == 0 {
            return;
        }
        // SAFETY: guaranteed by the caller (valid, non-overlapping ranges of `count` bytes).
        unsafe { std::ptr::copy_nonoverlapping(src, dest, count) };
    }
}

/// One registry slot: the allocator and the priority it was registered with.
struct Registration {
    allocator: Arc<dyn Allocator>,
    priority: u8,
}

/// The process-wide registry, indexed by [`DeviceType::index`].
static REGISTRY: Lazy<RwLock<[Option<Registration>; DeviceType::COUNT]>> = Lazy::new(|| {
    let mut slots: [Option<Registration>; DeviceType::COUNT] = Default::default();
    slots[DeviceType::Cpu.index()] = Some(Registration {
        allocator: Arc::new(CpuAllocator::new()),
        priority: 0,
    });
    RwLock::new(slots)
});

/// Registers `allocator` for `device_type` with `priority`, as c10's
/// `SetAllocator(DeviceType, Allocator*, uint8_t priority)`.
///
/// The registration takes effect only if `priority` is greater than or equal to the priority of
/// the allocator currently registered for that type (an empty slot accepts anything). Returns
/// whether it took effect.
///
/// # Errors
/// [`Error::DeviceMismatch`] if `allocator.device_type() != device_type`.
pub fn set_allocator(
    device_type: DeviceType,
    allocator: Arc<dyn Allocator>,
    priority: u8,
) -> Result<bool> {
    if allocator.device_type() != device_type {
        return Err(Error::DeviceMismatch {
            expected: device_type,
            actual: allocator.device_type(),
        });
    }
    let mut slots = REGISTRY.write();
    let slot = &mut slots[device_type.index()];
    if slot
        .as_ref()
        .is_some_and(|current| priority < current.priority)
    {
        return Ok(false);
    }
    *slot = Some(Registration {
        allocator,
        priority,
    });
    Ok(true)
}

/// The allocator registered for `device_type`, as c10's `GetAllocator(DeviceType)`.
///
/// # Errors
/// [`Error::NoAllocator`] when nothing is registered for that type.
pub fn get_allocator(device_type: DeviceType) -> Result<Arc<dyn Allocator>> {
    REGISTRY.read()[device_type.index()]
        .as_ref()
        .map(|registration| Arc::clone(&registration.allocator))
        .ok_or(Error::NoAllocator { device_type })
}

/// The priority of the allocator registered for `device_type`, or `None` if there is none, as
/// c10's `allocator_priority[t]`.
pub fn allocator_priority(device_type: DeviceType) -> Option<u8> {
    REGISTRY.read()[device_type.index()]
        .as_ref()
        .map(|registration| registration.priority)
}

/// The allocator registered for [`DeviceType::Cpu`], as c10's `GetCPUAllocator()`.
///
/// # Errors
/// None in practice: the CPU slot is filled at start-up and registrations cannot empty it.
pub fn get_cpu_allocator() -> Result<Arc<dyn Allocator>> {
    get_allocator(DeviceType::Cpu)
}
