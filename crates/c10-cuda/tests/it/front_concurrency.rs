//! The thread-safe front (`CachingAllocator`): eight threads allocating and freeing on two
//! devices, DataPtrs dropped on other threads, free-memory callbacks that re-enter the
//! allocator, and pointer errors (unknown pointer, double free) with two devices and with one.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::Duration;

use c10_core::{Allocator, DataPtr};
use c10_cuda::config::{AllocatorConfig, MIB};
use c10_cuda::device::{DevicePtr, StreamId};
use c10_cuda::stats::StatType;
use c10_cuda::{CachingAllocator, Error, SimDevice};

const THREADS: usize = 8;
const ITERATIONS: usize = 4000;

fn front(capacity: usize, conf: &str) -> (Vec<SimDevice>, Arc<CachingAllocator<SimDevice>>) {
    let devs = vec![
        SimDevice::address_only(0, capacity),
        SimDevice::address_only(1, capacity),
    ];
    let config = AllocatorConfig::parse(conf).unwrap();
    let front = CachingAllocator::new(devs.clone(), config).unwrap();
    (devs, Arc::new(front))
}

fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

/// Runs `f` on a helper thread and fails (instead of hanging) if it does not finish in time.
fn within(secs: u64, f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = mpsc::channel();
    let h = thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(()) => h.join().unwrap(),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            // The closure panicked: surface its panic.
            h.join().unwrap();
        }
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("deadlock: not done in {secs} s"),
    }
}

