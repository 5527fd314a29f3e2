//! Exact evicted neighbourhoods e*(t) for h_DTR (and the evicted ancestors for MSPS), cached
//! per storage and invalidated only where an eviction or rematerialization changes them.
//!
//! The forward region of a material storage is the set of evicted storages reachable through
//! its children while staying on evicted storages; the backward region, through its parents
//! (simrd's `Region` / `region_rev`). h_DTR charges the compute of both. simrd keeps the sets
//! themselves and merges them on every eviction; here each material storage caches only the
//! two sums and a dirty flag. State changes are queued; before the next search for a victim,
//! one search from all of them through evicted storages finds exactly the material storages
//! whose regions touched them and marks them dirty; a dirty storage recomputes its sums (one
//! bounded search) when the heuristic next scores it. Eager evictions between searches (most
//! of them) thus cost O(1) each.
//! Pending (not yet computed) and banished storages are barriers, never region members.

use crate::graph::{Storage, StorageId, StorageState};

/// The cache.
#[derive(Clone, Debug, Default)]
pub(crate) struct EStar {
    enabled: bool,
    fwd: Vec<u64>,
    bwd: Vec<u64>,
    dirty: Vec<bool>,
    stamp: Vec<u32>,
    epoch: u32,
    stack: Vec<StorageId>,
    /// Storages whose state changed since the last flush.
    changed: Vec<StorageId>,
}

impl EStar {
    pub fn new(enabled: bool) -> Self {
        EStar {
            enabled,
            ..Self::default()
        }
    }

    #[inline]
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Turns the cache on or off; turning it on marks every storage dirty.
    pub fn set_enabled(&mut self, on: bool, storages: usize) {
        self.enabled = on;
        self.fwd.clear();
        self.bwd.clear();
        self.dirty.clear();
        self.stamp.clear();
        self.changed.clear();
        if on {
            self.grow(storages);
        }
    }

    /// Makes room for storages up to `n` (new ones start dirty).
    #[inline]
    pub fn grow(&mut self, n: usize) {
        if !self.enabled {
            return;
        }
        self.fwd.resize(n, 0);
        self.bwd.resize(n, 0);
        self.dirty.resize(n, true);
        self.stamp.resize(n, 0);
    }

    fn next_epoch(&mut self) -> u32 {
        self.epoch = self.epoch.wrapping_add(1);
        if self.epoch == 0 {
            self.stamp.iter_mut().for_each(|x| *x = 0);
            self.epoch = 1;
        }
        self.epoch
    }

    /// `s` was evicted, rematerialized or banished: `s` is dirty, and so is (at the next
    /// [`EStar::flush`]) every material storage whose regions reach `s` through evicted
    /// storages.
    #[inline]
    pub fn on_state_change(&mut self, s: StorageId) {
        self.dirty[s.index()] = true;
        self.changed.push(s);
    }

    /// A new edge between `a` and `b`: regions reaching either through evicted storages may
    /// grow.
    #[inline]
    pub fn on_edge(&mut self, storages: &[Storage], a: StorageId, b: StorageId) {
        for x in [a, b] {
            self.dirty[x.index()] = true;
            if storages[x.index()].state == StorageState::Evicted {
                self.changed.push(x);
            }
        }
    }

    /// Marks dirty every material storage that reaches a storage changed since the last
    /// flush through evicted storages (one search from all of them, in each direction).
    ///
    /// Batching is exact: if a material storage's region differs from when its sums were
    /// cached, some storage on an old or new region path changed state since, and the first
    /// such storage along the path reaches it through storages that are still evicted.
    pub fn flush(&mut self, storages: &[Storage]) {
        if self.changed.is_empty() {
            return;
        }
        for forward in [false, true] {
            let epoch = self.next_epoch();
            self.stack.clear();
            for &s in &self.changed {
                if self.stamp[s.index()] != epoch {
                    self.stamp[s.index()] = epoch;
                    self.stack.push(s);
                }
            }
            while let Some(x) = self.stack.pop() {
                let st = &storages[x.index()];
                let next = if forward { &st.children } else { &st.parents };
                for &y in next {
                    if self.stamp[y.index()] == epoch {
                        continue;
                    }
                    self.stamp[y.index()] = epoch;
                    match storages[y.index()].state {
                        StorageState::Material => self.dirty[y.index()] = true,
                        StorageState::Evicted => self.stack.push(y),
                        StorageState::Pending | StorageState::Banished => {}
                    }
                }
            }
        }
        self.changed.clear();
    }

