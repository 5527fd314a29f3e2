//! NDArray's sync copies (MXNet's `SyncCopyFromCPU` / `SyncCopyToCPU`) on the simulated device
//! stage through aten's pinned host allocator (PyTorch's `CachingHostAllocator`): one cached
//! staging block serves every copy of a size, and none stays checked out.
//!
//! Its own test binary on purpose: it counts the process-wide pinned host allocator's
//! statistics, which the other tests' copies would change under `cargo test` (one process).

use std::sync::Arc;

use aten::TensorOptions;
use c10_core::{Device, DeviceType};
use engine::{Engine, EngineConfig, EngineKind};
use engine_ndarray::NDArray;

#[test]
fn pinned_ndarray_sync_copies_stage_through_one_cached_pinned_block() {
    aten::sim::install(1, 64 << 20).expect("install sim:0");
    let engine: Arc<dyn Engine> = EngineConfig::new(EngineKind::Naive).build().unwrap();
    let x = NDArray::zeros(
        &engine,
        &[4, 8],
        TensorOptions::new().device(Device::sim(0)),
    )
    .unwrap();
    let data: Vec<f32> = (0..32).map(|i| i as f32 * 0.5).collect();
    let stats = || aten::pinned::host_memory_stats(DeviceType::Sim);
    for round in 0..3 {
        x.sync_copy_from_cpu(&data).unwrap();
        let y = x.mul_scalar(2.0).unwrap();
        let mut out = vec![0f32; 32];
        y.sync_copy_to_cpu(&mut out).unwrap();
        assert_eq!(
            out,
            data.iter().map(|v| v * 2.0).collect::<Vec<_>>(),
            "round {round}"
        );
    }
    let s = stats();
    // 128-byte copies: one pinned block of 128 bytes, made once, used by all six copies.
    assert_eq!(s["num_host_alloc"], 1, "{s:?}");
    assert_eq!(s["allocated_bytes.current"], 128);
    assert_eq!(s["active_requests.allocated"], 6);
    assert_eq!(s["active_requests.current"], 0);
}
