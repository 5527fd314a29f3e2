//! [`DataPtr`]: an owning pointer to raw bytes on a device, as c10's `DataPtr` + `UniqueVoidPtr`.
//!
//! A `DataPtr` holds three things, exactly like c10:
//!
//! * `data`: the address of the bytes (what [`DataPtr::get`] returns; never freed directly);
//! * a *context*: an opaque `*mut c_void` that owns the allocation (often equal to `data`, but
//!   an allocator may point it at a bookkeeping block instead);
//! * a *deleter*: an `unsafe fn(*mut c_void)` that is called with the context, exactly once, when
//!   the `DataPtr` is dropped or cleared, unless the context was released first.
//!
//! As with c10's `std::unique_ptr<void, DeleterFnPtr>`, a null context never reaches the deleter,
//! so [`DataPtr::null`] (zero bytes) never calls anything.
//!
//! `DataPtr` is deliberately not `Clone`: it is the unique owner of its context. Sharing happens
//! one level up, through [`crate::Storage`].

use std::ffi::c_void;
use std::fmt;
use std::ptr;

use crate::device::Device;

/// The function that frees a [`DataPtr`]'s context, as c10's `DeleterFnPtr` (`void(*)(void*)`).
///
/// It is only ever called with a non-null context.
pub type DeleterFn = unsafe fn(*mut c_void);

/// An owning, device-tagged pointer to raw bytes, as c10's `DataPtr`.
///
/// See the [module documentation](self) for the data/context/deleter split.
pub struct DataPtr {
    data: *mut u8,
    ctx: *mut c_void,
    deleter: Option<DeleterFn>,
    device: Device,
}

// SAFETY: a `DataPtr` exclusively owns its context; the only thing that ever touches the context
// is the deleter, called once from `Drop`/`clear` (which need `&mut self` or ownership, so never
// from two threads at once). The contract of `DataPtr::new` requires the deleter to be callable
// from any thread, which makes moving the owner to another thread sound. The data pointer itself is
// never dereferenced by `DataPtr`.
unsafe impl Send for DataPtr {}

// SAFETY: every `&self` method only reads the four plain fields (pointer values, a function
// pointer and a `Copy` device); none dereferences `data` or `ctx`, and none mutates. Sharing
// `&DataPtr` across threads therefore cannot race. Access to the bytes behind `data` is raw and its
// synchronisation is the caller's responsibility, as in c10.
unsafe impl Sync for DataPtr {}

/// A context and its deleter taken out of a [`DataPtr`] by [`DataPtr::release_context`].
///
/// The caller now owns the allocation. Dropping a `RawContext` does **not** free anything (it
/// leaks); call [`RawContext::delete`] to free it the way the `DataPtr` would have.
#[derive(Debug)]
#[must_use = "the allocation leaks unless `RawContext::delete` is called"]
pub struct RawContext {
    /// The opaque context that owns the allocation (possibly null).
    pub ctx: *mut c_void,
    /// The deleter that frees `ctx` (possibly none).
    pub deleter: Option<DeleterFn>,
}

impl RawContext {
    /// Frees the context with its deleter, as the `DataPtr` would have on drop. Does nothing when
    /// the context is null or there is no deleter.
    ///
    /// # Safety
    /// The context must not have been freed by any other path (for example by a `RawContext`
    /// rebuilt from the same public fields), and no pointer into the allocation may be used
    /// afterwards.
    pub unsafe fn delete(self) {
        if let (false, Some(deleter)) = (self.ctx.is_null(), self.deleter) {
            // SAFETY: the caller guarantees this is the one and only release of `ctx`; the
            // `DataPtr` this came from guaranteed `deleter` accepts `ctx` (contract of `new`).
            unsafe { deleter(self.ctx) };
        }
    }
}

impl DataPtr {
    /// A data pointer that owns `ctx` and frees it with `deleter` on drop, as c10's
    /// `DataPtr(void* data, void* ctx, DeleterFnPtr ctx_deleter, Device device)`.
    ///
    /// # Safety
    /// * If `ctx` is non-null and `deleter` is `Some`, calling `deleter(ctx)` once, from any
    ///   thread, must be sound and must release the allocation; nothing else may free `ctx`.
    /// * `data` must stay valid for as many bytes as the owner of this `DataPtr` (for example a
    ///   [`crate::StorageImpl`]) declares, until the deleter runs; on [`DeviceType::Cpu`]
    ///   those bytes must be host memory readable and writable through `data`, and not
    ///   reachable by any other path that the owner does not know about.
    ///
    /// [`DeviceType::Cpu`]: crate::DeviceType::Cpu
    pub unsafe fn new(
        data: *mut u8,
        ctx: *mut c_void,
        deleter: Option<DeleterFn>,
        device: Device,
    ) -> Self {
        DataPtr {
            data,
            ctx,
            deleter,
            device,
        }
    }

