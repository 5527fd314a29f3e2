//! The whole stack on a CPU: tensors on the host-backed simulated device, allocated by c10-cuda's
//! caching allocator, with the CPU kernels running on the device's bytes; and tensors on a
//! user's own host-backed allocator (sim:6, sim:7, cuda:7), which says its bytes are host memory.
//!
//! One install for the whole binary (tests run in parallel); each test that reads statistics
//! owns one device index.

use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use aten::{Error, Generator, Tensor, TensorOptions};
use c10_core::{Allocator, DataPtr, DeleterFn, Device, DeviceType, ScalarType};
use c10_cuda::{CachingAllocator, SimDevice};

type R = aten::Result<()>;

const MIB: usize = 1 << 20;

fn front() -> &'static Arc<CachingAllocator<SimDevice>> {
    static FRONT: OnceLock<Arc<CachingAllocator<SimDevice>>> = OnceLock::new();
    FRONT.get_or_init(|| aten::sim::install(6, 64 * MIB).expect("install the simulated devices"))
}

fn stat(device: u8, key: &str) -> i64 {
    front().memory_stats(device).unwrap()[key]
}

#[test]
fn a_sim_tensor_is_a_caching_allocator_block_returned_on_drop() -> R {
    let dev = 3;
    front();
    assert_eq!(stat(dev, "allocated_bytes.all.current"), 0);
    let t = Tensor::zeros(&[1000], TensorOptions::new().device(Device::sim(dev)))?;
    assert_eq!(t.device(), Device::sim(dev));
    // 4000 bytes round to 4096 (512-byte blocks) in a 2 MiB small-pool segment.
    assert_eq!(stat(dev, "allocated_bytes.all.current"), 4096);
    assert_eq!(stat(dev, "allocation.all.current"), 1);
    assert_eq!(stat(dev, "reserved_bytes.all.current"), 2 * MIB as i64);
    assert_eq!(stat(dev, "requested_bytes.all.current"), 4000);
    // The tensor's bytes are the device's bytes at the block's address.
    t.fill_(1.5)?;
    let mut raw = [0u8; 8];
    front()
        .with_device(dev, |a| {
            use c10_cuda::device::DeviceMemory as _;
            assert_eq!(a.device().index(), dev);
            a.device().read(t.data_ptr() as u64, &mut raw)
        })?
        .expect("the block is host-backed device memory");
    assert_eq!(bytemuck::cast::<[u8; 8], [f32; 2]>(raw), [1.5, 1.5]);
    // Views keep the block alive; the last handle returns it to the cache.
    let view = t.narrow(0, 10, 5)?;
    drop(t);
    assert_eq!(stat(dev, "allocated_bytes.all.current"), 4096);
    drop(view);
    assert_eq!(stat(dev, "allocated_bytes.all.current"), 0);
    assert_eq!(stat(dev, "allocation.all.current"), 0);
    assert_eq!(stat(dev, "reserved_bytes.all.current"), 2 * MIB as i64); // cached, not freed
    assert_eq!(stat(dev, "allocation.all.allocated"), 1);
    assert_eq!(stat(dev, "allocation.all.freed"), 1);
    // A large tensor goes to the large pool (a 20 MiB segment), and empty_cache frees both.
    let big = Tensor::ones(
        &[2 * MIB as i64],
        TensorOptions::new().device(Device::sim(dev)),
    )?;
    assert_eq!(
        stat(dev, "allocated_bytes.large_pool.current"),
        8 * MIB as i64
    );
    assert_eq!(
        big.sum_all()?.to(Device::cpu())?.item::<f32>()?,
        2.0 * MIB as f32
    );
    drop(big);
    front().empty_cache()?;
    assert_eq!(stat(dev, "reserved_bytes.all.current"), 0);
    Ok(())
}

