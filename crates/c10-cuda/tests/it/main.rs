//! The integration tests of c10-cuda, one binary (issue 33): each module was one test file;
//! `support` holds the helpers they share (the allocator on a simulated device).

mod support;

mod allocator_bugs;
mod allocator_report;
mod allocator_rules;
mod config_parse;
mod config_props;
mod device_buffer;
mod front_concurrency;
mod history_frames;
mod history_snapshot;
mod mem_pool_guard;
mod module_layers;
mod observers;
mod private_pools;
mod proptest_allocator;
mod room;
mod set_config;
mod sim_device;
mod summary_format;
mod thread_cache;
mod torch_versions;
