//! Differential testing of c10-cuda's caching allocator against PyTorch's real one.
//!
//! torch-oracle (`../shared/torch-oracle`) runs the unmodified `libc10_cuda.so` of a torch
//! wheel on a fake CUDA runtime and prints every decision for an op script. This crate:
//! - reads and writes those scripts ([`script`]) and the oracle's output ([`trace`]), and
//!   refuses the scripts no PyTorch program can produce ([`api`]);
//! - runs a script through our allocator on [`fake::FakeCuda`], a device that mirrors the
//!   oracle's fake runtime call for call, and prints the same lines ([`driver`]);
//! - compares the two ([`compare`]) and tells a divergence from one of our deliberate fixes
//!   ([`check`]: a script that agrees once the fixes are off is a deliberate difference);
//! - generates random scripts ([`generate`]), shrinks a diverging one ([`shrink`]), runs
//!   campaigns on every core ([`fuzz`]), and keeps the committed fixtures ([`fixtures`]) that
//!   CI checks without the oracle.
//!
//! `cargo xtask oracle` runs a campaign; `oracle-diff --help` lists the commands.
pub mod api;
pub mod check;
pub mod compare;
pub mod driver;
pub mod fake;
pub mod fixtures;
pub mod fuzz;
pub mod generate;
pub mod oracle;
pub mod script;
pub mod shrink;
pub mod trace;
