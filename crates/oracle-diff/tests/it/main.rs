//! The integration tests of oracle-diff, one binary (issue 33); each module was one test file.

mod api;
mod driver;
