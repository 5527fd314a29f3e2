//! Routing of the pooled engine (MXNet's `ThreadedEnginePooled`): one shared pool of
//! `cpu_workers` threads runs every op, whatever its device; copy ops (`CopyFromGPU`,
//! `CopyToGPU`) go to a separate copy pool of `device_copy_workers` threads, as MXNet's IO
//! thread pool, so copies overlap compute. Workers make a stream per context they meet.

use crate::context::Context;
use crate::engine::{EngineConfig, FnProperty};
use crate::error::Result;
use crate::stream::StreamKind;
use crate::worker::{GroupSpec, Topology};

pub(crate) struct PooledTopology;

impl Topology for PooledTopology {
    fn slots(&self) -> usize {
        2
    }

    fn check(&self, _ctx: Context) -> Result<()> {
        Ok(())
    }

    fn route(&self, _ctx: Context, prop: FnProperty) -> usize {
        match prop {
            FnProperty::CopyFromGPU | FnProperty::CopyToGPU => 1,
            _ => 0,
        }
    }

    fn spec(&self, slot: usize, config: &EngineConfig) -> GroupSpec {
        if slot == 0 {
            GroupSpec {
                name: "pool".into(),
                threads: config.cpu_workers,
                kind: StreamKind::Compute,
            }
        } else {
            GroupSpec {
                name: "io".into(),
                threads: config.device_copy_workers,
                kind: StreamKind::Copy,
            }
        }
    }
}
