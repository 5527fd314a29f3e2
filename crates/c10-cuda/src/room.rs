//! Making room for a missed request: which allocated blocks to free so that the retry is
//! served, at the least cost to their owner (Coop's sliding window, Zhang et al., NeurIPS
//! 2023, generalised to PyTorch's segments and expandable segments).
//!
//! After [`crate::MallocOutcome::Miss`] the owner says, per tagged allocated block, what freeing
//! it costs (`None`: it cannot be freed); [`DeviceCachingAllocator::plan_room`] returns the
//! cheapest set of blocks whose freeing lets the request through, found among three kinds of
//! plan:
//! - **window**: a contiguous run of free and freeable blocks inside one segment of the
//!   request's pool and stream (mapped blocks only) whose span covers the rounded size: once
//!   freed, they merge into one free block that best fit hands out. A two-pointer scan per
//!   segment: for each right end the shortest run that covers the size is the cheapest
//!   (costs are not negative), so the scan is linear in the blocks.
//! - **release**: whole segments (every block free or freeable) whose bytes, once released to
//!   the device, let it give the request's new segment (`get_allocation_size`); the
//!   allocator's own retry path (`release_cached_blocks`) releases them.
//! - **pages** (expandable segments): runs of free and freeable mapped blocks whose whole pages,
//!   once unmapped, let the device map the pages the request needs.
//!
//! A plan's cost is the sum of its blocks' costs (`+inf` costs are counted apart and compared
//! first, so a plan with fewer of them wins); ties go to the plan that frees fewer bytes. With a
//! [`RoomOptions::byte_credit`] `λ`, a plan that makes `x` bytes more available than the
//! request needs (a longer run, more pages or segments) is credited `λ·x`: plans are ranked by
//! `cost - λ·x`, so spare room counts at the price the owner puts on a byte. While `λ` is at
//! most every freeable block's cost per byte, a longer run is never better for the same right
//! end, so the scan stays exact. The
//! plan is a proposal: nothing changes until the owner frees the blocks and calls
//! [`DeviceCachingAllocator::try_malloc`] again.

use std::cmp::Ordering;

use crate::allocator::DeviceCachingAllocator;
use crate::device::{DeviceMemory, DevicePtr};
use crate::segment_view::{BlockState, Pool};
use crate::sizes::{LARGE_BUFFER, SMALL_BUFFER};
use crate::try_malloc::Miss;

/// Which kind of plan [`DeviceCachingAllocator::plan_room`] chose.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RoomKind {
    /// A contiguous run inside one segment that covers the request once merged.
    Window {
        /// The segment's start address.
        segment: DevicePtr,
        /// Start of the run.
        start: DevicePtr,
        /// Bytes of the run (free blocks included).
        span: usize,
    },
    /// Whole segments released to the device so that it can give a new segment.
    Release {
        /// How many segments.
        segments: usize,
    },
    /// Pages of expandable segments unmapped so that the device can map the request's pages.
    Pages {
        /// Bytes of whole pages the plan frees.
        bytes: usize,
    },
}

/// A total eviction cost: the sum of finite costs and the number of infinite ones (compared
/// first).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RoomCost {
    /// Blocks whose cost is `+inf`.
    pub infinite: u32,
    /// Sum of the finite costs.
    pub finite: f64,
}

impl RoomCost {
    fn of(c: f64) -> Self {
        if c.is_infinite() {
            RoomCost {
                infinite: 1,
                finite: 0.0,
            }
        } else {
            RoomCost {
                infinite: 0,
                finite: c,
            }
        }
    }

    fn add(self, o: RoomCost) -> Self {
        RoomCost {
            infinite: self.infinite + o.infinite,
            finite: self.finite + o.finite,
        }
    }

    fn sub(self, o: RoomCost) -> Self {
        RoomCost {
            infinite: self.infinite - o.infinite,
            // Rounding can leave a tiny negative rest after subtracting every block.
            finite: (self.finite - o.finite).max(0.0),
        }
    }

    /// Infinite counts first, then the finite sums.
    pub fn compare(&self, o: &RoomCost) -> Ordering {
        self.infinite
            .cmp(&o.infinite)
            .then(self.finite.total_cmp(&o.finite))
    }

    /// As one number (`+inf` when any cost is infinite).
    pub fn value(&self) -> f64 {
        if self.infinite > 0 {
            f64::INFINITY
        } else {
            self.finite
        }
    }
}

