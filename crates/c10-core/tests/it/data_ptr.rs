//! `DataPtr` ownership: the deleter runs exactly once, on drop, never on `get()`, never after
//! `release_context()`; `cast_context` and `compare_exchange_deleter` check the deleter.

use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use c10_core::{DataPtr, DeleterFn, Device};

/// A test allocation: a heap buffer plus a counter of how many times it was deleted.
struct Tracked {
    bytes: Vec<u8>,
    deletes: Arc<AtomicUsize>,
}

/// Deleter for a `Box<Tracked>` context: counts, then frees.
unsafe fn delete_tracked(ctx: *mut c_void) {
    // SAFETY: `tracked` below made `ctx` with `Box::into_raw`, and the DataPtr calls this once.
    let tracked = unsafe { Box::from_raw(ctx.cast::<Tracked>()) };
    tracked.deletes.fetch_add(1, Ordering::SeqCst);
}

/// A different deleter (distinct body, so it cannot be merged with `delete_tracked`).
unsafe fn other_deleter(ctx: *mut c_void) {
    // SAFETY: only used with `Box<Tracked>` contexts, called once.
    let tracked = unsafe { Box::from_raw(ctx.cast::<Tracked>()) };
    tracked.deletes.fetch_add(100, Ordering::SeqCst);
}

/// A `DataPtr` over `nbytes` tracked bytes, and its delete counter.
fn tracked(nbytes: usize) -> (DataPtr, Arc<AtomicUsize>) {
    let deletes = Arc::new(AtomicUsize::new(0));
    let mut ctx = Box::new(Tracked {
        bytes: vec![7; nbytes],
        deletes: Arc::clone(&deletes),
    });
    let data = ctx.bytes.as_mut_ptr();
    let ctx = Box::into_raw(ctx);
    // SAFETY: `delete_tracked(ctx)` frees the box once from any thread; `data` points into it.
    let data_ptr = unsafe {
        DataPtr::new(
            data,
            ctx.cast(),
            Some(delete_tracked as DeleterFn),
            Device::cpu(),
        )
    };
    (data_ptr, deletes)
}

#[test]
fn deleter_runs_exactly_once_on_drop_and_never_on_get() {
    let (data_ptr, deletes) = tracked(32);
    for _ in 0..10 {
        assert!(!data_ptr.get().is_null());
        // SAFETY: the buffer is 32 initialised bytes, alive until the drop below.
        assert_eq!(unsafe { *data_ptr.get().add(31) }, 7);
    }
    assert_eq!(data_ptr.device(), Device::cpu());
    assert_eq!(deletes.load(Ordering::SeqCst), 0);
    drop(data_ptr);
    assert_eq!(deletes.load(Ordering::SeqCst), 1);
}

#[test]
fn deleter_runs_once_when_dropped_on_another_thread() {
    let (data_ptr, deletes) = tracked(8);
    std::thread::spawn(move || drop(data_ptr)).join().unwrap();
    assert_eq!(deletes.load(Ordering::SeqCst), 1);
}

#[test]
fn clear_frees_now_and_drop_does_not_free_again() {
    let (mut data_ptr, deletes) = tracked(8);
    data_ptr.clear();
    assert!(data_ptr.is_null());
    assert!(data_ptr.get_context().is_null());
    assert_eq!(deletes.load(Ordering::SeqCst), 1);
    drop(data_ptr);
    assert_eq!(deletes.load(Ordering::SeqCst), 1);
}

#[test]
fn release_context_hands_ownership_to_the_caller() {
    let (mut data_ptr, deletes) = tracked(16);
    let data = data_ptr.get();
    let released = data_ptr.release_context();
    assert!(!released.ctx.is_null());
    assert!(released.deleter.is_some());
    // The data pointer is still visible, but the DataPtr no longer owns anything.
    assert_eq!(data_ptr.get(), data);
    assert!(data_ptr.get_context().is_null());
    assert!(data_ptr.get_deleter().is_none());
    drop(data_ptr);
    assert_eq!(deletes.load(Ordering::SeqCst), 0);
    // The caller frees manually.
    // SAFETY: `released` is the only owner of the context now.
    unsafe { released.delete() };
    assert_eq!(deletes.load(Ordering::SeqCst), 1);
}

