//! PyTorch's size and placement rules as tables: `round_size`, `get_allocation_size`,
//! `should_split`, pool choice, and best fit / stream / oversize decisions through the allocator.

use c10_cuda::config::{AllocatorConfig, MIB};
use c10_cuda::device::{DevicePtr, StreamId};
use c10_cuda::sizes::{
    get_allocation_size, is_small, round_size, roundup_power2_next_division, should_split,
};
use c10_cuda::{DeviceCachingAllocator, Rules, SimDevice, TorchVersion};
use rstest::rstest;

const KIB: usize = 1 << 10;
const GIB: usize = 1 << 30;

use crate::support::{allocator, config};

const S0: StreamId = StreamId::DEFAULT;

// ---------------------------------------------------------------------------------------------
// round_size
// ---------------------------------------------------------------------------------------------

/// Without `roundup_power2_divisions`: below 512 -> 512, else the next multiple of 512.
#[rstest]
#[case::zero(0, 512)]
#[case::one(1, 512)]
#[case::b511(511, 512)]
#[case::b512_stays(512, 512)]
#[case::b513_next_multiple(513, 1024)]
// 1200 / 512 = 2.34 -> 3 * 512 = 1536.
#[case::b1200(1200, 1536)]
#[case::kib_700(700 * KIB, 700 * KIB)]
#[case::mib_1(MIB, MIB)]
// 1 MiB + 1 -> 2049 * 512 = 1 MiB + 512.
#[case::mib_1_plus_1(MIB + 1, MIB + 512)]
#[case::mib_2(2 * MIB, 2 * MIB)]
#[case::mib_2_plus_1(2 * MIB + 1, 2 * MIB + 512)]
#[case::gib_1(GIB, GIB)]
#[case::gib_1_plus_1(GIB + 1, GIB + 512)]
// Saturation: the largest multiple of 512 instead of overflowing.
#[case::usize_max(usize::MAX, usize::MAX & !511)]
fn round_size_default(#[case] size: usize, #[case] expected: usize) {
    assert_eq!(round_size(size, &AllocatorConfig::default()), expected);
}

/// `roundup_power2_divisions:4` for every interval. The power-of-two rule applies only when
/// `size > 512 * 4 = 2048`; below that the plain multiple-of-512 rule applies.
#[rstest]
#[case::zero(0, 512)]
#[case::one(1, 512)]
#[case::b511(511, 512)]
#[case::b512(512, 512)]
// 513 <= 2048: plain rounding to 1024.
#[case::b513(513, 1024)]
// The reference's "1200 with d=4 -> 1280" is `roundup_power2_next_division(1200, 4)` (see
// `next_division_examples`); `round_size` never gets there because 1200 <= 512 * 4 = 2048, so
// PyTorch's `round_size` gives ceil(1200 / 512) * 512 = 1536.
#[case::b1200_guarded_by_512_times_d(1200, 1536)]
#[case::b2048_power_of_two(2048, 2048)]
// (2048, 4096), step 2048 / 4 = 512: identical to plain rounding. 3000 -> 2560 + 512 = 3072.
#[case::b3000(3000, 3072)]
// [4096, 8192), step 1024: 4097 -> 4096 + 1024 = 5120 (plain rounding would give 4608).
#[case::b4097(4097, 5120)]
// [512 KiB, 1 MiB), step 128 KiB: 700 KiB = 5.47 steps -> 6 * 128 KiB = 768 KiB.
#[case::kib_700(700 * KIB, 768 * KIB)]
// [512 KiB, 1 MiB), step 128 KiB: 1 MiB - 1 -> 8 * 128 KiB = 1 MiB.
#[case::mib_1_minus_1(MIB - 1, MIB)]
#[case::mib_1_exact(MIB, MIB)]
// [1 MiB, 2 MiB), step 256 KiB: 1 MiB + 1 -> 1 MiB + 256 KiB.
#[case::mib_1_plus_1(MIB + 1, MIB + 256 * KIB)]
#[case::mib_2_exact(2 * MIB, 2 * MIB)]
// [2 MiB, 4 MiB), step 512 KiB: 3 MiB is a step boundary and stays.
#[case::mib_3_on_step(3 * MIB, 3 * MIB)]
#[case::mib_3_plus_1(3 * MIB + 1, 3 * MIB + 512 * KIB)]
// [4 MiB, 8 MiB), step 1 MiB: 5 MiB + 1 -> 6 MiB.
#[case::mib_5_plus_1(5 * MIB + 1, 6 * MIB)]
#[case::gib_1_exact(GIB, GIB)]
// [1 GiB, 2 GiB), step 256 MiB: 1 GiB + 1 -> 1.25 GiB.
#[case::gib_1_plus_1(GIB + 1, GIB + 256 * MIB)]
// [2^63, 2^64), step 2^61: 2^63 + 1 -> 2^63 + 2^61.
#[case::top_interval(1 << 63 | 1, (1 << 63) + (1 << 61))]
// The next step would be 2^64: saturates like the plain rule, at the largest multiple of 512.
#[case::usize_max_saturates(usize::MAX, usize::MAX & !511)]
fn round_size_with_four_divisions(#[case] size: usize, #[case] expected: usize) {
    assert_eq!(
        round_size(size, &config("roundup_power2_divisions:4")),
        expected
    );
}

