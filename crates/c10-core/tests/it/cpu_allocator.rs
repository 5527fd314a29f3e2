//! `CpuAllocator`: 64-byte alignment, zero-size and huge allocations, zero fill, the live-byte
//! counter and raw allocation.

use c10_core::{ALIGNMENT, Allocator, CpuAllocator, Device, DeviceType, Error};
use rstest::rstest;

const SIZES: [usize; 12] = [1, 2, 7, 63, 64, 65, 127, 128, 1000, 4096, 4097, 1 << 20];

#[test]
fn every_allocation_is_64_byte_aligned() {
    let allocator = CpuAllocator::new();
    // Keep them all alive at once so the system allocator cannot reuse one block.
    let ptrs: Vec<_> = SIZES
        .iter()
        .map(|&n| allocator.allocate(n).expect("small allocation"))
        .collect();
    for (data_ptr, &n) in ptrs.iter().zip(&SIZES) {
        assert!(!data_ptr.is_null(), "{n} bytes");
        assert_eq!(data_ptr.get() as usize % 64, 0, "{n} bytes");
        assert_eq!(data_ptr.get() as usize % ALIGNMENT, 0, "{n} bytes");
        assert_eq!(data_ptr.device(), Device::cpu());
        // Writable end to end (valgrind checks the bounds).
        // SAFETY: the allocation is `n` bytes long and exclusively ours.
        unsafe { std::ptr::write_bytes(data_ptr.get(), 0xAB, n) };
    }
    assert_eq!(allocator.allocated_bytes(), SIZES.iter().sum::<usize>());
    drop(ptrs);
    assert_eq!(allocator.allocated_bytes(), 0);
}

#[test]
fn zero_size_gives_a_null_data_ptr_that_frees_nothing() {
    let allocator = CpuAllocator::new();
    let data_ptr = allocator.allocate(0).unwrap();
    assert!(data_ptr.is_null());
    assert!(data_ptr.get_context().is_null());
    assert!(data_ptr.get_deleter().is_none());
    assert_eq!(data_ptr.device(), Device::cpu());
    assert_eq!(allocator.allocated_bytes(), 0);
    drop(data_ptr);
    assert_eq!(allocator.allocated_bytes(), 0);
}

#[rstest]
#[case::usize_max(usize::MAX)]
#[case::isize_max(isize::MAX as usize)]
#[case::just_too_big(isize::MAX as usize - 62)]
fn sizes_that_overflow_a_layout_are_rejected(#[case] nbytes: usize) {
    let allocator = CpuAllocator::new();
    assert_eq!(
        allocator.allocate(nbytes).unwrap_err(),
        Error::SizeOverflow { nbytes }
    );
    assert_eq!(allocator.allocated_bytes(), 0);
}

#[test]
fn a_refused_allocation_is_an_out_of_memory_error() {
    let allocator = CpuAllocator::new();
    let nbytes = 1usize << 62;
    assert_eq!(
        allocator.allocate(nbytes).unwrap_err(),
        Error::OutOfMemory {
            requested: nbytes,
            device: Device::cpu()
        }
    );
    assert_eq!(allocator.allocated_bytes(), 0);
}

#[test]
fn zeroed_allocator_zero_fills() {
    let allocator = CpuAllocator::zeroed();
    assert!(allocator.zero_fill());
    assert!(!CpuAllocator::new().zero_fill());
    for n in [1, 65, 4096] {
        let data_ptr = allocator.allocate(n).unwrap();
        // SAFETY: `n` initialised (zeroed) bytes, alive while `data_ptr` is.
        let bytes = unsafe { std::slice::from_raw_parts(data_ptr.get(), n) };
        assert!(bytes.iter().all(|&b| b == 0), "{n} bytes");
    }
}

#[test]
fn counter_tracks_live_bytes_and_outlives_the_allocator() {
    let allocator = CpuAllocator::new();
    let a = allocator.allocate(100).unwrap();
    let b = allocator.allocate(28).unwrap();
    assert_eq!(allocator.allocated_bytes(), 128);
    drop(a);
    assert_eq!(allocator.allocated_bytes(), 28);
    // Freeing after the allocator is gone is fine: the block carries its own counter handle.
    drop(allocator);
    drop(b);
}

#[test]
fn context_is_the_data_pointer() {
    let allocator = CpuAllocator::new();
    let data_ptr = allocator.allocate(10).unwrap();
    assert_eq!(data_ptr.get().cast(), data_ptr.get_context());
    let deleter = allocator.raw_deleter().expect("cpu has a raw deleter");
    assert_eq!(data_ptr.cast_context::<u8>(deleter), Some(data_ptr.get()));
    assert_eq!(allocator.device_type(), DeviceType::Cpu);
}

#[test]
fn raw_allocate_and_deallocate() {
    let allocator = CpuAllocator::new();
    for &n in &SIZES {
        let ptr = allocator.raw_allocate(n).unwrap();
        assert_eq!(ptr as usize % 64, 0, "{n} bytes");
        assert_eq!(allocator.allocated_bytes(), n);
        // SAFETY: `ptr` is a live `n`-byte block from `raw_allocate`, freed once below.
        unsafe {
            std::ptr::write_bytes(ptr, 1, n);
            allocator.raw_deallocate(ptr);
        }
        assert_eq!(allocator.allocated_bytes(), 0);
    }
    let null = allocator.raw_allocate(0).unwrap();
    assert!(null.is_null());
    // SAFETY: null is accepted and ignored.
    unsafe { allocator.raw_deallocate(null) };
    assert!(matches!(
        allocator.raw_allocate(usize::MAX),
        Err(Error::SizeOverflow { .. })
    ));
}

#[test]
fn copy_data_copies_bytes() {
    let allocator = CpuAllocator::new();
    let src = allocator.allocate(5).unwrap();
    let dst = allocator.allocate(5).unwrap();
    // SAFETY: both are live, distinct 5-byte blocks.
    unsafe {
        std::ptr::copy_nonoverlapping(b"hello".as_ptr(), src.get(), 5);
        allocator.copy_data(dst.get(), src.get(), 5);
        assert_eq!(std::slice::from_raw_parts(dst.get(), 5), b"hello");
    }
}

#[test]
fn allocations_from_many_threads() {
    let allocator = std::sync::Arc::new(CpuAllocator::new());
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let allocator = std::sync::Arc::clone(&allocator);
            std::thread::spawn(move || {
                for i in 1..50 {
                    let data_ptr = allocator.allocate(i * (t + 1)).unwrap();
                    assert_eq!(data_ptr.get() as usize % 64, 0);
                }
            })
        })
        .collect();
    for handle in handles {
        handle.join().unwrap();
    }
    assert_eq!(allocator.allocated_bytes(), 0);
}
