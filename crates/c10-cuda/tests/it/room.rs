//! The owner-side API: `try_malloc` misses, the segment view with tags, `plan_room` (windows,
//! whole-segment releases, expandable pages), `Placement::High` and `CappedDevice`, on
//! simulated devices whose capacity is the budget. Hand-built layouts with values worked out
//! from PyTorch's rules, and a property test: a proposed plan, once freed, always lets the
//! retry through, and reserved bytes never pass the capacity.

use c10_cuda::config::{AllocatorConfig, MIB};
use c10_cuda::device::{DeviceMemory, DevicePtr, StreamId};
use c10_cuda::{
    BlockState, CappedDevice, DeviceCachingAllocator, Error, MallocOutcome, Placement, Pool,
    RoomKind, RoomOptions, SimDevice,
};
use proptest::prelude::*;

const S: StreamId = StreamId::DEFAULT;

fn alloc(capacity: usize, conf: &str) -> DeviceCachingAllocator<SimDevice> {
    crate::support::allocator(capacity, conf).1
}

/// Ten 2 MiB blocks filling one 20 MiB segment of a 20 MiB device, tagged 0..9.
fn full_segment() -> (DeviceCachingAllocator<SimDevice>, Vec<DevicePtr>) {
    let mut a = alloc(20 * MIB, "");
    let ptrs: Vec<DevicePtr> = (0..10)
        .map(|i| {
            let p = a.malloc(2 * MIB, S).expect("fits").ptr;
            a.set_block_tag(p, i).expect("allocated");
            p
        })
        .collect();
    (a, ptrs)
}

fn miss(a: &mut DeviceCachingAllocator<SimDevice>, size: usize) -> c10_cuda::Miss {
    match a.try_malloc(size, S).expect("no device error") {
        MallocOutcome::Miss(m) => m,
        MallocOutcome::Allocated(got) => panic!("expected a miss, got {got:?}"),
    }
}

#[test]
fn a_miss_reports_the_request_and_records_no_oom() {
    let mut a = alloc(20 * MIB, "");
    a.record_history(100, c10_cuda::history::Clock::Logical);
    let first = a.malloc(15 * MIB, S).expect("fits");
    // 15 MiB -> a 16 MiB segment whose 1 MiB rest is not split off.
    assert_eq!((first.size, a.reserved_bytes()), (16 * MIB, 16 * MIB));
    let m = miss(&mut a, 10 * MIB);
    assert_eq!(m.request.requested, 10 * MIB);
    assert_eq!(m.request.size, 10 * MIB);
    assert_eq!(m.request.alloc_size, 10 * MIB);
    assert_eq!(m.request.pool, Pool::Large);
    assert_eq!(m.request.stream, S);
    assert_eq!(
        (m.device_free, m.reserved, m.allocated),
        (4 * MIB, 16 * MIB, 16 * MIB)
    );
    assert_eq!(a.stats().num_ooms, 0);
    assert!(
        a.history()
            .iter()
            .all(|e| e.action != c10_cuda::history::TraceAction::Oom)
    );
    a.check_invariants().unwrap();
    // malloc of the same request raises and records it.
    assert!(matches!(a.malloc(10 * MIB, S), Err(Error::OutOfMemory(_))));
    assert_eq!(a.stats().num_ooms, 1);
    // Once room is made the retry is served.
    a.free(first.ptr).unwrap();
    let got = a
        .try_malloc(10 * MIB, S)
        .unwrap()
        .allocation()
        .expect("served");
    assert_eq!(got.size, 10 * MIB);
    assert!(a.reserved_bytes() <= 20 * MIB);
    assert_eq!(a.request(3000, S).size, 3072);
    assert_eq!(a.request(3000, S).alloc_size, 2 * MIB);
    assert_eq!(a.request(3000, S).pool, Pool::Small);
}

