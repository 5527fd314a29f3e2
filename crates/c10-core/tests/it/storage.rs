//! `Storage` sharing (use counts, weak handles, when the bytes are freed), byte access and
//! resizing.

use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use c10_core::{Allocator, CpuAllocator, DataPtr, DeleterFn, Device, DeviceType, Error, Storage};

/// Context of a counted allocation: the bytes and the delete counter.
struct Counted {
    bytes: Vec<u8>,
    deletes: Arc<AtomicUsize>,
}

unsafe fn delete_counted(ctx: *mut c_void) {
    // SAFETY: made by `Box::into_raw` in `counted`, freed once by the DataPtr.
    let counted = unsafe { Box::from_raw(ctx.cast::<Counted>()) };
    counted.deletes.fetch_add(1, Ordering::SeqCst);
}

/// A non-resizable CPU storage of `nbytes` bytes whose deletion is counted.
fn counted(nbytes: usize) -> (Storage, Arc<AtomicUsize>) {
    let deletes = Arc::new(AtomicUsize::new(0));
    let mut ctx = Box::new(Counted {
        bytes: vec![0; nbytes],
        deletes: Arc::clone(&deletes),
    });
    let data = ctx.bytes.as_mut_ptr();
    let ctx = Box::into_raw(ctx);
    // SAFETY: `delete_counted` frees the box once from any thread; `data` is `nbytes` bytes of
    // host memory inside it that nothing else uses.
    let storage = unsafe {
        let data_ptr = DataPtr::new(
            data,
            ctx.cast(),
            Some(delete_counted as DeleterFn),
            Device::cpu(),
        );
        Storage::from_data_ptr(nbytes, data_ptr, None, false).unwrap()
    };
    (storage, deletes)
}

#[test]
fn use_counts_follow_clones_and_weak_handles() {
    let (storage, deletes) = counted(64);
    assert_eq!((storage.use_count(), storage.weak_count()), (1, 0));
    assert!(storage.is_unique());

    let alias = storage.clone();
    assert_eq!((storage.use_count(), alias.use_count()), (2, 2));
    assert!(!storage.is_unique());
    assert!(alias.is_alias_of(&storage));

    let weak = storage.downgrade();
    let weak2 = weak.clone();
    assert_eq!((storage.use_count(), storage.weak_count()), (2, 2));
    assert_eq!(weak.use_count(), 2);
    assert!(!weak.expired());

    let upgraded = weak.upgrade().expect("alive");
    assert_eq!(upgraded.use_count(), 3);
    drop(upgraded);
    drop(alias);
    assert_eq!(storage.use_count(), 1);
    drop(weak2);
    assert_eq!(storage.weak_count(), 1);
    assert_eq!(deletes.load(Ordering::SeqCst), 0);

    drop(storage);
    assert_eq!(deletes.load(Ordering::SeqCst), 1);
    assert!(weak.upgrade().is_none());
    assert!(weak.expired());
    assert_eq!(weak.use_count(), 0);
    drop(weak);
    assert_eq!(deletes.load(Ordering::SeqCst), 1);
}

#[test]
fn deleter_runs_when_the_last_handle_drops_on_any_thread() {
    let (storage, deletes) = counted(8);
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let storage = storage.clone();
            std::thread::spawn(move || assert_eq!(storage.nbytes(), 8))
        })
        .collect();
    for handle in handles {
        handle.join().unwrap();
    }
    assert_eq!(deletes.load(Ordering::SeqCst), 0);
    let last = storage.clone();
    drop(storage);
    assert_eq!(deletes.load(Ordering::SeqCst), 0);
    std::thread::spawn(move || drop(last)).join().unwrap();
    assert_eq!(deletes.load(Ordering::SeqCst), 1);
}

#[test]
fn distinct_storages_are_not_aliases() {
    let cpu: Arc<dyn Allocator> = Arc::new(CpuAllocator::new());
    let a = Storage::new(8, Arc::clone(&cpu), false).unwrap();
    let b = Storage::new(8, Arc::clone(&cpu), false).unwrap();
    assert!(!a.is_alias_of(&b));
    let empty_a = Storage::new(0, Arc::clone(&cpu), false).unwrap();
    let empty_b = Storage::new(0, cpu, false).unwrap();
    assert!(
        !empty_a.is_alias_of(&empty_b),
        "null data pointers are not aliases"
    );
    assert!(empty_a.is_alias_of(&empty_a));
}

