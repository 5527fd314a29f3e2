//! The GPU-only tests of c10-cuda-driver, one binary (issue 33): built only with the `gpu-tests`
//! feature (`required-features` of its `[[test]]` entry, which is how `cargo xtask gpu-test` and
//! `cargo xtask gpu-bundle` find it); each module was one test file.

mod gpu;
mod gpu_interop;
mod gpu_ipc;
mod gpu_pinned;