#[test]
fn cast_context_checks_the_deleter() {
    let (data_ptr, deletes) = tracked(4);
    let ctx = data_ptr
        .cast_context::<Tracked>(delete_tracked)
        .expect("right deleter");
    assert_eq!(ctx.cast::<c_void>(), data_ptr.get_context());
    // SAFETY: the context is a live `Tracked` owned by `data_ptr`.
    assert_eq!(unsafe { (*ctx).bytes.len() }, 4);
    assert!(data_ptr.cast_context::<Tracked>(other_deleter).is_none());
    drop(data_ptr);
    assert_eq!(deletes.load(Ordering::SeqCst), 1);
}

#[test]
fn compare_exchange_deleter_swaps_only_on_match() {
    let (mut data_ptr, deletes) = tracked(4);
    // SAFETY: `other_deleter` accepts `Box<Tracked>` contexts.
    assert!(!unsafe { data_ptr.compare_exchange_deleter(other_deleter, other_deleter) });
    // SAFETY: as above.
    assert!(unsafe { data_ptr.compare_exchange_deleter(delete_tracked, other_deleter) });
    assert!(data_ptr.cast_context::<Tracked>(other_deleter).is_some());
    assert!(data_ptr.cast_context::<Tracked>(delete_tracked).is_none());
    drop(data_ptr);
    // The new deleter ran (adds 100), the old one did not.
    assert_eq!(deletes.load(Ordering::SeqCst), 100);
}

#[test]
fn null_data_ptr_never_calls_a_deleter() {
    let mut data_ptr = DataPtr::null(Device::cuda(1));
    assert!(data_ptr.is_null());
    assert!(data_ptr.get_context().is_null());
    assert!(data_ptr.get_deleter().is_none());
    assert_eq!(data_ptr.device(), Device::cuda(1));
    assert!(data_ptr.cast_context::<u8>(delete_tracked).is_none());
    let released = data_ptr.release_context();
    // SAFETY: a null context: nothing to free.
    unsafe { released.delete() };
    data_ptr.clear();
}

/// Calls of [`count_calls`], whatever the context (only
/// `null_context_with_a_deleter_is_never_passed_to_it` uses it).
static NULL_CONTEXT_CALLS: AtomicUsize = AtomicUsize::new(0);

/// A deleter that frees nothing and only counts its calls, so a call with a null context is
/// seen as a number, not as a crash.
unsafe fn count_calls(_ctx: *mut c_void) {
    NULL_CONTEXT_CALLS.fetch_add(1, Ordering::SeqCst);
}

#[test]
fn null_context_with_a_deleter_is_never_passed_to_it() {
    let mut byte = 0u8;
    let data: *mut u8 = &raw mut byte;
    let null_context = || {
        // SAFETY: the deleter touches nothing; `byte` outlives the DataPtr.
        unsafe {
            DataPtr::new(
                data,
                std::ptr::null_mut(),
                Some(count_calls as DeleterFn),
                Device::cpu(),
            )
        }
    };
    drop(null_context());
    null_context().clear();
    let released = null_context().release_context();
    assert!(released.deleter.is_some());
    // SAFETY: a null context: nothing to free (and the deleter frees nothing anyway).
    unsafe { released.delete() };
    assert_eq!(NULL_CONTEXT_CALLS.load(Ordering::SeqCst), 0);

    // The counter does count: the same deleter with a non-null context runs once on drop.
    // SAFETY: as above; the context is never dereferenced.
    let owning = unsafe {
        DataPtr::new(
            data,
            data.cast(),
            Some(count_calls as DeleterFn),
            Device::cpu(),
        )
    };
    drop(owning);
    assert_eq!(NULL_CONTEXT_CALLS.load(Ordering::SeqCst), 1);
}

#[test]
fn non_owning_data_ptr_frees_nothing() {
    let mut buffer = [1u8; 8];
    // SAFETY: `buffer` outlives the DataPtr.
    let data_ptr = unsafe { DataPtr::non_owning(buffer.as_mut_ptr(), Device::cpu()) };
    assert_eq!(data_ptr.get(), buffer.as_mut_ptr());
    assert!(data_ptr.get_context().is_null());
    drop(data_ptr);
    assert_eq!(buffer, [1; 8]);
}

#[test]
fn data_ptr_is_send_and_sync_but_not_clone() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<DataPtr>();
    // Not `Clone`: checked by the compile-fail doc of this property being absent; here we only
    // check the Debug output carries the device.
    let data_ptr = DataPtr::null(Device::sim(2));
    assert!(format!("{data_ptr:?}").contains("Sim"));
}