#[test]
fn storage_from_an_allocator() {
    let cpu = Arc::new(CpuAllocator::zeroed());
    let mut storage = Storage::new(100, cpu.clone(), false).unwrap();
    assert_eq!(storage.nbytes(), 100);
    assert_eq!(storage.device(), Device::cpu());
    assert_eq!(storage.device_type(), DeviceType::Cpu);
    assert!(!storage.resizable());
    assert!(storage.allocator().is_some());
    assert_eq!(storage.data_ptr() as usize % 64, 0);
    assert_eq!(cpu.allocated_bytes(), 100);

    let bytes = storage.try_bytes_mut().expect("unique");
    assert_eq!(bytes.len(), 100);
    assert!(bytes.iter().all(|&b| b == 0));
    bytes[99] = 42;
    // SAFETY: no writer while the slice is alive.
    assert_eq!(unsafe { storage.as_bytes() }.unwrap()[99], 42);

    drop(storage);
    assert_eq!(cpu.allocated_bytes(), 0);
}

#[test]
fn try_bytes_mut_needs_unique_ownership() {
    let (mut storage, _deletes) = counted(4);
    let alias = storage.clone();
    assert!(storage.try_bytes_mut().is_none());
    drop(alias);
    let weak = storage.downgrade();
    assert!(
        storage.try_bytes_mut().is_none(),
        "a weak handle also blocks it"
    );
    drop(weak);
    storage
        .try_bytes_mut()
        .unwrap()
        .copy_from_slice(&[1, 2, 3, 4]);
    // SAFETY: no writer while the slice is alive.
    assert_eq!(unsafe { storage.as_bytes() }, Some(&[1u8, 2, 3, 4][..]));
}

#[test]
fn host_access_is_refused_for_device_storages() {
    // SAFETY: zero bytes on a CUDA device; nothing is ever dereferenced.
    let mut storage =
        unsafe { Storage::from_data_ptr(0, DataPtr::null(Device::cuda(0)), None, false) }.unwrap();
    assert_eq!(storage.device(), Device::cuda(0));
    assert!(storage.try_bytes_mut().is_none());
    // SAFETY: no writers.
    assert!(unsafe { storage.as_bytes() }.is_none());
}

#[test]
fn zero_byte_storage_gives_empty_slices() {
    let mut storage = Storage::new(0, Arc::new(CpuAllocator::new()), false).unwrap();
    assert!(storage.data_ptr().is_null());
    assert_eq!(storage.try_bytes_mut().map(|b| b.len()), Some(0));
    // SAFETY: no writers.
    assert_eq!(unsafe { storage.as_bytes() }, Some(&[][..]));
}

#[test]
fn non_resizable_storage_refuses_to_change_size() {
    let (storage, _deletes) = counted(16);
    assert_eq!(
        storage.resize(32).unwrap_err(),
        Error::NotResizable {
            nbytes: 16,
            requested: 32
        }
    );
    assert_eq!(
        storage.set_nbytes(8).unwrap_err(),
        Error::NotResizable {
            nbytes: 16,
            requested: 8
        }
    );
    assert_eq!(storage.nbytes(), 16);
}

#[test]
fn resizable_storage_needs_an_allocator() {
    // SAFETY: zero bytes, nothing to access.
    let result = unsafe { Storage::from_data_ptr(0, DataPtr::null(Device::cpu()), None, true) };
    assert_eq!(result.unwrap_err(), Error::MissingAllocator);
}

#[test]
fn allocator_and_data_ptr_must_agree_on_the_device() {
    let cpu: Arc<dyn Allocator> = Arc::new(CpuAllocator::new());
    // SAFETY: zero bytes, nothing to access.
    let result =
        unsafe { Storage::from_data_ptr(0, DataPtr::null(Device::sim(0)), Some(cpu), false) };
    assert_eq!(
        result.unwrap_err(),
        Error::DeviceMismatch {
            expected: DeviceType::Cpu,
            actual: DeviceType::Sim
        }
    );
}

#[test]
fn resize_keeps_the_prefix_and_frees_the_old_allocation() {
    let cpu = Arc::new(CpuAllocator::new());
    let mut storage = Storage::new(4, cpu.clone(), true).unwrap();
    storage.try_bytes_mut().unwrap().copy_from_slice(b"abcd");

    // Shared handles see the resize (c10 semantics: one StorageImpl).
    let alias = storage.clone();
    alias.resize(10).unwrap();
    assert_eq!(storage.nbytes(), 10);
    assert_eq!(cpu.allocated_bytes(), 10);
    drop(alias);
    assert_eq!(&storage.try_bytes_mut().unwrap()[..4], b"abcd");

    storage.resize(2).unwrap();
    assert_eq!(cpu.allocated_bytes(), 2);
    assert_eq!(storage.try_bytes_mut().unwrap(), b"ab");

    // set_nbytes shrinks within the allocation, but cannot grow past it.
    storage.set_nbytes(1).unwrap();
    assert_eq!(storage.nbytes(), 1);
    storage.set_nbytes(2).unwrap();
    assert_eq!(
        storage.set_nbytes(3).unwrap_err(),
        Error::ExceedsCapacity {
            requested: 3,
            capacity: 2
        }
    );

    storage.resize(0).unwrap();
    assert!(storage.data_ptr().is_null());
    assert_eq!(cpu.allocated_bytes(), 0);
    storage.resize(3).unwrap();
    assert_eq!(cpu.allocated_bytes(), 3);
    drop(storage);
    assert_eq!(cpu.allocated_bytes(), 0);
}