#[test]
fn the_view_tiles_segments_and_shows_tags_until_free() {
    let (mut a, ptrs) = full_segment();
    a.free(ptrs[4]).unwrap();
    let segs: Vec<_> = a.segments().collect();
    assert_eq!(segs.len(), 1);
    let seg = segs[0];
    assert_eq!(
        (seg.address, seg.size(), seg.pool, seg.expandable),
        (ptrs[0], 20 * MIB, Pool::Large, false)
    );
    let blocks: Vec<_> = seg.blocks().collect();
    assert_eq!(blocks.len(), 10);
    for (i, b) in blocks.iter().enumerate() {
        assert_eq!(b.ptr, ptrs[0] + (i * 2 * MIB) as u64);
        assert_eq!(b.size, 2 * MIB);
        if i == 4 {
            assert_eq!((b.state, b.tag), (BlockState::Free, None));
        } else {
            assert_eq!((b.state, b.tag), (BlockState::Allocated, Some(i as u64)));
        }
    }
    assert_eq!(a.block_tag(ptrs[3]), Some(3));
    assert_eq!(a.block_tag(ptrs[4]), None);
    assert!(matches!(
        a.set_block_tag(ptrs[4], 1),
        Err(Error::InvalidPointer { .. })
    ));
    // A reused block starts untagged.
    let again = a.malloc(2 * MIB, S).unwrap();
    assert_eq!((again.ptr, a.block_tag(again.ptr)), (ptrs[4], None));
}

#[test]
fn the_window_is_the_cheapest_covering_run_and_the_retry_lands_in_it() {
    let (mut a, ptrs) = full_segment();
    let costs = [5.0, 1.0, 1.0, 1.0, 9.0, 0.2, 0.2, 9.0, 0.1, 0.1];
    let m = miss(&mut a, 5 * MIB);
    assert_eq!(m.device_free, 0);
    let plan = a
        .plan_room(&m, RoomOptions::default(), |t| Some(costs[t as usize]))
        .expect("a plan");
    // Three neighbours cover 5 MiB; 1+2+3 costs 3, every other run more, the whole segment 27.
    assert_eq!(plan.tags, [1, 2, 3]);
    assert_eq!(plan.cost.value(), 3.0);
    assert_eq!(plan.freed_bytes, 6 * MIB);
    assert_eq!(
        plan.kind,
        RoomKind::Window {
            segment: ptrs[0],
            start: ptrs[1],
            span: 6 * MIB
        }
    );
    assert_eq!(plan.scanned, 10);
    for t in &plan.tags {
        a.free(ptrs[*t as usize]).unwrap();
    }
    let got = a
        .try_malloc(5 * MIB, S)
        .unwrap()
        .allocation()
        .expect("served");
    // The merged 6 MiB block is handed out whole (a 1 MiB rest is not split off).
    assert_eq!((got.ptr, got.size), (ptrs[1], 6 * MIB));
    a.check_invariants().unwrap();
}

#[test]
fn free_blocks_join_windows_at_no_cost_and_unfreeable_blocks_break_them() {
    let (mut a, ptrs) = full_segment();
    a.free(ptrs[2]).unwrap();
    let m = miss(&mut a, 5 * MIB);
    // Block 1 cannot be freed; 3 is the cheapest partner of the free block 2.
    let costs = [1.0, f64::NAN, 0.0, 4.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0];
    let plan = a
        .plan_room(&m, RoomOptions::default(), |t| {
            (t != 1).then(|| costs[t as usize])
        })
        .expect("a plan");
    // Runs covering 5 MiB: {2 free, 3, 4} = 6, {3,4,5} = 8, {4,5,6} = 6, ... ties go to the
    // plan that frees fewer bytes, then to the first found.
    assert_eq!(plan.tags, [3, 4]);
    assert_eq!(plan.freed_bytes, 4 * MIB);
    // Infinite costs lose to any finite plan.
    let plan = a
        .plan_room(&m, RoomOptions::default(), |t| {
            Some(if t < 5 { f64::INFINITY } else { 100.0 })
        })
        .unwrap();
    assert_eq!(plan.tags, [5, 6, 7]);
    // Nothing freeable: no plan.
    assert!(a.plan_room(&m, RoomOptions::default(), |_| None).is_none());
}

