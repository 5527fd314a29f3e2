//! The iteration order of PyTorch's sets of private pool ids: a mirror of c10's
//! `ska::flat_hash_set<MempoolId_t, MempoolIdHash>` (`c10/util/flat_hash_map.h`: Robin Hood
//! hashing with Fibonacci hashing, a load factor of 0.5, backward-shift deletion).
//!
//! PyTorch walks two such tables in an order its callers can see: `graph_pools_freeable`
//! (`emptyCache` frees the pools' segments in that order, so the `cudaFree` calls come in it)
//! and torch 2.15's `use_on_oom_pools` (an allocation that fails in the default pools takes
//! the first fitting block in that order). The order depends only on the ids and on the
//! history of inserts and erases, so this table keeps the ids exactly where c10's table keeps
//! them. Checked against the real allocators (torch-oracle, both versions): with ids 1..=6
//! inserted in order the walk is 5, 2, 4, 1, 6, 3.

use crate::pool_types::MempoolId;

/// Knuth's multiplicative constant (2^64 / golden ratio), c10's `fibonacci_hash_policy`.
const FIBONACCI: u64 = 11_400_714_819_323_198_485;
/// c10's `min_lookups`.
const MIN_LOOKUPS: usize = 4;
/// c10's default `_max_load_factor` (a `float`).
const MAX_LOAD_FACTOR: f64 = 0.5;

/// One slot: a key and its distance from its desired slot.
#[derive(Clone, Copy, Debug)]
struct Slot {
    key: MempoolId,
    distance: usize,
}

/// A set of pool ids that iterates in c10's `flat_hash_set` order.
#[derive(Clone, Debug, Default)]
pub(crate) struct HashOrder {
    /// `num_slots + max_lookups - 1` usable entries (c10's last entry is its end marker);
    /// empty before the first insert.
    slots: Vec<Option<Slot>>,
    /// Number of buckets (a power of two), 0 before the first insert.
    buckets: usize,
    /// `64 - log2(buckets)`.
    shift: u32,
    /// c10's `max_lookups`.
    max_lookups: usize,
    len: usize,
}

/// PyTorch's `MempoolIdHash`: the first half of the id unless it is 0, else the second.
fn hash(id: MempoolId) -> u64 {
    if id.first != 0 { id.first } else { id.second }
}

