//! The engine's loom models, one binary (issue 33): built with `RUSTFLAGS="--cfg loom"`
//! (`cargo xtask loom`, or `cargo test -p engine --release --test loom`); empty otherwise. Each
//! module was one test file.

#![cfg(loom)]

mod loom_naive;
mod loom_opr;
mod loom_var;
