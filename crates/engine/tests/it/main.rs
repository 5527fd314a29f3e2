//! The integration tests of the engine, one binary (issue 33); each module was one test file.
//! `common` holds the helpers they share (and engine-ndarray's tests share): the engine matrix, the
//! hang guard. The loom models are the `loom` binary (`tests/loom/`, built with `--cfg loom`).

#[path = "../common/mod.rs"]
mod common;

mod bulk;
mod config;
mod errors;
mod lifecycle;
mod random_workload;
mod semantics;
mod threads;
mod var_queue;
