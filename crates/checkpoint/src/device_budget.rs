//! DTR under a device-memory budget: the budget is the device's capacity, enforced by the
//! device, and eviction is driven by the caching allocator's misses.
//!
//! With a backend that has a device budget ([`Backend::device_capacity`]), the core counts
//! nothing: every fresh storage is allocated with [`Backend::try_allocate`] (the allocator's
//! `try_malloc`: cache, new segment, release of the cache, retry), and on a miss the core makes
//! room as [`Strategy`] says, then asks again, until the allocation is served or nothing is
//! left to evict (out of memory). The eviction happens in the core, between two allocator
//! calls, never inside one: the allocator reports the miss and returns.
//!
//! - [`Strategy::Callback`]: the heuristic's choice, one storage at a time, then retry (what a
//!   PyTorch free-memory callback can do: it sees no addresses).
//! - The window strategies (Coop's sliding window): the allocator's view of its segments, each
//!   block tagged with its storage, is scanned for the cheapest set of evictable storages
//!   whose freeing lets the request through ([`c10_cuda::DeviceCachingAllocator::plan_room`]):
//!   a contiguous run of free and evictable blocks inside one segment that covers the request
//!   once merged, or whole segments (expandable pages) given back to the device for the
//!   request's new segment. All of them are evicted, then the allocation is retried. When no
//!   plan exists the heuristic's choice is evicted (and out of memory follows once nothing is
//!   left).
//!
//! # The window's cost
//!
//! Per storage `t`, from h_DTR^eq's terms: `c(t)` the heuristic's recompute cost (for
//! h_DTR^eq: `t`'s compute plus the compute of the evicted equivalence classes next to it; for
//! h_DTR: the exact evicted neighbourhood e*; h_DTR^local and the baselines: its own compute),
//! `m(t)` its bytes and `s(t)` its staleness. The rate `r(t) = c(t) / s(t)` is the h_DTR^eq
//! score times the bytes `t` frees: the recompute work its eviction puts at risk, discounted by
//! how long it has gone unused. A storage used at the current clock (`s = 0`) has `r = +inf`:
//! it is evicted only when every plan needs such a storage, and then by the plan with the
//! fewest of them.
//!
//! A plan `P` (a window, or segments released) frees the request's `S` bytes and usually some
//! spare bytes `x(P)` beyond (the rest of a run, of a released segment). [`Strategy::Window`]
//! ranks plans by `Σ r(t) - 3λ/8 · x(P)`, where `λ` is the lowest `r(t) / m(t)` among the
//! evictable storages now (the price per byte of the heuristic's own choice): spare room is
//! worth something (the next requests need no eviction), but less than what the cheapest
//! eviction would buy it for. The variants:
//! - [`Strategy::WindowTotal`]: `Σ r(t)`, spare room worth nothing (Coop's window as published:
//!   the least total cost that covers the request);
//! - [`Strategy::WindowScore`]: `Σ r(t) / m(t)`, the h_DTR^eq scores summed;
//! - [`Strategy::WindowFirst`]: the heuristic's choice when it alone lets the request
//!   through (then contiguity costs nothing), else [`Strategy::Window`]'s plan;
//! - [`Strategy::WindowDeficit`]: while the storages' bytes (the request included) pass the
//!   device's capacity, the heuristic's choices, exactly as the allocator-blind run evicts;
//!   once they fit, a miss is fragmentation alone and [`Strategy::Window`]'s plan answers it.
//!
//! # Moving instead of evicting
//!
//! Most misses of the window strategies come while the storages' bytes fit the device: the
//! cached free blocks hold enough bytes, only not in one piece (GPT-4 at ratio 0.45: all 198
//! misses of `window`). The moving strategies copy live blocks out of the way (a device copy,
//! [`Backend::make_room_by_moving`], `move_plan.rs`): nothing is lost, and the copy is
//! charged on the clock, `1000 ns + 2 · bytes / 650 B/ns` per block (the corpus's nominal GPU:
//! launch time, each byte read and written once at 650 GB/s; not fitted), and with the
//! rematerializations against the thrashing limit.
//! - [`Strategy::WindowMove`]: on a miss while the storages' bytes fit the device, the move
//!   plan that copies the fewest bytes (a window inside a segment, or whole segments given
//!   back; free blocks inside the window are held while the copies are made when a copy's
//!   best fit would land there), at most two between evictions; otherwise
//!   [`Strategy::Window`]'s plan. Every storage in memory may move, locked inputs of the
//!   running call and pinned constants included (a copy keeps the data; only the address
//!   changes): in resnet18-64's backward at ratio 0.5 nothing is evictable and a 196 MiB
//!   request misses with 266 MiB free in pieces of at most 147 MiB.
//! - [`Strategy::WindowMoveAll`]: the same, and the victims of the window's plan are copied
//!   outside what the plan frees instead of evicted wherever the allocator's best fit can put
//!   them and the copy costs less than the victim's recompute cost `c(t)`
//!   ([`Backend::move_out`]); the rest are evicted. Its plans for a small-pool request (at most
//!   1 MiB) make room for the whole 2 MiB small segment the allocator would create for it
//!   ([`crate::backend::whole_segment`]), not for the request alone: when the device is full
//!   of segments and no free small block holds the request, a window of the request's size
//!   frees one small storage, and the next small request misses again (lstm-32 at ratio 0.60,
//!   before this: 10,369 misses, 9,803 of whose move tries found no plan); a whole segment's
//!   window or release serves the next ones. (The eviction plans only: a move plan
//!   ([`Backend::make_room_by_moving`]) answers the request's own miss.)
//! - [`Strategy::WindowMoveAhead`]: [`Strategy::WindowMoveAll`] with look-ahead at the next
//!   request. A replayed log knows the next large-pool request of the program before its next
//!   release ([`Runtime::set_ahead`]; for a live run the analogue would be the previous
//!   iteration's log, not wired). A large-pool miss is planned for the request and that next
//!   one at once (a window holding both sizes, or a release), and that joint plan is taken
//!   when its cost is at most the cost of the request's own plan plus the cost of the plan the
//!   next request alone would need now (0 when a cached free block or the device's free bytes
//!   serve it): one window then answers two requests, and the second does not miss and evict
//!   again. No constant. Measured (README, "Look-ahead at the next request"): 10 of 12 fit logs
//!   (mean distance +0.013, against `window-move-all`'s 12 and +0.000), 7 of 13 report logs
//!   (+0.046, against 7 and +0.035), so it is not the default.
//!
//! The three moving strategies (`window-move`, `window-move-all`, `window-move-ahead`), when
//! nothing is left to evict (out of memory otherwise) while the storages' bytes fit, try one
//! last move plan per allocation (a window or segments released) whose copies may take new
//! segments from the device's free bytes where no cached block holds them; if the retry still
//! misses, the allocation is out of memory (vgg16-32 at 0.55: every storage locked by the
//! running call, a 392 MiB request, its one window's 33.6 MiB of copies with
//! nowhere cached to go and 107 MiB left on the device). Only then: allowed on every miss it
//! put lstm and gpt-4 off the targets on the fit half.
//!
//! The factor 3/8 is fitted on the fit half of issue 28's logs (the five shared logs and seven
//! recorded ones, `corpus/README.md`): 0 (`window-total`), 1/8, 1/4, 3/8, 1/2 (the earlier
//! value, fitted on the five shared logs alone) and 1 were measured; 1/4 and 3/8 meet the three
//! targets (smallest budget within 0.05 of the allocator-blind run, overheads at ratios >= 0.5
//! within 1.10x of it, monotone) on 9 of the 12 fit logs, the others on 8, and 3/8 has the
//! lowest mean distance to the blind run (+0.029). On the report half (13 recorded logs) 3/8
//! meets them on 5 (1/2: 3) and is within 0.05 on 8 (1/2: 5); no strategy here meets them on
//! every log. `examples/device_budget.rs` prints the per-log table, the README has the figures.
//! The moving strategies add no constant of their own (the copy's price is the cost model's):
//! `window-move-all`, the default since issue 28, meets the three targets on all 12 fit logs
//! and 7 of the 13 report logs (mean distance to the blind run +0.000 and +0.035; before
//! whole small segments: 11 and 7, densenet201-32 +0.10), `window-move` on 9 and 6. Whole
//! small segments for `window` and `window-move` leave their counts as they were (9 and 5, 9
//! and 6), so only `window-move-all` plans them. Under expandable segments `window-move-all`
//! meets the targets on 8 fit and 6 report logs only. What it still misses (README, "Moving
//! live blocks"): final-phase and backward thrash (lstm-32, swin_t-32, inception_v3-32),
//! evictions forced by the allocator's segment rounding while the storages' bytes fit
//! (resnet18-64, convnext_tiny-32), and vgg16-32 out of memory at 0.55 (since the
//! last-resort plan above, in the final phase instead of the backward).

