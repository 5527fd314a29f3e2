//! The integration tests of c10-core, one binary (issue 33); each module was one test file.

mod cpu_allocator;
mod data_ptr;
mod device;
mod errors;
mod registry;
mod scalar_type;
mod storage;
