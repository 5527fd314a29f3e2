//! `MemPool` and `PoolGuard`, the RAII forms of `torch.cuda.MemPool` and `use_mem_pool`, on the
//! front over the simulated device: use counts 1 / 2 / 1 / gone as PyTorch's, allocations of the
//! calling thread routed only while the guard lives, and every segment back to the device once
//! the handles drop (the raw calls with one missing `release_pool` kept 40 MiB reserved).

use std::sync::Arc;

use c10_cuda::config::{AllocatorConfig, MIB};
use c10_cuda::device::StreamId;
use c10_cuda::stats::StatType;
use c10_cuda::{
    CachingAllocator, DeviceBuffer, Error, MemPool, MempoolId, PoolError, SimDevice, StreamFilter,
};

const S0: StreamId = StreamId::DEFAULT;

fn front() -> Arc<CachingAllocator<SimDevice>> {
    let dev = SimDevice::address_only(0, 1 << 30);
    Arc::new(CachingAllocator::new(vec![dev], AllocatorConfig::default()).unwrap())
}

fn reserved(front: &CachingAllocator<SimDevice>) -> i64 {
    front.device_stats(0).unwrap().reserved_bytes[StatType::Aggregate as usize].current
}

fn pool_of(
    front: &CachingAllocator<SimDevice>,
    buf: &DeviceBuffer<SimDevice>,
) -> Option<MempoolId> {
    front
        .with_device(0, |a| a.block_pool_id(buf.ptr()))
        .unwrap()
}

#[test]
fn use_counts_and_routing_follow_the_handles() {
    let front = front();
    let pool = MemPool::new(&front, 0).unwrap();
    assert_eq!(pool.use_count().unwrap(), 1);
    let before = DeviceBuffer::new(&front, 0, 20 * MIB, S0).unwrap();
    {
        let guard = pool.use_pool().unwrap();
        assert_eq!(guard.pool().use_count().unwrap(), 2);
        let inside = DeviceBuffer::new(&front, 0, 20 * MIB, S0).unwrap();
        assert_eq!(pool_of(&front, &inside), Some(pool.id()));
        // Another thread's allocations are not routed (the filter is the calling thread's).
        let other = std::thread::scope(|s| {
            s.spawn(|| {
                let b = DeviceBuffer::new(&front, 0, 20 * MIB, S0).unwrap();
                pool_of(&front, &b)
            })
            .join()
            .unwrap()
        });
        assert_eq!(other, None);
    }
    assert_eq!(pool.use_count().unwrap(), 1);
    let after = DeviceBuffer::new(&front, 0, 20 * MIB, S0).unwrap();
    assert_eq!(pool_of(&front, &before), None);
    assert_eq!(pool_of(&front, &after), None);
    assert!(
        front
            .with_device(0, |a| a.begun_pools())
            .unwrap()
            .is_empty()
    );
}

#[test]
fn dropping_the_handles_gives_every_segment_back() {
    let front = front();
    {
        let pool = MemPool::new(&front, 0).unwrap();
        let _guard = pool.use_pool().unwrap();
        let a = DeviceBuffer::new(&front, 0, 20 * MIB, S0).unwrap();
        let b = DeviceBuffer::new(&front, 0, 20 * MIB, S0).unwrap();
        assert_eq!(reserved(&front), 40 * MIB as i64);
        drop((a, b));
        // The guard drops here, then the pool (reverse order of declaration).
    }
    // ~MemPool released the last user and emptied the pool: nothing stays reserved.
    assert_eq!(reserved(&front), 0);
    assert!(
        front
            .with_device(0, |a| a.private_pools())
            .unwrap()
            .is_empty()
    );
}

#[test]
fn blocks_outliving_the_pool_stay_valid_and_go_back_with_empty_cache() {
    let front = front();
    let pool = MemPool::new(&front, 0).unwrap();
    let id = pool.id();
    let guard = pool.use_pool().unwrap();
    let kept = DeviceBuffer::new(&front, 0, 4 * MIB, S0).unwrap();
    guard.finish().unwrap();
    drop(pool);
    // The pool's segment is still there for the live block.
    assert_eq!(pool_of(&front, &kept), Some(id));
    assert_eq!(reserved(&front), 20 * MIB as i64);
    drop(kept);
    front.empty_cache().unwrap();
    assert_eq!(reserved(&front), 0);
}

#[test]
fn refusals_leak_no_user() {
    let front = front();
    assert!(matches!(
        MemPool::with_id(&front, 0, MempoolId::DEFAULT),
        Err(Error::Pool(PoolError::DefaultId))
    ));
    assert!(matches!(
        MemPool::new(&front, 5),
        Err(Error::InvalidDevice { device: 5, .. })
    ));
    let pool = MemPool::new(&front, 0).unwrap();
    let guard = pool.use_pool_with(StreamFilter::All).unwrap();
    // Using a pool that is in use already is refused, and the count is unchanged.
    assert!(matches!(
        pool.use_pool(),
        Err(Error::Pool(PoolError::AlreadyRecording { .. }))
    ));
    assert_eq!(pool.use_count().unwrap(), 2);
    drop(guard);
    assert_eq!(pool.use_count().unwrap(), 1);
    // A second handle of the same id is one more user.
    let again = MemPool::with_id(&front, 0, pool.id()).unwrap();
    assert_eq!(pool.use_count().unwrap(), 2);
    drop(again);
    assert_eq!(pool.use_count().unwrap(), 1);
}

#[test]
fn ids_are_fresh_per_pool() {
    let front = front();
    let a = MemPool::new(&front, 0).unwrap();
    let b = MemPool::new(&front, 0).unwrap();
    assert_ne!(a.id(), b.id());
    assert_eq!((a.id().first, b.id().first), (0, 0));
    assert_eq!(
        format!("{a:?}"),
        format!("MemPool {{ device: 0, id: {:?} }}", a.id())
    );
}
