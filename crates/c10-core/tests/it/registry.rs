//! The per-device-type allocator registry: the default CPU allocator, priorities, lookups.
//!
//! Tests in one binary run on parallel threads and the registry is process-wide, so each test
//! owns one device type: the CPU slot is only read, `Sim` is only written by
//! `priority_decides_which_registration_wins`, `Meta` is never registered.

use std::sync::Arc;

use c10_core::{
    Allocator, DataPtr, Device, DeviceType, Error, Storage, allocator_priority, get_allocator,
    get_cpu_allocator, set_allocator,
};

/// An allocator that only serves zero-byte requests: enough to tell registrations apart.
struct Stub {
    device_type: DeviceType,
}

// SAFETY: it returns only null data pointers (zero bytes) on its own device type, and has no raw
// deleter.
unsafe impl Allocator for Stub {
    fn allocate(&self, nbytes: usize) -> c10_core::Result<DataPtr> {
        let device = Device::new(self.device_type, Some(0));
        if nbytes == 0 {
            Ok(DataPtr::null(device))
        } else {
            Err(Error::OutOfMemory {
                requested: nbytes,
                device,
            })
        }
    }

    fn device_type(&self) -> DeviceType {
        self.device_type
    }
}

fn stub(device_type: DeviceType) -> Arc<dyn Allocator> {
    Arc::new(Stub { device_type })
}

fn same(a: &Arc<dyn Allocator>, b: &Arc<dyn Allocator>) -> bool {
    std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
}

#[test]
fn default_cpu_allocator_is_registered() {
    let cpu = get_allocator(DeviceType::Cpu).expect("cpu allocator registered at start-up");
    assert_eq!(cpu.device_type(), DeviceType::Cpu);
    assert_eq!(allocator_priority(DeviceType::Cpu), Some(0));
    assert!(same(&cpu, &get_cpu_allocator().unwrap()));

    let data_ptr = cpu.allocate(100).unwrap();
    assert_eq!(data_ptr.get() as usize % 64, 0);
    assert_eq!(data_ptr.device(), Device::cpu());

    let storage = Storage::new(10, cpu, true).unwrap();
    storage.resize(20).unwrap();
    assert_eq!(storage.nbytes(), 20);
}

#[test]
fn priority_decides_which_registration_wins() {
    let first = stub(DeviceType::Sim);
    assert!(set_allocator(DeviceType::Sim, Arc::clone(&first), 5).unwrap());
    assert!(same(&get_allocator(DeviceType::Sim).unwrap(), &first));
    assert_eq!(allocator_priority(DeviceType::Sim), Some(5));

    // Lower priority: ignored.
    let lower = stub(DeviceType::Sim);
    assert!(!set_allocator(DeviceType::Sim, Arc::clone(&lower), 4).unwrap());
    assert!(same(&get_allocator(DeviceType::Sim).unwrap(), &first));

    // Equal priority replaces (c10 uses `>=`).
    let equal = stub(DeviceType::Sim);
    assert!(set_allocator(DeviceType::Sim, Arc::clone(&equal), 5).unwrap());
    assert!(same(&get_allocator(DeviceType::Sim).unwrap(), &equal));

    // Higher priority replaces.
    let higher = stub(DeviceType::Sim);
    assert!(set_allocator(DeviceType::Sim, Arc::clone(&higher), 9).unwrap());
    let current = get_allocator(DeviceType::Sim).unwrap();
    assert!(same(&current, &higher));
    assert_eq!(allocator_priority(DeviceType::Sim), Some(9));
    assert_eq!(current.allocate(0).unwrap().device(), Device::sim(0));
    assert!(current.allocate(1).is_err());

    // The registry holds its own reference; our replaced ones are ours alone again.
    assert_eq!(Arc::strong_count(&first), 1);
    assert_eq!(Arc::strong_count(&lower), 1);
}

#[test]
fn unregistered_device_type_is_an_error() {
    match get_allocator(DeviceType::Meta) {
        Err(err) => assert_eq!(
            err,
            Error::NoAllocator {
                device_type: DeviceType::Meta
            }
        ),
        Ok(_) => panic!("nothing registers a Meta allocator"),
    }
    assert_eq!(allocator_priority(DeviceType::Meta), None);
}

#[test]
fn registration_must_match_the_device_type() {
    let err = set_allocator(DeviceType::Meta, stub(DeviceType::Cuda), 255).unwrap_err();
    assert_eq!(
        err,
        Error::DeviceMismatch {
            expected: DeviceType::Meta,
            actual: DeviceType::Cuda
        }
    );
    assert_eq!(allocator_priority(DeviceType::Meta), None);
}

#[test]
fn raw_allocation_needs_a_raw_deleter() {
    let err = stub(DeviceType::Cuda).raw_allocate(8).unwrap_err();
    assert_eq!(
        err,
        Error::RawAllocationUnsupported {
            device_type: DeviceType::Cuda,
            reason: "the allocator has no raw deleter"
        }
    );
}
