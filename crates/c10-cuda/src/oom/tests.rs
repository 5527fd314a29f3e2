//! The out-of-memory message in the states that pick different hints (unit tests: the error is
//! `#[non_exhaustive]`, so only this crate can write one with made-up figures).

use super::OutOfMemoryError;
use crate::rules::TorchVersion;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// A 3.5 MiB request on an 8 GiB device, served from a 20 MiB segment, with 2.5 GiB of the
/// 7.5 GiB reserved left unallocated by fragmentation; expandable segments off, no fraction.
fn fragmented() -> OutOfMemoryError {
    OutOfMemoryError {
        device: 0,
        requested: 3_670_000,
        rounded: 3_670_016,
        segment_size: 20 * MIB,
        device_total: 8 * GIB,
        device_free: 12 * MIB,
        allocated: 5 * GIB,
        reserved: 7 * GIB + GIB / 2,
        allowed: None,
        expandable_segments: false,
        max_split_size: None,
        stream: 0,
        torch: TorchVersion::V2_15,
    }
}

#[test]
fn fragmented_cache_with_expandable_off() {
    let e = fragmented();
    assert!(e.fragmented() && !e.fraction_limited());
    assert_eq!(e.reserved_but_unallocated(), 2 * GIB + GIB / 2);
    insta::assert_snapshot!("oom_fragmented_expandable_off", e.to_string());
}

#[test]
fn expandable_segments_on() {
    let e = OutOfMemoryError {
        device: 1,
        requested: 1000,
        rounded: 1024,
        segment_size: 2 * MIB,
        device_free: 0,
        allocated: 7 * GIB + 900 * MIB,
        reserved: 7 * GIB + 920 * MIB,
        expandable_segments: true,
        stream: 7,
        ..fragmented()
    };
    insta::assert_snapshot!("oom_expandable_on", e.to_string());
    // torch 2.7 has no note on virtual address space.
    let old = OutOfMemoryError {
        torch: TorchVersion::V2_7,
        ..e.clone()
    };
    let text = old.to_string();
    assert!(!text.contains("virtual address space"), "{text}");
    assert!(e.to_string().contains("virtual address space"));
    assert_eq!(
        e.to_string().replace(
            "If the process runs out of virtual address space (VSZ) instead: each expandable \
             segment reserves about 9/8 of the device's memory, per stream and pool (torch 2.15's \
             expandable_segments_reserve lowers it). ",
            ""
        ),
        text
    );
}

#[test]
fn fraction_limited() {
    // per_process_memory_fraction 0.5 of 8 GiB: 4 GiB allowed, 4 GiB - 8 MiB already reserved.
    let e = OutOfMemoryError {
        requested: 12_000_000,
        rounded: 12_000_256,
        segment_size: 12 * MIB,
        device_free: 3 * GIB,
        allocated: 3 * GIB,
        reserved: 4 * GIB - 8 * MIB,
        allowed: Some(4 * GIB),
        max_split_size: Some(200 * MIB),
        ..fragmented()
    };
    assert!(e.fraction_limited());
    insta::assert_snapshot!("oom_fraction_limited", e.to_string());
}

#[test]
fn request_equals_segment() {
    // A 256 MiB request needs a 256 MiB segment; the cache holds only 40 MiB unallocated.
    let e = OutOfMemoryError {
        requested: 256 * MIB,
        rounded: 256 * MIB,
        segment_size: 256 * MIB,
        device_free: 100 * MIB,
        allocated: 7 * GIB,
        reserved: 7 * GIB + 40 * MIB,
        ..fragmented()
    };
    assert!(!e.fragmented());
    let text = e.to_string();
    assert!(text.starts_with("CUDA out of memory. Tried to allocate 256.00 MiB. GPU 0 "));
    insta::assert_snapshot!("oom_request_equals_segment", text);
}

#[test]
fn hint_thresholds() {
    let base = fragmented();
    // Unallocated exactly a quarter of reserved: large.
    let quarter = OutOfMemoryError {
        allocated: 3 * GIB,
        reserved: 4 * GIB,
        ..base.clone()
    };
    assert!(quarter.fragmented());
    // Below a quarter but at least the segment size: large.
    let segment = OutOfMemoryError {
        allocated: 4 * GIB,
        reserved: 4 * GIB + 20 * MIB,
        ..base.clone()
    };
    assert!(segment.fragmented());
    // Below both: small.
    let small = OutOfMemoryError {
        allocated: 4 * GIB,
        reserved: 4 * GIB + 19 * MIB,
        ..base.clone()
    };
    assert!(!small.fragmented());
    // Nothing reserved: not fragmentation.
    let empty = OutOfMemoryError {
        allocated: 0,
        reserved: 0,
        ..base.clone()
    };
    assert!(!empty.fragmented());
    // A fraction set but not binding: the fraction hint is not given, "allowed" still is.
    let roomy = OutOfMemoryError {
        allowed: Some(8 * GIB),
        ..base
    };
    assert!(!roomy.fraction_limited());
    let text = roomy.to_string();
    assert!(text.contains("8.00 GiB allowed; Of the allocated memory"));
    assert!(text.contains("expandable_segments:True"));
    assert!(!text.contains("per_process_memory_fraction"));
}

#[test]
fn is_a_std_error() {
    let e: Box<dyn std::error::Error> = Box::new(fragmented());
    assert!(
        e.to_string()
            .starts_with("CUDA out of memory. Tried to allocate 3.50 MiB (a 20.00 MiB segment).")
    );
}
