//! `CudaDevice` against a real GPU. Compiled only with `--features gpu-tests`
//! (`cargo xtask gpu-test`, or `cargo test -p c10-cuda-driver --features gpu-tests --test gpu`).
//!
//! Every test first asserts that the probe finds a device: on a machine without one these tests
//! fail loudly instead of passing by skipping.

use c10_cuda::device::{DeviceError, DeviceMemory, StreamId};
use c10_cuda_driver::{CudaDevice, probe};

const MIB: usize = 1 << 20;
const GIB: usize = 1 << 30;

/// Asserts that a CUDA device is usable and opens `cuda:0`.
fn gpu() -> CudaDevice {
    let found = probe();
    assert!(
        found.is_available(),
        "GPU tests need a CUDA device: {found}"
    );
    CudaDevice::new(0).expect("open cuda:0")
}

/// `len` bytes of a non-repeating-looking pattern.
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i.wrapping_mul(31) % 251) as u8).collect()
}

#[test]
fn malloc_free_round_trip_and_mem_get_info() {
    let device = gpu();
    let size = 64 * MIB;
    let before = device.mem_get_info().expect("cuMemGetInfo");
    assert!(
        before.free <= before.total && before.total > 0,
        "{before:?}"
    );

    let ptr = device.malloc(size).expect("cuMemAlloc 64 MiB");
    assert_ne!(ptr, 0);
    assert_eq!(
        ptr % 512,
        0,
        "segments are at least 512-byte aligned: {ptr:#x}"
    );
    let during = device.mem_get_info().expect("cuMemGetInfo");
    assert!(
        before.free - during.free >= size,
        "free memory drops by the segment: before {before:?}, during {during:?}"
    );

    assert!(matches!(
        device.free(ptr, size + 1),
        Err(DeviceError::Invalid { .. })
    ));
    assert!(matches!(
        device.free(ptr + 512, size),
        Err(DeviceError::Invalid { .. })
    ));
    device.free(ptr, size).expect("cuMemFree");
    let after = device.mem_get_info().expect("cuMemGetInfo");
    assert!(
        after.free >= during.free + size,
        "during {during:?}, after {after:?}"
    );
    assert!(
        matches!(device.free(ptr, size), Err(DeviceError::Invalid { .. })),
        "a double free is refused before it reaches the driver"
    );
    assert!(matches!(device.malloc(0), Err(DeviceError::Invalid { .. })));
}

#[test]
fn out_of_memory_is_mapped_and_not_sticky() {
    let device = gpu();
    let total = device.mem_get_info().expect("cuMemGetInfo").total;
    let size = total + GIB;
    assert_eq!(device.malloc(size), Err(DeviceError::OutOfMemory { size }));
    // The context is still usable afterwards.
    let ptr = device
        .malloc(2 * MIB)
        .expect("a small allocation after an OOM");
    device.free(ptr, 2 * MIB).expect("cuMemFree");
}

#[test]
fn events_on_a_new_stream() {
    let device = gpu();
    let (stream, _handle) = device.new_stream().expect("cuStreamCreate");
    assert_ne!(stream, StreamId::DEFAULT);
    let size = 64 * MIB;
    let ptr = device.malloc(size).expect("cuMemAlloc");

    let event = device.create_event().expect("cuEventCreate");
    assert!(
        device.query_event(event).expect("cuEventQuery"),
        "a fresh event is complete"
    );
    device
        .memset_d8_async(ptr, 0x5a, size, stream)
        .expect("cuMemsetD8Async");
    device.record_event(event, stream).expect("cuEventRecord");
    device.synchronize_event(event).expect("cuEventSynchronize");
    assert!(device.query_event(event).expect("cuEventQuery"));
    let mut back = vec![0u8; size];
    device.copy_dtoh(&mut back, ptr).expect("cuMemcpyDtoH");
    assert!(
        back.iter().all(|&b| b == 0x5a),
        "the memset ran before the event completed"
    );

    // The legacy default stream works too; unknown streams and events are refused.
    device
        .record_event(event, StreamId::DEFAULT)
        .expect("record on stream 0");
    device.synchronize_event(event).expect("cuEventSynchronize");
    assert!(matches!(
        device.record_event(event, StreamId(0xdead_0000)),
        Err(DeviceError::Invalid { what: "stream", .. })
    ));
    device.destroy_event(event);
    device.destroy_event(event); // ignored
    assert!(matches!(
        device.query_event(event),
        Err(DeviceError::Invalid { .. })
    ));

    device.destroy_stream(stream).expect("cuStreamDestroy");
    assert!(device.destroy_stream(stream).is_err());
    assert!(device.destroy_stream(StreamId::DEFAULT).is_err());
    device.free(ptr, size).expect("cuMemFree");
}

/// A stream made outside the device (as PyTorch's, through the C ABI) is refused until
/// `accept_external_streams`, then events record on it.
#[test]
fn events_on_an_external_stream() {
    let device = gpu();
    let foreign = device.context().new_stream().expect("cuStreamCreate");
    let id = StreamId(foreign.cu_stream() as usize as u64);
    let event = device.create_event().expect("cuEventCreate");
    assert!(matches!(
        device.record_event(event, id),
        Err(DeviceError::Invalid { what: "stream", .. })
    ));
    // SAFETY: `foreign` is a live stream of this device's primary context and outlives the
    // event (destroyed below).
    unsafe { device.accept_external_streams() };
    device
        .record_event(event, id)
        .expect("cuEventRecord on the external stream");
    device.synchronize_event(event).expect("cuEventSynchronize");
    assert!(device.query_event(event).expect("cuEventQuery"));
    device.destroy_event(event);
    drop(foreign);
}

