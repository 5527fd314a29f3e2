//! Tensors on a real GPU through cudarc. Compiled only with `--features gpu-tests`
//! (`cargo test -p aten --features gpu-tests --test gpu`); every test first asserts that a CUDA
//! device is usable, so on a machine without one they fail loudly instead of passing by
//! skipping.

use aten::{Error, Tensor, TensorOptions};
use c10_core::{Device, ScalarType};

fn gpu() -> Device {
    let found = c10_cuda_driver::probe();
    assert!(
        found.is_available(),
        "GPU tests need a CUDA device: {found}"
    );
    Device::cuda(0)
}

#[test]
fn round_trip_through_the_gpu() -> aten::Result<()> {
    let cuda = gpu();
    let cpu = Tensor::arange(0.0, 12.0, 1.0, TensorOptions::new())?.view(&[3, 4])?;
    let on_gpu = cpu.t()?.to(cuda)?; // strided source, contiguous on the device
    assert_eq!(on_gpu.device(), cuda);
    assert!(on_gpu.is_contiguous());
    assert_eq!(
        on_gpu.to_vec::<f32>()?,
        cpu.t()?.contiguous()?.to_vec::<f32>()?
    );
    // A strided view of a GPU tensor copies back through its span.
    let col = on_gpu.select(1, 2)?;
    assert_eq!(col.to(Device::cpu())?.to_vec::<f32>()?, [2.0, 6.0, 10.0]);
    assert!(on_gpu.to_string().ends_with("device='cuda:0')"), "{on_gpu}");
    let stats = aten::device_copy::cuda_front()?.memory_stats(0)?;
    assert!(stats["allocated_bytes.all.current"] >= 512);
    Ok(())
}

#[test]
fn copies_and_fills_on_the_gpu() -> aten::Result<()> {
    let cuda = gpu();
    let t = Tensor::zeros(
        &[2, 3],
        TensorOptions::new().device(cuda).dtype(ScalarType::Double),
    )?;
    assert_eq!(t.to_vec::<f64>()?, [0.0; 6]);
    t.copy_(&Tensor::from_slice(&[1i32, 2, 3], &[3])?)?; // broadcast + convert, then HtoD
    assert_eq!(t.to_vec::<f64>()?, [1.0, 2.0, 3.0, 1.0, 2.0, 3.0]);
    t.fill_(4.0)?;
    t.sync_copy_from_cpu(&[5.0f64; 6])?;
    let mut out = [0f64; 6];
    t.sync_copy_to_cpu(&mut out)?;
    assert_eq!(out, [5.0; 6]);
    assert_eq!(t.version(), 3);
    assert!(matches!(
        t.sync_copy_from_cpu(&[0f64; 5]),
        Err(Error::MemorySizeMismatch { .. })
    ));
    // Kernels need host memory: a clear error, not a crash.
    assert!(matches!(t.add(&t), Err(Error::UnsupportedDevice { .. })));
    assert_eq!(t.deep_clone()?.to_vec::<f64>()?, [5.0; 6]);
    Ok(())
}
