//! The allocator configuration: PYTORCH_CUDA_ALLOC_CONF parsing, validation and printing.
