//! The integration tests of tensormem, one binary (issue 33): each module was one test file;
//! `support` holds the helpers they share (the shared snapshots folder, scratch folders, running
//! the binary, synthetic snapshots). `train.rs` stays a binary of its own: it installs
//! simulated devices with `aten::sim::install`, which is process-wide.

mod support;

mod cli;
mod defects;
mod diff;
mod dump_fidelity;
mod formats;
mod honest_unknowns;
mod oom_user;
mod window;
