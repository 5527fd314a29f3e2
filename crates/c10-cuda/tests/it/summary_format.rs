//! Size formatting rules and `memory_summary()` text, checked against PyTorch's formats.
//!
//! `format_size` is the C++ `format_size` of the OOM message; `format_size_summary` and
//! `format_count` are `_format_size` / `_format_count` of `torch/cuda/memory.py`. The summary
//! snapshots were compared byte for byte with PyTorch's `memory_summary` formatting code run on
//! the same `memory_stats()` map.

use c10_cuda::stats::{DeviceStats, Stat, StatArray, StatType};
use c10_cuda::summary::{
    format_count, format_size, format_size_summary, memory_summary, stats_table,
};
use rstest::rstest;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const TIB: u64 = 1 << 40;

#[rstest]
#[case::zero(0, "0 bytes")]
#[case::b511(511, "511 bytes")]
#[case::b767(767, "767 bytes")]
#[case::b768(768, "768 bytes")]
#[case::b1023(1023, "1023 bytes")]
#[case::b1024_still_bytes(1024, "1024 bytes")]
#[case::b1025_first_kib(1025, "1.00 KiB")]
#[case::half_even_tie(1152, "1.12 KiB")]
#[case::kib_1_5(KIB + KIB / 2, "1.50 KiB")]
#[case::mib_1_still_kib(MIB, "1024.00 KiB")]
#[case::mib_1_plus_1(MIB + 1, "1.00 MiB")]
#[case::mib_20(20 * MIB, "20.00 MiB")]
#[case::gib_1_still_mib(GIB, "1024.00 MiB")]
#[case::gib_1_plus_1(GIB + 1, "1.00 GiB")]
#[case::tib_1_5(TIB + TIB / 2, "1536.00 GiB")]
#[case::u64_max(u64::MAX, "17179869184.00 GiB")]
fn format_size_follows_cpp(#[case] bytes: u64, #[case] expected: &str) {
    assert_eq!(format_size(bytes), expected);
}

#[rstest]
#[case::zero(0, "     0 B  ")]
#[case::b511(511, "   511 B  ")]
#[case::b767(767, "   767 B  ")]
#[case::b768(768, "   768 B  ")]
#[case::b1023(1023, "  1023 B  ")]
#[case::b1024(1024, "  1024 B  ")]
#[case::b1025(1025, "  1025 B  ")]
#[case::below_768_kib(768 * 1024 - 1, "786431 B  ")]
#[case::at_768_kib(768 * 1024, "   768 KiB")]
#[case::mib_1(MIB as i64, "  1024 KiB")]
#[case::mib_1_plus_1(MIB as i64 + 1, "  1024 KiB")]
#[case::below_768_mib(768 * MIB as i64 - 1, "786431 KiB")]
#[case::at_768_mib(768 * MIB as i64, "   768 MiB")]
#[case::gib_1(GIB as i64, "  1024 MiB")]
#[case::tib_1_5((TIB + TIB / 2) as i64, "  1536 GiB")]
#[case::pib_1(1 << 50, "  1024 TiB")]
#[case::eib_1(1 << 60, "  1024 PiB")]
#[case::i64_max(i64::MAX, "  8191 PiB")]
#[case::negative_small(-1, "    -1 B  ")]
#[case::negative_large(-(GIB as i64), "-1073741824 B  ")]
fn format_size_summary_follows_memory_py(#[case] bytes: i64, #[case] expected: &str) {
    assert_eq!(format_size_summary(bytes), expected);
}

#[rstest]
#[case::zero(0, "      0   ")]
#[case::below_k(749_999, " 749999   ")]
#[case::at_k(750_000, "    750 K ")]
#[case::floor_k(1_234_567, "   1234 K ")]
#[case::below_m(749_999_999, " 749999 K ")]
#[case::at_m(750_000_000, "    750 M ")]
#[case::no_unit_past_m(1_000_000_000_000_000, "1000000000 M ")]
#[case::negative(-5, "     -5   ")]
fn format_count_follows_memory_py(#[case] count: i64, #[case] expected: &str) {
    assert_eq!(format_count(count), expected);
}