/// Per-interval divisions `[1:4,2:8,>:2]`: interval 0 (below 2 MiB) has 4, interval 1
/// ([2 MiB, 4 MiB)) has 8, every later interval 2. The interval is floor(log2 size) - 20,
/// clamped to [0, 15].
#[rstest]
// Below 1 MiB the index clamps to 0 (d = 4): [512 KiB, 1 MiB), step 128 KiB.
#[case::kib_700_interval_0(700 * KIB, 768 * KIB)]
// [1 MiB, 2 MiB), d = 4, step 256 KiB: 1 MiB + 300 KiB -> 1 MiB + 512 KiB.
#[case::mib_1_300k_interval_0(MIB + 300 * KIB, MIB + 512 * KIB)]
// 2 MiB - 1 is still interval 0: step 256 KiB -> 2 MiB.
#[case::mib_2_minus_1_interval_0(2 * MIB - 1, 2 * MIB)]
#[case::mib_2_boundary_stays(2 * MIB, 2 * MIB)]
// 2 MiB + 1 is interval 1, d = 8: step 2 MiB / 8 = 256 KiB -> 2 MiB + 256 KiB.
#[case::mib_2_plus_1_interval_1(2 * MIB + 1, 2 * MIB + 256 * KIB)]
// 4 MiB + 1 is interval 2, d = 2: step 2 MiB -> 6 MiB.
#[case::mib_4_plus_1_interval_2(4 * MIB + 1, 6 * MIB)]
// 1 GiB + 1 is interval 10, d = 2: step 512 MiB -> 1.5 GiB.
#[case::gib_1_plus_1_interval_10(GIB + 1, GIB + 512 * MIB)]
fn round_size_with_interval_list(#[case] size: usize, #[case] expected: usize) {
    let c = config("roundup_power2_divisions:[1:4,2:8,>:2]");
    assert_eq!(c.roundup_power2_divisions[0], 4);
    assert_eq!(c.roundup_power2_divisions[1], 8);
    assert!(c.roundup_power2_divisions[2..].iter().all(|&d| d == 2));
    assert_eq!(round_size(size, &c), expected);
}

/// `divisions:1` means no power-of-two rounding at all.
#[rstest]
#[case::b4097(4097, 4608)]
#[case::mib_5_plus_1(5 * MIB + 1, 5 * MIB + 512)]
fn round_size_with_one_division_is_plain(#[case] size: usize, #[case] expected: usize) {
    assert_eq!(
        round_size(size, &config("roundup_power2_divisions:1")),
        expected
    );
}

/// Any power of two parses as a division count. With d = 2^55 or more, `512 * d` overflows
/// (a panic in debug builds, a wrap to 0 in release that sent every size through the
/// power-of-two rule, before the library fix); the guard `size > 512 * d` is simply never met,
/// so plain rounding applies.
#[rstest]
#[case::d_2_55(1 << 55)]
#[case::d_2_63(1 << 63)]
fn round_size_with_huge_division_counts(#[case] d: usize) {
    let c = config(&format!("roundup_power2_divisions:{d}"));
    assert_eq!(c.roundup_power2_divisions[0], d);
    assert_eq!(round_size(5000, &c), 5120);
    assert_eq!(round_size((1 << 40) + 1, &c), (1 << 40) + 512);
    assert_eq!(round_size(usize::MAX, &c), usize::MAX & !511);
}

