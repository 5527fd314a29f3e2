//! The process-wide allocator behind the C ABI: chosen once from the environment (simulated
//! devices or CUDA), behind an object-safe view of the thread-safe front.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use c10_cuda::call_site::HistoryOptions;
use c10_cuda::config::AllocatorConfig;
use c10_cuda::device::{DeviceMemory, DevicePtr, StreamId};
use c10_cuda::snapshot_pickle::snapshot_pickle;
use c10_cuda::{CachingAllocator, Result, SimDevice};
use c10_cuda_driver::{CudaDevice, probe};

/// `TENSORMEM_ALLOC_BACKEND`: `sim` or `cuda` (the default).
pub const BACKEND_VAR: &str = "TENSORMEM_ALLOC_BACKEND";
/// `TENSORMEM_SIM_MEMORY`: bytes per simulated device (default 80 GiB).
pub const SIM_MEMORY_VAR: &str = "TENSORMEM_SIM_MEMORY";
/// `TENSORMEM_SIM_DEVICES`: how many simulated devices (default 1).
pub const SIM_DEVICES_VAR: &str = "TENSORMEM_SIM_DEVICES";

/// Bytes of a simulated device when `TENSORMEM_SIM_MEMORY` is not set.
pub const DEFAULT_SIM_MEMORY: usize = 80 << 30;

/// What the C entry points need of the front, for any device backend.
pub trait Front: Send + Sync {
    /// `raw_alloc_with_stream`.
    fn malloc(&self, device: u8, size: usize, stream: StreamId) -> Result<DevicePtr>;
    /// `raw_delete`.
    fn free(&self, ptr: DevicePtr) -> Result<()>;
    /// `record_stream`.
    fn record_stream(&self, ptr: DevicePtr, stream: StreamId) -> Result<()>;
    /// `empty_cache`.
    fn empty_cache(&self) -> Result<()>;
    /// `memory_stats(device)`.
    fn memory_stats(&self, device: u8) -> Result<BTreeMap<String, i64>>;
    /// `memory_summary(device, abbreviated)`.
    fn memory_summary(&self, device: u8, abbreviated: bool) -> Result<String>;
    /// `set_config`.
    fn set_config(&self, config: AllocatorConfig) -> Result<()>;
    /// `record_memory_history`.
    fn record_history(&self, options: &HistoryOptions);
    /// The snapshot of every device as `_dump_snapshot` writes it.
    fn snapshot_pickle(&self) -> Vec<u8>;
}

impl<D: DeviceMemory> Front for CachingAllocator<D> {
    fn malloc(&self, device: u8, size: usize, stream: StreamId) -> Result<DevicePtr> {
        self.raw_alloc_with_stream(device, size, stream)
    }
    fn free(&self, ptr: DevicePtr) -> Result<()> {
        self.raw_delete(ptr)
    }
    fn record_stream(&self, ptr: DevicePtr, stream: StreamId) -> Result<()> {
        CachingAllocator::record_stream(self, ptr, stream)
    }
    fn empty_cache(&self) -> Result<()> {
        CachingAllocator::empty_cache(self)
    }
    fn memory_stats(&self, device: u8) -> Result<BTreeMap<String, i64>> {
        CachingAllocator::memory_stats(self, device)
    }
    fn memory_summary(&self, device: u8, abbreviated: bool) -> Result<String> {
        CachingAllocator::memory_summary(self, device, abbreviated)
    }
    fn set_config(&self, config: AllocatorConfig) -> Result<()> {
        CachingAllocator::set_config(self, config)
    }
    fn record_history(&self, options: &HistoryOptions) {
        self.record_memory_history(options);
    }
    fn snapshot_pickle(&self) -> Vec<u8> {
        let config = self
            .with_device(0, |a| a.config().clone())
            .unwrap_or_default();
        snapshot_pickle(&self.snapshot(), &config)
    }
}

/// The allocator of this process, made at the first call; or why it could not be.
pub fn front() -> std::result::Result<&'static dyn Front, String> {
    static FRONT: OnceLock<std::result::Result<Box<dyn Front>, String>> = OnceLock::new();
    match FRONT.get_or_init(|| from_env(|name| std::env::var(name).ok())) {
        Ok(front) => Ok(front.as_ref()),
        Err(message) => Err(message.clone()),
    }
}

