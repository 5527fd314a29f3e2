//! The GPU-only tests of aten, one binary (issue 33): built only with the `gpu-tests` feature
//! (`required-features` of its `[[test]]` entry, which is how `cargo xtask gpu-test` and
//! `cargo xtask gpu-bundle` find it); each module was one test file.

mod gpu;
mod gpu_pinned_ipc;