/// PyTorch's `roundup_power2_next_division` on its own: the documentation's example
/// (1200 with 4 divisions -> 1280: steps 1024, 1280, 1536, 1792) and the edges.
#[rstest]
#[case::doc_example_1200_d4(1200, 4, 1280)]
#[case::power_of_two_stays(1024, 4, 1024)]
#[case::on_a_step_stays(1280, 4, 1280)]
#[case::just_above_a_step(1281, 4, 1536)]
#[case::last_step_rounds_to_next_power(1793, 4, 2048)]
#[case::d2(5000, 2, 6144)]
#[case::d8_mib(2 * MIB + 1, 8, 2 * MIB + 256 * KIB)]
fn next_division_examples(#[case] size: usize, #[case] d: usize, #[case] expected: usize) {
    assert_eq!(roundup_power2_next_division(size, d), expected);
}

// ---------------------------------------------------------------------------------------------
// get_allocation_size and pool choice
// ---------------------------------------------------------------------------------------------

#[rstest]
#[case::one_byte(1, 2 * MIB)]
#[case::mib_1_small_buffer(MIB, 2 * MIB)]
#[case::mib_1_plus_1_large_buffer(MIB + 1, 20 * MIB)]
#[case::mib_10_minus_1_large_buffer(10 * MIB - 1, 20 * MIB)]
#[case::mib_10_exact(10 * MIB, 10 * MIB)]
// Rounded up to a multiple of 2 MiB.
#[case::mib_10_plus_1(10 * MIB + 1, 12 * MIB)]
#[case::mib_20(20 * MIB, 20 * MIB)]
#[case::mib_21_plus_1(21 * MIB + 1, 22 * MIB)]
#[case::gib_1(GIB, GIB)]
fn allocation_size(#[case] size: usize, #[case] expected: usize) {
    assert_eq!(get_allocation_size(size), expected);
}

/// `is_small` takes the rounded size: at most 1 MiB is the small pool.
#[rstest]
#[case::b512(512, true)]
#[case::mib_1(MIB, true)]
#[case::mib_1_plus_512(MIB + 512, false)]
#[case::mib_2(2 * MIB, false)]
fn pool_choice(#[case] rounded: usize, #[case] small: bool) {
    assert_eq!(is_small(rounded), small);
}

/// Pool choice through the allocator: the segment size and pool of the first miss.
#[rstest]
#[case::b1_small(1, true, 2 * MIB)]
#[case::mib_1_small(MIB, true, 2 * MIB)]
// 1 MiB + 1 rounds to 1 MiB + 512: large pool, a 20 MiB segment.
#[case::mib_1_plus_1_large(MIB + 1, false, 20 * MIB)]
#[case::mib_12_large_exact_segment(12 * MIB, false, 12 * MIB)]
fn pool_choice_through_malloc(#[case] size: usize, #[case] small: bool, #[case] segment: usize) {
    let (dev, mut a) = allocator(GIB, "");
    a.malloc(size, S0).unwrap();
    let s = a.stats();
    let (pool, other) = if small { (1, 2) } else { (2, 1) };
    assert_eq!(s.segment[pool].current, 1);
    assert_eq!(s.segment[other].current, 0);
    assert_eq!(s.reserved_bytes[pool].current, segment as i64);
    assert_eq!(dev.used_bytes(), segment);
    a.check_invariants().unwrap();
}

// ---------------------------------------------------------------------------------------------
// should_split
// ---------------------------------------------------------------------------------------------

#[rstest]
// Small pool: split when the remainder is at least 512 bytes.
#[case::small_remainder_0(MIB, MIB, true, "", false)]
#[case::small_remainder_511(MIB + 511, MIB, true, "", false)]
#[case::small_remainder_512(MIB + 512, MIB, true, "", true)]
#[case::small_ignores_max_split(2 * MIB, 512, true, "max_split_size_mb:20", true)]
// Large pool: split only when the remainder is strictly more than 1 MiB.
#[case::large_remainder_exactly_1mib(21 * MIB, 20 * MIB, false, "", false)]
#[case::large_remainder_1mib_plus_512(21 * MIB + 512, 20 * MIB, false, "", true)]
#[case::large_remainder_0(20 * MIB, 20 * MIB, false, "", false)]
// With max_split_size 20 MiB: a request of 20 MiB (not < max_split_size) is never split...
#[case::large_at_max_split(100 * MIB, 20 * MIB, false, "max_split_size_mb:20", false)]
// ...one just below it is.
#[case::large_below_max_split(100 * MIB, 20 * MIB - 512, false, "max_split_size_mb:20", true)]
// Expandable segments: the 512-byte rule in the large pool too, regardless of max_split_size.
#[case::expandable_remainder_512(
    20 * MIB + 512,
    20 * MIB,
    false,
    "expandable_segments:True",
    true
)]
#[case::expandable_remainder_511(
    20 * MIB + 511,
    20 * MIB,
    false,
    "expandable_segments:True",
    false
)]
#[case::expandable_over_max_split(
    200 * MIB,
    150 * MIB,
    false,
    "expandable_segments:True,max_split_size_mb:128",
    true
)]
fn split_decision(
    #[case] block: usize,
    #[case] size: usize,
    #[case] small: bool,
    #[case] conf: &str,
    #[case] split: bool,
) {
    assert_eq!(should_split(block, size, small, &config(conf)), split);
}