    /// The compute (ns) of `s`'s forward and backward evicted regions (call [`EStar::flush`]
    /// first).
    pub fn costs(&mut self, storages: &[Storage], s: StorageId) -> (u64, u64) {
        if self.dirty[s.index()] {
            let f = self.region(storages, s, true);
            let b = self.region(storages, s, false);
            self.fwd[s.index()] = f;
            self.bwd[s.index()] = b;
            self.dirty[s.index()] = false;
        }
        (self.fwd[s.index()], self.bwd[s.index()])
    }

    fn region(&mut self, storages: &[Storage], s: StorageId, forward: bool) -> u64 {
        let epoch = self.next_epoch();
        self.stamp[s.index()] = epoch;
        self.stack.clear();
        self.stack.push(s);
        let mut sum = 0u64;
        while let Some(x) = self.stack.pop() {
            let st = &storages[x.index()];
            let next = if forward { &st.children } else { &st.parents };
            for &y in next {
                if self.stamp[y.index()] == epoch {
                    continue;
                }
                self.stamp[y.index()] = epoch;
                let ys = &storages[y.index()];
                if ys.state == StorageState::Evicted {
                    sum += ys.compute;
                    self.stack.push(y);
                }
            }
        }
        sum
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use crate::graph::{Storage, StorageId, StorageState};
    use crate::heuristic::SplitMix64;
    use crate::{Config, Heuristic, NullBackend, OpSpec, OutputSpec, Runtime, TensorId};

    fn fresh_search(storages: &[Storage], s: StorageId, forward: bool) -> u64 {
        let mut seen = HashSet::from([s]);
        let mut stack = vec![s];
        let mut sum = 0;
        while let Some(x) = stack.pop() {
            let st = &storages[x.index()];
            for &y in if forward { &st.children } else { &st.parents } {
                if storages[y.index()].state == StorageState::Evicted && seen.insert(y) {
                    sum += storages[y.index()].compute;
                    stack.push(y);
                }
            }
        }
        sum
    }

    fn check(rt: &mut Runtime<NullBackend>) {
        rt.estar.flush(&rt.storages);
        for i in 0..rt.storages.len() {
            if rt.storages[i].state != StorageState::Material {
                continue;
            }
            let s = StorageId(i as u32);
            let want = (
                fresh_search(&rt.storages, s, true),
                fresh_search(&rt.storages, s, false),
            );
            assert_eq!(rt.estar.costs(&rt.storages, s), want, "storage {s}");
        }
    }

    /// After every step of random programs under memory pressure, the cached region sums of
    /// every material storage equal a fresh search.
    #[test]
    fn cached_regions_match_a_fresh_search() {
        for seed in 0..300u64 {
            let mut rng = SplitMix64::new(seed);
            let mut rt = Runtime::new(
                NullBackend,
                Config {
                    budget: Some(200 + rng.below(600) as u64),
                    heuristic: Heuristic::Dtr,
                    ..Config::default()
                },
            );
            let mut handles: Vec<TensorId> = Vec::new();
            for _ in 0..60 {
                let r = match rng.below(10) {
                    0 => rt
                        .constant(1 + rng.below(30) as u64)
                        .map(|t| handles.push(t)),
                    1..=2 if !handles.is_empty() => {
                        let t = handles.swap_remove(rng.below(handles.len()));
                        rt.release(t)
                    }
                    _ if !handles.is_empty() => {
                        let args: Vec<TensorId> = (0..1 + rng.below(3))
                            .map(|_| handles[rng.below(handles.len())])
                            .collect();
                        let outs: Vec<OutputSpec> = (0..1 + rng.below(2))
                            .map(|_| {
                                if rng.below(5) == 0 {
                                    OutputSpec::alias_of(0)
                                } else {
                                    OutputSpec::fresh(10 + rng.below(90) as u64)
                                }
                            })
                            .collect();
                        rt.compute(OpSpec {
                            cost: 1 + rng.below(100) as u64,
                            args: &args,
                            outputs: &outs,
                        })
                        .map(|o| handles.extend(o.iter()))
                    }
                    _ => Ok(()),
                };
                check(&mut rt);
                if r.is_err() {
                    break;
                }
            }
        }
    }
}
