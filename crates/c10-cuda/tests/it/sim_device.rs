//! The simulated device itself: host-backed bytes (segments and expandable pages), range
//! checks, scripted addresses, capacity and event control.

use c10_cuda::config::AllocatorConfig;
use c10_cuda::device::{DeviceError, DeviceMemory, StreamId};
use c10_cuda::{DeviceCachingAllocator, SimDevice};

const MIB: usize = 1 << 20;

#[test]
fn host_backed_blocks_hold_real_bytes() {
    let sim = SimDevice::host_backed(0, 256 * MIB);
    let mut alloc = DeviceCachingAllocator::new(sim.clone(), AllocatorConfig::default()).unwrap();
    let a = alloc.malloc(3000, StreamId::DEFAULT).unwrap();
    let b = alloc.malloc(5 * MIB, StreamId::DEFAULT).unwrap();
    let pattern: Vec<u8> = (0..3000).map(|i| (i % 251) as u8).collect();
    sim.write(a.ptr, &pattern).unwrap();
    sim.write(b.ptr + MIB as u64, &[7u8; 4096]).unwrap();
    let mut back = vec![0u8; 3000];
    sim.read(a.ptr, &mut back).unwrap();
    assert_eq!(back, pattern);
    let mut back = vec![0u8; 4096];
    sim.read(b.ptr + MIB as u64, &mut back).unwrap();
    assert!(back.iter().all(|&x| x == 7));
    // Fresh segment memory reads as zero.
    let mut zero = vec![1u8; 64];
    sim.read(b.ptr, &mut zero).unwrap();
    assert!(zero.iter().all(|&x| x == 0));
    alloc.free(a.ptr).unwrap();
    alloc.free(b.ptr).unwrap();
    alloc.empty_cache().unwrap();
    assert_eq!(sim.used_bytes(), 0);
    assert!(sim.live_segments().is_empty());
}

#[test]
fn host_backed_range_checks_refuse_foreign_and_freed_memory() {
    let sim = SimDevice::host_backed(0, 64 * MIB);
    let seg = sim.malloc(2 * MIB).unwrap();
    let end = seg + (2 * MIB) as u64;
    assert!(sim.is_host_range(seg, 2 * MIB));
    assert!(!sim.is_host_range(seg, 2 * MIB + 1));
    assert!(matches!(
        sim.write(end - 4, &[0u8; 8]),
        Err(DeviceError::Invalid { .. })
    ));
    let mut buf = [0u8; 8];
    assert!(matches!(
        sim.read(0x1000, &mut buf),
        Err(DeviceError::Invalid { .. })
    ));
    sim.free(seg, 2 * MIB).unwrap();
    assert!(matches!(
        sim.read(seg, &mut buf),
        Err(DeviceError::Invalid { .. })
    ));
    // Freeing twice or with the wrong size is refused.
    assert!(sim.free(seg, 2 * MIB).is_err());
}

#[cfg(unix)]
#[test]
fn host_backed_expandable_segments_map_real_pages() {
    let sim = SimDevice::host_backed(0, 256 * MIB);
    let config: AllocatorConfig = "expandable_segments:True".parse().unwrap();
    let mut alloc = DeviceCachingAllocator::new(sim.clone(), config).unwrap();
    // 30 MiB spans two 20 MiB pages of the large pool's expandable segment.
    let a = alloc.malloc(30 * MIB, StreamId::DEFAULT).unwrap();
    assert_eq!(sim.mapped_pages().len(), 2);
    let data: Vec<u8> = (0..(30 * MIB)).map(|i| (i % 253) as u8).collect();
    sim.write(a.ptr, &data).unwrap();
    let mut back = vec![0u8; 30 * MIB];
    sim.read(a.ptr, &mut back).unwrap();
    assert_eq!(back, data);
    alloc.free(a.ptr).unwrap();
    alloc.empty_cache().unwrap();
    assert!(sim.mapped_pages().is_empty());
    assert_eq!(sim.used_bytes(), 0);
    alloc.check_invariants().unwrap();
}

#[test]
fn address_only_refuses_byte_access_and_counts_capacity() {
    let sim = SimDevice::address_only(3, 10 * MIB);
    let p = sim.malloc(4 * MIB).unwrap();
    let mut buf = [0u8; 4];
    assert!(matches!(
        sim.read(p, &mut buf),
        Err(DeviceError::Unsupported { .. })
    ));
    sim.set_external_usage(5 * MIB);
    assert_eq!(sim.mem_get_info().unwrap().free, MIB);
    assert!(matches!(
        sim.malloc(2 * MIB),
        Err(DeviceError::OutOfMemory { size }) if size == 2 * MIB
    ));
    assert_eq!(sim.counters().failed_mallocs, 1);
    assert_eq!(sim.device_type(), c10_core::DeviceType::Sim);
}

#[test]
fn scripted_addresses_are_used_in_order_and_fall_back_to_first_fit() {
    let sim = SimDevice::address_only(0, 1 << 30);
    sim.script_malloc(0x7f00_0000_0000, 2 * MIB);
    sim.script_malloc(0x7f00_1000_0000, 20 * MIB);
    assert_eq!(sim.malloc(2 * MIB).unwrap(), 0x7f00_0000_0000);
    // A size that does not match the next scripted entry: first fit, script kept.
    let first_fit = sim.malloc(4 * MIB).unwrap();
    assert_ne!(first_fit, 0x7f00_1000_0000);
    assert_eq!(sim.malloc(20 * MIB).unwrap(), 0x7f00_1000_0000);
    // A scripted range that overlaps a live segment is not used.
    sim.script_malloc(0x7f00_0000_0000, 2 * MIB);
    let other = sim.malloc(2 * MIB).unwrap();
    assert_ne!(other, 0x7f00_0000_0000);
    assert_eq!(sim.clear_script(), 0);
}