/// Splitting through the allocator: the large-pool remainder of a 20 MiB segment decides.
#[rstest]
// 20 MiB - (19 MiB - 512) = 1 MiB + 512 > 1 MiB: split, the block is the rounded request.
#[case::split(19 * MIB - 512, 19 * MIB - 512)]
// 20 MiB - 19 MiB = exactly 1 MiB: not split, the whole segment is handed out.
#[case::not_split(19 * MIB, 20 * MIB)]
fn split_through_malloc(#[case] first_fit: usize, #[case] block: usize) {
    let (_dev, mut a) = allocator(GIB, "");
    // A 5 MiB request makes a 20 MiB segment; freeing it leaves one 20 MiB block cached.
    let p = a.malloc(5 * MIB, S0).unwrap().ptr;
    a.free(p).unwrap();
    let got = a.malloc(first_fit, S0).unwrap();
    assert_eq!(got.ptr, p);
    assert_eq!(got.size, block);
    assert_eq!(a.reserved_bytes(), 20 * MIB);
    a.check_invariants().unwrap();
}

// ---------------------------------------------------------------------------------------------
// Best fit, streams and oversize blocks through the allocator
// ---------------------------------------------------------------------------------------------

/// Four cached whole segments on the default stream, in address order
/// A = 12 MiB, B = 16 MiB, C = 12 MiB, D = 14 MiB (each request >= 10 MiB gets a segment of
/// exactly its size). Freed out of address order so insertion order differs from address order.
fn four_cached_segments() -> (SimDevice, DeviceCachingAllocator<SimDevice>, [DevicePtr; 4]) {
    let (dev, mut a) = allocator(GIB, "");
    let sizes = [12 * MIB, 16 * MIB, 12 * MIB, 14 * MIB];
    let ptrs = sizes.map(|s| a.malloc(s, S0).unwrap().ptr);
    assert!(ptrs.windows(2).all(|w| w[0] < w[1]));
    for i in [3, 2, 1, 0] {
        a.free(ptrs[i]).unwrap();
    }
    assert_eq!(a.reserved_bytes(), 54 * MIB);
    (dev, a, ptrs)
}

/// `Some(i)`: served from cached segment i with a block of `block` bytes; `None`: a new
/// segment of `block` bytes.
#[rstest]
// Smallest fitting is 12 MiB (A and C): tie -> lowest address A. 12 - 11 = 1 MiB: not split.
#[case::tie_lowest_address(11 * MIB, Some(0), 12 * MIB)]
#[case::exact_fit(12 * MIB, Some(0), 12 * MIB)]
// 13 MiB: the 14 MiB block D, not the larger B.
#[case::smallest_that_fits(13 * MIB, Some(3), 14 * MIB)]
#[case::only_one_fits(15 * MIB, Some(1), 16 * MIB)]
#[case::none_fits(17 * MIB, None, 18 * MIB)]
// 2 MiB: smallest fitting is A (12 MiB); remainder 10 MiB > 1 MiB -> split, block = 2 MiB.
#[case::small_request_splits_smallest(2 * MIB, Some(0), 2 * MIB)]
fn best_fit(#[case] request: usize, #[case] from: Option<usize>, #[case] block: usize) {
    let (_dev, mut a, ptrs) = four_cached_segments();
    let got = a.malloc(request, S0).unwrap();
    assert_eq!(got.size, block);
    match from {
        Some(i) => {
            assert_eq!(got.ptr, ptrs[i]);
            assert_eq!(a.reserved_bytes(), 54 * MIB);
        }
        None => {
            assert!(!ptrs.contains(&got.ptr));
            assert_eq!(a.reserved_bytes(), 54 * MIB + block);
        }
    }
    a.check_invariants().unwrap();
}