use std::fmt;
use std::str::FromStr;
use std::time::Instant;

use crate::backend::{AllocOutcome, AllocRequest, Backend};
use crate::error::{Error, Result};
use crate::graph::StorageId;
use crate::runtime::{EvictReason, Runtime};

/// How the core makes room when the device misses (see the module docs for the costs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Strategy {
    /// Evict the heuristic's choice, one storage at a time, and retry. CLI name `callback`.
    Callback,
    /// The cheapest plan by `Σ r(t) - 3λ/8 · spare bytes`. CLI name `window`.
    Window,
    /// The cheapest plan by `Σ r(t)`. CLI name `window-total`.
    WindowTotal,
    /// The cheapest plan by the sum of h_DTR^eq scores `Σ r(t) / m(t)`. CLI name
    /// `window-score`.
    WindowScore,
    /// The heuristic's choice when it alone makes room, else [`Strategy::Window`]. CLI name
    /// `window-first`.
    WindowFirst,
    /// Deficit first: while the storages' bytes pass the device's capacity, evict the
    /// heuristic's choices, as the allocator-blind run would; once they fit and the device
    /// still misses (fragmentation), [`Strategy::Window`]'s plan. CLI name `window-deficit`.
    WindowDeficit,
    /// [`Strategy::Window`], but a miss while the storages' bytes fit the device is first
    /// answered by moving live blocks out of the way (a device copy, `move_plan.rs`);
    /// [`Strategy::Window`]'s plan when no move plan exists. CLI name `window-move`.
    WindowMove,
    /// [`Strategy::WindowMove`], and the victims of the window's plan are moved out of the
    /// window instead of evicted where a copy costs less than their recompute cost `c(t)` and
    /// the allocator can put them outside it; a small-pool request's plan makes room for the
    /// whole 2 MiB small segment ([`crate::backend::whole_segment`]). The default: it meets
    /// issue 28's targets on the most logs of both halves (module docs). CLI name
    /// `window-move-all`.
    #[default]
    WindowMoveAll,
    /// [`Strategy::WindowMoveAll`] with look-ahead at the next request: when a replayed log
    /// says which large-pool request follows the program's call before any release
    /// ([`Runtime::set_ahead`], [`Backend::look_ahead`]), a large-pool miss is also planned for
    /// both requests at once (one window or release holding the two sizes), and that plan is
    /// taken when it costs no more than the plan for the request alone plus the plan the next
    /// request alone would need now (nothing when a cached free block or the device's free
    /// bytes serve it). No constant. Without a look-ahead (the live driver) it is
    /// [`Strategy::WindowMoveAll`]. CLI name `window-move-ahead`.
    WindowMoveAhead,
}

