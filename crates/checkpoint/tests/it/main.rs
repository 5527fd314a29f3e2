//! The integration tests of checkpoint, one binary (issue 33): each module was one test file;
//! `support` finds the shared DTR logs and the committed corpus. `live.rs` and
//! `live_device_budget.rs` stay binaries of their own: they install simulated devices with
//! `aten::sim::install`, which is process-wide.

mod support;

mod allocator;
mod corpus;
mod device_budget;
mod log_errors;
mod parity;
mod proptest_log;
mod runtime;
mod sweep_snapshot;
