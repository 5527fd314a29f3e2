//! Making room for a missed request by moving live blocks instead of evicting them: which
//! allocated blocks to copy elsewhere so that the freed addresses let the request through
//! (compaction, issue 28's "move a live tensor instead of recomputing").
//!
//! Under a device budget most misses of the window strategies come with enough free bytes in
//! the allocator's cached blocks, only not in one piece: the storages' bytes fit the device,
//! their blocks do not. Evicting then throws away work that must be recomputed; a device copy
//! of the blocks in the way costs their bytes read and written once. A plan is one of:
//! - **window**: a contiguous run of free and movable blocks inside one segment of the
//!   request's pool and stream whose span covers the rounded request; every movable block in
//!   it moves out, and once they are freed the run merges into one free block;
//! - **release** (not under expandable segments): whole segments, every block free or
//!   movable, emptied so that the allocator's retry gives them back to the device and the
//!   device can give the request its new segment.
//!
//! The moves must land outside what is vacated. The plan replays the allocator's best fit
//! (smallest free block of the pool and stream that holds the rounded size, lowest address on
//! ties, PyTorch's oversize rules, `should_split`, the low end of a split block) over the free
//! blocks as they are now, the largest moved block first, and is dropped as soon as a copy's
//! best fit lies inside the vacated addresses or nothing holds it. Windows are ranked by the
//! bytes they move (a copy's time is its bytes); the cheapest few are replayed. When none of
//! them works, they are replayed again with **holds**: every free block inside the vacated
//! addresses is first allocated itself (an exact-size request, largest first, replayed like
//! the copies), so that no copy's best fit can land there; the holds are freed with the
//! originals (resnet18-64 at ratio 0.5: the only 196 MiB window holds free 6 and 12 MiB
//! blocks that were the best fit of its 5 and 9 MiB copies). Only blocks above the small
//! pool's 1 MiB can be held. When the owner allows it (its last resort before out of memory),
//! a window's copy that no cached block holds takes a new segment of the allocator's size for
//! it (`get_allocation_size`) out of the device's free bytes, as the allocator would. The
//! owner checks each copy's address when it makes them and the request by retrying
//! `try_malloc`.

use c10_cuda::config::AllocatorConfig;
use c10_cuda::device::{DevicePtr, StreamId};
use c10_cuda::segment_view::Pool;
use c10_cuda::sizes::{SMALL_BUFFER, SMALL_SIZE, get_allocation_size, round_size, should_split};
use c10_cuda::try_malloc::Miss;

/// What a block is to the planner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Slot {
    /// Free (cached).
    Free,
    /// Allocated and movable: its tag and the bytes its owner asked for.
    Movable {
        /// The block's tag (the storage).
        tag: u64,
        /// Bytes of the copy to allocate.
        requested: usize,
    },
    /// Anything that cannot move (untagged, pinned by the owner, pending, unmapped).
    Fixed,
}

/// One block of a segment, in address order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Block {
    /// Its address.
    pub ptr: DevicePtr,
    /// Its bytes.
    pub size: usize,
    /// What it is.
    pub slot: Slot,
}

/// One segment: its blocks are `blocks[first..end]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Segment {
    /// Its pool.
    pub pool: Pool,
    /// Its stream.
    pub stream: StreamId,
    /// Whether it is an expandable segment.
    pub expandable: bool,
    /// Index of its first block.
    pub first: usize,
    /// One past its last block.
    pub end: usize,
}

/// The tag of a hold: a free block inside the vacated addresses allocated for the time of
/// the copies so that no copy's best fit lands there (freed with the originals; no copy).
pub(crate) const HOLD: u64 = u64::MAX;

/// One block to copy (or, with tag [`HOLD`], a free block to hold during the copies).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Move {
    /// The block's tag.
    pub tag: u64,
    /// Its address now.
    pub from: DevicePtr,
    /// Bytes of the copy to allocate.
    pub requested: usize,
    /// Where the allocator's best fit is expected to put the copy.
    pub to: DevicePtr,
}

/// A plan: the copies, in the order to allocate them, and the address ranges they vacate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct MovePlan {
    /// The copies, largest first.
    pub moves: Vec<Move>,
    /// Vacated `[start, end)` address ranges: a copy must not land in one.
    pub vacated: Vec<(DevicePtr, DevicePtr)>,
    /// Bytes copied (the sum of `requested` over the copies; holds are not copied).
    pub bytes: u64,
    /// Blocks looked at.
    pub scanned: usize,
}

