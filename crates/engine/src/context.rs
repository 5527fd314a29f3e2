//! Where an op runs: [`Context`] (MXNet's `Context`: a device type and an index).

use std::fmt;

/// The most device indices a per-device engine serves for each device type (indices
/// `0..MAX_DEVICES`); pushing to a higher index is refused with
/// [`crate::EngineError::DeviceOutOfRange`].
pub const MAX_DEVICES: u32 = 16;

/// The kind of device an op runs on (MXNet's `Context::DeviceType`, with this project's
/// simulated device added).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DevType {
    /// The host (MXNet's `kCPU`; `kCPUPinned` and `kCPUShared` map here too).
    Cpu,
    /// An NVIDIA GPU (MXNet's `kGPU`).
    Cuda,
    /// This project's simulated device: workers and streams as on a GPU, no hardware.
    Sim,
}

/// The execution context of an op: a device type and index (MXNet's `Context`, `exec_ctx`).
///
/// `Display` prints `cpu`, `cuda:1`, `sim:0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Context {
    /// The device type.
    pub dev_type: DevType,
    /// The device index (0 for the CPU).
    pub dev_id: u32,
}

impl Context {
    /// The host (MXNet's `Context::CPU()`).
    pub const fn cpu() -> Self {
        Context {
            dev_type: DevType::Cpu,
            dev_id: 0,
        }
    }

    /// CUDA device `index` (MXNet's `Context::GPU(index)`).
    pub const fn cuda(index: u32) -> Self {
        Context {
            dev_type: DevType::Cuda,
            dev_id: index,
        }
    }

    /// Simulated device `index`.
    pub const fn sim(index: u32) -> Self {
        Context {
            dev_type: DevType::Sim,
            dev_id: index,
        }
    }

    /// Whether this is the host.
    pub const fn is_cpu(&self) -> bool {
        matches!(self.dev_type, DevType::Cpu)
    }
}

impl Default for Context {
    /// The host.
    fn default() -> Self {
        Context::cpu()
    }
}

impl fmt::Display for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.dev_type {
            DevType::Cpu => f.write_str("cpu"),
            DevType::Cuda => write!(f, "cuda:{}", self.dev_id),
            DevType::Sim => write!(f, "sim:{}", self.dev_id),
        }
    }
}