/// A `DeviceStats` where every printed field has its own value, so a mis-wired row or column
/// shows up in the snapshot.
///
/// Byte stats: `(100 * (array + 1) + 10 * pool + field)` MiB plus 4321 bytes, with `pool` the
/// `StatType` index (all 0, small 1, large 2) and `field` current 0, peak 1, allocated 2,
/// freed 3; counts: `1000 * (array + 1) + 10 * pool + field`. A few totals are raised to show
/// the unit being chosen by the "all" row (TiB, M).
fn distinct_stats() -> DeviceStats {
    fn fill(array: &mut StatArray, index: u64, bytes: bool) {
        for pool in StatType::ALL {
            let p = pool as u64;
            let v = |field: u64| {
                if bytes {
                    ((100 * (index + 1) + 10 * p + field) * MIB + 4321) as i64
                } else {
                    (1000 * (index + 1) + 10 * p + field) as i64
                }
            };
            array[pool as usize] = Stat {
                current: v(0),
                peak: v(1),
                allocated: v(2),
                freed: v(3),
            };
        }
    }
    let mut s = DeviceStats::default();
    fill(&mut s.allocation, 0, false);
    fill(&mut s.segment, 1, false);
    fill(&mut s.active, 2, false);
    fill(&mut s.inactive_split, 3, false);
    fill(&mut s.allocated_bytes, 4, true);
    fill(&mut s.reserved_bytes, 5, true);
    fill(&mut s.active_bytes, 6, true);
    fill(&mut s.inactive_split_bytes, 7, true);
    fill(&mut s.requested_bytes, 8, true);
    // Totals large enough to switch unit: the pool rows follow the unit of their "all" row.
    s.reserved_bytes[StatType::Aggregate as usize].allocated = (3 * TIB + 7 * GIB) as i64;
    s.reserved_bytes[StatType::LargePool as usize].allocated = (2 * TIB + 5 * GIB) as i64;
    s.reserved_bytes[StatType::SmallPool as usize].allocated = (TIB + 2 * GIB) as i64;
    s.allocation[StatType::Aggregate as usize].allocated = 2_345_678_901;
    s.allocation[StatType::LargePool as usize].allocated = 1_234_567_890;
    s.allocation[StatType::SmallPool as usize].allocated = 1_111_111_011;
    s.oversize_allocations = Stat {
        current: 11,
        peak: 12,
        allocated: 13,
        freed: 14,
    };
    s.oversize_segments = Stat {
        current: 21,
        peak: 22,
        allocated: 23,
        freed: 24,
    };
    s.num_alloc_retries = 5;
    s.num_ooms = 3;
    s.num_sync_all_streams = 7;
    s.num_device_alloc = 31;
    s.num_device_free = 29;
    s.num_oom_rejections = 37;
    s.max_split_size = Some(200 * MIB);
    s
}

#[test]
fn stats_table_of_distinct_stats() {
    let table = stats_table(&distinct_stats());
    // torch 2.15's keys (the default rules): 2.7's 122 and num_oom_rejections.
    assert_eq!(table.lines().count(), 123);
    let old = DeviceStats {
        torch: c10_cuda::TorchVersion::V2_7,
        ..distinct_stats()
    };
    assert_eq!(stats_table(&old).lines().count(), 122);
    assert!(!stats_table(&old).contains("num_oom_rejections"));
    insta::assert_snapshot!("stats_table_distinct", table);
}

#[test]
fn stats_table_of_zero_stats() {
    insta::assert_snapshot!("stats_table_zero", stats_table(&DeviceStats::default()));
}

#[rstest]
#[case::full(false)]
#[case::abbreviated(true)]
fn memory_summary_of_distinct_stats(#[case] abbreviated: bool) {
    let name = if abbreviated {
        "summary_distinct_abbreviated"
    } else {
        "summary_distinct_full"
    };
    insta::assert_snapshot!(name, memory_summary(1, &distinct_stats(), abbreviated));
}

#[rstest]
#[case::full(false)]
#[case::abbreviated(true)]
fn memory_summary_of_zero_stats(#[case] abbreviated: bool) {
    let name = if abbreviated {
        "summary_zero_abbreviated"
    } else {
        "summary_zero_full"
    };
    insta::assert_snapshot!(
        name,
        memory_summary(0, &DeviceStats::default(), abbreviated)
    );
}

#[test]
fn memory_summary_shape() {
    let full = memory_summary(12, &distinct_stats(), false);
    let short = memory_summary(12, &distinct_stats(), true);
    // 6 header lines, 9 metrics x (separator + 3 rows), 2 oversize x 2, closing line.
    assert_eq!(full.lines().count(), 6 + 9 * 4 + 2 * 2 + 1);
    assert_eq!(short.lines().count(), 6 + 9 * 2 + 2 * 2 + 1);
    for line in full.lines().chain(short.lines()) {
        assert_eq!(line.len(), 77, "{line:?}");
        assert!(line.starts_with('|') && line.ends_with('|'));
    }
    assert!(full.ends_with("|\n"));
    assert!(full.contains("device ID 12 "));
    // Abbreviated keeps only the "all" rows.
    assert!(!short.contains("from large pool"));
    assert_eq!(full.matches("from small pool").count(), 9);
}
