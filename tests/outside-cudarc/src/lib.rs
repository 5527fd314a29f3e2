//! A user's crate on cudarc with CUDA 13.0 bindings and dynamic linking, using c10-cuda's
//! caching allocator (on c10-cuda-driver's `CudaDevice`) for its buffers and launching its own
//! kernel on one: it only has to build (`cargo xtask ci` checks it; nothing here runs without a
//! GPU).

use std::sync::Arc;

use c10_cuda::config::AllocatorConfig;
use c10_cuda::device::StreamId;
use c10_cuda::{CachingAllocator, DeviceBuffer};
use c10_cuda_driver::{CudaBufferViews, CudaDevice};
use cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg};

/// Fills `n` floats of a fresh block with `value` by launching `fill(float *y, float v,
/// unsigned n)` on the default stream, and copies them back.
pub fn fill_on_gpu(
    fill: &CudaFunction,
    n: u32,
    value: f32,
) -> Result<Vec<f32>, Box<dyn std::error::Error>> {
    let device = CudaDevice::new(0)?;
    let stream = device.context().default_stream();
    let front = Arc::new(CachingAllocator::new(vec![device], AllocatorConfig::default())?);
    let mut buf = DeviceBuffer::new(&front, 0, n as usize * 4, StreamId::DEFAULT)?;
    let mut y = buf.view_mut::<f32>(&stream)?;
    let mut launch = stream.launch_builder(fill);
    launch.arg(&mut y).arg(&value).arg(&n);
    // SAFETY: the arguments match fill's parameters; `y` holds n floats.
    unsafe { launch.launch(LaunchConfig::for_num_elems(n)) }?;
    Ok(stream.clone_dtoh(&y)?)
}