impl Strategy {
    /// Every strategy, in CLI order.
    pub const ALL: [Strategy; 9] = [
        Strategy::Callback,
        Strategy::Window,
        Strategy::WindowTotal,
        Strategy::WindowScore,
        Strategy::WindowFirst,
        Strategy::WindowDeficit,
        Strategy::WindowMove,
        Strategy::WindowMoveAll,
        Strategy::WindowMoveAhead,
    ];

    /// The CLI and JSON name: `callback`, `window`, `window-total`, `window-score`,
    /// `window-first`, `window-deficit`, `window-move`, `window-move-all`,
    /// `window-move-ahead`.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Callback => "callback",
            Strategy::Window => "window",
            Strategy::WindowTotal => "window-total",
            Strategy::WindowScore => "window-score",
            Strategy::WindowFirst => "window-first",
            Strategy::WindowDeficit => "window-deficit",
            Strategy::WindowMove => "window-move",
            Strategy::WindowMoveAll => "window-move-all",
            Strategy::WindowMoveAhead => "window-move-ahead",
        }
    }

    /// The names of [`Strategy::ALL`] as a sentence: `callback, window, ... or window-deficit`
    /// (for help texts and errors, so that no other list of names exists).
    pub fn names() -> String {
        crate::names_sentence(Strategy::ALL.map(Strategy::name))
    }

    /// Whether it plans with the allocator's view (every strategy but `callback`).
    pub fn uses_window(self) -> bool {
        self != Strategy::Callback
    }

    /// The share of the cheapest price per byte credited for each spare byte.
    fn spare_credit(self) -> f64 {
        match self {
            Strategy::Window
            | Strategy::WindowFirst
            | Strategy::WindowDeficit
            | Strategy::WindowMove
            | Strategy::WindowMoveAll
            | Strategy::WindowMoveAhead => 0.375,
            _ => 0.0,
        }
    }

    /// Whether its plans make room for a small-pool request's whole 2 MiB segment
    /// ([`crate::backend::whole_segment`]).
    pub fn whole_segment(self) -> bool {
        matches!(self, Strategy::WindowMoveAll | Strategy::WindowMoveAhead)
    }

    /// Whether it moves live blocks before evicting.
    pub fn moves(self) -> bool {
        matches!(
            self,
            Strategy::WindowMove | Strategy::WindowMoveAll | Strategy::WindowMoveAhead
        )
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An unknown strategy name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown strategy '{0}' (use {names})", names = Strategy::names())]
pub struct UnknownStrategy(pub String);

impl FromStr for Strategy {
    type Err = UnknownStrategy;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        let k = s.trim().to_ascii_lowercase().replace('_', "-");
        Strategy::ALL
            .into_iter()
            .find(|x| x.name() == k)
            .or(match k.as_str() {
                "coop" => Some(Strategy::WindowTotal),
                _ => None,
            })
            .ok_or_else(|| UnknownStrategy(s.to_string()))
    }
}