impl HashOrder {
    /// Number of ids held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether the set is empty.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn index(&self, id: MempoolId) -> usize {
        (FIBONACCI.wrapping_mul(hash(id)) >> self.shift) as usize
    }

    /// Whether `id` is in the set.
    pub(crate) fn contains(&self, id: MempoolId) -> bool {
        self.position(id).is_some()
    }

    fn position(&self, id: MempoolId) -> Option<usize> {
        if self.buckets == 0 {
            return None;
        }
        let mut i = self.index(id);
        let mut distance = 0;
        while let Some(Some(s)) = self.slots.get(i) {
            if s.distance < distance {
                return None;
            }
            if s.key == id {
                return Some(i);
            }
            i += 1;
            distance += 1;
        }
        None
    }

    /// The ids in iteration order.
    pub(crate) fn ids(&self) -> Vec<MempoolId> {
        self.slots.iter().flatten().map(|s| s.key).collect()
    }

    /// Inserts `id` (c10's `emplace`); false when it was there already.
    pub(crate) fn insert(&mut self, id: MempoolId) -> bool {
        if self.contains(id) {
            return false;
        }
        self.emplace_new(id);
        true
    }

    fn emplace_new(&mut self, id: MempoolId) {
        loop {
            if self.buckets == 0 {
                self.grow();
                continue;
            }
            let mut i = self.index(id);
            let mut distance = 0;
            while distance < self.max_lookups {
                match self.slots.get(i) {
                    Some(Some(s)) if s.distance >= distance => {
                        i += 1;
                        distance += 1;
                    }
                    _ => break,
                }
            }
            if distance == self.max_lookups
                || i >= self.slots.len()
                || (self.len + 1) as f64 > self.buckets as f64 * MAX_LOAD_FACTOR
            {
                self.grow();
                continue;
            }
            let Some(occupant) = self.slots[i] else {
                self.slots[i] = Some(Slot { key: id, distance });
                self.len += 1;
                return;
            };
            // Robin Hood: the new key takes the slot, the displaced one moves on.
            self.slots[i] = Some(Slot { key: id, distance });
            let result = i;
            let mut carry = occupant;
            carry.distance += 1;
            i += 1;
            loop {
                if i >= self.slots.len() {
                    // Past c10's end marker (never reached with a few ids): grow and retry.
                    self.slots[result] = Some(Slot {
                        key: carry.key,
                        distance: 0,
                    });
                    self.grow();
                    self.emplace_new(id);
                    return;
                }
                match self.slots[i] {
                    None => {
                        self.slots[i] = Some(carry);
                        self.len += 1;
                        return;
                    }
                    Some(s) if s.distance < carry.distance => {
                        self.slots[i] = Some(carry);
                        carry = s;
                        carry.distance += 1;
                    }
                    Some(_) => {
                        carry.distance += 1;
                        if carry.distance == self.max_lookups {
                            // c10 puts the displaced key back where the new one went, grows,
                            // and inserts the displaced key again.
                            let placed = self.slots[result].expect("just placed").key;
                            let back = Slot {
                                key: carry.key,
                                distance: self.slots[result].expect("just placed").distance,
                            };
                            self.slots[result] = Some(back);
                            debug_assert_eq!(placed, id);
                            self.grow();
                            self.emplace_new(placed);
                            return;
                        }
                    }
                }
                i += 1;
            }
        }
    }

    /// c10's `grow`: `rehash(max(4, 2 * bucket_count()))`.
    fn grow(&mut self) {
        self.rehash((2 * self.buckets).max(4));
    }

    fn rehash(&mut self, wanted: usize) {
        let wanted = wanted.max((self.len as f64 / MAX_LOAD_FACTOR).ceil() as usize);
        let buckets = wanted.next_power_of_two().max(2);
        if buckets == self.buckets {
            return;
        }
        let max_lookups = (buckets.trailing_zeros() as usize).max(MIN_LOOKUPS);
        let old = std::mem::replace(&mut self.slots, vec![None; buckets + max_lookups - 1]);
        self.buckets = buckets;
        self.shift = 64 - buckets.trailing_zeros();
        self.max_lookups = max_lookups;
        self.len = 0;
        for s in old.into_iter().flatten() {
            self.emplace_new(s.key);
        }
    }

    /// Erases `id` (c10's `erase`, shifting the following run back); false when absent.
    pub(crate) fn remove(&mut self, id: MempoolId) -> bool {
        let Some(mut i) = self.position(id) else {
            return false;
        };
        self.slots[i] = None;
        self.len -= 1;
        while let Some(Some(next)) = self.slots.get(i + 1).copied() {
            if next.distance == 0 {
                break;
            }
            self.slots[i] = Some(Slot {
                key: next.key,
                distance: next.distance - 1,
            });
            self.slots[i + 1] = None;
            i += 1;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u64) -> MempoolId {
        MempoolId::new(0, n)
    }

    fn seconds(h: &HashOrder) -> Vec<u64> {
        h.ids().iter().map(|i| i.second).collect()
    }

    /// The walks torch-oracle showed for ids 1..=n inserted in order (both torch versions:
    /// `emptyCache`'s `cudaFree` order of freeable pools, 2.15's `use_on_oom` order).
    #[test]
    fn walks_as_the_real_allocator_does() {
        for (n, want) in [
            (2u64, vec![2u64, 1]),
            (3, vec![2, 1, 3]),
            (4, vec![2, 4, 1, 3]),
            (5, vec![5, 2, 4, 1, 3]),
            (6, vec![5, 2, 4, 1, 6, 3]),
        ] {
            let mut h = HashOrder::default();
            for k in 1..=n {
                assert!(h.insert(id(k)));
            }
            assert_eq!(seconds(&h), want, "n = {n}");
            assert_eq!(h.len(), n as usize);
        }
    }

    #[test]
    fn insert_find_remove_agree_with_a_plain_set() {
        let mut h = HashOrder::default();
        let mut plain = std::collections::BTreeSet::new();
        let mut x: u64 = 7;
        for _ in 0..2000 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let k = id((x >> 33) % 40 + 1);
            if (x >> 20) % 3 == 0 {
                assert_eq!(h.remove(k), plain.remove(&k));
            } else {
                assert_eq!(h.insert(k), plain.insert(k));
            }
            assert_eq!(h.len(), plain.len());
            let mut got = h.ids();
            got.sort();
            assert_eq!(got, plain.iter().copied().collect::<Vec<_>>());
        }
        assert!(!h.is_empty() || plain.is_empty());
    }

    #[test]
    fn graph_ids_hash_by_their_first_half() {
        let mut h = HashOrder::default();
        h.insert(MempoolId::new(1, 0));
        h.insert(id(2));
        assert_eq!(h.ids(), vec![id(2), MempoolId::new(1, 0)]);
    }
}
