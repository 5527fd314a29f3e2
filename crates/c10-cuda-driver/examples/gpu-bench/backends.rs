//! The allocators the GPU bench compares, behind one small trait: ours (the caching allocator's
//! front on `CudaDevice`), cudarc's stream-ordered allocation on the default memory pool, and
//! raw `cuMemAlloc`/`cuMemFree`; plus the driver handle that reads `cuMemGetInfo` and trims the
//! default pool between runs, and the same replay on the simulated device.

use std::sync::Arc;

use c10_cuda::config::AllocatorConfig;
use c10_cuda::device::StreamId;
use c10_cuda::stats::StatType;
use c10_cuda::{CachingAllocator, DeviceCachingAllocator, SimDevice};
use c10_cuda_driver::{CudaDevice, Probe, probe};
use cudarc::driver::{CudaContext, CudaStream, result, sys};

use crate::ops::{Op, Trace};

/// One allocator under test. Sizes of 0 never reach it (the replays skip nothing: the shared
/// traces have none, and the warm pairs are non-empty).
pub trait Backend {
    fn alloc(&mut self, size: usize, stream: u32) -> Result<u64, String>;
    fn free(&mut self, ptr: u64, size: usize, stream: u32) -> Result<(), String>;
    /// Waits for queued work (the stream-ordered frees).
    fn finish(&mut self) -> Result<(), String>;
}

/// The device (`cuda:0`) as the bench sees it outside any allocator.
pub struct Driver {
    ctx: Arc<CudaContext>,
    probe: Probe,
}

impl Driver {
    /// Probes for a device and retains `cuda:0`'s primary context.
    pub fn open() -> Result<Driver, String> {
        let found = probe();
        if !found.is_available() {
            return Err(format!("no usable CUDA device: {found}"));
        }
        let ctx = CudaContext::new(0).map_err(|e| format!("cuda:0: {e:?}"))?;
        Ok(Driver { ctx, probe: found })
    }

    /// The device's name and memory, and the driver.
    pub fn describe(&self) -> String {
        let name = self.ctx.name().unwrap_or_else(|_| "cuda:0".into());
        let total = self.total().unwrap_or(0);
        format!(
            "{name}, {:.1} GiB ({})",
            total as f64 / (1u64 << 30) as f64,
            self.probe
        )
    }

    fn bind(&self) -> Result<(), String> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| format!("cuCtxSetCurrent: {e:?}"))
    }

    /// Bytes in use on the device (`total - free` of `cuMemGetInfo`), by anyone.
    pub fn used(&self) -> Result<u64, String> {
        self.bind()?;
        let (free, total) = result::mem_get_info().map_err(|e| format!("cuMemGetInfo: {e:?}"))?;
        Ok((total - free) as u64)
    }

    /// The device's memory in bytes.
    pub fn total(&self) -> Result<usize, String> {
        self.bind()?;
        let (_, total) = result::mem_get_info().map_err(|e| format!("cuMemGetInfo: {e:?}"))?;
        Ok(total)
    }

    /// Waits for the device, then returns the default memory pool's unused memory to the
    /// driver (`cuMemPoolTrimTo(pool, 0)`), so one backend's cache never counts for the next.
    pub fn trim(&self) -> Result<(), String> {
        self.bind()?;
        self.ctx
            .synchronize()
            .map_err(|e| format!("cuCtxSynchronize: {e:?}"))?;
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: `pool` is a valid out-pointer; the device handle comes from the live context,
        // which is current.
        unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, self.ctx.cu_device()) }
            .result()
            .map_err(|e| format!("cuDeviceGetDefaultMemPool: {e:?}"))?;
        // SAFETY: `pool` is the device's default pool, which lives as long as the context.
        unsafe { sys::cuMemPoolTrimTo(pool, 0) }
            .result()
            .map_err(|e| format!("cuMemPoolTrimTo: {e:?}"))
    }
}

/// Our caching allocator's front on `CudaDevice` (`raw_alloc_with_stream` / `raw_delete`).
pub struct Ours {
    front: CachingAllocator<CudaDevice>,
    streams: Vec<StreamId>,
}

impl Ours {
    /// A fresh front on `cuda:0` with `streams` streams (the default one and new ones) and the
    /// `PYTORCH_CUDA_ALLOC_CONF`-style `config`.
    pub fn new(streams: u32, config: &str) -> Result<Ours, String> {
        let device = CudaDevice::new(0).map_err(|e| e.to_string())?;
        let mut ids = vec![StreamId::DEFAULT];
        for _ in 1..streams {
            ids.push(device.new_stream().map_err(|e| e.to_string())?.0);
        }
        let config = AllocatorConfig::parse(config).map_err(|e| e.to_string())?;
        let front = CachingAllocator::new(vec![device], config).map_err(|e| e.to_string())?;
        Ok(Ours {
            front,
            streams: ids,
        })
    }

