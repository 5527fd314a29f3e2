//! The integration tests of aten, one binary (issue 33); each module was one test file. The
//! GPU-only tests are the `gpu` binary (`tests/gpu/`, feature `gpu-tests`); `tests/pinned_tensor.rs`
//! stays a binary of its own (it reads the process-wide pinned allocator's statistics).

mod ipc_tensor;
mod layout_rules;
mod ops;
mod printing;
mod props;
mod sim;
mod tensor;
mod torch_battery;
mod torch_semantics;
mod torch_special_values;