impl MovePlan {
    /// The copies (the moves that are not holds).
    pub fn copies(&self) -> usize {
        self.moves.iter().filter(|m| m.tag != HOLD).count()
    }

    /// Whether `ptr` lies in a vacated range.
    pub fn inside(&self, ptr: DevicePtr) -> bool {
        self.vacated.iter().any(|&(a, b)| ptr >= a && ptr < b)
    }
}

/// How many of the cheapest windows are replayed before giving up on windows.
const WINDOWS_TRIED: usize = 8;

/// The cheapest move plan for `miss` over `segs` and `blocks`, or `None`. With
/// `new_segments` a window's copies that no cached block holds may take new segments from
/// the device's free bytes (`miss.device_free`).
pub(crate) fn plan(
    segs: &[Segment],
    blocks: &[Block],
    miss: &Miss,
    config: &AllocatorConfig,
    new_segments: bool,
) -> Option<MovePlan> {
    let req = miss.request;
    // Windows: (bytes moved, first block, one past the last).
    let mut windows: Vec<(usize, usize, usize)> = Vec::new();
    for s in segs
        .iter()
        .filter(|s| s.pool == req.pool && s.stream == req.stream)
    {
        let run = &blocks[s.first..s.end];
        let (mut left, mut span, mut moved) = (0usize, 0usize, 0usize);
        for (j, b) in run.iter().enumerate() {
            if b.slot == Slot::Fixed {
                (left, span, moved) = (j + 1, 0, 0);
                continue;
            }
            span += b.size;
            moved += movable_bytes(b);
            while left < j && span - run[left].size >= req.size {
                span -= run[left].size;
                moved -= movable_bytes(&run[left]);
                left += 1;
            }
            if span >= req.size && moved > 0 {
                windows.push((moved, s.first + left, s.first + j + 1));
            }
        }
    }
    windows.sort_unstable();
    // Bytes a window's copies may take as new segments (not under expandable segments, whose
    // growth is mapped pages, not replayed here).
    let fresh = if config.expandable_segments || !new_segments {
        0
    } else {
        miss.device_free
    };
    for holds in [false, true] {
        for &(_, lo, hi) in windows.iter().take(WINDOWS_TRIED) {
            let vacated = vec![(
                blocks[lo].ptr,
                blocks[hi - 1].ptr + blocks[hi - 1].size as u64,
            )];
            if let Some(p) = replay(segs, blocks, &[(lo, hi)], vacated, config, holds, fresh) {
                return Some(p);
            }
        }
    }
    if config.expandable_segments {
        return None;
    }
    // Release: whole segments emptied, fewest bytes moved first, until the device can give
    // the request's segment.
    let need = get_allocation_size(req.size).saturating_sub(miss.device_free);
    if need == 0 {
        return None;
    }
    let mut whole: Vec<(usize, usize)> = segs
        .iter()
        .enumerate()
        .filter(|(_, s)| {
            !s.expandable
                && blocks[s.first..s.end].iter().all(|b| b.slot != Slot::Fixed)
                && blocks[s.first..s.end].iter().any(|b| movable_bytes(b) > 0)
        })
        .map(|(k, s)| (blocks[s.first..s.end].iter().map(movable_bytes).sum(), k))
        .collect();
    whole.sort_unstable();
    let mut gives = 0usize;
    let mut ranges = Vec::new();
    let mut vacated = Vec::new();
    for &(_, k) in &whole {
        if gives >= need {
            break;
        }
        let s = &segs[k];
        let size: usize = blocks[s.first..s.end].iter().map(|b| b.size).sum();
        gives += size;
        ranges.push((s.first, s.end));
        vacated.push((blocks[s.first].ptr, blocks[s.first].ptr + size as u64));
    }
    if gives < need {
        return None;
    }
    // The copies of a release plan stay in cached blocks: a new segment for one would take
    // device bytes the request's segment needs.
    replay(segs, blocks, &ranges, vacated.clone(), config, false, 0)
        .or_else(|| replay(segs, blocks, &ranges, vacated, config, true, 0))
}

fn movable_bytes(b: &Block) -> usize {
    match b.slot {
        Slot::Movable { .. } => b.size,
        _ => 0,
    }
}