#[test]
fn ops_run_on_the_device_bytes() -> R {
    front(); // each test may run in its own process (nextest)
    let sim = Device::sim(0);
    let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?.to(sim)?;
    let b = Tensor::from_vec(vec![10.0f32, 20.0, 30.0], &[3])?.to(sim)?;
    assert_eq!(a.device(), sim);
    let c = a.add(&b)?;
    assert_eq!(c.device(), sim);
    assert_eq!(c.to_vec::<f32>()?, [11.0, 22.0, 33.0, 14.0, 25.0, 36.0]);
    assert_eq!(
        a.t()?.contiguous()?.to_vec::<f32>()?,
        [1.0, 4.0, 2.0, 5.0, 3.0, 6.0]
    );
    let m = a.matmul(&a.t()?)?;
    assert_eq!(
        (m.device(), m.to_vec::<f32>()?),
        (sim, vec![14.0, 32.0, 32.0, 77.0])
    );
    let s = a.sum(&[1], false)?;
    assert_eq!((s.device(), s.to_vec::<f32>()?), (sim, vec![6.0, 15.0]));
    let p = a.softmax(1)?;
    assert_eq!(p.device(), sim);
    let l = a.cross_entropy(
        &Tensor::from_vec(vec![2i64, 0], &[2])?.to(sim)?,
        aten::Reduction::Sum,
    )?;
    assert_eq!(l.device(), sim);
    assert!((l.item::<f32>()? - 2.8152118).abs() < 1e-5);
    a.add_(&a)?;
    a.select(0, 0)?.zero_()?;
    assert_eq!(
        a.to(Device::cpu())?.to_vec::<f32>()?,
        [0.0, 0.0, 0.0, 8.0, 10.0, 12.0]
    );
    assert_eq!(a.version(), 2);
    assert_eq!(a.as_slice::<f32>()?.len(), 6);
    // Random tensors and arange are made on the host and moved.
    let r = Tensor::randn(
        &[4],
        &mut Generator::new(5),
        TensorOptions::new().device(sim),
    )?;
    let rc = Tensor::randn(&[4], &mut Generator::new(5), TensorOptions::new())?;
    assert_eq!(r.to_vec::<f32>()?, rc.to_vec::<f32>()?);
    let ar = Tensor::arange(
        0.0,
        3.0,
        1.0,
        TensorOptions::new().device(sim).dtype(ScalarType::Long),
    )?;
    assert_eq!(ar.to_string(), "tensor([0, 1, 2], device='sim:0')");
    Ok(())
}

#[test]
fn copies_between_cpu_and_devices() -> R {
    front(); // each test may run in its own process (nextest)
    let (s1, s2) = (Device::sim(1), Device::sim(2));
    let cpu = Tensor::arange(0.0, 12.0, 1.0, ScalarType::Double)?.view(&[3, 4])?;
    let on1 = cpu.t()?.to(s1)?; // a strided source
    assert!(on1.is_contiguous());
    let on2 = on1.to(s2)?;
    assert_eq!(on2.device(), s2);
    let back = on2.to(Device::cpu())?;
    assert_eq!(back.device(), Device::cpu());
    assert_eq!(
        back.to_vec::<f64>()?,
        cpu.t()?.contiguous()?.to_vec::<f64>()?
    );
    // Same device: the same tensor.
    assert!(
        on1.to(Device::new(c10_core::DeviceType::Sim, Some(1)))?
            .is_same(&on1)
    );
    // copy_ across devices, broadcasting and converting.
    let dst = Tensor::zeros(&[2, 4], TensorOptions::new().device(s1))?;
    dst.copy_(&Tensor::from_vec(vec![1i32, 2, 3, 4], &[4])?)?;
    assert_eq!(
        dst.to_vec::<f32>()?,
        [1.0, 2.0, 3.0, 4.0, 1.0, 2.0, 3.0, 4.0]
    );
    // Synchronous host copies with exact sizes.
    dst.sync_copy_from_cpu(&[9.0f32; 8])?;
    let mut out = [0f32; 8];
    dst.sync_copy_to_cpu(&mut out)?;
    assert_eq!(out, [9.0; 8]);
    assert!(matches!(
        dst.sync_copy_from_cpu(&[0f32; 7]),
        Err(Error::MemorySizeMismatch { .. })
    ));
    Ok(())
}