#[test]
fn events_complete_under_test_control_and_on_synchronize() {
    let sim = SimDevice::address_only(0, 1 << 30);
    let s = sim.new_stream();
    let e1 = sim.create_event().unwrap();
    let e2 = sim.create_event().unwrap();
    sim.record_event(e1, s).unwrap();
    sim.record_event(e2, s).unwrap();
    assert_eq!(sim.pending_events(), 2);
    assert!(!sim.query_event(e1).unwrap());
    // Synchronizing on the second waits for the first too (stream order).
    sim.synchronize_event(e2).unwrap();
    assert!(sim.query_event(e1).unwrap() && sim.query_event(e2).unwrap());
    let e3 = sim.create_event().unwrap();
    sim.record_event(e3, StreamId::DEFAULT).unwrap();
    assert!(sim.complete_next(StreamId::DEFAULT));
    assert!(!sim.complete_next(StreamId::DEFAULT));
    assert!(sim.query_event(e3).unwrap());
    sim.destroy_event(e3);
    assert!(sim.query_event(e3).is_err());
}

#[test]
fn boxed_devices_of_different_types_run_one_front() {
    use std::sync::Arc;

    use c10_core::{Allocator as _, Device};
    use c10_cuda::{CachingAllocator, CappedDevice};

    // Two devices picked at run time: a plain simulated device and a capped one.
    let sim0 = SimDevice::host_backed(0, 64 * MIB);
    let sim1 = SimDevice::host_backed(1, 64 * MIB);
    let devices: Vec<Box<dyn DeviceMemory>> = vec![
        Box::new(sim0.clone()),
        Box::new(CappedDevice::new(sim1.clone(), 4 * MIB)),
    ];
    let front = Arc::new(CachingAllocator::new(devices, AllocatorConfig::default()).unwrap());
    // The provided `device_type` is forwarded: the boxes are still simulated devices.
    let a0 = front.allocator(0).unwrap();
    let a1 = front.allocator(1).unwrap();
    let d0 = a0.allocate(3000).unwrap();
    let d1 = a1.allocate(3000).unwrap();
    assert_eq!((d0.device(), d1.device()), (Device::sim(0), Device::sim(1)));
    assert_eq!(
        front.memory_stats(0).unwrap()["allocated_bytes.all.current"],
        3072
    );
    assert_eq!(sim0.used_bytes(), 2 * MIB);
    assert_eq!(sim1.used_bytes(), 2 * MIB);
    // The cap of the boxed CappedDevice holds: 3 MiB needs a 20 MiB large-pool segment, over
    // its 4 MiB; the uncapped device gives it (dropped at once, cached).
    assert!(a1.allocate(3 * MIB).is_err());
    assert!(a0.allocate(3 * MIB).is_ok());
    assert_eq!(sim0.used_bytes(), 22 * MIB);
    assert_eq!(sim1.used_bytes(), 2 * MIB);
    drop((d0, d1));
    front.empty_cache().unwrap();
    assert_eq!((sim0.used_bytes(), sim1.used_bytes()), (0, 0));
}

#[test]
fn an_arc_device_is_the_device_shared() {
    use std::sync::Arc;

    let sim = SimDevice::host_backed(3, 256 * MIB);
    let shared: Arc<SimDevice> = Arc::new(sim.clone());
    let config: AllocatorConfig = "expandable_segments:True".parse().unwrap();
    let mut alloc = DeviceCachingAllocator::new(Arc::clone(&shared), config).unwrap();
    // Expandable segments go through the forwarded virtual-memory calls.
    let a = alloc.malloc(30 * MIB, StreamId::DEFAULT).unwrap();
    assert_eq!(shared.mapped_pages().len(), 2);
    alloc.free(a.ptr).unwrap();
    alloc.empty_cache().unwrap();
    assert!(sim.mapped_pages().is_empty());
    alloc.check_invariants().unwrap();

    // Every call answers as the device's own, through Arc and through Box<dyn>.
    let boxed: Box<dyn DeviceMemory> = Box::new(sim.clone());
    for device in [&shared as &dyn DeviceMemory, &boxed] {
        assert_eq!(device.index(), 3);
        assert_eq!(device.device_type(), c10_core::DeviceType::Sim);
        assert!(device.supports_virtual_memory());
        assert_eq!(device.mem_get_info().unwrap(), sim.mem_get_info().unwrap());
        let seg = device.malloc(2 * MIB).unwrap();
        assert_eq!(sim.used_bytes(), 2 * MIB);
        device.free(seg, 2 * MIB).unwrap();
        let range = device.reserve_address_range(20 * MIB).unwrap();
        device.map(range, 20 * MIB).unwrap();
        assert_eq!(sim.used_bytes(), 20 * MIB);
        device.unmap(range, 20 * MIB).unwrap();
        device.release_address_range(range, 20 * MIB).unwrap();
        let stream = sim.new_stream();
        let event = device.create_event().unwrap();
        device.record_event(event, stream).unwrap();
        assert!(!device.query_event(event).unwrap());
        sim.complete_stream(stream);
        assert!(device.query_event(event).unwrap());
        device.synchronize_event(event).unwrap();
        device.destroy_event(event);
        assert!(device.query_event(event).is_err());
        assert_eq!(sim.used_bytes(), 0);
    }
}