#[test]
fn a_byte_credit_pays_for_spare_room() {
    // One full 20 MiB segment: blocks of 2, 2, 8, 2, 2, 2, 2 MiB tagged 0..6.
    let mut a = alloc(20 * MIB, "");
    let ptrs: Vec<DevicePtr> = [2, 2, 8, 2, 2, 2, 2]
        .iter()
        .enumerate()
        .map(|(i, &mib)| {
            let p = a.malloc(mib * MIB, S).unwrap().ptr;
            a.set_block_tag(p, i as u64).unwrap();
            p
        })
        .collect();
    let m = miss(&mut a, 3 * MIB);
    let costs = [1.0, 1.0, 2.5, 9.0, 9.0, 9.0, 9.0];
    let plan = |credit_per_mib: f64| {
        let options = RoomOptions {
            byte_credit: credit_per_mib / MIB as f64,
            ..RoomOptions::default()
        };
        a.plan_room(&m, options, |t| Some(costs[t as usize]))
            .unwrap()
    };
    // By total cost {0, 1} (4 MiB, 1 MiB spare) at 2.0 beats {2} (8 MiB, 5 MiB spare) at 2.5.
    assert_eq!(plan(0.0).tags, [0, 1]);
    // Credited x per spare MiB: 2 - x against 2.5 - 5x; {2} wins above x = 0.125.
    assert_eq!(plan(0.1).tags, [0, 1]);
    let p = plan(0.2);
    assert_eq!(p.tags, [2]);
    assert_eq!(
        (p.cost.value(), p.freed_bytes, p.kind),
        (
            2.5,
            8 * MIB,
            RoomKind::Window {
                segment: ptrs[0],
                start: ptrs[2],
                span: 8 * MIB
            }
        )
    );
}

#[test]
fn a_request_larger_than_every_segment_releases_whole_segments() {
    let mut a = alloc(40 * MIB, "");
    let mut ptrs = Vec::new();
    for i in 0..4u64 {
        // 8 MiB requests: two per 20 MiB segment (the 4 MiB rest stays free).
        let p = a.malloc(8 * MIB, S).unwrap().ptr;
        a.set_block_tag(p, i).unwrap();
        ptrs.push(p);
    }
    assert_eq!(a.reserved_bytes(), 40 * MIB);
    let m = miss(&mut a, 30 * MIB);
    assert_eq!((m.request.alloc_size, m.device_free), (30 * MIB, 0));
    let costs = [1.0, 2.0, 3.0, 4.0];
    let plan = a
        .plan_room(&m, RoomOptions::default(), |t| Some(costs[t as usize]))
        .expect("a plan");
    // No segment holds 30 MiB: both have to go back to the device.
    assert_eq!(plan.kind, RoomKind::Release { segments: 2 });
    let mut tags = plan.tags.clone();
    tags.sort_unstable();
    assert_eq!(tags, [0, 1, 2, 3]);
    assert_eq!(plan.cost.value(), 10.0);
    for &t in &plan.tags {
        a.free(ptrs[t as usize]).unwrap();
    }
    let got = a
        .try_malloc(30 * MIB, S)
        .unwrap()
        .allocation()
        .expect("served");
    assert_eq!(got.size, 30 * MIB);
    assert_eq!(a.reserved_bytes(), 30 * MIB);
    // 12 MiB more: the device has 10 MiB left and the only segment holds an untagged block.
    let m = miss(&mut a, 12 * MIB);
    assert_eq!(m.device_free, 10 * MIB);
    assert!(
        a.plan_room(&m, RoomOptions::default(), |_| Some(1.0))
            .is_none()
    );
    a.set_block_tag(got.ptr, 9).unwrap();
    let windows = RoomOptions {
        window: true,
        release: false,
        ..RoomOptions::default()
    };
    // A window inside it covers 12 MiB; releasing it also gives the device room.
    let w = a.plan_room(&m, windows, |_| Some(1.0)).unwrap();
    assert_eq!((w.tags.as_slice(), w.freed_bytes), (&[9][..], 30 * MIB));
    assert!(matches!(w.kind, RoomKind::Window { .. }));
    let release = RoomOptions {
        window: false,
        release: true,
        ..RoomOptions::default()
    };
    let r = a.plan_room(&m, release, |_| Some(1.0)).unwrap();
    assert_eq!(r.kind, RoomKind::Release { segments: 1 });
    a.check_invariants().unwrap();
}

