//! Routing of the per-device engine (MXNet's `ThreadedEnginePerDevice`): a CPU pool of
//! `cpu_workers` threads and a CPU priority pool (`CPUPrioritized`); per device (CUDA or
//! simulated, index below [`MAX_DEVICES`]): compute workers (`Normal`, `Async`, `NoSkip`,
//! `DeleteVar`, `CPUPrioritized`), copy workers (`CopyFromGPU`, `CopyToGPU`) and priority workers
//! (`GPUPrioritized`), each worker owning its stream.

use crate::context::{Context, DevType, MAX_DEVICES};
use crate::engine::{EngineConfig, FnProperty};
use crate::error::{EngineError, Result};
use crate::stream::StreamKind;
use crate::worker::{GroupSpec, Topology};

pub(crate) struct PerDeviceTopology;

const CPU_NORMAL: usize = 0;
const CPU_PRIORITY: usize = 1;
const DEVICE_BASE: usize = 2;
/// compute, copy, priority
const PER_DEVICE: usize = 3;

fn device_slot(ctx: Context) -> usize {
    let type_index = match ctx.dev_type {
        DevType::Cuda => 0,
        _ => 1,
    };
    DEVICE_BASE + (type_index * MAX_DEVICES as usize + ctx.dev_id as usize) * PER_DEVICE
}

impl Topology for PerDeviceTopology {
    fn slots(&self) -> usize {
        DEVICE_BASE + 2 * MAX_DEVICES as usize * PER_DEVICE
    }

    fn check(&self, ctx: Context) -> Result<()> {
        if ctx.is_cpu() || ctx.dev_id < MAX_DEVICES {
            Ok(())
        } else {
            Err(EngineError::DeviceOutOfRange {
                index: ctx.dev_id,
                max: MAX_DEVICES,
            })
        }
    }

    fn route(&self, ctx: Context, prop: FnProperty) -> usize {
        if ctx.is_cpu() {
            return match prop {
                FnProperty::CPUPrioritized => CPU_PRIORITY,
                _ => CPU_NORMAL,
            };
        }
        device_slot(ctx)
            + match prop {
                FnProperty::CopyFromGPU | FnProperty::CopyToGPU => 1,
                FnProperty::GPUPrioritized => 2,
                _ => 0,
            }
    }

    fn spec(&self, slot: usize, config: &EngineConfig) -> GroupSpec {
        match slot {
            CPU_NORMAL => GroupSpec {
                name: "cpu".into(),
                threads: config.cpu_workers,
                kind: StreamKind::Compute,
            },
            CPU_PRIORITY => GroupSpec {
                name: "cpu-priority".into(),
                threads: config.cpu_priority_workers,
                kind: StreamKind::Priority,
            },
            _ => {
                let rel = slot - DEVICE_BASE;
                let (device, role) = (rel / PER_DEVICE, rel % PER_DEVICE);
                let (ty, index) = (device / MAX_DEVICES as usize, device % MAX_DEVICES as usize);
                let ty = if ty == 0 { "cuda" } else { "sim" };
                let (role_name, threads, kind) = match role {
                    0 => (
                        "compute",
                        config.device_compute_workers,
                        StreamKind::Compute,
                    ),
                    1 => ("copy", config.device_copy_workers, StreamKind::Copy),
                    _ => (
                        "priority",
                        config.device_priority_workers,
                        StreamKind::Priority,
                    ),
                };
                GroupSpec {
                    name: format!("{ty}{index}-{role_name}"),
                    threads,
                    kind,
                }
            }
        }
    }
}
