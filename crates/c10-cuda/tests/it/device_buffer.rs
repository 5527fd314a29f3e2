//! `DeviceBuffer`, the RAII block handle, on the simulated device: drop returns the block,
//! `record_stream` keeps it out of the cache until the other stream's work completes (PyTorch's
//! `recordStream` rule), `into_raw`/`from_raw` hand ownership over, zero bytes own nothing, and
//! an out-of-memory request comes back as an error with the allocator still usable.

use std::sync::Arc;

use c10_cuda::config::{AllocatorConfig, MIB};
use c10_cuda::device::StreamId;
use c10_cuda::stats::StatType;
use c10_cuda::{CachingAllocator, DeviceBuffer, Error, SimDevice};

const S0: StreamId = StreamId::DEFAULT;

fn front(capacity: usize) -> (SimDevice, Arc<CachingAllocator<SimDevice>>) {
    let dev = SimDevice::address_only(0, capacity).with_auto_complete(false);
    let front = CachingAllocator::new(vec![dev.clone()], AllocatorConfig::default()).unwrap();
    (dev, Arc::new(front))
}

/// (allocated bytes now, blocks handed out now) of device 0.
fn allocated(front: &CachingAllocator<SimDevice>) -> (i64, i64) {
    let stats = front.device_stats(0).unwrap();
    let all = StatType::Aggregate as usize;
    (
        stats.allocated_bytes[all].current,
        stats.allocation[all].current,
    )
}

#[test]
fn drop_returns_the_block_to_the_cache() {
    let (dev, front) = front(64 * MIB);
    let buf = DeviceBuffer::new(&front, 0, 1000, S0).unwrap();
    assert_eq!(buf.size(), 1000);
    assert_eq!((buf.device(), buf.stream()), (0, S0));
    assert_ne!(buf.ptr(), 0);
    // 1000 bytes are a 1024-byte block (round_size to 512) of a 2 MiB small-pool segment.
    assert_eq!(allocated(&front), (1024, 1));
    let ptr = buf.ptr();
    drop(buf);
    assert_eq!(allocated(&front), (0, 0));
    // Cached, not released: the next request of the same size gets the same block.
    assert_eq!(dev.live_segments().len(), 1);
    let again = DeviceBuffer::new(&front, 0, 1000, S0).unwrap();
    assert_eq!(again.ptr(), ptr);
}

#[test]
fn a_recorded_stream_keeps_the_block_until_its_work_completes() {
    let (dev, front) = front(64 * MIB);
    let side = dev.new_stream();
    let buf = DeviceBuffer::new(&front, 0, 4 * MIB, S0).unwrap();
    let ptr = buf.ptr();
    buf.record_stream(side).unwrap();
    // Recording the allocation stream itself adds nothing.
    buf.record_stream(S0).unwrap();
    drop(buf);
    // The user's bytes are freed at once; the block waits for the event on `side`.
    assert_eq!(allocated(&front), (0, 0));
    let other = DeviceBuffer::new(&front, 0, 4 * MIB, S0).unwrap();
    assert_ne!(
        other.ptr(),
        ptr,
        "the block was reused before `side` finished"
    );
    drop(other);
    dev.complete_stream(side);
    let reused = DeviceBuffer::new(&front, 0, 4 * MIB, S0).unwrap();
    // Both 4 MiB blocks are cached now; best fit picks the lower address, the first block.
    assert_eq!(reused.ptr(), ptr);
}

#[test]
fn into_raw_and_from_raw_move_ownership() {
    let (_dev, front) = front(64 * MIB);
    let buf = DeviceBuffer::new(&front, 0, 3 * MIB, S0).unwrap();
    let ptr = buf.into_raw();
    // Not freed by into_raw.
    assert_eq!(allocated(&front).1, 1);
    // SAFETY: `ptr` is a live 3 MiB block of `front` on device 0 for S0, owned by nothing else.
    let back = unsafe { DeviceBuffer::from_raw(&front, ptr, 3 * MIB, 0, S0) };
    assert_eq!(back.ptr(), ptr);
    drop(back);
    assert_eq!(allocated(&front), (0, 0));
    // Freed exactly once: a second raw free is refused.
    assert!(matches!(
        front.raw_delete(ptr),
        Err(Error::UnknownPointer { ptr: p }) if p == ptr
    ));
}

#[test]
fn zero_bytes_own_nothing() {
    let (dev, front) = front(64 * MIB);
    let buf = DeviceBuffer::new(&front, 0, 0, S0).unwrap();
    assert!(buf.is_empty());
    assert_eq!(buf.ptr(), 0);
    buf.record_stream(dev.new_stream()).unwrap();
    drop(buf);
    assert_eq!(allocated(&front), (0, 0));
    assert!(dev.live_segments().is_empty());
}

#[test]
fn out_of_memory_is_an_error_and_the_allocator_stays_usable() {
    let (_dev, front) = front(64 * MIB);
    let held = DeviceBuffer::new(&front, 0, 40 * MIB, S0).unwrap();
    match DeviceBuffer::new(&front, 0, 40 * MIB, S0) {
        Err(Error::OutOfMemory(oom)) => assert_eq!(oom.requested, 40 * MIB as u64),
        other => panic!("expected out of memory, got {other:?}"),
    }
    drop(held);
    let ok = DeviceBuffer::new(&front, 0, 40 * MIB, S0).unwrap();
    assert_eq!(ok.size(), 40 * MIB);
}

#[test]
fn an_unknown_device_is_refused() {
    let (_dev, front) = front(64 * MIB);
    assert!(matches!(
        DeviceBuffer::new(&front, 3, 1000, S0),
        Err(Error::InvalidDevice {
            device: 3,
            count: 1
        })
    ));
}

#[test]
fn debug_shows_the_block() {
    let (_dev, front) = front(64 * MIB);
    let buf = DeviceBuffer::new(&front, 0, 512, S0).unwrap();
    assert_eq!(
        format!("{buf:?}"),
        format!(
            "DeviceBuffer {{ ptr: {:#x}, size: 512, device: 0, stream: StreamId(0) }}",
            buf.ptr()
        )
    );
}