fn stress(conf: &'static str) {
    let (devs, front) = front(2 << 30, conf);
    // One stream per thread and device, created up front.
    let streams: Vec<[StreamId; 2]> = (0..THREADS)
        .map(|_| [devs[0].new_stream(), devs[1].new_stream()])
        .collect();
    let start = Arc::new(Barrier::new(THREADS));
    let barrier = Arc::new(Barrier::new(THREADS));
    let made = Arc::new(AtomicUsize::new(0));
    let dropped = Arc::new(AtomicUsize::new(0));
    let (senders, receivers): (Vec<_>, Vec<_>) =
        (0..THREADS).map(|_| mpsc::channel::<DataPtr>()).unzip();
    let mut handles = Vec::new();
    for (t, rx) in receivers.into_iter().enumerate() {
        let front = Arc::clone(&front);
        let devs = devs.clone();
        let my_streams = streams[t];
        let other_streams = streams[(t + 3) % THREADS];
        let tx = senders[(t + 1) % THREADS].clone();
        let barrier = Arc::clone(&barrier);
        let start = Arc::clone(&start);
        let (made, dropped) = (Arc::clone(&made), Arc::clone(&dropped));
        handles.push(thread::spawn(move || {
            let mut rng = xorshift(t as u64 + 1);
            let alloc0 = front.allocator(0).unwrap();
            let mut live: Vec<(DevicePtr, usize)> = Vec::new();
            start.wait();
            for _ in 0..ITERATIONS {
                let r = rng();
                match r % 16 {
                    0..=6 => {
                        let device = (r >> 8) as usize % 2;
                        let size = match (r >> 16) % 4 {
                            0 | 1 => (r >> 24) as usize % MIB,
                            2 => MIB + (r >> 24) as usize % (19 * MIB),
                            _ => 20 * MIB + (r >> 24) as usize % (44 * MIB),
                        };
                        let stream = if r & 0x80 == 0 {
                            StreamId::DEFAULT
                        } else {
                            my_streams[device]
                        };
                        match front.raw_alloc_with_stream(device as u8, size, stream) {
                            Ok(0) => assert_eq!(size, 0),
                            Ok(p) => live.push((p, device)),
                            Err(Error::OutOfMemory(_)) => {}
                            Err(e) => panic!("thread {t}: {e}"),
                        }
                    }
                    7..=11 if !live.is_empty() => {
                        let (p, _) = live.swap_remove((r >> 8) as usize % live.len());
                        front.raw_delete(p).unwrap();
                    }
                    12 if !live.is_empty() => {
                        // Use the block on another thread's stream, then free it: pending.
                        let (p, device) = live.swap_remove((r >> 8) as usize % live.len());
                        front.record_stream(p, other_streams[device]).unwrap();
                        front.raw_delete(p).unwrap();
                    }
                    13 => {
                        let n = (r >> 8) as usize % (3 * MIB);
                        let ptr = alloc0.allocate(n);
                        if let Ok(ptr) = ptr {
                            made.fetch_add(1, Ordering::Relaxed);
                            tx.send(ptr).unwrap();
                        }
                    }
                    14 => devs[(r >> 8) as usize % 2].complete_all(),
                    15 if r % 5 == 0 => front.empty_cache().unwrap(),
                    _ => {
                        while let Ok(ptr) = rx.try_recv() {
                            drop(ptr);
                            dropped.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }
            for (p, _) in live {
                front.raw_delete(p).unwrap();
            }
            barrier.wait();
            // Every send happened before the barrier: drain what is left.
            drop(tx);
            while let Ok(ptr) = rx.try_recv() {
                drop(ptr);
                dropped.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    drop(senders);
    for h in handles {
        h.join().unwrap();
    }
    assert!(made.load(Ordering::Relaxed) > 0);
    assert_eq!(
        made.load(Ordering::Relaxed),
        dropped.load(Ordering::Relaxed)
    );
    for d in &devs {
        d.complete_all();
    }
    front.empty_cache().unwrap();
    for (i, dev) in devs.iter().enumerate() {
        let i = i as u8;
        let stats = front.memory_stats(i).unwrap();
        for key in [
            "allocation.all.current",
            "active.all.current",
            "allocated_bytes.all.current",
            "requested_bytes.all.current",
            "reserved_bytes.all.current",
            "segment.all.current",
        ] {
            assert_eq!(stats[key], 0, "device {i}: {key}");
        }
        assert!(stats["allocation.all.allocated"] > 1000, "device {i}");
        front
            .with_device(i, |d| d.check_invariants())
            .unwrap()
            .unwrap();
        assert_eq!(dev.used_bytes(), 0);
        assert_eq!(dev.pending_events(), 0);
    }
}

#[test]
fn eight_threads_two_devices() {
    within(120, || stress(""));
}

#[test]
fn eight_threads_two_devices_expandable() {
    within(120, || {
        stress("expandable_segments:True,max_split_size_mb:64")
    });
}

/// A callback that frees a held block through the front (taking the device lock itself) runs
/// on a miss, without the lock held, and the search after it finds the freed block: no new
/// segment. A cache hit does not run callbacks.
#[test]
fn free_memory_callback_frees_a_held_block() {
    within(30, || {
        let dev = SimDevice::address_only(0, 12 * MIB);
        let front =
            Arc::new(CachingAllocator::new(vec![dev.clone()], AllocatorConfig::default()).unwrap());
        let held = front.raw_alloc(0, 12 * MIB).unwrap();
        let slot = Arc::new(Mutex::new(Some(held)));
        let calls = Arc::new(AtomicUsize::new(0));
        {
            let weak = Arc::downgrade(&front);
            let (slot, calls) = (Arc::clone(&slot), Arc::clone(&calls));
            front.register_free_memory_callback(Arc::new(move || {
                calls.fetch_add(1, Ordering::SeqCst);
                let Some(front) = weak.upgrade() else {
                    return false;
                };
                match slot.lock().unwrap().take() {
                    Some(p) => {
                        front.raw_delete(p).unwrap();
                        true
                    }
                    None => false,
                }
            }));
        }
        // Miss (the only segment is in use): the callback frees `held`, the search finds it.
        let p = front.raw_alloc(0, 12 * MIB).unwrap();
        assert_eq!(p, held);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(dev.counters().mallocs, 1);
        let stats = front.device_stats(0).unwrap();
        assert_eq!((stats.num_device_alloc, stats.num_alloc_retries), (1, 0));
        // A hit does not call the callbacks.
        front.raw_delete(p).unwrap();
        let q = front.raw_alloc(0, 12 * MIB).unwrap();
        assert_eq!(q, held);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        // A miss whose callback frees nothing goes on to the device (full here): OOM.
        assert!(matches!(
            front.raw_alloc(0, 4 * MIB),
            Err(Error::OutOfMemory(_))
        ));
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        front.raw_delete(q).unwrap();
        front
            .with_device(0, |d| d.check_invariants())
            .unwrap()
            .unwrap();
    });
}

/// The front's pointer errors on `device` of a front with `count` devices: unknown pointers,
/// a double free and a freed pointer's `record_stream` are `UnknownPointer`, a device past the
/// last is `InvalidDevice`.
fn assert_pointer_errors(front: &CachingAllocator<SimDevice>, device: u8, count: usize) {
    let p = front.raw_alloc(device, 4096).unwrap();
    assert_eq!(front.get_base_allocation(p).unwrap(), (p, 2 * MIB));
    assert!(matches!(
        front.raw_delete(p + 512),
        Err(Error::UnknownPointer { ptr }) if ptr == p + 512
    ));
    assert!(matches!(
        front.raw_delete(0xdead_0000),
        Err(Error::UnknownPointer { ptr: 0xdead_0000 })
    ));
    assert!(matches!(
        front.get_base_allocation(0xdead_0000),
        Err(Error::UnknownPointer { ptr: 0xdead_0000 })
    ));
    front.record_stream(p, StreamId(1)).unwrap();
    front.raw_delete(p).unwrap();
    assert!(matches!(
        front.raw_delete(p),
        Err(Error::UnknownPointer { ptr }) if ptr == p
    ));
    assert!(matches!(
        front.record_stream(p, StreamId(1)),
        Err(Error::UnknownPointer { .. })
    ));
    let past = count as u8;
    assert!(matches!(
        front.raw_alloc(past, 16),
        Err(Error::InvalidDevice { device, count: c }) if device == past && c == count
    ));
}

#[test]
fn pointer_errors() {
    let (_devs, front) = front(1 << 30, "");
    assert_pointer_errors(&front, 1, 2);
    // The null pointer is ignored; zero bytes give it.
    assert_eq!(front.raw_alloc(0, 0).unwrap(), 0);
    front.raw_delete(0).unwrap();
    assert!(front.allocator(2).is_err());
    // The device allocator underneath refuses a double free the same way.
    front
        .with_device(1, |d| {
            let a = d.malloc(4096, StreamId::DEFAULT).unwrap();
            d.free(a.ptr).unwrap();
            assert!(matches!(
                d.free(a.ptr),
                Err(Error::InvalidPointer { device: 1, .. })
            ));
            d.check_invariants().unwrap();
        })
        .unwrap();
    let stats = front.memory_stats(1).unwrap();
    assert_eq!(stats["allocation.all.current"], 0);
}

/// DataPtrs from `allocator(0)` return their block when dropped, on any thread.
#[test]
fn data_ptr_drop_frees_on_another_thread() {
    let (_devs, front) = front(1 << 30, "");
    let alloc = front.allocator(0).unwrap();
    let ptrs: Vec<DataPtr> = (1..=64)
        .map(|i| alloc.allocate(i * 1000).unwrap())
        .collect();
    assert_eq!(front.memory_stats(0).unwrap()["allocation.all.current"], 64);
    thread::spawn(move || drop(ptrs)).join().unwrap();
    assert_eq!(front.memory_stats(0).unwrap()["allocation.all.current"], 0);
    assert!(alloc.allocate(0).unwrap().get().is_null());
}

/// With one device the front keeps no pointer-to-device map (the device allocator's own map
/// answers); the errors are the same as with several devices.
#[test]
fn pointer_errors_with_one_device() {
    let dev = SimDevice::address_only(0, 1 << 30);
    let front = CachingAllocator::new(vec![dev], AllocatorConfig::default()).unwrap();
    assert_pointer_errors(&front, 0, 1);
    let stats = front.memory_stats(0).unwrap();
    assert_eq!(stats["allocation.all.current"], 0);
}

/// Devices are named by their own index, in any order and with gaps (`cuda:5` and `cuda:2`).
#[test]
fn devices_are_named_by_their_own_index() {
    let devices = vec![
        SimDevice::address_only(5, 1 << 30),
        SimDevice::address_only(2, 1 << 30),
    ];
    let front = CachingAllocator::new(devices, AllocatorConfig::default()).unwrap();
    assert_eq!(front.device_indices(), vec![5, 2]);
    assert!(front.has_device(2) && front.has_device(5) && !front.has_device(0));
    let a = front.raw_alloc(5, 4096).unwrap();
    let b = front.raw_alloc(2, 4096).unwrap();
    let on = |d: u8| {
        front.device_stats(d).unwrap().allocated_bytes[StatType::Aggregate as usize].current
    };
    assert_eq!((on(5), on(2)), (4096, 4096));
    let snapshot = front.snapshot();
    assert_eq!(
        snapshot.iter().map(|s| s.device).collect::<Vec<_>>(),
        vec![5, 2]
    );
    front.raw_delete(a).unwrap();
    front.raw_delete(b).unwrap();
    assert_eq!((on(5), on(2)), (0, 0));
    assert!(matches!(
        front.raw_alloc(0, 16),
        Err(Error::InvalidDevice {
            device: 0,
            count: 2
        })
    ));
    // Two devices with one index are refused.
    let twice = vec![
        SimDevice::address_only(1, 1 << 30),
        SimDevice::address_only(1, 1 << 30),
    ];
    assert!(matches!(
        CachingAllocator::new(twice, AllocatorConfig::default()),
        Err(Error::InvalidDevice {
            device: 1,
            count: 2
        })
    ));
}
