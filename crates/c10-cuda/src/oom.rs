//! The out-of-memory error value and its message.
