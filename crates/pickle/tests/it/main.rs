//! The integration tests of tensormem-pickle, one binary (issue 33); each module was one test file.

mod cpython_pickles;
mod hostile;
mod roundtrip;
mod shared_snapshots;