#[test]
fn a_failed_resize_leaves_the_storage_unchanged() {
    let cpu = Arc::new(CpuAllocator::new());
    let mut storage = Storage::new(3, cpu.clone(), true).unwrap();
    storage.try_bytes_mut().unwrap().copy_from_slice(b"xyz");
    assert_eq!(
        storage.resize(usize::MAX).unwrap_err(),
        Error::SizeOverflow { nbytes: usize::MAX }
    );
    assert_eq!(storage.nbytes(), 3);
    assert_eq!(storage.try_bytes_mut().unwrap(), b"xyz");
    assert_eq!(cpu.allocated_bytes(), 3);
}

#[test]
fn storage_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Storage>();
    assert_send_sync::<c10_core::WeakStorage>();
}

/// A host allocator that tags its bytes with the simulated device `sim:0` and says whether they
/// are host memory ([`Allocator::host_accessible`]): a user's host-emulated device.
struct HostSim {
    host_accessible: bool,
}

// SAFETY: every data pointer is a `CpuAllocator` allocation (host memory, `nbytes` bytes, its
// own deleter) re-tagged with `sim:0`, so the bytes are host memory whatever `host_accessible`
// says; there is no raw deleter.
unsafe impl Allocator for HostSim {
    fn allocate(&self, nbytes: usize) -> c10_core::Result<DataPtr> {
        let mut cpu = CpuAllocator::new().allocate(nbytes)?;
        let raw = cpu.release_context();
        // SAFETY: the context and deleter come from a CPU data pointer that has just given them
        // up, so this is their one owner; the bytes stay valid until the deleter runs.
        Ok(unsafe { DataPtr::new(cpu.get(), raw.ctx, raw.deleter, Device::sim(0)) })
    }

    fn device_type(&self) -> DeviceType {
        DeviceType::Sim
    }

    fn host_accessible(&self) -> bool {
        self.host_accessible
    }
}

#[test]
fn the_default_host_accessibility_is_the_cpu_only() {
    assert!(CpuAllocator::new().host_accessible());
    struct Meta;
    // SAFETY: only null data pointers on the meta device; no raw deleter.
    unsafe impl Allocator for Meta {
        fn allocate(&self, _nbytes: usize) -> c10_core::Result<DataPtr> {
            Ok(DataPtr::null(Device::new(DeviceType::Meta, None)))
        }
        fn device_type(&self) -> DeviceType {
            DeviceType::Meta
        }
    }
    assert!(!Meta.host_accessible());
}

#[test]
fn an_allocator_that_says_host_memory_gives_host_access_on_any_device() {
    let host: Arc<dyn Allocator> = Arc::new(HostSim {
        host_accessible: true,
    });
    let mut storage = Storage::new(4, host, true).unwrap();
    assert_eq!(storage.device(), Device::sim(0));
    assert!(storage.is_host_accessible());
    storage
        .try_bytes_mut()
        .expect("unique and host memory")
        .copy_from_slice(&[1, 2, 3, 4]);
    // A resize goes through the same allocator, so the new bytes are host memory too (shrunk,
    // so that every byte is initialised).
    storage.resize(3).unwrap();
    // SAFETY: no writers while the slice lives; the 3 bytes were copied from initialised ones.
    let bytes = unsafe { storage.as_bytes() };
    assert_eq!(bytes, Some(&[1u8, 2, 3][..]));

    // The same bytes behind an allocator that does not say so are refused.
    let device_only: Arc<dyn Allocator> = Arc::new(HostSim {
        host_accessible: false,
    });
    let mut storage = Storage::new(4, device_only, false).unwrap();
    assert!(!storage.is_host_accessible());
    assert!(storage.try_bytes_mut().is_none());
    // SAFETY: nothing is dereferenced (refused).
    assert!(unsafe { storage.as_bytes() }.is_none());
}