/// The cheapest way found to make room for a missed request.
#[derive(Clone, Debug, PartialEq)]
pub struct RoomPlan {
    /// Which kind of plan.
    pub kind: RoomKind,
    /// The tags of the blocks to free, in address order within each segment.
    pub tags: Vec<u64>,
    /// Their total cost.
    pub cost: RoomCost,
    /// Bytes of the blocks to free.
    pub freed_bytes: usize,
    /// Blocks looked at.
    pub scanned: usize,
}

/// Which kinds of plan [`DeviceCachingAllocator::plan_room`] may return.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RoomOptions {
    /// Contiguous runs inside a segment ([`RoomKind::Window`]).
    pub window: bool,
    /// Whole segments or expandable pages given back to the device ([`RoomKind::Release`],
    /// [`RoomKind::Pages`]).
    pub release: bool,
    /// What a byte made available beyond the request is worth, in cost units (0: plans are
    /// ranked by total cost alone). Plans are ranked by `cost - byte_credit · spare bytes`.
    pub byte_credit: f64,
}

impl Default for RoomOptions {
    fn default() -> Self {
        RoomOptions {
            window: true,
            release: true,
            byte_credit: 0.0,
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Free,
    Evict(RoomCost),
    Barrier,
}

#[derive(Clone, Copy, Debug)]
struct Item {
    ptr: DevicePtr,
    size: usize,
    kind: Kind,
    tag: u64,
}

impl Item {
    fn cost(&self) -> RoomCost {
        match self.kind {
            Kind::Evict(c) => c,
            _ => RoomCost::default(),
        }
    }

    fn evicted(&self) -> usize {
        match self.kind {
            Kind::Evict(_) => self.size,
            _ => 0,
        }
    }
}

/// The best candidate so far: cost, bytes freed, then first found.
struct Best {
    cost: RoomCost,
    freed: usize,
    /// Bytes made available beyond what the request needs.
    spare: usize,
    kind: RoomKind,
    /// Items (indices into the scratch list) to free.
    items: Vec<usize>,
}

/// How candidates compare ([`RoomOptions::byte_credit`]).
#[derive(Clone, Copy)]
struct Rank {
    credit: f64,
}

impl Rank {
    /// Whether a candidate costing `cost`, freeing `freed` bytes of blocks and making `spare`
    /// bytes available beyond the need beats `best`.
    fn better(self, cost: RoomCost, freed: usize, spare: usize, best: &Option<Best>) -> bool {
        let Some(b) = best else {
            return true;
        };
        let net = |c: RoomCost, x: usize| c.finite - self.credit * x as f64;
        let order = cost
            .infinite
            .cmp(&b.cost.infinite)
            .then(net(cost, spare).total_cmp(&net(b.cost, b.spare)));
        match order {
            Ordering::Less => true,
            Ordering::Greater => false,
            Ordering::Equal => freed < b.freed,
        }
    }
}

/// One segment's items in the scratch list.
struct Seg {
    pool: Pool,
    expandable: bool,
    matches: bool,
    base: DevicePtr,
    first: usize,
    end: usize,
}

impl<D: DeviceMemory> DeviceCachingAllocator<D> {
    /// The cheapest plan that makes room for `miss` ([`RoomKind`] says how), or `None` when
    /// no set of freeable blocks would let the request through. `cost(tag)` is the cost of
    /// freeing the allocated block tagged `tag`, not negative (`+inf` allowed), or `None` when
    /// it cannot be freed; untagged and pending blocks cannot be freed. It is called once per
    /// tagged block. Linear in the blocks, plus sorting the candidate segments and runs of a
    /// release plan.
    ///
    /// The plan assumes the allocator's rules: a window is only proposed where the merged
    /// block would be handed out (not an oversize block under `max_split_size`), and a
    /// release plan counts what the allocator's retry path can give back. The owner checks
    /// the result by retrying [`Self::try_malloc`].
    pub fn plan_room(
        &self,
        miss: &Miss,
        options: RoomOptions,
        mut cost: impl FnMut(u64) -> Option<f64>,
    ) -> Option<RoomPlan> {
        let req = miss.request;
        let mut items: Vec<Item> = Vec::new();
        let mut segs: Vec<Seg> = Vec::new();
        for seg in self.segments() {
            let first = items.len();
            for b in seg.blocks() {
                let kind = match b.state {
                    BlockState::Free => Kind::Free,
                    BlockState::Allocated => match b.tag.and_then(&mut cost) {
                        Some(c) if c >= 0.0 => Kind::Evict(RoomCost::of(c)),
                        _ => Kind::Barrier,
                    },
                    BlockState::PendingFree | BlockState::Unmapped => Kind::Barrier,
                };
                items.push(Item {
                    ptr: b.ptr,
                    size: b.size,
                    kind,
                    tag: b.tag.unwrap_or(0),
                });
            }
            segs.push(Seg {
                pool: seg.pool,
                expandable: seg.expandable,
                matches: seg.pool == req.pool && seg.stream == req.stream,
                base: seg.address,
                first,
                end: items.len(),
            });
        }
        let mut best: Option<Best> = None;
        let rank = Rank {
            credit: options.byte_credit.max(0.0),
        };
        if options.window {
            for s in segs.iter().filter(|s| s.matches) {
                self.best_window(&items[s.first..s.end], s, req.size, rank, &mut best);
            }
        }
        if options.release {
            self.best_release(miss, &items, &segs, rank, &mut best);
        }
        let best = best?;
        let mut tags = Vec::with_capacity(best.items.len());
        tags.extend(
            best.items
                .iter()
                .filter(|&&i| matches!(items[i].kind, Kind::Evict(_)))
                .map(|&i| items[i].tag),
        );
        Some(RoomPlan {
            kind: best.kind,
            tags,
            cost: best.cost,
            freed_bytes: best.freed,
            scanned: items.len(),
        })
    }

    /// Whether a free block of `merged` bytes would serve a rounded request of `size` bytes
    /// (the oversize rules of `get_free_block`).
    fn hands_out(&self, merged: usize, size: usize) -> bool {
        let max_split = self.config.max_split_size_or_max();
        if size < max_split {
            merged < max_split
        } else {
            merged < size.saturating_add(self.config.max_non_split_rounding)
        }
    }

    /// The cheapest window of one segment (two pointers).
    fn best_window(
        &self,
        run: &[Item],
        seg: &Seg,
        size: usize,
        rank: Rank,
        best: &mut Option<Best>,
    ) {
        let base = seg.first;
        let mut left = 0usize;
        let mut span = 0usize;
        let mut evicted = 0usize;
        let mut total = RoomCost::default();
        for (j, it) in run.iter().enumerate() {
            if matches!(it.kind, Kind::Barrier) {
                left = j + 1;
                span = 0;
                evicted = 0;
                total = RoomCost::default();
                continue;
            }
            span += it.size;
            evicted += it.evicted();
            total = total.add(it.cost());
            while left < j && span - run[left].size >= size {
                span -= run[left].size;
                evicted -= run[left].evicted();
                total = total.sub(run[left].cost());
                left += 1;
            }
            if span < size || evicted == 0 || !rank.better(total, evicted, span - size, best) {
                continue;
            }
            // The merged block also takes the free neighbours just outside the run.
            let mut merged = span;
            if left > 0 && matches!(run[left - 1].kind, Kind::Free) {
                merged += run[left - 1].size;
            }
            if j + 1 < run.len() && matches!(run[j + 1].kind, Kind::Free) {
                merged += run[j + 1].size;
            }
            if !self.hands_out(merged, size) {
                continue;
            }
            *best = Some(Best {
                cost: total,
                freed: evicted,
                spare: span - size,
                kind: RoomKind::Window {
                    segment: seg.base,
                    start: run[left].ptr,
                    span,
                },
                items: (base + left..=base + j).collect(),
            });
        }
    }

    /// The cheapest set of whole segments or expandable pages that gives the device the bytes
    /// the request's growth needs.
    fn best_release(
        &self,
        miss: &Miss,
        items: &[Item],
        segs: &[Seg],
        rank: Rank,
        best: &mut Option<Best>,
    ) {
        let req = miss.request;
        let mut headroom = miss.device_free;
        if let Some(allowed) = self.accounting.allowed_memory_maximum {
            headroom = headroom.min(allowed.saturating_sub(self.reserved_bytes()));
        }
        let growth = if self.config.expandable_segments {
            let page = match req.pool {
                Pool::Small => SMALL_BUFFER,
                Pool::Large => LARGE_BUFFER,
            };
            req.size.div_ceil(page) * page
        } else {
            req.alloc_size
        };
        let need = growth.saturating_sub(headroom);
        if need == 0 {
            return;
        }
        // Units: whole non-expandable segments, and maximal runs of expandable segments, each
        // with the bytes it gives back and its cost.
        struct Unit {
            gives: usize,
            cost: RoomCost,
            evicted: usize,
            first: usize,
            end: usize,
        }
        let mut units: Vec<Unit> = Vec::new();
        for s in segs {
            let run = &items[s.first..s.end];
            if !s.expandable {
                if run.iter().any(|it| matches!(it.kind, Kind::Barrier)) {
                    continue;
                }
                let gives: usize = run.iter().map(|it| it.size).sum();
                let cost = run
                    .iter()
                    .fold(RoomCost::default(), |c, it| c.add(it.cost()));
                let evicted = run.iter().map(Item::evicted).sum();
                if evicted == 0 {
                    continue;
                }
                units.push(Unit {
                    gives,
                    cost,
                    evicted,
                    first: s.first,
                    end: s.end,
                });
                if gives >= need && rank.better(cost, evicted, gives - need, best) {
                    *best = Some(Best {
                        cost,
                        freed: evicted,
                        spare: gives - need,
                        kind: RoomKind::Release { segments: 1 },
                        items: (s.first..s.end).collect(),
                    });
                }
                continue;
            }
            let page = match s.pool {
                Pool::Small => SMALL_BUFFER,
                Pool::Large => LARGE_BUFFER,
            };
            let pages_in = |start: DevicePtr, end: DevicePtr| -> usize {
                let lo = ((start - s.base) as usize).div_ceil(page);
                let hi = (end - s.base) as usize / page;
                hi.saturating_sub(lo) * page
            };
            // Maximal runs of free and freeable mapped blocks, and inside each the cheapest
            // sub-run whose whole pages cover the need (two pointers: pages only grow as a
            // run grows).
            let mut k = 0;
            while k < run.len() {
                if matches!(run[k].kind, Kind::Barrier) {
                    k += 1;
                    continue;
                }
                let start = k;
                while k < run.len() && !matches!(run[k].kind, Kind::Barrier) {
                    k += 1;
                }
                let r = &run[start..k];
                let end_ptr = |j: usize| r[j].ptr + r[j].size as u64;
                let mut left = 0usize;
                let mut total = RoomCost::default();
                let mut evicted = 0usize;
                for j in 0..r.len() {
                    total = total.add(r[j].cost());
                    evicted += r[j].evicted();
                    while left < j && pages_in(r[left + 1].ptr, end_ptr(j)) >= need {
                        total = total.sub(r[left].cost());
                        evicted -= r[left].evicted();
                        left += 1;
                    }
                    let gives = pages_in(r[left].ptr, end_ptr(j));
                    if evicted > 0
                        && gives >= need
                        && rank.better(total, evicted, gives - need, best)
                    {
                        *best = Some(Best {
                            cost: total,
                            freed: evicted,
                            spare: gives - need,
                            kind: RoomKind::Pages {
                                bytes: pages_in(r[left].ptr, end_ptr(j)),
                            },
                            items: (s.first + start + left..=s.first + start + j).collect(),
                        });
                    }
                }
                let gives = pages_in(r[0].ptr, end_ptr(r.len() - 1));
                let evicted: usize = r.iter().map(Item::evicted).sum();
                if gives > 0 && evicted > 0 {
                    units.push(Unit {
                        gives,
                        cost: r.iter().fold(RoomCost::default(), |c, it| c.add(it.cost())),
                        evicted,
                        first: s.first + start,
                        end: s.first + k,
                    });
                }
            }
        }
        // Several units, cheapest per byte given first, until the need is covered.
        units.sort_by(|a, b| {
            a.cost
                .infinite
                .cmp(&b.cost.infinite)
                .then((a.cost.finite / a.gives as f64).total_cmp(&(b.cost.finite / b.gives as f64)))
        });
        let mut gave = 0usize;
        let mut cost = RoomCost::default();
        let mut evicted = 0usize;
        let mut picked = Vec::new();
        let mut count = 0usize;
        for u in &units {
            if gave >= need {
                break;
            }
            gave += u.gives;
            cost = cost.add(u.cost);
            evicted += u.evicted;
            picked.extend(u.first..u.end);
            count += 1;
        }
        if count > 1 && gave >= need && rank.better(cost, evicted, gave - need, best) {
            let kind = if self.config.expandable_segments {
                RoomKind::Pages { bytes: gave }
            } else {
                RoomKind::Release { segments: count }
            };
            *best = Some(Best {
                cost,
                freed: evicted,
                spare: gave - need,
                kind,
                items: picked,
            });
        }
    }
}