/// A tie between equal-size free blocks in different segments: torch 2.7 takes the lowest
/// address, torch 2.15 the block of the oldest segment (its registration counter), here when the
/// lower block's segment was created later. (torch-oracle's `tie*.ops` probes, run top-down, show
/// both rules in the real allocators.)
#[rstest]
#[case::torch_2_7_lowest_address(TorchVersion::V2_7, false)]
#[case::torch_2_15_oldest_segment(TorchVersion::V2_15, true)]
fn best_fit_tie_by_version(#[case] version: TorchVersion, #[case] oldest_wins: bool) {
    let dev = SimDevice::address_only(0, GIB);
    let mut a =
        DeviceCachingAllocator::with_rules(dev.clone(), config(""), Rules::new(version)).unwrap();
    let p = a.malloc(12 * MIB, S0).unwrap().ptr;
    let q = a.malloc(12 * MIB, S0).unwrap().ptr;
    a.free(p).unwrap();
    a.empty_cache().unwrap();
    // The device's first fit reuses p's range: r is created after q but sits below it.
    let r = a.malloc(12 * MIB, S0).unwrap().ptr;
    assert_eq!(r, p);
    assert!(r < q);
    a.free(q).unwrap();
    a.free(r).unwrap();
    let got = a.malloc(12 * MIB, S0).unwrap().ptr;
    assert_eq!(got, if oldest_wins { q } else { r });
    assert_eq!(dev.counters().mallocs, 3);
    a.check_invariants().unwrap();
}

/// A cached block serves only requests on its own stream.
#[rstest]
#[case::large_same_stream(12 * MIB, false, true)]
#[case::large_other_stream(12 * MIB, true, false)]
#[case::small_same_stream(4 * KIB, false, true)]
#[case::small_other_stream(4 * KIB, true, false)]
fn stream_must_match(#[case] size: usize, #[case] other_stream: bool, #[case] hit: bool) {
    let (dev, mut a) = allocator(GIB, "");
    let s1 = dev.new_stream();
    let s2 = dev.new_stream();
    let p = a.malloc(size, s1).unwrap().ptr;
    a.free(p).unwrap();
    let reserved = a.reserved_bytes();
    let stream = if other_stream { s2 } else { s1 };
    let got = a.malloc(size, stream).unwrap();
    assert_eq!(got.ptr == p, hit);
    assert_eq!(got.stream, stream);
    let grown = a.reserved_bytes() - reserved;
    assert_eq!(grown, if hit { 0 } else { reserved });
    assert_eq!(dev.counters().mallocs, if hit { 1 } else { 2 });
    a.check_invariants().unwrap();
}

/// `max_split_size_mb:20`, `max_non_split_rounding` 20 MiB (default), one cached 40 MiB
/// oversize block. A normal request (< 20 MiB) never takes it; an oversize request takes it
/// only if 40 MiB < request + 20 MiB. A hit hands out the whole 40 MiB (never split).
#[rstest]
#[case::normal_request_never(12 * MIB, false)]
#[case::normal_request_just_below_max_split(20 * MIB - 512, false)]
// 40 < 20 + 20 is false: the boundary is strict.
#[case::oversize_at_rounding_limit(20 * MIB, false)]
// 40 < 20.5 + 20: taken.
#[case::oversize_within_rounding(20 * MIB + 512 * KIB, true)]
#[case::oversize_30(30 * MIB, true)]
#[case::oversize_exact(40 * MIB, true)]
#[case::oversize_too_big(41 * MIB, false)]
fn oversize_rules(#[case] request: usize, #[case] hit: bool) {
    let (dev, mut a) = allocator(GIB, "max_split_size_mb:20");
    let big = a.malloc(40 * MIB, S0).unwrap().ptr;
    a.free(big).unwrap();
    assert_eq!(a.stats().oversize_segments.current, 1);
    let got = a.malloc(request, S0).unwrap();
    assert_eq!(got.ptr == big, hit);
    if hit {
        assert_eq!(got.size, 40 * MIB);
        assert_eq!(a.reserved_bytes(), 40 * MIB);
        assert_eq!(a.stats().oversize_allocations.current, 1);
    } else {
        let rounded = round_size(request, a.config());
        assert_eq!(a.reserved_bytes(), 40 * MIB + get_allocation_size(rounded));
    }
    assert_eq!(dev.counters().mallocs, if hit { 1 } else { 2 });
    a.check_invariants().unwrap();
}