    /// The peak of reserved bytes (all pools) since the front was made.
    pub fn peak_reserved(&self) -> Result<u64, String> {
        let stats = self.front.device_stats(0).map_err(|e| e.to_string())?;
        Ok(stats.reserved_bytes[StatType::Aggregate as usize].peak as u64)
    }
}

impl Backend for Ours {
    fn alloc(&mut self, size: usize, stream: u32) -> Result<u64, String> {
        self.front
            .raw_alloc_with_stream(0, size, self.streams[stream as usize])
            .map_err(|e| e.to_string())
    }

    fn free(&mut self, ptr: u64, _size: usize, _stream: u32) -> Result<(), String> {
        self.front.raw_delete(ptr).map_err(|e| e.to_string())
    }

    fn finish(&mut self) -> Result<(), String> {
        Ok(())
    }
}

/// `cuMemAllocAsync` / `cuMemFreeAsync` on the device's default memory pool, one cudarc stream
/// per trace stream (stream 0 is the legacy default stream).
pub struct StreamOrdered {
    ctx: Arc<CudaContext>,
    streams: Vec<Arc<CudaStream>>,
}

impl StreamOrdered {
    pub fn new(driver: &Driver, streams: u32) -> Result<StreamOrdered, String> {
        driver.bind()?;
        let mut all = vec![driver.ctx.default_stream()];
        for _ in 1..streams {
            all.push(
                driver
                    .ctx
                    .new_stream()
                    .map_err(|e| format!("cuStreamCreate: {e:?}"))?,
            );
        }
        Ok(StreamOrdered {
            ctx: Arc::clone(&driver.ctx),
            streams: all,
        })
    }
}

impl Backend for StreamOrdered {
    fn alloc(&mut self, size: usize, stream: u32) -> Result<u64, String> {
        // SAFETY: the stream is a live stream of the current context (bound at creation; the
        // bench is single-threaded); the returned memory is only freed by `free` below.
        unsafe { result::malloc_async(self.streams[stream as usize].cu_stream(), size) }
            .map_err(|e| format!("cuMemAllocAsync({size}): {e:?}"))
    }

    fn free(&mut self, ptr: u64, _size: usize, stream: u32) -> Result<(), String> {
        // SAFETY: `ptr` came from `cuMemAllocAsync` here and is freed once, on a live stream.
        unsafe { result::free_async(ptr, self.streams[stream as usize].cu_stream()) }
            .map_err(|e| format!("cuMemFreeAsync: {e:?}"))
    }

    fn finish(&mut self) -> Result<(), String> {
        self.ctx
            .synchronize()
            .map_err(|e| format!("cuCtxSynchronize: {e:?}"))
    }
}

/// Raw `cuMemAlloc` / `cuMemFree` (synchronizing).
pub struct Raw {
    _ctx: Arc<CudaContext>,
}

impl Raw {
    pub fn new(driver: &Driver) -> Result<Raw, String> {
        driver.bind()?;
        Ok(Raw {
            _ctx: Arc::clone(&driver.ctx),
        })
    }
}

impl Backend for Raw {
    fn alloc(&mut self, size: usize, _stream: u32) -> Result<u64, String> {
        // SAFETY: the context is current (bound at creation; single-threaded bench).
        unsafe { result::malloc_sync(size) }.map_err(|e| format!("cuMemAlloc({size}): {e:?}"))
    }

    fn free(&mut self, ptr: u64, _size: usize, _stream: u32) -> Result<(), String> {
        // SAFETY: `ptr` came from `cuMemAlloc` here and is freed once.
        unsafe { result::free_sync(ptr) }.map_err(|e| format!("cuMemFree: {e:?}"))
    }

    fn finish(&mut self) -> Result<(), String> {
        Ok(())
    }
}

/// The peak reserved bytes of `t` replayed under `config` on a simulated device of `capacity`
/// bytes (what `tensormem replay` would predict for this GPU).
pub fn simulated_peak_reserved(t: &Trace, config: &str, capacity: usize) -> Result<u64, String> {
    let dev = SimDevice::address_only(0, capacity);
    let mut streams = vec![StreamId::DEFAULT];
    for _ in 1..t.streams {
        streams.push(dev.new_stream());
    }
    let config = AllocatorConfig::parse(config).map_err(|e| e.to_string())?;
    let mut alloc = DeviceCachingAllocator::new(dev, config).map_err(|e| e.to_string())?;
    let mut live = vec![0u64; t.slots];
    for op in &t.ops {
        match *op {
            Op::Alloc { size, slot, stream } => {
                live[slot as usize] = alloc
                    .malloc(size, streams[stream as usize])
                    .map_err(|e| format!("simulated replay: {e}"))?
                    .ptr;
            }
            Op::Free { slot } => {
                let ptr = std::mem::take(&mut live[slot as usize]);
                if ptr != 0 {
                    alloc
                        .free(ptr)
                        .map_err(|e| format!("simulated replay: {e}"))?;
                }
            }
        }
    }
    Ok(alloc.stats().reserved_bytes[StatType::Aggregate as usize].peak as u64)
}
