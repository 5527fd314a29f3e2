//! Reports after a scripted sequence, as insta snapshots checked by hand: `memory_summary`,
//! the `memory_stats()` table, the out-of-memory message, and `snapshot()` segments as text.
//!
//! The script, on a 48 MiB simulated device with the default config (`s0` the default
//! stream, `s1` a side stream; a = 1000 B, b = 300,000 B, ... as below):
//!
//! | step | call                        | rounded           | where                                   |
//! |------|-----------------------------|-------------------|-----------------------------------------|
//! | 1    | a = malloc(1000)            | 1024              | miss: small segment S (2 MiB), split    |
//! | 2    | b = malloc(300000)          | 300032 (586*512)  | S's remainder (2096128), split again    |
//! | 3    | c = malloc(5 MiB)           | 5242880           | miss: large segment L1 (20 MiB), split  |
//! | 4    | d = malloc(12 MiB + 100)    | 12583424          | L1's 15 MiB remainder, split (3145216)  |
//! | 5    | e = malloc(16 MiB)          | 16777216          | miss: segment L2 (16 MiB), unsplit      |
//! | 6    | record_stream(b, s1), free b|                   | b pending (event on s1 not complete)    |
//! | 7    | free c                      |                   | inactive, inside split L1               |
//! | 8    | free e                      |                   | cached whole segment L2                 |
//! | 9    | malloc(39 MiB + 1)          | 40894976          | OOM (see below)                         |
//! | 10   | f = malloc(2 MiB)           | 2097152           | L1's 3145216 tail, not split            |
//!
//! Step 9: reserved is 2 + 20 + 16 = 38 MiB, so the 40 MiB segment does not fit the 10 MiB
//! left. No max_split_size, so the full release runs: b's event is synchronized (b merges with
//! S's free tail), L2 is freed (reserved 22 MiB), nothing fits, the retry sees 26 MiB free and
//! fails: one retry, one OOM. Step 10: 3145216 - 2097152 = 1048064 <= 1 MiB, so not split.

use std::fmt::Write as _;

use c10_cuda::config::{AllocatorConfig, MIB};
use c10_cuda::device::StreamId;
use c10_cuda::history::Clock;
use c10_cuda::snapshot::DeviceSnapshot;
use c10_cuda::summary::{memory_summary, stats_table};
use c10_cuda::{DeviceCachingAllocator, Error, SimDevice};

const S0: StreamId = StreamId::DEFAULT;

struct Report {
    before_oom: DeviceSnapshot,
    oom: String,
    end: DeviceSnapshot,
    alloc: DeviceCachingAllocator<SimDevice>,
}

fn script() -> Report {
    let dev = SimDevice::address_only(0, 48 * MIB);
    let mut a = DeviceCachingAllocator::new(dev.clone(), AllocatorConfig::default()).unwrap();
    a.record_history(1000, Clock::Logical);
    let s1 = dev.new_stream();
    let _a = a.malloc(1000, S0).unwrap();
    let b = a.malloc(300_000, S0).unwrap();
    let c = a.malloc(5 * MIB, S0).unwrap();
    let _d = a.malloc(12 * MIB + 100, S0).unwrap();
    let e = a.malloc(16 * MIB, S0).unwrap();
    a.record_stream(b.ptr, s1).unwrap();
    a.free(b.ptr).unwrap();
    a.free(c.ptr).unwrap();
    a.free(e.ptr).unwrap();
    let before_oom = a.snapshot();
    let oom = match a.malloc(39 * MIB + 1, S0) {
        Err(Error::OutOfMemory(e)) => e.to_string(),
        other => panic!("expected OOM, got {other:?}"),
    };
    let f = a.malloc(2 * MIB, S0).unwrap();
    assert_eq!(f.size, 3 * MIB - 512);
    let end = a.snapshot();
    a.check_invariants().unwrap();
    Report {
        before_oom,
        oom,
        end,
        alloc: a,
    }
}

/// Segments and blocks as text: block offsets relative to their segment, no addresses.
fn render(snap: &DeviceSnapshot) -> String {
    let mut out = String::new();
    for (i, s) in snap.segments.iter().enumerate() {
        writeln!(
            out,
            "segment {i}: {} stream {} expandable {} total {} allocated {} active {} requested {}",
            s.segment_type(),
            s.stream,
            s.is_expandable,
            s.total_size,
            s.allocated_size,
            s.active_size,
            s.requested_size
        )
        .unwrap();
        for b in &s.blocks {
            writeln!(
                out,
                "  +{:<9} size {:<9} requested {:<9} {}",
                b.address - s.address,
                b.size,
                b.requested_size,
                b.state.as_str()
            )
            .unwrap();
        }
    }
    out
}

fn redacted(f: impl FnOnce()) {
    insta::with_settings!({filters => vec![(r"0x[0-9a-fA-F]{6,}", "[addr]")]}, { f() });
}

