//! Pinned CPU tensors (`Tensor::pin_memory`, `Tensor::is_pinned`) and the pinned staging of
//! the sync copies on the simulated device, through aten's pinned host allocator (PyTorch's
//! `CachingHostAllocator`).
//!
//! Its own test binary on purpose (not a module of `it`): it reads the process-wide pinned host
//! allocator's statistics, which the sync copies of other tests would change under `cargo test`
//! (one process, many threads).

use std::sync::OnceLock;

use aten::{Error, Tensor, TensorOptions};
use c10_core::{Device, DeviceType};

fn setup() -> std::sync::MutexGuard<'static, ()> {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    INSTALLED.get_or_init(|| {
        aten::sim::install(1, 64 << 20).expect("install");
    });
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn stat(key: &str) -> i64 {
    aten::pinned::host_memory_stats(DeviceType::Sim)
        .get(key)
        .copied()
        .unwrap_or(0)
}

#[test]
fn pinned_pin_memory_copies_into_a_pinned_block() {
    let _serial = setup();
    let t = Tensor::arange(0.0, 10.0, 1.0, TensorOptions::new()).unwrap();
    assert!(!t.is_pinned());
    let p = t.pin_memory_for(DeviceType::Sim).unwrap();
    assert!(p.is_pinned());
    assert_eq!(p.device(), Device::cpu());
    assert_eq!(p.to_vec::<f32>().unwrap(), t.to_vec::<f32>().unwrap());
    // Pinning a pinned tensor is the tensor itself (PyTorch returns self).
    let again = p.pin_memory_for(DeviceType::Sim).unwrap();
    assert!(again.is_same(&p));
    // A view of a pinned tensor is pinned; a copy of it is not.
    assert!(p.narrow(0, 2, 3).unwrap().is_pinned());
    assert!(!p.deep_clone().unwrap().is_pinned());
    // A non-contiguous source gives a contiguous pinned copy.
    let m = Tensor::arange(0.0, 6.0, 1.0, TensorOptions::new())
        .unwrap()
        .view(&[2, 3])
        .unwrap()
        .transpose(0, 1)
        .unwrap();
    let pm = m.pin_memory_for(DeviceType::Sim).unwrap();
    assert!(pm.is_contiguous() && pm.is_pinned());
    assert_eq!(pm.to_vec::<f32>().unwrap(), [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
}

#[test]
fn pinned_only_cpu_tensors_can_be_pinned() {
    let _serial = setup();
    let s = Tensor::ones(&[4], TensorOptions::new().device(Device::sim(0))).unwrap();
    assert!(!s.is_pinned());
    assert!(matches!(
        s.pin_memory_for(DeviceType::Sim),
        Err(Error::UnsupportedDevice { .. })
    ));
    assert!(matches!(
        Tensor::ones(&[4], TensorOptions::new())
            .unwrap()
            .pin_memory_for(DeviceType::Meta),
        Err(Error::UnsupportedDevice { .. })
    ));
}

#[test]
fn pinned_sync_copies_to_the_sim_device_stage_through_one_cached_block() {
    let _serial = setup();
    let dev = Tensor::zeros(&[2, 3], TensorOptions::new().device(Device::sim(0))).unwrap();
    let data = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
    dev.sync_copy_from_cpu(&data).unwrap();
    let allocs = stat("num_host_alloc");
    assert!(allocs >= 1, "the copy went through a pinned block");
    for _ in 0..3 {
        dev.sync_copy_from_cpu(&data).unwrap();
        let mut out = [0f32; 6];
        dev.sync_copy_to_cpu(&mut out).unwrap();
        assert_eq!(out, data);
    }
    // Six more staged copies of the same size reused the cached block.
    assert_eq!(stat("num_host_alloc"), allocs);
    assert_eq!(
        stat("active_requests.current"),
        0,
        "every staging block went back"
    );
    assert!(stat("active_requests.allocated") >= 7);
    // A strided destination is staged as well.
    let col = dev.transpose(0, 1).unwrap();
    col.sync_copy_from_cpu(&[10f32, 20., 30., 40., 50., 60.])
        .unwrap();
    assert_eq!(
        dev.to_vec::<f32>().unwrap(),
        [10.0, 30.0, 50.0, 20.0, 40.0, 60.0]
    );
}

#[test]
fn pinned_empty_cache_releases_the_staging_blocks() {
    let _serial = setup();
    let dev = Tensor::zeros(&[256], TensorOptions::new().device(Device::sim(0))).unwrap();
    dev.sync_copy_from_cpu(&[1f32; 256]).unwrap();
    assert!(stat("allocations.current") >= 1);
    aten::pinned::empty_pinned_cache();
    assert_eq!(stat("allocations.current"), 0);
    assert_eq!(stat("num_host_free"), stat("num_host_alloc"));
}