/// Builds the allocator the environment asks for (`lookup` reads a variable).
///
/// # Errors
/// A message naming the variable and the problem: an unknown backend, a bad size or count, a
/// bad `PYTORCH_CUDA_ALLOC_CONF`, or no usable CUDA device.
pub fn from_env(
    lookup: impl Fn(&str) -> Option<String>,
) -> std::result::Result<Box<dyn Front>, String> {
    let config = AllocatorConfig::from_env_with(|name| lookup(name).map(std::ffi::OsString::from))
        .map_err(|e| format!("the allocator configuration from the environment: {e}"))?;
    match lookup(BACKEND_VAR).as_deref() {
        Some("sim") => {
            let capacity = match lookup(SIM_MEMORY_VAR) {
                Some(v) => parse_size(&v).map_err(|e| format!("{SIM_MEMORY_VAR}={v:?}: {e}"))?,
                None => DEFAULT_SIM_MEMORY,
            };
            let count = match lookup(SIM_DEVICES_VAR) {
                Some(v) => match v.trim().parse::<u8>() {
                    Ok(n) if n > 0 => n,
                    _ => {
                        return Err(format!(
                            "{SIM_DEVICES_VAR}={v:?}: expected a device count from 1 to 255"
                        ));
                    }
                },
                None => 1,
            };
            // Simulated streams do no work: an event completes as soon as it is recorded, so a
            // block recorded on another stream becomes free at the next allocation after its
            // free (or at empty_cache), as on a GPU whose streams are idle.
            let devices = (0..count)
                .map(|i| SimDevice::address_only(i, capacity).with_auto_complete(true))
                .collect();
            let front = CachingAllocator::new(devices, config).map_err(|e| e.to_string())?;
            Ok(Box::new(front))
        }
        None | Some("cuda") => {
            let found = probe();
            if !found.is_available() {
                return Err(format!(
                    "no usable CUDA device ({found}); set {BACKEND_VAR}=sim for a simulated one"
                ));
            }
            let count = u8::try_from(found.devices()).unwrap_or(u8::MAX);
            let mut devices = Vec::with_capacity(usize::from(count));
            for i in 0..count {
                let device = CudaDevice::new(i).map_err(|e| format!("CUDA device {i}: {e}"))?;
                // SAFETY: the streams that reach this device come from the C caller as
                // `cudaStream_t` values of the runtime API, which uses each device's primary
                // context, the context CudaDevice works in; the ABI documents that streams
                // must be live streams of that device (or its default streams).
                unsafe { device.accept_external_streams() };
                devices.push(device);
            }
            let front = CachingAllocator::new(devices, config).map_err(|e| e.to_string())?;
            Ok(Box::new(front))
        }
        Some(other) => Err(format!(
            "{BACKEND_VAR}={other:?}: expected \"sim\" or \"cuda\""
        )),
    }
}

/// Parses a byte count: digits with an optional unit `B`, `K`/`KiB`, `M`/`MiB`, `G`/`GiB`,
/// `T`/`TiB` (powers of 1024; `KB`, `MB`, `GB`, `TB` mean the same, as PyTorch's `_mb` keys do).
///
/// # Errors
/// A message for an empty, non-numeric, zero, unknown-unit or overflowing value.
pub fn parse_size(text: &str) -> std::result::Result<usize, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: usize = digits
        .parse()
        .map_err(|_| "expected a byte count such as 80GiB or 1073741824".to_string())?;
    let shift = match unit.trim() {
        "" | "B" => 0,
        "K" | "KB" | "KiB" => 10,
        "M" | "MB" | "MiB" => 20,
        "G" | "GB" | "GiB" => 30,
        "T" | "TB" | "TiB" => 40,
        other => return Err(format!("unknown unit {other:?} (B, KiB, MiB, GiB or TiB)")),
    };
    let bytes = n
        .checked_mul(1usize << shift)
        .ok_or_else(|| "too large".to_string())?;
    if bytes == 0 {
        return Err("a device needs more than 0 bytes".to_string());
    }
    Ok(bytes)
}