#[test]
fn expandable_segments_free_whole_pages() {
    // Three 20 MiB pages; six 10 MiB blocks, two per page; 1 and 4 freed.
    let mut a = alloc(60 * MIB, "expandable_segments:True");
    let ptrs: Vec<DevicePtr> = (0..6u64)
        .map(|i| {
            let p = a.malloc(10 * MIB, S).unwrap().ptr;
            a.set_block_tag(p, i).unwrap();
            p
        })
        .collect();
    assert_eq!(a.reserved_bytes(), 60 * MIB);
    a.free(ptrs[1]).unwrap();
    a.free(ptrs[4]).unwrap();
    let m = miss(&mut a, 20 * MIB);
    // Every page still holds an allocated block, so nothing was unmapped.
    assert_eq!((m.device_free, m.reserved), (0, 60 * MIB));
    let costs = [5.0, 0.0, 1.0, 1.0, 0.0, 3.0];
    let pages = RoomOptions {
        window: false,
        release: true,
        ..RoomOptions::default()
    };
    let plan = a
        .plan_room(&m, pages, |t| Some(costs[t as usize]))
        .expect("a plan");
    // Page 1 (blocks 2 and 3) is the cheapest page to empty.
    assert_eq!(plan.kind, RoomKind::Pages { bytes: 20 * MIB });
    assert_eq!(plan.tags, [2, 3]);
    // With windows allowed, block 0 or block 2 next to free 1, or block 3 or 5 next to free
    // 4, make a 20 MiB mapped block; 2 (cost 1, before 3 in address order) wins.
    let plan = a
        .plan_room(&m, RoomOptions::default(), |t| Some(costs[t as usize]))
        .unwrap();
    assert_eq!(plan.tags, [2]);
    assert!(matches!(plan.kind, RoomKind::Window { .. }));
    a.free(ptrs[2]).unwrap();
    let got = a
        .try_malloc(20 * MIB, S)
        .unwrap()
        .allocation()
        .expect("served");
    assert_eq!(got.ptr, ptrs[1]);
    assert!(a.reserved_bytes() <= 60 * MIB);
    a.check_invariants().unwrap();
}

#[test]
fn high_placement_takes_the_top_of_the_block() {
    let mut a = alloc(1 << 30, "");
    let low = a.try_malloc(3 * MIB, S).unwrap().allocation().unwrap();
    let high = a
        .try_malloc_placed(4 * MIB, S, Placement::High)
        .unwrap()
        .allocation()
        .unwrap();
    assert_eq!(high.ptr, low.ptr + (16 * MIB) as u64);
    assert_eq!(high.size, 4 * MIB);
    a.check_invariants().unwrap();
    let stats = a.stats().memory_stats();
    assert_eq!(stats["inactive_split.all.current"], 1);
    assert_eq!(stats["inactive_split_bytes.all.current"], (13 * MIB) as i64);
    // In the middle of a free block of a split segment.
    let mid = a
        .try_malloc_placed(2 * MIB, S, Placement::High)
        .unwrap()
        .allocation()
        .unwrap();
    assert_eq!(mid.ptr, high.ptr - (2 * MIB) as u64);
    a.check_invariants().unwrap();
    let stats = a.stats().memory_stats();
    assert_eq!(stats["inactive_split_bytes.all.current"], (11 * MIB) as i64);
    // A rest of 1 MiB or less is not split off: the whole block is handed out.
    let rest = a
        .try_malloc_placed(10 * MIB + 512, S, Placement::High)
        .unwrap()
        .allocation()
        .unwrap();
    assert_eq!(
        (rest.ptr, rest.size),
        (low.ptr + (3 * MIB) as u64, 11 * MIB)
    );
    for p in [low.ptr, high.ptr, mid.ptr, rest.ptr] {
        a.free(p).unwrap();
    }
    a.check_invariants().unwrap();
    assert_eq!(a.stats().memory_stats()["inactive_split.all.current"], 0);
    // Small pool too.
    let s1 = a
        .try_malloc_placed(1000, S, Placement::High)
        .unwrap()
        .allocation()
        .unwrap();
    let s2 = a.try_malloc(1000, S).unwrap().allocation().unwrap();
    assert_eq!(s1.ptr, s2.ptr + (2 * MIB - 1024) as u64);
    a.check_invariants().unwrap();
}

