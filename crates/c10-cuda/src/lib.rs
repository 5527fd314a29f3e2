//! PyTorch's CUDA caching allocator (`c10/cuda/CUDACachingAllocator.cpp`) in Rust.
#![allow(missing_docs)]
pub mod config;
pub mod cuda;
pub mod device;
pub mod oom;
pub mod stats;
pub mod summary;