/// Before the OOM (after step 8): S = [a allocated 1024 | b pending 300032 | tail 1796096],
/// L1 = [c inactive 5 MiB | d allocated 12583424 | tail 3145216], L2 = [e inactive 16 MiB].
/// S: active = a + b = 301056, requested 1000 + 300000 = 301000. L1: allocated = active = d.
/// (Inactive blocks keep the requested size of their last allocation, as in PyTorch; the
/// never-allocated tails show 0.)
///
/// At the end: b's event was synchronized and b absorbed S's tail (2096128, keeping b's
/// requested 300000); L2 is gone; f took L1's tail whole (3145216, requested 2 MiB).
/// L1: allocated = active = 12583424 + 3145216 = 15728640, requested 12583012 + 2097152
/// = 14680164.
#[test]
fn snapshot_segments_as_text() {
    let r = script();
    let text = format!(
        "before the OOM\n{}\nat the end\n{}",
        render(&r.before_oom),
        render(&r.end)
    );
    redacted(|| insta::assert_snapshot!(text));
}

/// Requested 39 MiB + 1 (prints 39.00 MiB), segment 40 MiB. Free on the device after the
/// release: 48 - 22 = 26 MiB. Allocated: a + d = 1024 + 12583424 = 12584448 B = 12.0010 MiB
/// ("12.00 MiB"). Reserved 22 MiB = 23068672; unallocated 23068672 - 12584448 = 10484224 B
/// = 9.9985 MiB ("10.00 MiB"), more than a quarter of reserved: the expandable-segments hint.
#[test]
fn oom_message() {
    let r = script();
    redacted(|| insta::assert_snapshot!(r.oom));
}

/// Hand count (B = bytes; "alloc/freed/cur/peak" = allocated/freed/current/peak):
///
/// - allocation: all 6/3/3/5 (a..f; b, c, e freed; 5 live after step 5); small 2/1/1/2;
///   large 4/2/2/3.
/// - active: the same numbers (b's active count falls at step 9, after the peak).
/// - segment: all 3/1/2/3; small 1/0/1/1; large 2/1/1/2 (L2 freed at step 9).
/// - reserved_bytes: small 2097152/0/2097152/2097152; large 20971520 + 16777216 = 37748736
///   allocated, 16777216 freed, 20971520 current, 37748736 peak; all adds 2 MiB to each
///   (39845888 / 16777216 / 23068672 / 39845888).
/// - allocated_bytes: small 1024 + 300032 = 301056 / 300032 / 1024 / 301056; large
///   5242880 + 12583424 + 16777216 + 3145216 = 37748736 / 5242880 + 16777216 = 22020096 /
///   15728640 / 34603520 (c + d + e after step 5); all 38049792 / 22320128 / 15729664 /
///   34904576. active_bytes: the same.
/// - requested_bytes: small 301000 / 300000 / 1000 / 301000; large 5242880 + 12583012 +
///   16777216 + 2097152 = 36700260 / 22020096 / 14680164 / 34603108; all 37001260 /
///   22320096 / 14681164 / 34904108.
/// - inactive_split (free blocks in split segments): small +1 at step 1 (the tail), count
///   unchanged at step 9 (b absorbs the tail: -1 +1): 1/0/1/1. Large +1 at step 3, +1 at
///   step 7 (c), -1 at step 10 (f takes the tail): 2/1/1/2. All 3/1/2/3.
/// - inactive_split_bytes: small +2096128 (step 1), -300032 (step 2, b), +300032 (step 9:
///   -1796096 for the absorbed tail, +2096128 for b) = 2396160 / 300032 / 2096128 / 2096128.
///   Large +15728640 (step 3), -12583424 (step 4), +5242880 (step 7), -3145216 (step 10) =
///   20971520 / 15728640 / 5242880 / 15728640. All: 23367680 / 16028672 / 7339008, peak
///   2096128 - 300032 + 15728640 = 17524736 (after step 3).
/// - oversize_*: 0 (max_split_size unlimited, which reads -1).
/// - num_alloc_retries 1, num_ooms 1, num_sync_all_streams 1 (step 9), num_device_alloc 3
///   (S, L1, L2), num_device_free 1 (L2).
#[test]
fn stats_table_after_script() {
    let r = script();
    redacted(|| insta::assert_snapshot!(stats_table(&r.alloc.stats())));
}

/// The same figures in PyTorch's summary format. Byte cells switch unit at 768 of the next
/// unit, chosen by the "all" row of the column: every byte figure here is below 768 MiB and
/// at least 768 KiB, so the all rows print in KiB, floor-divided (15729664 B -> 15361 KiB, 34904576 B -> 34086 KiB),
/// and pool rows use the all row's unit (1024 B -> 1 KiB). Counts print plainly.
#[test]
fn memory_summary_after_script() {
    let r = script();
    redacted(|| insta::assert_snapshot!(memory_summary(0, &r.alloc.stats(), false)));
}