/// Move plans tried for one allocation before the moving strategies evict, counted again
/// from 0 after each eviction round (a plan whose retry still misses is not repeated
/// forever). Not fitted.
const MOVE_PLANS: u32 = 2;

/// Launch time charged per block copied, ns: the corpus's nominal GPU (`corpus/README.md`,
/// `launch_ns=1000`), not fitted.
const MOVE_LAUNCH_NS: u64 = 1000;

/// Device copy bandwidth, bytes per ns: the corpus's nominal GPU (650 GB/s); a copy reads and
/// writes its bytes once each. Not fitted.
const COPY_BYTES_PER_NS: u64 = 650;

/// The time charged for copying one block of `bytes`, ns.
fn copy_ns(bytes: u64) -> u64 {
    MOVE_LAUNCH_NS + (bytes * 2).div_ceil(COPY_BYTES_PER_NS)
}

impl<B: Backend> Runtime<B> {
    /// Gives fresh storage `s` its bytes under a device budget: `try_allocate`, and on a
    /// miss make room and retry; with `in_place` the bytes of that storage are handed over
    /// instead when the backend can.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] when nothing is left to evict; [`Error::Backend`].
    pub(crate) fn allocate_on_device(
        &mut self,
        s: StorageId,
        in_place: Option<StorageId>,
    ) -> Result<()> {
        if let Some(from) = in_place {
            if self.backend.transfer(from, s).map_err(Error::Backend)? {
                // The new version holds the old one's bytes: count them once.
                self.profile.in_place += 1;
                self.memory -= self.storages[s.index()].size;
                self.storages[from.index()].donated = true;
                return Ok(());
            }
        }
        let request = AllocRequest {
            storage: s,
            bytes: self.storages[s.index()].size,
            compute_ns: self.storages[s.index()].compute,
        };
        self.room_moves = 0;
        self.room_last_resort = false;
        loop {
            match self.backend.try_allocate(request).map_err(Error::Backend)? {
                AllocOutcome::Done => return Ok(()),
                AllocOutcome::Miss => self.room_after_miss(request.bytes)?,
            }
        }
    }

    /// [`Runtime::allocate_on_device`] for the duplicates of a run.
    pub(crate) fn allocate_scratch_on_device(&mut self, bytes: u64) -> Result<()> {
        self.room_moves = 0;
        self.room_last_resort = false;
        loop {
            match self
                .backend
                .try_allocate_scratch(bytes)
                .map_err(Error::Backend)?
            {
                AllocOutcome::Done => return Ok(()),
                AllocOutcome::Miss => self.room_after_miss(bytes)?,
            }
        }
    }