#[test]
fn virtual_memory_reserve_map_copy_unmap_release() {
    let device = gpu();
    if !device.supports_virtual_memory() {
        println!(
            "SKIPPED: cuda:0 does not support virtual memory management (no expandable segments)"
        );
        return;
    }
    let granularity = device
        .allocation_granularity()
        .expect("granularity with VMM");
    let page = 2 * MIB;
    assert_eq!(
        page % granularity,
        0,
        "2 MiB pages on a granularity of {granularity} bytes"
    );

    let base = device
        .reserve_address_range(2 * page)
        .expect("cuMemAddressReserve");
    let before = device.mem_get_info().expect("cuMemGetInfo");
    device.map(base, page).expect("map the first page");
    device
        .map(base + page as u64, page)
        .expect("map the second page");
    assert!(
        matches!(device.map(base, page), Err(DeviceError::Invalid { .. })),
        "already mapped"
    );
    if granularity > 1 {
        assert!(matches!(
            device.map(base, granularity + 1),
            Err(DeviceError::Invalid { .. })
        ));
    }
    let mapped = device.mem_get_info().expect("cuMemGetInfo");
    assert!(
        before.free - mapped.free >= 2 * page,
        "before {before:?}, mapped {mapped:?}"
    );

    // One copy across both pages, there and back.
    let data = pattern(2 * page);
    device
        .copy_htod(base, &data)
        .expect("cuMemcpyHtoD into mapped pages");
    let mut back = vec![0u8; 2 * page];
    device
        .copy_dtoh(&mut back, base)
        .expect("cuMemcpyDtoH from mapped pages");
    assert!(
        back == data,
        "the bytes survive a round trip through the mapped range"
    );

    assert!(
        matches!(
            device.release_address_range(base, 2 * page),
            Err(DeviceError::Invalid { .. })
        ),
        "a range with mapped pages cannot be released"
    );
    device
        .unmap(base + page as u64, page)
        .expect("unmap the second page");
    assert!(
        matches!(
            device.copy_htod(base, &data),
            Err(DeviceError::Invalid { .. })
        ),
        "copies into an unmapped page are refused"
    );
    device.unmap(base, page).expect("unmap the first page");
    assert!(matches!(
        device.unmap(base, page),
        Err(DeviceError::Invalid { .. })
    ));
    device
        .release_address_range(base, 2 * page)
        .expect("cuMemAddressFree");
    assert!(matches!(
        device.release_address_range(base, 2 * page),
        Err(DeviceError::Invalid { .. })
    ));
}

#[test]
fn copy_round_trip_of_one_mib() {
    let device = gpu();
    let size = MIB;
    let ptr = device.malloc(size).expect("cuMemAlloc");
    let data = pattern(size);
    device.copy_htod(ptr, &data).expect("cuMemcpyHtoD");
    let mut back = vec![0u8; size];
    device.copy_dtoh(&mut back, ptr).expect("cuMemcpyDtoH");
    assert!(
        back == data,
        "1 MiB survives a host -> device -> host round trip"
    );

    device
        .memset_d8(ptr + 4096, 0xab, 4096)
        .expect("cuMemsetD8");
    device.copy_dtoh(&mut back, ptr).expect("cuMemcpyDtoH");
    assert!(back[..4096] == data[..4096]);
    assert!(back[4096..8192].iter().all(|&b| b == 0xab));
    assert!(back[8192..] == data[8192..]);

    // Ranges outside the segment never reach the driver.
    assert!(matches!(
        device.copy_htod(ptr + 1, &data),
        Err(DeviceError::Invalid { .. })
    ));
    assert!(matches!(
        device.copy_dtoh(&mut back, 0x1000),
        Err(DeviceError::Invalid { .. })
    ));
    device.free(ptr, size).expect("cuMemFree");
    assert!(matches!(
        device.memset_d8(ptr, 0, 1),
        Err(DeviceError::Invalid { .. })
    ));
}

#[test]
fn a_capped_gpu_holds_reserved_bytes_under_the_limit_and_reports_misses() {
    use c10_cuda::config::AllocatorConfig;
    use c10_cuda::{CappedDevice, DeviceCachingAllocator, MallocOutcome};
    for conf in ["", "expandable_segments:True"] {
        let device = CappedDevice::new(gpu(), 64 * MIB);
        assert_eq!(device.mem_get_info().expect("cuMemGetInfo").total, 64 * MIB);
        let config: AllocatorConfig = conf.parse().expect("config");
        let mut a = DeviceCachingAllocator::new(device, config).expect("allocator");
        let x = a.malloc(40 * MIB, StreamId::DEFAULT).expect("40 MiB fit");
        a.set_block_tag(x.ptr, 7).expect("allocated");
        let m = match a
            .try_malloc(40 * MIB, StreamId::DEFAULT)
            .expect("no driver error")
        {
            MallocOutcome::Miss(m) => m,
            MallocOutcome::Allocated(got) => panic!("{conf}: 80 MiB on a 64 MiB cap: {got:?}"),
        };
        assert!(a.reserved_bytes() <= 64 * MIB, "{conf}");
        let plan = a
            .plan_room(&m, Default::default(), |t| (t == 7).then_some(1.0))
            .expect("freeing the first block makes room");
        assert_eq!(plan.tags, [7], "{conf}");
        a.free(x.ptr).expect("free");
        let y = a
            .try_malloc(40 * MIB, StreamId::DEFAULT)
            .expect("no driver error");
        let y = y.allocation().expect("served after the plan");
        assert!(a.reserved_bytes() <= 64 * MIB, "{conf}");
        a.free(y.ptr).expect("free");
        a.empty_cache().expect("empty_cache");
        assert_eq!(a.device().used(), 0, "{conf}");
    }
}