/// Replays the allocator's best fit for the copies of the movable blocks in `ranges` (block
/// index ranges), the largest first; `None` when one lands in `vacated` or finds no block.
fn replay(
    segs: &[Segment],
    blocks: &[Block],
    ranges: &[(usize, usize)],
    vacated: Vec<(DevicePtr, DevicePtr)>,
    config: &AllocatorConfig,
    with_holds: bool,
    device_free: usize,
) -> Option<MovePlan> {
    let movers: Vec<Move> = ranges
        .iter()
        .flat_map(|&(lo, hi)| blocks[lo..hi].iter())
        .filter_map(|b| match b.slot {
            Slot::Movable { tag, requested } => Some(Move {
                tag,
                from: b.ptr,
                requested,
                to: 0,
            }),
            _ => None,
        })
        .collect();
    if !with_holds {
        return fit(
            segs,
            blocks,
            Vec::new(),
            movers,
            &vacated,
            config,
            true,
            device_free,
        );
    }
    // A copy's best fit lies inside the vacated addresses: hold the free blocks there
    // (largest first, each an exact-size request, so the allocator's best fit is that block
    // or another of its size) while the copies are made. Only large-pool blocks above the
    // small pool's limit can be held (a smaller request would go to the small pool).
    let holds: Vec<Move> = ranges
        .iter()
        .flat_map(|&(lo, hi)| blocks[lo..hi].iter())
        .filter(|b| b.slot == Slot::Free)
        .map(|b| Move {
            tag: HOLD,
            from: b.ptr,
            requested: hold_request(b.size, config),
            to: 0,
        })
        .collect();
    if holds.is_empty() || holds.iter().any(|h| h.requested <= SMALL_SIZE) {
        return None;
    }
    fit(
        segs,
        blocks,
        holds,
        movers,
        &vacated,
        config,
        true,
        device_free,
    )
}

/// The request that holds a free block of `size` bytes: the largest whose rounded size
/// (`round_size`) is at most `size`, so that the allocator's best fit can be the block itself.
/// That is `size` unless `roundup_power2_divisions` rounds it up (a block between two of its
/// steps, such as a split block's remainder; the rounded request would need a larger block or
/// a new segment): then the step at or below it. A block it leaves over is held next
/// ([`fit`]).
fn hold_request(size: usize, config: &AllocatorConfig) -> usize {
    if round_size(size, config) <= size {
        return size;
    }
    // Rounded up: power-of-two divisions apply (`size` > 512 · divisions), and the steps
    // between `floor` and `2 · floor` are `floor / divisions` (at least 512) apart.
    let divisions = config.roundup_power2_divisions_for(size).max(1);
    let floor = 1usize << (usize::BITS - 1 - size.leading_zeros());
    let step = (floor >> divisions.trailing_zeros()).max(1);
    size & !(step - 1)
}

/// The copies of `victims` (tags, each of a movable block) that can land outside `vacated`,
/// the largest first; the others are left out of the plan (the owner evicts them).
pub(crate) fn movable_victims(
    segs: &[Segment],
    blocks: &[Block],
    victims: &[u64],
    vacated: Vec<(DevicePtr, DevicePtr)>,
    config: &AllocatorConfig,
) -> MovePlan {
    let movers: Vec<Move> = blocks
        .iter()
        .filter_map(|b| match b.slot {
            Slot::Movable { tag, requested } if victims.contains(&tag) => Some(Move {
                tag,
                from: b.ptr,
                requested,
                to: 0,
            }),
            _ => None,
        })
        .collect();
    fit(segs, blocks, Vec::new(), movers, &vacated, config, false, 0).unwrap_or(MovePlan {
        moves: Vec::new(),
        vacated: Vec::new(),
        bytes: 0,
        scanned: blocks.len(),
    })
}

