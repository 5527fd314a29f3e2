//! Union-find with summed values: the equivalence classes of evicted storages behind
//! h_DTR^eq (the paper's §4 "equivalence class" approximation of e*, simrd's `EqClassNode`).
//!
//! Evicting a storage creates a node holding its compute cost and merges it with the classes
//! of its evicted neighbours (values add up). Rematerializing subtracts the storage's cost from
//! its class and never splits it, so spurious connections remain, as in the paper.

use crate::graph::NONE;

/// The forest. Nodes are never freed during a run (a few per eviction).
#[derive(Clone, Debug, Default)]
pub struct UnionFind {
    parent: Vec<u32>,
    value: Vec<i64>,
}

impl UnionFind {
    /// An empty forest.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of nodes ever created.
    pub fn len(&self) -> usize {
        self.parent.len()
    }

    /// Whether no node was created.
    pub fn is_empty(&self) -> bool {
        self.parent.is_empty()
    }

    /// A new singleton class holding `value` (ns of compute); returns its node.
    pub fn make(&mut self, value: i64) -> u32 {
        let id = self.parent.len() as u32;
        self.parent.push(NONE);
        self.value.push(value);
        id
    }

    /// The root of `node`'s class (path halving).
    #[inline]
    pub fn find(&mut self, mut node: u32) -> u32 {
        loop {
            let p = self.parent[node as usize];
            if p == NONE {
                return node;
            }
            let gp = self.parent[p as usize];
            if gp == NONE {
                return p;
            }
            self.parent[node as usize] = gp;
            node = gp;
        }
    }

    /// The summed value of `node`'s class.
    #[inline]
    pub fn value(&mut self, node: u32) -> i64 {
        let r = self.find(node);
        self.value[r as usize]
    }

    /// Adds `delta` to `node`'s class value.
    pub fn add(&mut self, node: u32, delta: i64) {
        let r = self.find(node);
        self.value[r as usize] += delta;
    }

    /// Merges the classes of `a` and `b` (the values add up once, even when called again on
    /// the same pair); returns the new root. `b`'s root becomes the root, as in simrd.
    pub fn union(&mut self, a: u32, b: u32) -> u32 {
        let ra = self.find(a);
        let rb = self.find(b);
        if ra == rb {
            return rb;
        }
        self.parent[ra as usize] = rb;
        self.value[rb as usize] += self.value[ra as usize];
        rb
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_sums_once_and_subtract_never_splits() {
        let mut uf = UnionFind::new();
        let a = uf.make(10);
        let b = uf.make(5);
        let c = uf.make(1);
        uf.union(a, b);
        uf.union(a, b);
        assert_eq!(uf.value(a), 15);
        uf.union(c, a);
        assert_eq!(uf.value(c), 16);
        uf.add(b, -5);
        assert_eq!(uf.value(a), 11);
        assert_eq!(uf.find(a), uf.find(c));
        assert_eq!(uf.len(), 3);
    }
}