#[test]
fn mixing_devices_is_an_error() -> R {
    front(); // each test may run in its own process (nextest)
    let a = Tensor::ones(&[2], TensorOptions::new().device(Device::sim(4)))?;
    let b = Tensor::ones(&[2], TensorOptions::new())?;
    match a.add(&b) {
        Err(Error::DeviceMismatch { lhs, rhs, .. }) => {
            assert_eq!((lhs, rhs), (Device::sim(4), Device::cpu()))
        }
        other => panic!("expected a device mismatch, got {other:?}"),
    }
    assert!(matches!(
        a.mm(&b.view(&[2, 1])?),
        Err(Error::DeviceMismatch { .. })
    ));
    // But copy_ moves across devices.
    a.copy_(&b.mul_scalar(3.0)?)?;
    assert_eq!(a.to_vec::<f32>()?, [3.0, 3.0]);
    Ok(())
}

#[test]
fn an_address_only_device_is_refused_for_host_work() -> R {
    front();
    let devices = (0..6)
        .map(|i| SimDevice::address_only(i, 64 * MIB))
        .collect();
    let other = Arc::new(CachingAllocator::new(devices, Default::default())?);
    // Route sim:5 to an address-only device: its addresses are not host memory.
    aten::set_device_allocator(Device::sim(5), Arc::new(other.allocator(5)?))?;
    match Tensor::zeros(&[4], TensorOptions::new().device(Device::sim(5))) {
        Err(Error::UnsupportedDevice { device, .. }) => assert_eq!(device, Device::sim(5)),
        other => panic!("expected UnsupportedDevice, got {other:?}"),
    }
    // An allocator that serves another index than the one registered is caught too.
    aten::set_device_allocator(Device::sim(5), Arc::new(other.allocator(0)?))?;
    match Tensor::zeros(&[4], TensorOptions::new().device(Device::sim(5))) {
        Err(Error::Core(c10_core::Error::AllocatorFailure { device, message })) => {
            assert_eq!(device, Device::sim(5));
            assert!(message.contains("placed the bytes on sim:0"), "{message}");
        }
        other => panic!("expected an allocator failure, got {other:?}"),
    }
    Ok(())
}

/// A user's own host-backed allocator (no c10-cuda): 64-byte aligned heap blocks tagged with
/// `device`, counting allocations and frees, saying its bytes are host memory when
/// `host_accessible`.
struct UserHostAllocator {
    device: Device,
    host_accessible: bool,
    counts: Arc<Counts>,
}

#[derive(Default)]
struct Counts {
    allocated: AtomicUsize,
    freed: AtomicUsize,
}

/// The context of one block: its layout, for the free, and the counters.
struct Block {
    data: *mut u8,
    layout: std::alloc::Layout,
    counts: Arc<Counts>,
}

unsafe fn free_block(ctx: *mut c_void) {
    // SAFETY: `ctx` is the `Box<Block>` leaked by `allocate`, freed once by its DataPtr.
    let block = unsafe { Box::from_raw(ctx.cast::<Block>()) };
    // SAFETY: `data` came from `alloc` with this layout and is freed only here.
    unsafe { std::alloc::dealloc(block.data, block.layout) };
    block.counts.freed.fetch_add(1, Ordering::SeqCst);
}

// SAFETY: every non-null data pointer is a fresh `std::alloc` block of `nbytes` host bytes
// (readable and writable by the CPU, reached only through this DataPtr) on `self.device`, freed
// once by `free_block`, which may run on any thread; `host_accessible` is fixed at construction;
// no raw deleter.
unsafe impl Allocator for UserHostAllocator {
    fn allocate(&self, nbytes: usize) -> c10_core::Result<DataPtr> {
        if nbytes == 0 {
            return Ok(DataPtr::null(self.device));
        }
        let layout = std::alloc::Layout::from_size_align(nbytes, 64)
            .map_err(|_| c10_core::Error::SizeOverflow { nbytes })?;
        // SAFETY: `layout` has a non-zero size.
        let data = unsafe { std::alloc::alloc(layout) };
        if data.is_null() {
            return Err(c10_core::Error::OutOfMemory {
                requested: nbytes,
                device: self.device,
            });
        }
        self.counts.allocated.fetch_add(1, Ordering::SeqCst);
        let ctx = Box::into_raw(Box::new(Block {
            data,
            layout,
            counts: Arc::clone(&self.counts),
        }));
        // SAFETY: `free_block(ctx)` frees the block once from any thread; `data` is `nbytes`
        // bytes of host memory that only this DataPtr reaches.
        Ok(unsafe { DataPtr::new(data, ctx.cast(), Some(free_block as DeleterFn), self.device) })
    }