    /// Evicts after a miss of `bytes` as the strategy says.
    fn room_after_miss(&mut self, bytes: u64) -> Result<()> {
        self.profile.misses += 1;
        let start = Instant::now();
        let mut victims = std::mem::take(&mut self.room_victims);
        victims.clear();
        let strategy = self.config.strategy;
        let capacity = self.backend.device_capacity().unwrap_or(u64::MAX);
        if strategy == Strategy::WindowDeficit && self.memory > capacity {
            // Memory-bound: the storages alone (the request included) pass the device, so
            // evict as the allocator-blind run would until they fit.
            let mut result = Ok(());
            while self.memory > capacity {
                let Some(v) = self.choose() else { break };
                if let Err(e) = self.evict(v, EvictReason::Heuristic) {
                    result = Err(e);
                    break;
                }
                victims.push(v);
            }
            self.profile.search_ns += start.elapsed().as_nanos() as u64;
            let none = victims.is_empty();
            self.room_victims = victims;
            if none {
                return Err(Error::OutOfMemory {
                    requested: bytes,
                    used: self.memory,
                    budget: capacity,
                });
            }
            return result;
        }
        if strategy.moves() && self.memory <= capacity && self.room_moves < MOVE_PLANS {
            // The bytes fit: fragmentation alone. Move what is in the way, if it can go.
            self.room_moves += 1;
            let storages = &self.storages;
            let movable = |s: StorageId| storages.get(s.index()).is_some_and(|st| st.is_material());
            let moved = self
                .backend
                .make_room_by_moving(&movable, false)
                .map_err(Error::Backend)?;
            if let Some(m) = moved {
                self.charge_moves(m);
                self.profile.search_ns += start.elapsed().as_nanos() as u64;
                self.room_victims = victims;
                return Ok(());
            }
        }
        if strategy.uses_window() {
            self.plan_window(strategy, &mut victims)?;
            if strategy.whole_segment() && !victims.is_empty() {
                // Copy instead of evict where the copy is cheaper than the recompute.
                let mut worth = std::mem::take(&mut self.room_costs);
                worth.clear();
                for &v in &victims {
                    let c = self.recompute_cost(v).max(0) as f64;
                    worth.push(if (copy_ns(self.storages[v.index()].size) as f64) < c {
                        1.0
                    } else {
                        0.0
                    });
                }
                let list = victims.clone();
                let is_worth = |s: StorageId| {
                    list.iter()
                        .position(|&v| v == s)
                        .is_some_and(|k| worth[k] > 0.0)
                };
                let moved = self
                    .backend
                    .move_out(&mut victims, &is_worth)
                    .map_err(Error::Backend);
                worth.clear();
                self.room_costs = worth;
                let m = moved?;
                self.charge_moves(m);
                if m.blocks > 0 && victims.is_empty() {
                    self.profile.search_ns += start.elapsed().as_nanos() as u64;
                    self.room_victims = victims;
                    return Ok(());
                }
            }
        }
        if victims.is_empty() {
            // The callback strategy, or no plan: the heuristic's choice.
            victims.extend(self.choose());
        }
        self.profile.search_ns += start.elapsed().as_nanos() as u64;
        if victims.is_empty()
            && strategy.moves()
            && self.memory <= capacity
            && !self.room_last_resort
        {
            // Nothing left to evict: one last move plan per allocation whose copies may take
            // new segments from the device's free bytes (vgg16-32 at 0.55: every storage
            // locked, a 392 MiB request, the one window's 33.6 MiB of copies held by no cached
            // block). Once only: a retry that still misses is out of memory, never a loop of
            // copies between windows.
            self.room_last_resort = true;
            let start = Instant::now();
            let storages = &self.storages;
            let movable = |s: StorageId| storages.get(s.index()).is_some_and(|st| st.is_material());
            let moved = self.backend.make_room_by_moving(&movable, true);
            self.profile.search_ns += start.elapsed().as_nanos() as u64;
            if let Some(m) = moved.map_err(Error::Backend)? {
                self.charge_moves(m);
                self.room_victims = victims;
                return Ok(());
            }
        }
        if victims.is_empty() {
            self.room_victims = victims;
            return Err(Error::OutOfMemory {
                requested: bytes,
                used: self.memory,
                budget: self.backend.device_capacity().unwrap_or(0),
            });
        }
        if strategy.moves() {
            // The evictions change the layout: the next miss of this allocation may move again.
            self.room_moves = 0;
        }
        let mut result = Ok(());
        for &v in &victims {
            let st = &self.storages[v.index()];
            if st.is_material() && st.locks == 0 && !st.pinned {
                if let Err(e) = self.evict(v, EvictReason::Heuristic) {
                    result = Err(e);
                    break;
                }
            }
        }
        self.room_victims = victims;
        result
    }