    /// A data pointer that does not own its bytes (no context, no deleter), as c10's
    /// `DataPtr(void* data, Device device)`.
    ///
    /// # Safety
    /// The same validity requirement on `data` as [`DataPtr::new`]; in addition the caller keeps
    /// the memory alive for as long as this `DataPtr` (or a storage built from it) is used.
    pub unsafe fn non_owning(data: *mut u8, device: Device) -> Self {
        DataPtr {
            data,
            ctx: ptr::null_mut(),
            deleter: None,
            device,
        }
    }

    /// The empty data pointer for a zero-byte allocation on `device`: null data, null context,
    /// no deleter (so nothing is ever freed), as c10's default `DataPtr`.
    pub const fn null(device: Device) -> Self {
        DataPtr {
            data: ptr::null_mut(),
            ctx: ptr::null_mut(),
            deleter: None,
            device,
        }
    }

    /// The data pointer, as c10's `DataPtr::get()`. Never frees; null for zero bytes.
    pub fn get(&self) -> *mut u8 {
        self.data
    }

    /// Whether the data pointer is null (a zero-byte allocation), as c10's `!DataPtr`.
    pub fn is_null(&self) -> bool {
        self.data.is_null()
    }

    /// The opaque context, as c10's `DataPtr::get_context()`. Ownership stays here.
    pub fn get_context(&self) -> *mut c_void {
        self.ctx
    }

    /// The deleter, as c10's `DataPtr::get_deleter()`.
    pub fn get_deleter(&self) -> Option<DeleterFn> {
        self.deleter
    }

    /// The device the bytes live on, as c10's `DataPtr::device()`.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Gives up ownership of the context: returns the context and its deleter, and leaves this
    /// `DataPtr` with a null context so it will not free anything. `get()` still returns the old
    /// data pointer. As c10's `DataPtr::move_context()` (c10's `release_context()` returns only the
    /// context; here the deleter comes along so the caller can free it).
    pub fn release_context(&mut self) -> RawContext {
        let released = RawContext {
            ctx: self.ctx,
            deleter: self.deleter,
        };
        self.ctx = ptr::null_mut();
        self.deleter = None;
        released
    }

    /// The context as a `*mut T`, only if this data pointer's deleter is `expected_deleter`
    /// (which identifies what the context is), else `None`; as c10's `DataPtr::cast_context<T>`.
    ///
    /// Function pointers are compared by address ([`std::ptr::fn_addr_eq`]); like in C++, two
    /// distinct functions with identical bodies may be merged by the compiler and compare equal,
    /// so give each context type a deleter with a distinct body.
    pub fn cast_context<T>(&self, expected_deleter: DeleterFn) -> Option<*mut T> {
        match self.deleter {
            Some(deleter) if ptr::fn_addr_eq(deleter, expected_deleter) => {
                Some(self.ctx.cast::<T>())
            }
            _ => None,
        }
    }

    /// Replaces the deleter with `new_deleter` if it currently is `expected_deleter`; returns
    /// whether it did. As c10's `DataPtr::compare_exchange_deleter`. Used to wrap a context's
    /// deleter (for example to record a free event) without touching the context.
    ///
    /// # Safety
    /// `new_deleter` must satisfy the contract of [`DataPtr::new`] for this data pointer's context.
    pub unsafe fn compare_exchange_deleter(
        &mut self,
        expected_deleter: DeleterFn,
        new_deleter: DeleterFn,
    ) -> bool {
        match self.deleter {
            Some(deleter) if ptr::fn_addr_eq(deleter, expected_deleter) => {
                self.deleter = Some(new_deleter);
                true
            }
            _ => false,
        }
    }

    /// Frees the context now (running the deleter once) and resets this to the null data pointer
    /// on the same device, as c10's `DataPtr::clear()`.
    pub fn clear(&mut self) {
        let released = self.release_context();
        self.data = ptr::null_mut();
        // SAFETY: `released` came out of this `DataPtr`, which owned the context until now and has
        // just given it up, so this is the one release of that context.
        unsafe { released.delete() };
    }
}

impl Drop for DataPtr {
    /// Runs the deleter once with the context, unless the context is null or was released.
    fn drop(&mut self) {
        self.clear();
    }
}

impl fmt::Debug for DataPtr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DataPtr")
            .field("data", &self.data)
            .field("ctx", &self.ctx)
            .field("has_deleter", &self.deleter.is_some())
            .field("device", &self.device)
            .finish()
    }
}
