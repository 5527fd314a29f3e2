//! Changing the configuration of a live allocator (`set_config`, PyTorch's
//! `_set_allocator_settings`), which we allow only while it holds no memory.

use c10_cuda::config::{AllocatorConfig, ConfigWarning, MIB};
use c10_cuda::device::StreamId;
use c10_cuda::{CachingAllocator, DeviceCachingAllocator, Error, SimDevice};

const S0: StreamId = StreamId::DEFAULT;

fn conf(s: &str) -> AllocatorConfig {
    AllocatorConfig::parse(s).unwrap()
}

#[test]
fn a_new_configuration_applies_to_the_next_allocations() {
    let mut a = DeviceCachingAllocator::new(SimDevice::address_only(0, 8 << 30), conf("")).unwrap();
    let p = a.malloc(1200 * 1024, S0).unwrap();
    assert_eq!(p.size, 1200 * 1024);
    a.free(p.ptr).unwrap();
    a.empty_cache().unwrap();
    a.set_config(conf(
        "roundup_power2_divisions:4,max_split_size_mb:40,per_process_memory_fraction:0.5",
    ))
    .unwrap();
    // 1200 KiB rounds up to the next quarter of [1 MiB, 2 MiB).
    let p = a.malloc(1200 * 1024, S0).unwrap();
    assert_eq!(p.size, 1280 * 1024);
    let stats = a.stats().memory_stats();
    assert_eq!(stats["max_split_size"], 40 * MIB as i64);
    // The fraction limits the device to 4 GiB.
    assert!(matches!(a.malloc(5 << 30, S0), Err(Error::OutOfMemory(_))));
    a.free(p.ptr).unwrap();
    a.empty_cache().unwrap();
    // Without a fraction the whole device is usable again.
    a.set_config(conf("")).unwrap();
    let big = a.malloc(5 << 30, S0).unwrap();
    a.free(big.ptr).unwrap();
}

#[test]
fn it_is_refused_while_memory_is_held() {
    let mut a = DeviceCachingAllocator::new(SimDevice::address_only(0, 8 << 30), conf("")).unwrap();
    let p = a.malloc(4096, S0).unwrap();
    a.free(p.ptr).unwrap();
    // The 2 MiB segment is still cached.
    let err = a.set_config(conf("max_split_size_mb:40")).unwrap_err();
    assert!(
        matches!(
            err,
            Error::ConfigInUse {
                device: 0,
                reserved: 2097152,
                blocks: 1
            }
        ),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "cannot change the allocator configuration of device 0 while it holds 2097152 reserved \
         bytes in 1 blocks: free every allocation and empty the cache first"
    );
    assert_eq!(a.config(), &conf(""));
    a.empty_cache().unwrap();
    a.set_config(conf("max_split_size_mb:40")).unwrap();
    assert_eq!(a.config(), &conf("max_split_size_mb:40"));
}

#[test]
fn a_configuration_that_does_not_validate_is_refused() {
    let mut a = DeviceCachingAllocator::new(SimDevice::address_only(0, 8 << 30), conf("")).unwrap();
    let mut bad = conf("");
    bad.max_split_size = Some(3 * MIB);
    assert!(matches!(a.set_config(bad), Err(Error::Config(_))));
    assert_eq!(a.config(), &conf(""));
}

#[test]
fn expandable_segments_fall_back_without_virtual_memory() {
    let dev = SimDevice::address_only(0, 8 << 30).with_virtual_memory(false);
    let mut a = DeviceCachingAllocator::new(dev, conf("")).unwrap();
    a.set_config(conf("expandable_segments:True")).unwrap();
    assert!(!a.config().expandable_segments);
    assert_eq!(
        a.warnings(),
        [ConfigWarning::ExpandableSegmentsUnsupported { device: 0 }]
    );
    assert_eq!(
        a.warnings()[0].to_string(),
        "expandable_segments not supported on device 0: using regular segments"
    );
}

/// One channel: the allocator's warnings are the device's notes, then the config's own
/// (`validate_warnings`) for the configuration as applied; `set_config` replaces them.
#[rstest::rstest]
#[case::default("", true, vec![])]
#[case::gc_without_fraction(
    "garbage_collection_threshold:0.6",
    true,
    vec![ConfigWarning::GcThresholdWithoutMemoryFraction { threshold: 0.6 }]
)]
#[case::expandable_with_split_size(
    "expandable_segments:True,max_split_size_mb:40",
    true,
    vec![ConfigWarning::ExpandableSegmentsWithMaxSplitSize { max_split_size: 40 * MIB }]
)]
// Expandable segments are turned off on this device, so the note about them and
// max_split_size_mb does not apply any more.
#[case::expandable_unsupported(
    "expandable_segments:True,max_split_size_mb:40",
    false,
    vec![ConfigWarning::ExpandableSegmentsUnsupported { device: 2 }]
)]
#[case::both(
    "expandable_segments:True,garbage_collection_threshold:0.5",
    false,
    vec![
        ConfigWarning::ExpandableSegmentsUnsupported { device: 2 },
        ConfigWarning::GcThresholdWithoutMemoryFraction { threshold: 0.5 },
    ]
)]
fn the_allocator_keeps_the_warnings_of_the_applied_configuration(
    #[case] config: &str,
    #[case] virtual_memory: bool,
    #[case] expected: Vec<ConfigWarning>,
) {
    let device = || SimDevice::address_only(2, 8 << 30).with_virtual_memory(virtual_memory);
    let a = DeviceCachingAllocator::new(device(), conf(config)).unwrap();
    assert_eq!(a.warnings(), expected);
    // The same through set_config, which replaces what the previous configuration left.
    let mut b =
        DeviceCachingAllocator::new(device(), conf("garbage_collection_threshold:0.9")).unwrap();
    assert_eq!(b.warnings().len(), 1);
    b.set_config(conf(config)).unwrap();
    assert_eq!(b.warnings(), expected);
}

/// The front changes every device or none.
#[test]
fn the_front_changes_all_devices_or_none() {
    let front = CachingAllocator::new(
        vec![
            SimDevice::address_only(0, 1 << 30),
            SimDevice::address_only(1, 1 << 30),
        ],
        conf(""),
    )
    .unwrap();
    let p = front.raw_alloc(1, 4096).unwrap();
    assert!(matches!(
        front.set_config(conf("max_split_size_mb:40")),
        Err(Error::ConfigInUse { device: 1, .. })
    ));
    for d in 0..2 {
        assert_eq!(
            front.with_device(d, |a| a.config().clone()).unwrap(),
            conf("")
        );
    }
    front.raw_delete(p).unwrap();
    front.empty_cache().unwrap();
    front.set_config(conf("max_split_size_mb:40")).unwrap();
    for d in 0..2 {
        assert_eq!(
            front.with_device(d, |a| a.config().clone()).unwrap(),
            conf("max_split_size_mb:40")
        );
    }
}
