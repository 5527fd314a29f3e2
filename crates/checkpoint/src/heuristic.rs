//! Eviction heuristics: which storage to evict next (the paper's §3 heuristics and baselines).
//!
//! Every DTR-family score is `cost / (memory × staleness)`, the lowest evicted first, where
//! memory is the storage's bytes and staleness the simulated time (ns) since its last access.
//! Scores are compared exactly as fractions of integers (no floating-point ties). As in simrd's
//! list scan, among equal scores the storage that entered the pool last wins, except score 0,
//! where the first one wins; a zero denominator is an infinite score.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

use crate::backend::Backend;
use crate::graph::{NONE, StorageId, StorageState};
use crate::runtime::Runtime;

/// An eviction heuristic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Heuristic {
    /// h_DTR (the paper's full heuristic): cost = compute of the storage plus the compute of its
    /// exact evicted neighbourhood e* (evicted ancestors and descendants that would be
    /// recomputed with it), over memory × staleness. simrd's `DTR`. CLI name `dtr`.
    Dtr,
    /// h_DTR^eq: e* approximated by union-find equivalence classes of evicted storages (merged
    /// on eviction, decremented on rematerialization, never split). simrd's `DTREqClass`, the
    /// paper's main configuration. CLI name `dtr-eq`.
    DtrEq,
    /// h_DTR^local: the storage's own compute only, over memory × staleness. simrd's
    /// `DTRLocal`. CLI name `dtr-local`.
    DtrLocal,
    /// LRU: the least recently accessed storage. simrd's `LRU`. CLI name `lru`.
    Lru,
    /// Largest-first: the largest storage. simrd's `LargestStorage` (h_size). CLI name
    /// `largest`.
    Largest,
    /// MSPS ("memory saved per second", from Peng et al.'s Capuchin): compute of the storage
    /// and its evicted ancestors over memory, no staleness. simrd's `MSPS`. CLI name `msps`.
    Msps,
    /// Uniformly random (seeded). simrd's `RandomStorage` (h_rand). CLI name `random`.
    Random,
}

impl Heuristic {
    /// Every heuristic, in the paper's order.
    pub const ALL: [Heuristic; 7] = [
        Heuristic::Dtr,
        Heuristic::DtrEq,
        Heuristic::DtrLocal,
        Heuristic::Lru,
        Heuristic::Largest,
        Heuristic::Msps,
        Heuristic::Random,
    ];

    /// The CLI and JSON name (`dtr`, `dtr-eq`, `dtr-local`, `lru`, `largest`, `msps`,
    /// `random`).
    pub fn name(self) -> &'static str {
        match self {
            Heuristic::Dtr => "dtr",
            Heuristic::DtrEq => "dtr-eq",
            Heuristic::DtrLocal => "dtr-local",
            Heuristic::Lru => "lru",
            Heuristic::Largest => "largest",
            Heuristic::Msps => "msps",
            Heuristic::Random => "random",
        }
    }

    /// The names of [`Heuristic::ALL`] as a sentence: `dtr, dtr-eq, ..., msps or random` (for
    /// help texts and errors, so that no other list of names exists).
    pub fn names() -> String {
        crate::names_sentence(Heuristic::ALL.map(Heuristic::name))
    }

    /// Whether it needs the equivalence classes.
    pub fn uses_eq_classes(self) -> bool {
        self == Heuristic::DtrEq
    }

    /// Whether it needs the exact evicted regions.
    pub fn uses_estar(self) -> bool {
        matches!(self, Heuristic::Dtr | Heuristic::Msps)
    }
}

impl fmt::Display for Heuristic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An unknown heuristic name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown heuristic '{0}' (use {names})", names = Heuristic::names())]
pub struct UnknownHeuristic(pub String);