/// The best-fit replay of `holds` (largest first: each may land anywhere) and then of
/// `moves` (largest first). `strict`: `None` as soon as one copy lands in `vacated` or finds
/// no block (or a hold finds none); otherwise such a copy is left out. `device_free`: bytes
/// the copies may take as new segments when no cached block holds one (0: none); a hold
/// never takes one (it is there to fill the vacated addresses, not to grow the device).
/// When a hold's request is smaller than its block ([`hold_request`]) and the block splits,
/// the part left free inside `vacated` is held next, the same way.
#[allow(clippy::too_many_arguments)] // the layout, the two move lists and three settings
fn fit(
    segs: &[Segment],
    blocks: &[Block],
    mut holds: Vec<Move>,
    mut moves: Vec<Move>,
    vacated: &[(DevicePtr, DevicePtr)],
    config: &AllocatorConfig,
    strict: bool,
    mut device_free: usize,
) -> Option<MovePlan> {
    moves.sort_by(|a, b| b.requested.cmp(&a.requested).then(a.from.cmp(&b.from)));
    holds.sort_by(|a, b| b.requested.cmp(&a.requested).then(a.from.cmp(&b.from)));
    // (move, whether it is a hold), in the order they are allocated.
    let mut queue: std::collections::VecDeque<(Move, bool)> = holds
        .drain(..)
        .map(|m| (m, true))
        .chain(moves.drain(..).map(|m| (m, false)))
        .collect();
    // The free blocks of every (pool, stream): (pool, stream, size, address).
    let mut free: Vec<(Pool, StreamId, usize, DevicePtr)> = Vec::new();
    for s in segs {
        for b in &blocks[s.first..s.end] {
            if b.slot == Slot::Free {
                free.push((s.pool, s.stream, b.size, b.ptr));
            }
        }
    }
    let seg_of = |ptr: DevicePtr| -> Option<&Segment> {
        segs.iter().find(|s| {
            let a = blocks[s.first].ptr;
            let e = blocks[s.end - 1].ptr + blocks[s.end - 1].size as u64;
            ptr >= a && ptr < e
        })
    };
    let inside = |ptr: DevicePtr| vacated.iter().any(|&(a, b)| ptr >= a && ptr < b);
    let max_split = config.max_split_size_or_max();
    // New segments get addresses from the top of the address space down (a replay's own,
    // outside every vacated range).
    let mut fresh_base = DevicePtr::MAX;
    let mut bytes = 0u64;
    let mut kept = Vec::with_capacity(queue.len());
    while let Some((mut m, hold)) = queue.pop_front() {
        let Some(seg) = seg_of(m.from) else {
            if strict {
                return None;
            }
            continue;
        };
        let (pool, stream) = (seg.pool, seg.stream);
        let size = round_size(m.requested, config);
        let best = free
            .iter()
            .enumerate()
            .filter(|(_, f)| f.0 == pool && f.1 == stream && f.2 >= size)
            .min_by_key(|(_, f)| (f.2, f.3))
            .map(|(k, _)| k);
        // PyTorch's get_free_block refuses an oversize block for a small request and a
        // request far smaller than an oversize block.
        let fits = best.filter(|&k| {
            let fsize = free[k].2;
            !((size < max_split && fsize >= max_split)
                || (size >= max_split
                    && fsize >= size.saturating_add(config.max_non_split_rounding)))
        });
        let usable = match fits {
            Some(k) if !hold && inside(free[k].3) => None,
            Some(k) => Some(k),
            // No cached block serves a hold: a new segment would not fill the vacated
            // addresses.
            None if hold => None,
            // No cached block serves a copy: the allocator takes a new segment from the
            // device when the device has its bytes (`device_free`: only for the copies of a
            // window, which the request does not need).
            None => {
                let seg_size = match pool {
                    Pool::Small => SMALL_BUFFER,
                    Pool::Large => get_allocation_size(size),
                };
                if seg_size <= device_free {
                    device_free -= seg_size;
                    fresh_base -= seg_size as u64;
                    free.push((pool, stream, seg_size, fresh_base));
                    Some(free.len() - 1)
                } else {
                    None
                }
            }
        };
        let Some(k) = usable else {
            if strict {
                return None;
            }
            continue;
        };
        let (_, _, fsize, fptr) = free[k];
        m.to = fptr;
        if !hold {
            bytes += m.requested as u64;
        }
        if should_split(fsize, size, pool == Pool::Small, config) {
            let rest = (fsize - size, fptr + size as u64);
            free[k] = (pool, stream, rest.0, rest.1);
            // The hold's block was larger than its request: hold what is left of it, when
            // its hold is a large-pool request (a rest of 1.125 MiB under four divisions
            // holds 1 MiB, which the allocator sends to the small pool).
            let h = hold_request(rest.0, config);
            if hold && inside(rest.1) && h > SMALL_SIZE {
                queue.push_front((
                    Move {
                        tag: HOLD,
                        from: rest.1,
                        requested: h,
                        to: 0,
                    },
                    true,
                ));
            }
        } else {
            free.swap_remove(k);
        }
        kept.push(m);
    }
    Some(MovePlan {
        moves: kept,
        vacated: vacated.to_vec(),
        bytes,
        scanned: blocks.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use c10_cuda::try_malloc::Request;

    const MB: usize = 1 << 20;

    fn miss(size: usize, device_free: usize) -> Miss {
        Miss {
            request: Request {
                requested: size,
                size,
                alloc_size: get_allocation_size(size),
                pool: Pool::Large,
                stream: StreamId::DEFAULT,
            },
            device_free,
            reserved: 0,
            allocated: 0,
        }
    }

    /// Segments from (base, blocks as (MiB, slot)).
    fn layout(segs: &[(u64, &[(usize, Slot)])]) -> (Vec<Segment>, Vec<Block>) {
        let bytes: Vec<(u64, Vec<(usize, Slot)>)> = segs
            .iter()
            .map(|&(base, bs)| (base, bs.iter().map(|&(mb, s)| (mb * MB, s)).collect()))
            .collect();
        let refs: Vec<(u64, &[(usize, Slot)])> =
            bytes.iter().map(|(b, v)| (*b, v.as_slice())).collect();
        layout_bytes(&refs)
    }

    /// Segments from (base, blocks as (bytes, slot)).
    fn layout_bytes(segs: &[(u64, &[(usize, Slot)])]) -> (Vec<Segment>, Vec<Block>) {
        let mut out = Vec::new();
        let mut blocks = Vec::new();
        for &(base, bs) in segs {
            let first = blocks.len();
            let mut ptr = base;
            for &(size, slot) in bs {
                blocks.push(Block { ptr, size, slot });
                ptr += size as u64;
            }
            out.push(Segment {
                pool: Pool::Large,
                stream: StreamId::DEFAULT,
                expandable: false,
                first,
                end: blocks.len(),
            });
        }
        (out, blocks)
    }

    fn mv(tag: u64, mb: usize) -> Slot {
        Slot::Movable {
            tag,
            requested: mb * MB,
        }
    }

    #[test]
    fn moves_the_cheapest_block_out_of_the_way() {
        // Segment A: [free 12][live 4 (tag 1)][free 12]; segment B: [live 20 (tag 2)][free 6].
        // A 24 MiB request fits once tag 1 moves to B's free 6 MiB.
        let base_b = 1u64 << 32;
        let (segs, blocks) = layout(&[
            (0, &[(12, Slot::Free), (4, mv(1, 4)), (12, Slot::Free)]),
            (base_b, &[(20, mv(2, 20)), (6, Slot::Free)]),
        ]);
        let p = plan(
            &segs,
            &blocks,
            &miss(24 * MB, 0),
            &AllocatorConfig::default(),
            false,
        )
        .unwrap();
        assert_eq!(p.moves.len(), 1);
        assert_eq!(p.moves[0].tag, 1);
        assert_eq!(p.moves[0].to, base_b + (20 * MB) as u64);
        assert_eq!(p.bytes, (4 * MB) as u64);
        assert!(p.inside(0) && !p.inside(base_b));
    }

    #[test]
    fn no_plan_when_the_copy_would_land_in_the_window() {
        // The only free block that holds the 4 MiB copy is inside the window.
        let (segs, blocks) = layout(&[(
            0,
            &[
                (12, Slot::Free),
                (4, mv(1, 4)),
                (12, Slot::Free),
                (8, Slot::Fixed),
            ],
        )]);
        assert_eq!(
            plan(
                &segs,
                &blocks,
                &miss(24 * MB, 0),
                &AllocatorConfig::default(),
                false
            ),
            None
        );
    }

    #[test]
    fn copies_take_new_segments_when_no_cached_block_holds_them() {
        // vgg16-32 at ratio 0.55 (window-move-all), at its out-of-memory stop: a 392 MiB
        // request, nothing evictable; one 392 MiB segment [free 196][live 15.62][free 18]
        // [live 9][live 9][free 144.38] and a 20 MiB one [live 18][free 2]; 107 MiB left on
        // the device. No cached block outside the segment holds a copy, but the device has
        // room for their new segments (16 MiB for the 15.62 MiB copy, one 20 MiB segment for
        // both 9 MiB copies), so the window is the whole 392 MiB segment.
        let k = 1024 * 1024 / 100; // 0.01 MiB, in bytes (rounded to 512 below)
        let live = 15 * MB + 62 * k / 512 * 512;
        let free_tail = 392 * MB - 196 * MB - live - 18 * MB - 18 * MB;
        let base_b = 1u64 << 32;
        let big: Vec<Block> = [
            (196 * MB, Slot::Free),
            (live, mv(1, 0)),
            (18 * MB, Slot::Free),
            (9 * MB, mv(2, 0)),
            (9 * MB, mv(3, 0)),
            (free_tail, Slot::Free),
        ]
        .iter()
        .scan(0u64, |ptr, &(size, slot)| {
            let b = Block {
                ptr: *ptr,
                size,
                slot: match slot {
                    Slot::Movable { tag, .. } => Slot::Movable {
                        tag,
                        requested: size,
                    },
                    s => s,
                },
            };
            *ptr += size as u64;
            Some(b)
        })
        .collect();
        let (mut segs, small) = layout(&[(base_b, &[(18, mv(4, 18)), (2, Slot::Free)])]);
        let mut blocks = small;
        segs[0].first = 6;
        segs[0].end = 8;
        blocks.splice(0..0, big);
        segs.insert(
            0,
            Segment {
                pool: Pool::Large,
                stream: StreamId::DEFAULT,
                expandable: false,
                first: 0,
                end: 6,
            },
        );
        let config = AllocatorConfig::default();
        // Without the device's bytes, or without new segments: no plan.
        assert_eq!(
            plan(&segs, &blocks, &miss(392 * MB, 0), &config, true),
            None
        );
        assert_eq!(
            plan(&segs, &blocks, &miss(392 * MB, 107 * MB), &config, false),
            None
        );
        // With 107 MiB left: the 15.62 MiB copy's best fit is the window's own 18 MiB block,
        // so the window's free blocks are held, and the three copies go to new segments
        // (16 + 20 MiB).
        let p = plan(&segs, &blocks, &miss(392 * MB, 107 * MB), &config, true).unwrap();
        let got: Vec<(u64, usize)> = p.moves.iter().map(|m| (m.tag, m.requested)).collect();
        assert_eq!(
            got,
            [
                (HOLD, 196 * MB),
                (HOLD, free_tail),
                (HOLD, 18 * MB),
                (1, live),
                (2, 9 * MB),
                (3, 9 * MB)
            ]
        );
        assert!(
            p.moves[3..]
                .iter()
                .all(|m| !p.inside(m.to) && m.to > base_b)
        );
        assert_eq!(p.copies(), 3);
        // The two 9 MiB copies share one 20 MiB segment.
        assert_eq!(p.moves[5].to, p.moves[4].to + (9 * MB) as u64);
        assert_eq!(p.bytes, (live + 18 * MB) as u64);
        // 35 MiB left is one byte short of the 16 + 20 MiB segments.
        assert_eq!(
            plan(&segs, &blocks, &miss(392 * MB, 36 * MB - 1), &config, true),
            None
        );
    }

    #[test]
    fn free_blocks_inside_the_window_are_held_while_the_copy_is_made() {
        // Segment A: [free 12][live 4 (tag 1)][free 8]; segment B: [live 20 (tag 2)][free 10].
        // A 24 MiB request needs A's window; the copy's best fit is A's own 8 MiB block (not
        // B's 10), so the plain replay fails. Holding A's free blocks first (12: only itself
        // holds it; 8: itself, the smallest) sends the copy to B's 10 MiB block.
        let base_b = 1u64 << 32;
        let (segs, blocks) = layout(&[
            (0, &[(12, Slot::Free), (4, mv(1, 4)), (8, Slot::Free)]),
            (base_b, &[(20, mv(2, 20)), (10, Slot::Free)]),
        ]);
        let config = AllocatorConfig::default();
        assert_eq!(
            fit(
                &segs,
                &blocks,
                Vec::new(),
                vec![Move {
                    tag: 1,
                    from: (12 * MB) as u64,
                    requested: 4 * MB,
                    to: 0
                }],
                &[(0, (24 * MB) as u64)],
                &config,
                true,
                0
            ),
            None
        );
        let p = plan(&segs, &blocks, &miss(24 * MB, 0), &config, false).unwrap();
        let got: Vec<(u64, u64, usize)> =
            p.moves.iter().map(|m| (m.tag, m.to, m.requested)).collect();
        assert_eq!(
            got,
            [
                (HOLD, 0, 12 * MB),
                (HOLD, (16 * MB) as u64, 8 * MB),
                (1, base_b + (20 * MB) as u64, 4 * MB)
            ]
        );
        assert_eq!((p.copies(), p.bytes), (1, (4 * MB) as u64));
        assert_eq!(p.vacated, [(0, (24 * MB) as u64)]);
    }

    #[test]
    fn hold_requests_round_to_at_most_the_block() {
        // Four divisions per power of two: 13.5 MiB rounds up to 14, so its hold asks for 12
        // (the step below); sizes on a step, below 512 · 4 bytes or without divisions are
        // their own hold.
        let config = AllocatorConfig::parse("roundup_power2_divisions:4").unwrap();
        assert_eq!(round_size(27 * MB / 2, &config), 14 * MB);
        assert_eq!(hold_request(27 * MB / 2, &config), 12 * MB);
        assert_eq!(hold_request(13 * MB, &config), 12 * MB);
        assert_eq!(hold_request(7 * MB, &config), 7 * MB);
        assert_eq!(hold_request(3 * MB / 2, &config), 3 * MB / 2);
        assert_eq!(hold_request(1536, &config), 1536);
        assert_eq!(
            hold_request(27 * MB / 2, &AllocatorConfig::default()),
            27 * MB / 2
        );
        // Every 512-byte multiple up to 64 MiB, in 511 KiB strides: the hold's rounded
        // request is at most the block, and no larger request rounds to at most the block.
        for divisions in [2usize, 4, 8, 16] {
            let config =
                AllocatorConfig::parse(&format!("roundup_power2_divisions:{divisions}")).unwrap();
            for size in (1..).map(|k| k * 511 * 1024).take_while(|&s| s <= 64 * MB) {
                let h = hold_request(size, &config);
                let r = round_size(h, &config);
                assert!(r <= size && r == h, "{divisions} {size}: {h} -> {r}");
                assert!(round_size(h + 1, &config) > size, "{divisions} {size}");
            }
        }
    }

    /// The plan of the two power2-divisions hold tests: roundup_power2_divisions:4, segment A
    /// `[free first][live 4 MiB (tag 1)][free 7 MiB]` at 0, segment B `[live 20 MiB (tag 2)]
    /// [free 8 MiB]` at 2^32, a 24 MiB request with 16 MiB left on the device, new segments
    /// allowed. Returns the plan and its moves as (tag, destination, requested bytes).
    fn power2_hold_plan(first: usize) -> (MovePlan, Vec<(u64, u64, usize)>) {
        let config = AllocatorConfig::parse("roundup_power2_divisions:4").unwrap();
        let a = [
            (first, Slot::Free),
            (4 * MB, mv(1, 4)),
            (7 * MB, Slot::Free),
        ];
        let b = [(20 * MB, mv(2, 20)), (8 * MB, Slot::Free)];
        let (segs, blocks) = layout_bytes(&[(0, &a), (1u64 << 32, &b)]);
        let p = plan(&segs, &blocks, &miss(24 * MB, 16 * MB), &config, true).unwrap();
        let got = p.moves.iter().map(|m| (m.tag, m.to, m.requested)).collect();
        (p, got)
    }

    #[test]
    fn a_hold_under_power2_divisions_takes_its_own_block() {
        // roundup_power2_divisions:4. Segment A: [free 13.5][live 4 (tag 1)][free 7];
        // segment B: [live 20 (tag 2)][free 8]; a 24 MiB request, 16 MiB left on the device,
        // new segments allowed (not enough for the 20 MiB segment B's copy would need, so
        // B's window fails). The copy's best fit is A's own 7 MiB block, so A's free
        // blocks are held. A 13.5 MiB request rounds to 14 MiB, which no cached block holds
        // (it would take a new 14 MiB segment, and leave A's block free); the hold asks for
        // 12 MiB instead, its best fit is A's 13.5 MiB block, which splits, and the 1.5 MiB
        // left of it is held next. Then 7 MiB, then the copy to B's 8 MiB block.
        let (p, got) = power2_hold_plan(27 * MB / 2);
        let base_b = 1u64 << 32;
        assert_eq!(
            got,
            [
                (HOLD, 0, 12 * MB),
                (HOLD, (12 * MB) as u64, 3 * MB / 2),
                (HOLD, (35 * MB / 2) as u64, 7 * MB),
                (1, base_b + (20 * MB) as u64, 4 * MB)
            ]
        );
        assert_eq!((p.copies(), p.bytes), (1, (4 * MB) as u64));
    }

    #[test]
    fn a_rest_whose_hold_is_a_small_request_is_not_held() {
        // As above with a 13.125 MiB first block: its hold asks for 12 MiB and splits it; the
        // 1.125 MiB left would hold 1 MiB (the step below its rounded 1.25 MiB), a small-pool
        // request that the allocator would not serve from this large block. It stays free
        // (too small for the 4 MiB copy's best fit).
        let config = AllocatorConfig::parse("roundup_power2_divisions:4").unwrap();
        assert_eq!(hold_request(9 * MB / 8, &config), MB);
        let (p, got) = power2_hold_plan(105 * MB / 8);
        let base_b = 1u64 << 32;
        assert_eq!(
            got,
            [
                (HOLD, 0, 12 * MB),
                (HOLD, (137 * MB / 8) as u64, 7 * MB),
                (1, base_b + (20 * MB) as u64, 4 * MB)
            ]
        );
        assert!(p.moves.iter().all(|m| m.requested > SMALL_SIZE));
    }

    #[test]
    fn fixed_blocks_bar_a_window() {
        let base_b = 1u64 << 32;
        let (segs, blocks) = layout(&[
            (0, &[(12, Slot::Free), (4, Slot::Fixed), (12, Slot::Free)]),
            (base_b, &[(20, mv(2, 20)), (6, Slot::Free)]),
        ]);
        // No window of 24 MiB without the fixed block; segment A cannot be released, and
        // emptying B needs 20 MiB of free blocks outside it, which A's 12 MiB blocks are not.
        assert_eq!(
            plan(
                &segs,
                &blocks,
                &miss(24 * MB, 0),
                &AllocatorConfig::default(),
                false
            ),
            None
        );
    }

    #[test]
    fn victims_that_cannot_land_outside_stay_victims() {
        // A window over tags 1 (4 MiB) and 3 (8 MiB); only a 6 MiB free block lies outside:
        // tag 1 moves there (the window's own 2 MiB free block is too small to be its best fit),
        // tag 3 fits nowhere and stays to be evicted.
        let base_b = 1u64 << 32;
        let (segs, blocks) = layout(&[
            (0, &[(4, mv(1, 4)), (8, mv(3, 8)), (2, Slot::Free)]),
            (base_b, &[(20, mv(2, 20)), (6, Slot::Free)]),
        ]);
        let p = movable_victims(
            &segs,
            &blocks,
            &[1, 3],
            vec![(0, (14 * MB) as u64)],
            &AllocatorConfig::default(),
        );
        assert_eq!(p.moves.len(), 1);
        assert_eq!(p.moves[0].tag, 1);
        assert_eq!(p.moves[0].to, base_b + (20 * MB) as u64);
    }

    #[test]
    fn releases_a_segment_when_no_window_spans_the_request() {
        // Segments of 22 and 20 MiB, 10 MiB live in each; a 32 MiB request needs a new
        // segment, and the device has 20 MiB free: emptying the first (its 10 MiB go to the
        // second's free 10 MiB, the best fit; its own 12 MiB free block is larger) gives 42.
        let base_b = 1u64 << 32;
        let (segs, blocks) = layout(&[
            (0, &[(10, mv(1, 10)), (12, Slot::Free)]),
            (base_b, &[(10, mv(2, 10)), (10, Slot::Free)]),
        ]);
        let p = plan(
            &segs,
            &blocks,
            &miss(32 * MB, 20 * MB),
            &AllocatorConfig::default(),
            false,
        )
        .unwrap();
        assert_eq!(p.moves.len(), 1);
        assert_eq!(p.vacated, [(0, (22 * MB) as u64)]);
        assert_eq!(p.moves[0].to, base_b + (10 * MB) as u64);
    }
}
