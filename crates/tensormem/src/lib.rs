//! tensormem: replay real PyTorch memory snapshots through our caching allocator, and report
//! what happened and what would happen under other settings.
//!
//! The library behind the `tensormem` command: [`load`] reads snapshots (pickle or JSON),
//! [`start_state`] rebuilds the state before the recorded history, [`replay`] reruns the
//! history through `c10_cuda` (parity with PyTorch's decisions, or from empty), [`sweep`]
//! compares configurations, [`report`] formats text and JSON; [`train`] runs live Dynamic
//! Tensor Rematerialization on a small model trained on the simulated device.

pub mod demo;
pub mod load;
pub mod model;
pub mod plot;
pub mod replay;
pub mod report;
pub mod size;
pub mod start_state;
pub mod state;
pub mod sweep;
pub mod train;