impl FromStr for Heuristic {
    type Err = UnknownHeuristic;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let k = s.trim().to_ascii_lowercase().replace('_', "-");
        Heuristic::ALL
            .into_iter()
            .find(|h| h.name() == k)
            .or(match k.as_str() {
                "h-dtr" => Some(Heuristic::Dtr),
                "eq" | "dtr-eqclass" => Some(Heuristic::DtrEq),
                "local" => Some(Heuristic::DtrLocal),
                "size" | "largest-first" => Some(Heuristic::Largest),
                "rand" => Some(Heuristic::Random),
                _ => None,
            })
            .ok_or_else(|| UnknownHeuristic(s.to_string()))
    }
}

/// A seeded SplitMix64 generator (sampling and the random heuristic need only a few
/// reproducible draws).
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator with `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A uniform draw in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        ((self.next_u64() as u128 * n as u128) >> 64) as usize
    }
}

/// A score `num / den`; `den == 0` is +infinity.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Score {
    num: i128,
    den: u128,
}

impl Score {
    fn ratio(num: i128, den: u128) -> Self {
        Score { num, den }
    }

    fn is_zero(self) -> bool {
        self.den != 0 && self.num == 0
    }

    fn cmp(self, other: Score) -> Ordering {
        match (self.den == 0, other.den == 0) {
            (true, true) => Ordering::Equal,
            (true, false) => Ordering::Greater,
            (false, true) => Ordering::Less,
            (false, false) => (self.num * other.den as i128).cmp(&(other.num * self.den as i128)),
        }
    }
}

impl<B: Backend> Runtime<B> {
    /// The heuristic's choice among the evictable storages, or `None` when there is none.
    pub(crate) fn choose(&mut self) -> Option<StorageId> {
        let n = self.pool.len();
        if n == 0 {
            return None;
        }
        if self.config.heuristic == Heuristic::Random {
            self.profile.evaluations += 1;
            return Some(self.pool[self.rng.below(n)]);
        }
        let small_limit = if self.config.ignore_small_tensors && self.size_count > 0 {
            // size < 1% of the average  <=>  size * 100 * count < sum
            Some((self.size_sum, self.size_count as u128 * 100))
        } else {
            None
        };
        let sample = if self.config.sampling {
            ((n as f64).sqrt().ceil() as usize).clamp(1, n)
        } else {
            n
        };
        if self.estar.enabled() {
            self.estar.flush(&self.storages);
        }
        let mut best: Option<(Score, u64, StorageId)> = None;
        for k in 0..sample {
            let s = if self.config.sampling {
                self.pool[self.rng.below(n)]
            } else {
                self.pool[k]
            };
            if let Some((sum, scale)) = small_limit {
                if (self.storages[s.index()].size as u128) * scale < sum {
                    continue;
                }
            }
            let score = self.score(s);
            self.profile.evaluations += 1;
            let seq = self.storages[s.index()].pool_seq;
            let better = match best {
                None => true,
                Some((b, bseq, _)) => match score.cmp(b) {
                    Ordering::Less => true,
                    Ordering::Greater => false,
                    Ordering::Equal if score.is_zero() => seq < bseq,
                    Ordering::Equal => seq > bseq,
                },
            };
            if better {
                best = Some((score, seq, s));
            }
        }
        best.map(|(_, _, s)| s)
    }

    /// The heuristic's score of material storage `s` (lower is evicted first).
    pub(crate) fn score(&mut self, s: StorageId) -> Score {
        let (size, last) = {
            let st = &self.storages[s.index()];
            (st.size as u128, st.last_access)
        };
        let stale = self.clock.saturating_sub(last) as u128;
        match self.config.heuristic {
            Heuristic::Lru => Score::ratio(last as i128, 1),
            Heuristic::Largest => Score::ratio(1, size),
            Heuristic::Msps => Score::ratio(self.recompute_cost(s), size),
            Heuristic::DtrLocal | Heuristic::Dtr | Heuristic::DtrEq => {
                Score::ratio(self.recompute_cost(s), size * stale)
            }
            Heuristic::Random => Score::ratio(0, 1),
        }
    }

    /// The heuristic's cost of recomputing material storage `s`, ns: its own compute plus,
    /// for h_DTR, its evicted neighbourhood e* (ancestors and descendants); for h_DTR^eq, the
    /// values of the distinct equivalence classes of its evicted neighbours; for MSPS, its
    /// evicted ancestors. The other heuristics: its own compute.
    pub(crate) fn recompute_cost(&mut self, s: StorageId) -> i128 {
        let compute = self.storages[s.index()].compute as i128;
        match self.config.heuristic {
            Heuristic::Msps => {
                let (_, bwd) = self.estar.costs(&self.storages, s);
                compute + bwd as i128
            }
            Heuristic::Dtr => {
                let (fwd, bwd) = self.estar.costs(&self.storages, s);
                compute + fwd as i128 + bwd as i128
            }
            Heuristic::DtrEq => self.dtr_eq_cost(s),
            _ => compute,
        }
    }

    /// h_DTR^eq's cost of `s`: its compute plus the values of the distinct classes of its
    /// evicted neighbours, read from the compact `eq_live` (and none read at all when
    /// `eq_nbrs` says there is no such neighbour).
    fn dtr_eq_cost(&mut self, s: StorageId) -> i128 {
        let st = &self.storages[s.index()];
        let compute = st.compute as i128;
        if self.eq_nbrs[s.index()] == 0 {
            debug_assert!(
                st.parents
                    .iter()
                    .chain(st.children.iter())
                    .all(|&n| self.eq_live[n.index()] == NONE),
                "eq_nbrs of {s:?} out of step"
            );
            return compute;
        }
        // Most storages have one class or a few: the sort runs only for two or more.
        let mut roots = std::mem::take(&mut self.scratch_roots);
        roots.clear();
        for &n in st.parents.iter().chain(st.children.iter()) {
            let node = self.eq_live[n.index()];
            debug_assert_eq!(node, {
                let ns = &self.storages[n.index()];
                if matches!(ns.state, StorageState::Evicted | StorageState::Pending) {
                    ns.eq_node
                } else {
                    NONE
                }
            });
            if node != NONE && n != s {
                roots.push(self.eq.find(node));
            }
        }
        if roots.len() > 1 {
            roots.sort_unstable();
            roots.dedup();
        }
        let mut cost = compute;
        for &r in &roots {
            cost += self.eq.value(r) as i128;
        }
        self.scratch_roots = roots;
        cost
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for h in Heuristic::ALL {
            assert_eq!(h.name().parse::<Heuristic>().unwrap(), h);
        }
        assert_eq!("DTR_EQ".parse::<Heuristic>().unwrap(), Heuristic::DtrEq);
        assert!("belady".parse::<Heuristic>().is_err());
    }

    #[test]
    fn scores_compare_exactly() {
        let a = Score::ratio(1, 3);
        let b = Score::ratio(2, 6);
        let inf = Score::ratio(5, 0);
        assert_eq!(a.cmp(b), Ordering::Equal);
        assert_eq!(a.cmp(inf), Ordering::Less);
        assert_eq!(inf.cmp(Score::ratio(7, 0)), Ordering::Equal);
        assert_eq!(Score::ratio(-1, 5).cmp(Score::ratio(0, 1)), Ordering::Less);
        // 1e18+1 / 1e18 vs 1: equal as f64, not as fractions.
        let big = 1_000_000_000_000_000_000u128;
        assert_eq!(
            Score::ratio(big as i128 + 1, big).cmp(Score::ratio(1, 1)),
            Ordering::Greater
        );
    }

    #[test]
    fn splitmix_is_reproducible() {
        let mut a = SplitMix64::new(7);
        let mut b = SplitMix64::new(7);
        for _ in 0..100 {
            let x = a.below(10);
            assert_eq!(x, b.below(10));
            assert!(x < 10);
        }
    }
}