    fn device_type(&self) -> DeviceType {
        self.device.device_type()
    }

    fn host_accessible(&self) -> bool {
        self.host_accessible
    }
}

fn user_allocator(device: Device, host_accessible: bool) -> Arc<Counts> {
    let counts = Arc::new(Counts::default());
    let allocator = UserHostAllocator {
        device,
        host_accessible,
        counts: Arc::clone(&counts),
    };
    aten::set_device_allocator(device, Arc::new(allocator)).expect("register the allocator");
    counts
}

#[rstest::rstest]
#[case::sim(Device::sim(7))]
// A host allocator under a CUDA index (unified memory, say): the device type does not matter.
#[case::cuda(Device::cuda(7))]
fn a_user_allocator_whose_bytes_are_host_memory_computes(#[case] dev: Device) -> R {
    // No aten::sim::install: the user's allocator alone serves the device.
    let counts = user_allocator(dev, true);
    let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?.to(dev)?;
    let b = Tensor::ones(&[3], TensorOptions::new().device(dev))?;
    assert_eq!((a.device(), b.device()), (dev, dev));
    let c = a.add(&b)?;
    assert_eq!(c.device(), dev);
    assert_eq!(c.to_vec::<f32>()?, [2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
    let m = a.matmul(&a.t()?)?;
    assert_eq!(m.to_vec::<f32>()?, [14.0, 32.0, 32.0, 77.0]);
    assert_eq!(a.sum(&[1], false)?.to_vec::<f32>()?, [6.0, 15.0]);
    a.mul_(&a)?;
    assert_eq!(a.as_slice::<f32>()?[5], 36.0);
    let mut out = [0.0f32; 3];
    b.sync_copy_to_cpu(&mut out)?;
    assert_eq!(out, [1.0; 3]);
    b.sync_copy_from_cpu(&[7.0f32, 8.0, 9.0])?;
    assert_eq!(b.to(Device::cpu())?.to_vec::<f32>()?, [7.0, 8.0, 9.0]);
    assert_eq!(
        b.to_string(),
        format!("tensor([7., 8., 9.], device='{dev}')")
    );
    // a, b, c, and the matmul's and the sum's outputs (a.t() is a view, mul_ is in place, the
    // copies to the host are CPU tensors): five blocks of the user's, the sum's already freed.
    assert_eq!(counts.allocated.load(Ordering::SeqCst), 5);
    assert_eq!(counts.freed.load(Ordering::SeqCst), 1);
    drop((a, b, c, m));
    assert_eq!(counts.freed.load(Ordering::SeqCst), 5);
    Ok(())
}

#[test]
fn a_user_allocator_that_does_not_say_host_memory_is_refused() -> R {
    let dev = Device::sim(6);
    let counts = user_allocator(dev, false);
    match Tensor::zeros(&[4], TensorOptions::new().device(dev)) {
        Err(Error::UnsupportedDevice { device, .. }) => assert_eq!(device, dev),
        other => panic!("expected UnsupportedDevice, got {other:?}"),
    }
    // The block was allocated, then freed with the failed tensor.
    assert_eq!(counts.allocated.load(Ordering::SeqCst), 1);
    assert_eq!(counts.freed.load(Ordering::SeqCst), 1);
    Ok(())
}

#[test]
fn out_of_device_memory_is_an_error_not_a_panic() -> R {
    front();
    match Tensor::zeros(
        &[65 * MIB as i64 / 4],
        TensorOptions::new().device(Device::sim(4)),
    ) {
        Err(Error::Core(c10_core::Error::DeviceOutOfMemory { message, .. })) => {
            assert!(message.contains("out of memory"), "{message}");
        }
        other => panic!("expected an out-of-memory error, got {other:?}"),
    }
    Ok(())
}
