//! The integration tests of c10-cuda-capi, one binary (issue 33); each module was one test file.
//! The C program (`tests/c/abi_test.c`) and the PyTorch scripts stay beside it.

mod backend;
mod c_program;
mod symbols;
