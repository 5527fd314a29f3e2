//! The cross-crate integration tests of the workspace, one binary (issue 33); each module was one
//! test file. The crate's library (`support.rs`) finds `../shared/data`.

mod oracle_fixtures;
mod shared_data;
mod tensormem_snapshots;