#[test]
fn a_capped_device_holds_the_allocator_under_its_limit() {
    let dev = CappedDevice::new(SimDevice::address_only(0, 1 << 30), 50 * MIB);
    let info = dev.mem_get_info().unwrap();
    assert_eq!((info.total, info.free), (50 * MIB, 50 * MIB));
    let mut a = DeviceCachingAllocator::new(dev, AllocatorConfig::default()).unwrap();
    let x = a.malloc(30 * MIB, S).unwrap();
    // 30 MiB more does not fit in the 20 MiB left, even after releasing the (empty) cache.
    assert!(
        matches!(a.try_malloc(30 * MIB, S).unwrap(), MallocOutcome::Miss(m) if m.device_free == 20 * MIB)
    );
    assert!(matches!(a.malloc(30 * MIB, S), Err(Error::OutOfMemory(_))));
    let y = a.malloc(20 * MIB, S).unwrap();
    assert_eq!(a.device().used(), 50 * MIB);
    a.free(x.ptr).unwrap();
    a.free(y.ptr).unwrap();
    a.empty_cache().unwrap();
    assert_eq!((a.device().used(), a.device().inner().used_bytes()), (0, 0));
    // Pages count as well.
    let dev = CappedDevice::new(SimDevice::address_only(0, 1 << 30), 40 * MIB);
    let config: AllocatorConfig = "expandable_segments:True".parse().unwrap();
    let mut a = DeviceCachingAllocator::new(dev, config).unwrap();
    a.malloc(30 * MIB, S).unwrap();
    assert_eq!(a.reserved_bytes(), 40 * MIB);
    assert!(matches!(
        a.try_malloc(1, S).unwrap(),
        MallocOutcome::Miss(_)
    ));
    assert!(a.reserved_bytes() <= 40 * MIB);
}

const CONFIGS: &[&str] = &[
    "",
    "expandable_segments:True",
    "max_split_size_mb:64",
    "roundup_power2_divisions:4",
    "garbage_collection_threshold:0.6,per_process_memory_fraction:0.8",
];

fn size() -> impl Strategy<Value = usize> {
    prop_oneof![
        3 => 1..MIB,
        4 => MIB..20 * MIB,
        2 => 20 * MIB..=200 * MIB,
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random requests on a device whose capacity is the budget; every miss is answered by a
    /// plan with random costs; the plan's blocks are freed and the request retried.
    #[test]
    fn plans_always_let_the_retry_through(
        config in 0..CONFIGS.len(),
        capacity in 40 * MIB..=400 * MIB,
        sizes in prop::collection::vec((size(), any::<u64>(), 0..4u8), 120),
    ) {
        let config = AllocatorConfig::parse(CONFIGS[config]).unwrap();
        let mut a = DeviceCachingAllocator::new(SimDevice::address_only(0, capacity), config).unwrap();
        let mut live: Vec<(DevicePtr, u64)> = Vec::new();
        let mut next_tag = 0u64;
        for (step, &(size, seed, action)) in sizes.iter().enumerate() {
            if action == 0 && !live.is_empty() {
                let (p, _) = live.swap_remove(seed as usize % live.len());
                a.free(p).unwrap();
                continue;
            }
            let got = match a.try_malloc(size, S).unwrap() {
                MallocOutcome::Allocated(got) => Some(got),
                MallocOutcome::Miss(m) => {
                    // Every third block cannot be freed; costs from the seed.
                    let cost = |t: u64| (t % 3 != 0).then_some(((t ^ seed) % 97) as f64);
                    // A credit for spare room, sometimes above the blocks' cost per byte.
                    let options = RoomOptions {
                        byte_credit: (seed % 4) as f64 * 1e-6,
                        ..RoomOptions::default()
                    };
                    match a.plan_room(&m, options, cost) {
                        None => None,
                        Some(plan) => {
                            prop_assert!(!plan.tags.is_empty());
                            for t in &plan.tags {
                                let k = live.iter().position(|&(_, u)| u == *t).expect("a live tag");
                                let (p, _) = live.swap_remove(k);
                                a.free(p).unwrap();
                            }
                            let retry = a.try_malloc(size, S).unwrap();
                            prop_assert!(
                                retry.allocation().is_some(),
                                "step {step}: plan {plan:?} for {m:?} did not let the retry through"
                            );
                            retry.allocation()
                        }
                    }
                }
            };
            if let Some(got) = got {
                a.set_block_tag(got.ptr, next_tag).unwrap();
                live.push((got.ptr, next_tag));
                next_tag += 1;
            }
            prop_assert!(a.reserved_bytes() <= capacity);
            if let Err(e) = a.check_invariants() {
                panic!("step {step}: {e}");
            }
        }
    }
}
