//! The pinned host caching allocator on a real GPU: `cuMemHostAlloc` and the
//! `cuMemHostRegister` path (with pre-faulting threads), event-gated reuse behind real stream
//! work, and copies from pinned blocks. Compiled only with `--features gpu-tests`
//! (`cargo xtask gpu-test`).

use std::sync::Arc;

use c10_cuda::CachingAllocator;
use c10_cuda::config::AllocatorConfig;
use c10_cuda::device::DeviceMemory;
use c10_cuda_driver::CudaPinnedMemory;
use c10_cuda_driver::{CudaDevice, probe};
use c10_host_alloc::host_allocator::{CachingHostAllocator, HostAllocatorConfig};

const MIB: usize = 1 << 20;

fn gpu() -> Arc<CachingAllocator<CudaDevice>> {
    let found = probe();
    assert!(
        found.is_available(),
        "GPU tests need a CUDA device: {found}"
    );
    Arc::new(
        CachingAllocator::new(
            vec![CudaDevice::new(0).unwrap()],
            AllocatorConfig::default(),
        )
        .unwrap(),
    )
}

fn host(
    front: &Arc<CachingAllocator<CudaDevice>>,
    config: HostAllocatorConfig,
) -> CachingHostAllocator<CudaPinnedMemory> {
    CachingHostAllocator::new(CudaPinnedMemory::new(Arc::clone(front), 0).unwrap(), config)
}

#[test]
fn gpu_pinned_blocks_copy_to_the_device_and_come_back_after_their_stream() {
    let front = gpu();
    let h = host(&front, HostAllocatorConfig::default());
    let a = h.malloc(3 * MIB + 1).unwrap();
    assert_eq!(h.block_size(a), Some(4 * MIB));
    // Fill the pinned block and copy it to the device from there.
    // SAFETY: `a` is an allocated pinned block of 4 MiB that only this test uses.
    let bytes = unsafe { std::slice::from_raw_parts_mut(a as *mut u8, 4 * MIB) };
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = (i % 253) as u8;
    }
    let dev = front.raw_alloc(0, 4 * MIB).unwrap();
    front
        .with_device(0, |d| d.device().copy_htod(dev, bytes))
        .unwrap()
        .unwrap();
    let mut back = vec![0u8; 4 * MIB];
    front
        .with_device(0, |d| d.device().copy_dtoh(&mut back, dev))
        .unwrap()
        .unwrap();
    assert!(back == *bytes);
    // Queue work on a stream, record it on the block, free it: it waits for the stream.
    let (stream, _) = front
        .with_device(0, |d| d.device().new_stream())
        .unwrap()
        .unwrap();
    front
        .with_device(0, |d| d.device().memset_d8_async(dev, 7, 4 * MIB, stream))
        .unwrap()
        .unwrap();
    assert!(h.record_event(a, stream));
    h.free(a).unwrap();
    h.check_invariants().unwrap();
    // Once the stream is done (an event synchronized after the work), the block is reused.
    front
        .with_device(0, |d| {
            let e = d.device().create_event()?;
            d.device().record_event(e, stream)?;
            d.device().synchronize_event(e)?;
            d.device().destroy_event(e);
            Ok::<(), c10_cuda::device::DeviceError>(())
        })
        .unwrap()
        .unwrap();
    assert_eq!(h.malloc(4 * MIB).unwrap(), a);
    h.check_invariants().unwrap();
    let stats = h.host_memory_stats();
    assert_eq!(stats["num_host_alloc"], 1);
    assert_eq!(stats["host_alloc_time.count"], 1);
    h.free(a).unwrap();
    h.empty_cache();
    assert_eq!(h.host_memory_stats()["num_host_free"], 1);
    front.raw_delete(dev).unwrap();
}

#[test]
fn gpu_pinned_host_register_path_with_threads() {
    let front = gpu();
    let config: AllocatorConfig =
        "pinned_use_cuda_host_register:True,pinned_num_register_threads:8"
            .parse()
            .unwrap();
    let h = host(&front, HostAllocatorConfig::from_alloc_config(&config));
    let a = h.malloc(16 * MIB).unwrap();
    // SAFETY: as above; the block is 16 MiB of registered, zero-filled host memory.
    let bytes = unsafe { std::slice::from_raw_parts(a as *const u8, 16 * MIB) };
    assert!(bytes.iter().all(|&b| b == 0));
    let dev = front.raw_alloc(0, 16 * MIB).unwrap();
    front
        .with_device(0, |d| d.device().copy_htod(dev, bytes))
        .unwrap()
        .unwrap();
    h.free(a).unwrap();
    h.empty_cache();
    let stats = h.host_memory_stats();
    assert_eq!((stats["num_host_alloc"], stats["num_host_free"]), (1, 1));
    front.raw_delete(dev).unwrap();
}
