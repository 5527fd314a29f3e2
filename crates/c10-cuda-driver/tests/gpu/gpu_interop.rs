//! cudarc interop on a real GPU: a kernel compiled by nvrtc and launched with cudarc on our
//! blocks (`DeviceBuffer` views as launch arguments), cudarc copies into and out of them, and a
//! view on a second stream recording that stream on the block. Compiled only with
//! `--features gpu-tests` (`cargo xtask gpu-test`, or the bundle's `run.sh`).
//!
//! Every test first asserts that the probe finds a device: without one these tests fail loudly.

use std::sync::Arc;

use c10_cuda::config::AllocatorConfig;
use c10_cuda::device::StreamId;
use c10_cuda::stats::StatType;
use c10_cuda::{CachingAllocator, DeviceBuffer};
use c10_cuda_driver::{CudaBufferViews, CudaDevice, probe};
use cudarc::driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};

/// `y[i] = a * x[i] + y[i]` for `i < n`.
const SAXPY: &str = r#"
extern "C" __global__ void saxpy(float a, const float *x, float *y, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { y[i] = a * x[i] + y[i]; }
}
"#;

struct Gpu {
    front: Arc<CachingAllocator<CudaDevice>>,
    saxpy: CudaFunction,
    default: Arc<CudaStream>,
}

/// Asserts that a CUDA device is usable, opens `cuda:0` behind a front and compiles the kernel
/// with nvrtc.
fn gpu() -> Gpu {
    let found = probe();
    assert!(
        found.is_available(),
        "GPU tests need a CUDA device: {found}"
    );
    let device = CudaDevice::new(0).expect("open cuda:0");
    let ctx = Arc::clone(device.context());
    let default = device
        .stream(StreamId::DEFAULT)
        .expect("the default stream");
    let front =
        Arc::new(CachingAllocator::new(vec![device], AllocatorConfig::default()).expect("front"));
    let ptx = cudarc::nvrtc::compile_ptx(SAXPY).expect("nvrtc compiles the kernel");
    let module = ctx.load_module(ptx).expect("cuModuleLoadData");
    let saxpy = module.load_function("saxpy").expect("cuModuleGetFunction");
    Gpu {
        front,
        saxpy,
        default,
    }
}

fn allocated(front: &CachingAllocator<CudaDevice>) -> i64 {
    front.device_stats(0).unwrap().allocated_bytes[StatType::Aggregate as usize].current
}

#[test]
fn a_kernel_runs_on_our_blocks() {
    let gpu = gpu();
    let n = 1_000_000usize;
    let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let y: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
    let bytes = n * std::mem::size_of::<f32>();
    let mut xb = DeviceBuffer::new(&gpu.front, 0, bytes, StreamId::DEFAULT).unwrap();
    let mut yb = DeviceBuffer::new(&gpu.front, 0, bytes, StreamId::DEFAULT).unwrap();
    assert_eq!(allocated(&gpu.front), 2 * bytes as i64);
    let stream = &gpu.default;
    {
        let mut xv = xb.view_mut::<f32>(stream).unwrap();
        assert_eq!(xv.len(), n);
        stream.memcpy_htod(&x, &mut xv).expect("copy x in");
        let mut yv = yb.view_mut::<f32>(stream).unwrap();
        stream.memcpy_htod(&y, &mut yv).expect("copy y in");
    }
    let xv = xb.view::<f32>(stream).unwrap();
    let mut yv = yb.view_mut::<f32>(stream).unwrap();
    let a = 2.5f32;
    let n32 = n as u32;
    let mut launch = stream.launch_builder(&gpu.saxpy);
    launch.arg(&a).arg(&xv).arg(&mut yv).arg(&n32);
    // SAFETY: saxpy(float, const float*, float*, unsigned) matches the four arguments; both
    // views hold n floats; one thread per element, guarded by `i < n`.
    unsafe { launch.launch(LaunchConfig::for_num_elems(n32)) }.expect("launch saxpy");
    let out = stream.clone_dtoh(&yv).expect("copy y out");
    let want: Vec<f32> = x.iter().zip(&y).map(|(x, y)| a * x + y).collect();
    assert_eq!(out, want);
    drop((xv, yv));
    drop(xb);
    drop(yb);
    assert_eq!(allocated(&gpu.front), 0);
}

#[test]
fn a_view_on_another_stream_records_it() {
    let gpu = gpu();
    // A stream cudarc made, unknown to the device until the first view registers it.
    let side = gpu.default.context().new_stream().expect("cuStreamCreate");
    let n = 1 << 20;
    let bytes = n * 4;
    let mut buf = DeviceBuffer::new(&gpu.front, 0, bytes, StreamId::DEFAULT).unwrap();
    let mut x = DeviceBuffer::new(&gpu.front, 0, 2 * bytes, StreamId::DEFAULT).unwrap();
    let ptr = buf.ptr();
    let ones = vec![1.0f32; n];
    {
        let mut v = buf.view_mut::<f32>(&side).unwrap();
        side.memcpy_htod(&ones, &mut v).unwrap();
        let mut xv = x.view_mut::<f32>(&side).unwrap();
        assert_eq!(xv.len(), 2 * n);
        side.memcpy_htod(&vec![1.0f32; 2 * n], &mut xv).unwrap();
        let (twice, n32) = (2.0f32, n as u32);
        let mut launch = side.launch_builder(&gpu.saxpy);
        launch.arg(&twice).arg(&xv).arg(&mut v).arg(&n32);
        // SAFETY: as in `a_kernel_runs_on_our_blocks` (x holds 2n floats, the kernel reads n).
        unsafe { launch.launch(LaunchConfig::for_num_elems(n32)) }.unwrap();
        let out = side.clone_dtoh(&v).unwrap();
        assert!(out.iter().all(|&e| e == 3.0), "1 + 2 * 1 on every element");
    }
    // Both blocks were recorded on `side`: freeing them queues an event there (cuEventRecord on
    // the registered stream); once `side` is done, the next request gets the first block back.
    drop(x);
    drop(buf);
    assert_eq!(allocated(&gpu.front), 0);
    side.synchronize().unwrap();
    let again = DeviceBuffer::new(&gpu.front, 0, bytes, StreamId::DEFAULT).unwrap();
    assert_eq!(again.ptr(), ptr);
}

#[test]
fn a_copy_on_a_foreign_stream_is_ordered_and_synchronized() {
    let gpu = gpu();
    let other = gpu.default.context().new_stream().expect("cuStreamCreate");
    let n = 4096;
    let mut buf = DeviceBuffer::new(&gpu.front, 0, n * 4, StreamId::DEFAULT).unwrap();
    let data: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    let mut v = buf.view_mut::<f32>(&gpu.default).unwrap();
    // A cudarc call handed another stream than the view's: waits for the view's stream and
    // synchronizes after queuing, so the result is complete when it returns.
    other.memcpy_htod(&data, &mut v).unwrap();
    let back = other.clone_dtoh(&v).unwrap();
    assert_eq!(back, data);
}
