//! What the test modules share: an allocator on a simulated address-only device, configured by a
//! PYTORCH_CUDA_ALLOC_CONF string (written once here instead of once per test file).

use c10_cuda::config::AllocatorConfig;
use c10_cuda::history::Clock;
use c10_cuda::{DeviceCachingAllocator, Rules, SimDevice};

/// `conf` parsed as the newest PyTorch version reads it; panics (failing the test) when invalid.
pub fn config(conf: &str) -> AllocatorConfig {
    AllocatorConfig::parse(conf).expect("valid config")
}

/// An address-only simulated device of `capacity` bytes and an allocator on it with `conf`,
/// under the newest version's rules. The device handle is a clone: it sees the allocator's
/// segments (and lets a test complete events).
pub fn allocator(capacity: usize, conf: &str) -> (SimDevice, DeviceCachingAllocator<SimDevice>) {
    let dev = SimDevice::address_only(0, capacity);
    let alloc = DeviceCachingAllocator::new(dev.clone(), config(conf)).expect("allocator");
    (dev, alloc)
}

/// As [`allocator`], under `rules` (`conf` parsed as `rules.version` reads it).
pub fn allocator_with(
    capacity: usize,
    conf: &str,
    rules: Rules,
) -> (SimDevice, DeviceCachingAllocator<SimDevice>) {
    let dev = SimDevice::address_only(0, capacity);
    let config = AllocatorConfig::parse_for(conf, rules.version).expect("valid config");
    let alloc = DeviceCachingAllocator::with_rules(dev.clone(), config, rules).expect("allocator");
    (dev, alloc)
}

/// As [`allocator`], recording the memory history (`max_entries`, logical clock).
pub fn recording(
    capacity: usize,
    conf: &str,
    max_entries: usize,
) -> (SimDevice, DeviceCachingAllocator<SimDevice>) {
    let (dev, mut alloc) = allocator(capacity, conf);
    alloc.record_history(max_entries, Clock::Logical);
    (dev, alloc)
}