    /// Charges the copies of `m`: on the clock and in the profile.
    fn charge_moves(&mut self, m: crate::backend::Moved) {
        let ns = m.blocks * MOVE_LAUNCH_NS + (m.bytes * 2).div_ceil(COPY_BYTES_PER_NS);
        self.clock += ns;
        self.profile.moves += m.blocks;
        self.profile.moved_bytes += m.bytes;
        self.profile.move_ns += ns;
        self.profile.scanned_blocks += m.scanned;
    }

    /// Fills `victims` with the allocator's cheapest plan for the last miss under `strategy`.
    fn plan_window(&mut self, strategy: Strategy, victims: &mut Vec<StorageId>) -> Result<()> {
        if self.estar.enabled() {
            self.estar.flush(&self.storages);
        }
        if strategy == Strategy::WindowFirst {
            if let Some(t) = self.choose() {
                let only = |s: StorageId| (s == t).then_some(0.0);
                let scanned = self.backend.plan_room(&only, 0.0, false, victims);
                self.profile.scanned_blocks += scanned.map_err(Error::Backend)?;
                if !victims.is_empty() {
                    return Ok(());
                }
            }
        }
        let mut costs = std::mem::take(&mut self.room_costs);
        costs.resize(self.storages.len(), f64::NAN);
        // The cheapest price of a byte now: the lowest rate per byte among the evictable
        // storages (the heuristic's own choice, for h_DTR^eq).
        let mut price = f64::INFINITY;
        for k in 0..self.pool.len() {
            let s = self.pool[k];
            let rate = self.eviction_rate(s);
            let bytes = self.storages[s.index()].size.max(1) as f64;
            price = price.min(rate / bytes);
            costs[s.index()] = if strategy == Strategy::WindowScore {
                rate / bytes
            } else {
                rate
            };
        }
        let credit = if price.is_finite() {
            price * strategy.spare_credit()
        } else {
            0.0
        };
        let lookup = |s: StorageId| costs.get(s.index()).copied().filter(|c| !c.is_nan());
        self.backend
            .look_ahead(if strategy == Strategy::WindowMoveAhead {
                self.ahead
            } else {
                0
            });
        let scanned = self
            .backend
            .plan_room(&lookup, credit, strategy.whole_segment(), victims);
        for &s in &self.pool {
            costs[s.index()] = f64::NAN;
        }
        self.room_costs = costs;
        self.profile.scanned_blocks += scanned.map_err(Error::Backend)?;
        Ok(())
    }

    /// `r(s) = c(s) / staleness(s)` of evictable storage `s`, `+inf` at staleness 0 (see the
    /// module docs).
    fn eviction_rate(&mut self, s: StorageId) -> f64 {
        let c = self.recompute_cost(s).max(0);
        // The same double as `c as f64` (round to nearest), without the slow i128 conversion
        // whenever the cost fits in 64 bits.
        let c = u64::try_from(c).map_or(c as f64, |c| c as f64);
        let stale = self
            .clock
            .saturating_sub(self.storages[s.index()].last_access) as f64;
        if stale == 0.0 {
            f64::INFINITY
        } else {
            c / stale
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for s in Strategy::ALL {
            assert_eq!(s.name().parse::<Strategy>().unwrap(), s);
        }
        assert_eq!("COOP".parse::<Strategy>().unwrap(), Strategy::WindowTotal);
        assert_eq!(Strategy::default(), Strategy::WindowMoveAll);
        assert_eq!(
            "best-fit".parse::<Strategy>().unwrap_err().to_string(),
            "unknown strategy 'best-fit' (use callback, window, window-total, window-score, window-first, window-deficit, window-move, window-move-all or window-move-ahead)"
        );
    }
}