/// A normal request falls through an oversize block of the same stream and size class to the
/// device; without max_split_size the same block would be split.
#[test]
fn normal_request_splits_large_block_only_without_max_split() {
    for (conf, expect_split) in [("", true), ("max_split_size_mb:32", false)] {
        let (_dev, mut a) = allocator(GIB, conf);
        let big = a.malloc(64 * MIB, S0).unwrap().ptr;
        a.free(big).unwrap();
        let got = a.malloc(12 * MIB, S0).unwrap();
        assert_eq!(got.ptr == big, expect_split, "{conf:?}");
        a.check_invariants().unwrap();
    }
}

/// Freeing or querying an address that is not an allocated block is an error that names it,
/// including the pointer map's empty-slot marker `u64::MAX` and a block already freed; nothing
/// changes.
#[rstest]
#[case::never_allocated(0x1234_0000)]
#[case::empty_slot_marker(u64::MAX)]
#[case::zero(0)]
fn unknown_pointers_are_errors(#[case] ptr: DevicePtr) {
    let (_, mut a) = allocator(64 * MIB, "");
    let live = a.malloc(4096, StreamId::DEFAULT).unwrap();
    let before = a.stats();
    let err = a.free(ptr).unwrap_err();
    assert!(
        matches!(err, c10_cuda::Error::InvalidPointer { ptr: p, device: 0 } if p == ptr),
        "{err}"
    );
    assert!(a.record_stream(ptr, StreamId(7)).is_err());
    assert!(a.get_base_allocation(ptr).is_err());
    assert_eq!(a.block_info(ptr), None);
    assert_eq!(a.stats(), before);
    a.free(live.ptr).unwrap();
    assert!(a.free(live.ptr).is_err(), "a double free is refused");
    assert!(a.check_invariants().is_ok());
}

// ---------------------------------------------------------------------------------------------
// free: merging with idle neighbours
// ---------------------------------------------------------------------------------------------

/// A free merges the block with its idle neighbours (PyTorch's `free_block`: the lower one
/// first, then the upper one; the merged block is the freed one, keeping its request). One
/// small-pool segment tiled `[a 1024][b 2048][c 3072][rest]`; `a` and/or `c` are freed before
/// `b`. Each row gives the free blocks after `b`'s free, as `(offset, size, requested)`, and the
/// `inactive_split` count and bytes (free blocks of a split segment).
#[rstest]
#[case::no_idle_neighbour(false, false, &[(1024, 2048, 2000), (6144, 2 * MIB - 6144, 0)], 2, 2 * MIB - 4096)]
#[case::upper_only(false, true, &[(1024, 2 * MIB - 1024, 2000)], 1, 2 * MIB - 1024)]
#[case::lower_only(true, false, &[(0, 3072, 2000), (6144, 2 * MIB - 6144, 0)], 2, 2 * MIB - 3072)]
#[case::both(true, true, &[(0, 2 * MIB, 2000)], 0, 0)]
fn free_merges_idle_neighbours(
    #[case] free_a: bool,
    #[case] free_c: bool,
    #[case] free_blocks: &[(usize, usize, usize)],
    #[case] inactive_split: i64,
    #[case] inactive_split_bytes: usize,
) {
    let (_, mut alloc) = allocator(64 * MIB, "");
    let a = alloc.malloc(1000, S0).unwrap().ptr;
    let b = alloc.malloc(2000, S0).unwrap().ptr;
    let c = alloc.malloc(3000, S0).unwrap().ptr;
    assert_eq!(
        (b - a, c - a),
        (1024, 3072),
        "one segment, in address order"
    );
    if free_a {
        alloc.free(a).unwrap();
    }
    if free_c {
        alloc.free(c).unwrap();
    }
    alloc.free(b).unwrap();
    let snap = alloc.snapshot();
    let [segment] = snap.segments.as_slice() else {
        panic!("one segment: {:?}", snap.segments);
    };
    // The rest of the segment was never requested: a fresh segment's block asks for 0 bytes.
    let free: Vec<(usize, usize, usize)> = segment
        .blocks
        .iter()
        .filter(|blk| blk.state == c10_cuda::snapshot::BlockState::Inactive)
        .map(|blk| {
            let offset = blk.address - a;
            (
                offset as usize,
                blk.size as usize,
                blk.requested_size as usize,
            )
        })
        .collect();
    assert_eq!(free, free_blocks);
    let stats = alloc.stats();
    assert_eq!(stats.inactive_split[0].current, inactive_split);
    assert_eq!(
        stats.inactive_split_bytes[0].current,
        inactive_split_bytes as i64
    );
    alloc.check_invariants().unwrap();
}
