//! tensormem: replay real PyTorch memory snapshots through our caching allocator, and report
//! what happened and what would happen under other settings.
//!
//! The library behind the `tensormem` command and the `tensormem` Python module: [`load`] reads
//! snapshots (pickle, JSON, or an already decoded value), [`start_state`] rebuilds the state
//! before the recorded history, [`replay`] reruns the history through `c10_cuda` (parity with
//! PyTorch's decisions, or from empty), [`sweep`] compares configurations, [`top_sites`] finds
//! who holds the memory, [`advise`] searches the allocator settings, [`explain`] says why an
//! allocation failed, [`diff`] compares two snapshots, [`report`], [`session`] and [`html`] format text, JSON and HTML, [`dump`]
//! writes our replay in PyTorch's format; [`versions`] finds which PyTorch version's rules
//! reproduce a recording; [`window`] reads `--since`/`--until`; [`dtr`] simulates Dynamic Tensor
//! Rematerialization on an operator log (`tensormem dtr`, and its `--advise`); [`train`] runs live Dynamic Tensor Rematerialization
//! on a small model trained on the simulated device.

pub mod advise;
pub mod demo;
pub mod diff;
pub mod dtr;
pub mod dump;
pub mod error;
pub mod explain;
pub mod html;
pub mod load;
pub mod model;
mod par;
pub mod plot;
pub mod replay;
pub mod report;
pub mod session;
pub mod size;
pub mod start_state;
pub mod state;
pub mod sweep;
pub mod top_sites;
pub mod train;
pub mod versions;
pub mod window;

pub use error::Error;
