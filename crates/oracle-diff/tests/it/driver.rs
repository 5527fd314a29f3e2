//! The driver and the comparison without the oracle: our output round-trips through the
//! oracle's JSON format, the comparison names a tie-break difference between the versions'
//! rules, and a map that fails is logged as PyTorch's calls (creates released, nothing mapped).

use c10_cuda::{Rules, TorchVersion};
use oracle_diff::compare::{Call, compare_for, steps};
use oracle_diff::driver;
use oracle_diff::script::Script;
use oracle_diff::trace::{Line, parse_output, to_jsonl};

const TIE: &str = "env FAKECUDA_TOPDOWN=1\nalloc 0 512MiB\nalloc 1 512MiB\nalloc 2 512MiB\n\
                   free 2\nfree 0\nfree 1\nalloc 3 512MiB\nsnapshot\nstats\n";

#[test]
fn our_lines_round_trip_through_json() {
    let s = Script::parse(TIE).unwrap();
    let lines = driver::run(&s, Rules::default()).unwrap();
    assert!(matches!(lines.first(), Some(Line::Config { .. })));
    assert!(matches!(lines.last(), Some(Line::Stats { last: true, .. })));
    assert_eq!(parse_output(&to_jsonl(&lines)).unwrap(), lines);
}

#[test]
fn the_versions_break_the_tie_differently_and_the_comparison_says_where() {
    let s = Script::parse(TIE).unwrap();
    let new = driver::run(&s, Rules::new(TorchVersion::V2_15)).unwrap();
    let old = driver::run(&s, Rules::new(TorchVersion::V2_7)).unwrap();
    let seg_of_3 = |lines: &[Line]| {
        lines.iter().find_map(|l| match l {
            Line::Alloc { id, seg, .. } if id == "3" => Some(*seg),
            _ => None,
        })
    };
    // Top-down addresses: segment 0 is the oldest and the highest.
    assert_eq!(seg_of_3(&new), Some(0));
    assert_eq!(seg_of_3(&old), Some(2));
    let d = compare_for(&s, &new, &old).expect("they differ");
    assert_eq!(d.step, 6);
    assert_eq!(d.what, "allocation placement (segment, offset, block size)");
    assert!(compare_for(&s, &new, &new).is_none());
}

#[test]
fn a_failed_map_is_logged_as_pytorch_makes_it() {
    // 3 pages of 20 MiB fit on a 64 MiB device; a 70 MiB request needs 4.
    let s = Script::parse(
        "env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\nenv FAKECUDA_TOTAL_MEM=64MiB\n\
         alloc a 70MiB\n",
    )
    .unwrap();
    let lines = driver::run(&s, Rules::pytorch_exact(TorchVersion::V2_15)).unwrap();
    let first = &steps(&lines)[0];
    // Reserve 9/8 of the device in whole pages (80 MiB), then (first try and retry) three creates that are released and one that fails:
    // in canonical form only the failures, no page mapped or unmapped.
    assert_eq!(
        first.memory,
        vec![
            Call::Reserve(80 << 20, Some(0)),
            Call::MapFailed(20 << 20),
            Call::MapFailed(20 << 20),
        ]
    );
    assert!(matches!(first.line, Some(Line::Oom { .. })));
    let Some(Line::Stats { fake, .. }) = lines.last() else {
        panic!("final line");
    };
    assert_eq!(fake["cuMemCreate"], 6);
    assert_eq!(fake["cuMemCreate_failed"], 2);
    assert_eq!(fake["cuMemRelease"], 6);
    assert_eq!(fake["cuMemMap"], 0);
    assert_eq!(fake["cuMemUnmap"], 0);
}

/// Our run notes the op after which a private pool was forgotten while an allocation of it
/// was live (expandable segments: its count of device allocations reached 0); from there on
/// PyTorch goes on with the erased pool and is not compared (issue 29). Here: after P1's
/// destructor (op 9) the global `empty_cache` (op 11) unmaps its last page and forgets it
/// while 68 is live (torch 2.15.0 then leaves 68's segment out of its snapshot).
#[test]
fn an_erased_pool_with_live_blocks_is_noted() {
    let s = Script::parse(
        "env PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.63,expandable_segments:True
pool_create P1 mempool
pool_begin P1 all
alloc 67 77594624
alloc 68 39845888
free 67
alloc 72 2097152
pool_end P1
pool_release P1
pool_delete P1
free 72
empty_cache
snapshot
",
    )
    .unwrap();
    let (_, notes) = driver::run_noting(&s, Rules::new(TorchVersion::V2_15)).unwrap();
    assert_eq!(notes.erased_pool_with_live_blocks, Some(11));
    // Without expandable segments the pool keeps counting its segment: nothing is noted.
    let mut plain = s.clone();
    plain.env.clear();
    let (_, notes) = driver::run_noting(&plain, Rules::new(TorchVersion::V2_15)).unwrap();
    assert_eq!(notes.erased_pool_with_live_blocks, None);
    let (_, notes) = driver::run_noting(&Script::parse(TIE).unwrap(), Rules::default()).unwrap();
    assert_eq!(notes, driver::Notes::default());
}

/// The fake's `cudaStreamSynchronize` (what our allocator calls before unmapping pages of an
/// expandable segment) completes the events recorded on that stream only, also through the
/// smart pointers that forward a device.
#[test]
fn a_stream_sync_completes_that_streams_events() {
    use c10_cuda::device::{DeviceMemory, StreamId};
    use oracle_diff::fake::{FakeConfig, FakeCuda};
    use std::sync::Arc;

    let fake = FakeCuda::new(FakeConfig::default());
    let boxed: Box<dyn DeviceMemory> = Box::new(fake.clone());
    let shared: Arc<FakeCuda> = Arc::new(fake.clone());
    for device in [&boxed as &dyn DeviceMemory, &shared] {
        let on1 = device.create_event().unwrap();
        let on2 = device.create_event().unwrap();
        device.record_event(on1, StreamId(1)).unwrap();
        device.record_event(on2, StreamId(2)).unwrap();
        assert!(!device.query_event(on1).unwrap() && !device.query_event(on2).unwrap());
        device.synchronize_stream(StreamId(1)).unwrap();
        assert!(
            device.query_event(on1).unwrap(),
            "stream 1's event completes"
        );
        assert!(!device.query_event(on2).unwrap(), "stream 2's does not");
        fake.complete_stream(None);
    }
}
