//! The best-fit index of a pool's free blocks, ordered by `(stream, size, address)` exactly as
//! PyTorch's `std::set<Block*, BlockComparatorSize>`, but with O(1) size-class lookups.
//!
//! Per stream, sizes below [`EXACT_LIMIT`] bytes have one class per 512-byte size. A three-level
//! bitmap finds the next non-empty class at or above a size in a few `trailing_zeros`; each class
//! is a doubly linked list of its blocks sorted by address (usually zero to a handful), threaded
//! through a node table indexed by [`BlockId`], so removing a known block is O(1) and nothing is
//! allocated per block. Class heads live in lazily allocated pages of 256 classes; the bitmap's
//! lowest level grows with the largest class used. Larger sizes live in a vector sorted by
//! `(size, address)`. Iteration order is the same total order as PyTorch's set, so every decision
//! (best fit, ties to the lowest address, release order) is unchanged.

use smallvec::SmallVec;

use crate::block::{BlockId, SizeKey};
use crate::device::{DevicePtr, StreamId};

/// Sizes below this many bytes (64 MiB) use exact size classes; larger ones a sorted vector.
pub(crate) const EXACT_LIMIT: usize = 64 << 20;
const UNIT_SHIFT: u32 = 9;
const CLASSES: usize = EXACT_LIMIT >> UNIT_SHIFT; // 131072
const L0_WORDS: usize = CLASSES / 64; // 2048
const L1_WORDS: usize = L0_WORDS / 64; // 32

/// Node-table entries a new index has room for before it reallocates.
const INITIAL_NODES: usize = 1024;

/// No block: the end of a class list, or an empty class.
const NIL: u32 = u32::MAX;

/// A three-level bitmap over the size classes: bit set = class non-empty. The lowest level
/// covers only the classes up to the highest one ever set (the small pool needs 64 words).
#[derive(Clone, Debug, Default)]
struct Bitmap {
    l0: Vec<u64>,
    l1: [u64; L1_WORDS],
    l2: u64,
}

impl Bitmap {
    #[inline(always)]
    fn set(&mut self, c: usize) {
        let w = c >> 6;
        if w >= self.l0.len() {
            self.grow(w);
        }
        let word = self.l0[w];
        self.l0[w] = word | 1 << (c & 63);
        if word == 0 {
            // The word was empty: mark it in the upper levels.
            self.l1[w >> 6] |= 1 << (w & 63);
            self.l2 |= 1 << (w >> 6);
        }
    }

    #[cold]
    fn grow(&mut self, w: usize) {
        let len = (w + 1).next_power_of_two().clamp(64, L0_WORDS);
        self.l0.resize(len, 0);
    }

    #[inline(always)]
    fn clear(&mut self, c: usize) {
        let w = c >> 6;
        self.l0[w] &= !(1 << (c & 63));
        if self.l0[w] == 0 {
            self.l1[w >> 6] &= !(1 << (w & 63));
            if self.l1[w >> 6] == 0 {
                self.l2 &= !(1 << (w >> 6));
            }
        }
    }

    /// Word `w` of the lowest level (0 beyond the covered classes).
    #[inline]
    fn word(&self, w: usize) -> u64 {
        self.l0.get(w).copied().unwrap_or(0)
    }

    /// The lowest set class `>= c`.
    #[inline(always)]
    fn next_at_or_above(&self, c: usize) -> Option<usize> {
        if c >= CLASSES {
            return None;
        }
        let w = c >> 6;
        let m = self.word(w) & (!0u64 << (c & 63));
        if m != 0 {
            return Some((w << 6) | m.trailing_zeros() as usize);
        }
        let w1 = w + 1;
        if w1 >= L0_WORDS {
            return None;
        }
        let i = w1 >> 6;
        let m1 = self.l1[i] & (!0u64 << (w1 & 63));
        let word = if m1 != 0 {
            (i << 6) | m1.trailing_zeros() as usize
        } else {
            let i2 = i + 1;
            if i2 >= L1_WORDS {
                return None;
            }
            let m2 = self.l2 & (!0u64 << i2);
            if m2 == 0 {
                return None;
            }
            let i = m2.trailing_zeros() as usize;
            (i << 6) | self.l1[i].trailing_zeros() as usize
        };
        Some((word << 6) | self.l0[word].trailing_zeros() as usize)
    }

    /// The highest set class `< c`.
    #[inline]
    fn prev_below(&self, c: usize) -> Option<usize> {
        let c = c.min(CLASSES);
        if c == 0 {
            return None;
        }
        let top = c - 1;
        let w = top >> 6;
        let m = self.word(w) & (!0u64 >> (63 - (top & 63)));
        if m != 0 {
            return Some((w << 6) | (63 - m.leading_zeros() as usize));
        }
        if w == 0 {
            return None;
        }
        let w1 = w - 1;
        let i = w1 >> 6;
        let m1 = self.l1[i] & (!0u64 >> (63 - (w1 & 63)));
        let word = if m1 != 0 {
            (i << 6) | (63 - m1.leading_zeros() as usize)
        } else {
            if i == 0 {
                return None;
            }
            let m2 = self.l2 & (!0u64 >> (63 - (i - 1)));
            if m2 == 0 {
                return None;
            }
            let i = 63 - m2.leading_zeros() as usize;
            (i << 6) | (63 - self.l1[i].leading_zeros() as usize)
        };
        Some((word << 6) | (63 - self.l0[word].leading_zeros() as usize))
    }
}

/// Classes per lazily allocated page of class heads.
const PAGE: usize = 256;

/// One page of class heads: the lowest-address block of each class, or [`NIL`].
type HeadPage = Box<[u32; PAGE]>;

/// One stream's free blocks.
#[derive(Clone, Debug, Default)]
struct StreamFree {
    bitmap: Bitmap,
    /// Class -> its first block, in pages of [`PAGE`] classes allocated on first use (a direct
    /// index without hashing; memory grows with the size ranges in use).
    heads: Vec<Option<HeadPage>>,
    /// Blocks of `EXACT_LIMIT` bytes or more, by `(size, address)`.
    large: LargeSet,
}

impl StreamFree {
    /// The first block of class `c`, or [`NIL`].
    #[inline(always)]
    fn head(&self, c: usize) -> u32 {
        match self.heads.get(c / PAGE) {
            Some(Some(page)) => page[c % PAGE],
            _ => NIL,
        }
    }

    /// The head slot of class `c`, allocating its page if needed.
    #[inline(always)]
    fn head_mut(&mut self, c: usize) -> &mut u32 {
        let p = c / PAGE;
        if !matches!(self.heads.get(p), Some(Some(_))) {
            self.alloc_page(p);
        }
        match &mut self.heads[p] {
            Some(page) => &mut page[c % PAGE],
            None => unreachable!("the page was just allocated"),
        }
    }

    #[cold]
    #[inline(never)]
    fn alloc_page(&mut self, p: usize) {
        if p >= self.heads.len() {
            self.heads.resize_with(p + 1, || None);
        }
        self.heads[p].get_or_insert_with(|| Box::new([NIL; PAGE]));
    }
}

/// The free blocks of `EXACT_LIMIT` bytes or more of one stream, as a vector sorted by
/// `(size, address)`: there are few (device memory / 64 MiB at most), so binary search and a
/// short move beat a B-tree's node allocations.
#[derive(Clone, Debug, Default)]
struct LargeSet {
    entries: Vec<((usize, DevicePtr), BlockId)>,
}

impl LargeSet {
    /// Inserts `key -> id`; false if `key` is present.
    fn insert(&mut self, key: (usize, DevicePtr), id: BlockId) -> bool {
        match self.entries.binary_search_by_key(&key, |e| e.0) {
            Ok(_) => false,
            Err(at) => {
                self.entries.insert(at, (key, id));
                true
            }
        }
    }

    /// Removes `key` if it maps to `id`.
    fn remove(&mut self, key: (usize, DevicePtr), id: BlockId) -> bool {
        match self.entries.binary_search_by_key(&key, |e| e.0) {
            Ok(at) if self.entries[at].1 == id => {
                self.entries.remove(at);
                true
            }
            _ => false,
        }
    }

    fn get(&self, key: (usize, DevicePtr)) -> Option<BlockId> {
        let at = self.entries.binary_search_by_key(&key, |e| e.0).ok()?;
        Some(self.entries[at].1)
    }

    /// The entries `>= key`, ascending.
    fn from(&self, key: (usize, DevicePtr)) -> &[((usize, DevicePtr), BlockId)] {
        &self.entries[self.entries.partition_point(|e| e.0 < key)..]
    }

    /// The entries `< key`, ascending.
    fn below(&self, key: (usize, DevicePtr)) -> &[((usize, DevicePtr), BlockId)] {
        &self.entries[..self.entries.partition_point(|e| e.0 < key)]
    }
}

/// A free block's links in its class list (indexed by block id). A node is live (its block is
/// in an exact class list) unless `next == DEAD`; the key fields make removal exact.
#[derive(Clone, Copy, Debug)]
struct Node {
    ptr: DevicePtr,
    size: usize,
    stream: StreamId,
    prev: u32,
    next: u32,
}

/// `next` of a node whose block is not in a class list.
const DEAD: u32 = u32::MAX - 1;

const DEAD_NODE: Node = Node {
    ptr: 0,
    size: 0,
    stream: StreamId(0),
    prev: NIL,
    next: DEAD,
};

/// The free blocks of one pool in `(stream, size, address)` order. A block id is in the index
/// at most once.
#[derive(Clone, Debug)]
pub(crate) struct FreeIndex {
    /// Per stream, sorted by stream (PyTorch orders streams by handle value).
    streams: Vec<(StreamId, StreamFree)>,
    /// Class-list links of the blocks below `EXACT_LIMIT`, by block id.
    nodes: Vec<Node>,
    len: usize,
    /// Bitmap words a new stream's lowest level starts with: enough for the pool's usual sizes,
    /// so that filling a pool from empty does not grow it step by step.
    words: usize,
}

impl Default for FreeIndex {
    fn default() -> Self {
        FreeIndex::for_sizes_up_to(EXACT_LIMIT)
    }
}

#[inline]
fn class_of(size: usize) -> usize {
    size >> UNIT_SHIFT
}

impl FreeIndex {
    /// An empty index whose per-stream bitmaps start sized for free blocks of up to `size`
    /// bytes (larger ones still work: the bitmap grows). The small pool's blocks are at most one
    /// 2 MiB segment; the large pool's reach the exact-class limit and beyond.
    pub(crate) fn for_sizes_up_to(size: usize) -> Self {
        FreeIndex {
            streams: Vec::new(),
            nodes: Vec::with_capacity(INITIAL_NODES),
            len: 0,
            words: (class_of(size.min(EXACT_LIMIT - 1)) / 64 + 1)
                .next_power_of_two()
                .clamp(64, L0_WORDS),
        }
    }

    #[inline(always)]
    fn stream(&self, s: StreamId) -> Option<&StreamFree> {
        match self.streams.as_slice() {
            [(id, f)] => (*id == s).then_some(f),
            many => many.iter().find(|(id, _)| *id == s).map(|(_, f)| f),
        }
    }

    fn stream_index(&mut self, s: StreamId) -> usize {
        match self.streams.iter().position(|(id, _)| *id == s) {
            Some(i) => i,
            None => {
                let at = self.streams.partition_point(|(id, _)| *id < s);
                let mut f = StreamFree::default();
                f.bitmap.l0 = vec![0; self.words];
                self.streams.insert(at, (s, f));
                at
            }
        }
    }

    /// Number of free blocks.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Inserts a key; false if its block is already in the index.
    #[inline(always)]
    pub(crate) fn insert(&mut self, k: SizeKey) -> bool {
        // Fast path: the only stream, an allocated head page, a node slot.
        let id = k.id.0 as usize;
        if k.size < EXACT_LIMIT && id < self.nodes.len() && self.nodes[id].next == DEAD {
            if let [(s, f)] = self.streams.as_mut_slice() {
                let c = class_of(k.size);
                if *s == k.stream {
                    if let Some(Some(page)) = f.heads.get_mut(c / PAGE) {
                        link(&mut self.nodes, &mut page[c % PAGE], &mut f.bitmap, c, &k);
                        self.len += 1;
                        return true;
                    }
                }
            }
        }
        self.insert_slow(k)
    }

    #[cold]
    #[inline(never)]
    fn insert_slow(&mut self, k: SizeKey) -> bool {
        let s = self.stream_index(k.stream);
        if k.size >= EXACT_LIMIT {
            let inserted = self.streams[s].1.large.insert((k.size, k.ptr), k.id);
            self.len += usize::from(inserted);
            return inserted;
        }
        let id = k.id.0 as usize;
        if id >= self.nodes.len() {
            let len = (id + 1).next_power_of_two().max(INITIAL_NODES);
            self.nodes.resize(len, DEAD_NODE);
        } else if self.nodes[id].next != DEAD {
            return false;
        }
        let f = &mut self.streams[s].1;
        let c = class_of(k.size);
        f.head_mut(c);
        let Some(Some(page)) = f.heads.get_mut(c / PAGE) else {
            unreachable!("head_mut allocated the page");
        };
        link(&mut self.nodes, &mut page[c % PAGE], &mut f.bitmap, c, &k);
        self.len += 1;
        true
    }

    /// Removes a key; false if it was absent.
    #[inline(always)]
    pub(crate) fn remove(&mut self, k: &SizeKey) -> bool {
        if k.size >= EXACT_LIMIT {
            return self.remove_large(k);
        }
        if !self.contains(k) {
            return false;
        }
        self.remove_present(k);
        true
    }

    /// Removes a key that is in the index (one just found, or made from a free block's state:
    /// the caller knows it is there; checked in debug builds).
    #[inline(always)]
    pub(crate) fn remove_present(&mut self, k: &SizeKey) {
        if k.size >= EXACT_LIMIT {
            let removed = self.remove_large(k);
            debug_assert!(removed, "removing a key that is not in the index");
            return;
        }
        debug_assert!(self.contains(k), "removing a key that is not in the index");
        let id = k.id.0 as usize;
        let node = self.nodes[id];
        if node.prev == NIL {
            let c = class_of(k.size);
            let f = match self.streams.as_mut_slice() {
                [(_, f)] => f,
                many => match many.iter_mut().find(|(s, _)| *s == k.stream) {
                    Some((_, f)) => f,
                    None => unreachable!("a present key's stream has a list"),
                },
            };
            *f.head_mut(c) = node.next;
            if node.next == NIL {
                f.bitmap.clear(c);
            }
        } else {
            self.nodes[node.prev as usize].next = node.next;
        }
        if node.next != NIL {
            self.nodes[node.next as usize].prev = node.prev;
        }
        self.nodes[id].next = DEAD;
        self.len -= 1;
    }

    #[cold]
    #[inline(never)]
    fn remove_large(&mut self, k: &SizeKey) -> bool {
        let Some(i) = self.streams.iter().position(|(id, _)| *id == k.stream) else {
            return false;
        };
        let removed = self.streams[i].1.large.remove((k.size, k.ptr), k.id);
        self.len -= usize::from(removed);
        removed
    }

    /// Whether the key is present.
    #[inline]
    pub(crate) fn contains(&self, k: &SizeKey) -> bool {
        if k.size >= EXACT_LIMIT {
            return self
                .stream(k.stream)
                .is_some_and(|f| f.large.get((k.size, k.ptr)) == Some(k.id));
        }
        self.nodes.get(k.id.0 as usize).is_some_and(|n| {
            n.next != DEAD && n.ptr == k.ptr && n.size == k.size && n.stream == k.stream
        })
    }

    /// The first key `>= (stream, size, 0)` on `stream` (best fit), if any.
    #[inline(always)]
    pub(crate) fn lower_bound(&self, stream: StreamId, size: usize) -> Option<SizeKey> {
        let f = self.stream(stream)?;
        if size < EXACT_LIMIT {
            if let Some(c) = f.bitmap.next_at_or_above(class_of(size)) {
                let id = f.head(c);
                return Some(SizeKey {
                    stream,
                    size: c << UNIT_SHIFT,
                    ptr: self.nodes[id as usize].ptr,
                    id: BlockId(id),
                });
            }
        }
        f.large
            .from((size.max(EXACT_LIMIT), 0))
            .first()
            .map(|&((size, ptr), id)| SizeKey {
                stream,
                size,
                ptr,
                id,
            })
    }

    /// Keys of `stream` with size `>= size`, ascending by `(size, address)`.
    pub(crate) fn range_from(
        &self,
        stream: StreamId,
        size: usize,
    ) -> impl Iterator<Item = SizeKey> + '_ {
        let f = self.stream(stream);
        let start = if size < EXACT_LIMIT {
            f.and_then(|f| f.bitmap.next_at_or_above(class_of(size)))
        } else {
            None
        };
        let exact = ForwardClasses {
            f,
            nodes: &self.nodes,
            class: start,
            at: start.zip(f).map_or(NIL, |(c, f)| f.head(c)),
        }
        .map(move |(ptr, id, size)| SizeKey {
            stream,
            size,
            ptr,
            id,
        });
        let large = f
            .into_iter()
            .flat_map(move |f| f.large.from((size.max(EXACT_LIMIT), 0)))
            .map(move |&((size, ptr), id)| SizeKey {
                stream,
                size,
                ptr,
                id,
            });
        exact.chain(large)
    }

    /// Keys of `stream` with size `< size`, descending by `(size, address)`.
    pub(crate) fn range_below_rev(
        &self,
        stream: StreamId,
        size: usize,
    ) -> impl Iterator<Item = SizeKey> + '_ {
        let f = self.stream(stream);
        let large = f
            .into_iter()
            .flat_map(move |f| f.large.below((size, 0)).iter().rev())
            .map(move |&((size, ptr), id)| SizeKey {
                stream,
                size,
                ptr,
                id,
            });
        let start = f.and_then(|f| f.bitmap.prev_below(class_of(size.min(EXACT_LIMIT))));
        let exact = BackwardClasses {
            f,
            nodes: &self.nodes,
            class: start,
            pending: SmallVec::new(),
            loaded: false,
        }
        .map(move |(ptr, id, size)| SizeKey {
            stream,
            size,
            ptr,
            id,
        });
        large.chain(exact)
    }

    /// All keys in `(stream, size, address)` order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = SizeKey> + '_ {
        self.streams
            .iter()
            .flat_map(move |(s, _)| self.range_from(*s, 0))
    }
}

/// Links block `k` into class `c` (whose first block is `*head`) at its address position, and
/// marks the class non-empty.
#[inline(always)]
fn link(nodes: &mut [Node], head: &mut u32, bitmap: &mut Bitmap, c: usize, k: &SizeKey) {
    let (prev, next) = if *head == NIL {
        *head = k.id.0;
        bitmap.set(c);
        (NIL, NIL)
    } else if nodes[*head as usize].ptr > k.ptr {
        let next = *head;
        *head = k.id.0;
        nodes[next as usize].prev = k.id.0;
        (NIL, next)
    } else {
        // Walk to the last block below `k.ptr` (class lists are short).
        let mut at = *head;
        loop {
            let n = nodes[at as usize].next;
            if n == NIL || nodes[n as usize].ptr > k.ptr {
                break;
            }
            at = n;
        }
        let next = nodes[at as usize].next;
        nodes[at as usize].next = k.id.0;
        if next != NIL {
            nodes[next as usize].prev = k.id.0;
        }
        (at, next)
    };
    nodes[k.id.0 as usize] = Node {
        ptr: k.ptr,
        size: k.size,
        stream: k.stream,
        prev,
        next,
    };
}

/// Walks the exact classes upward from `class`, each class in address order.
struct ForwardClasses<'a> {
    f: Option<&'a StreamFree>,
    nodes: &'a [Node],
    class: Option<usize>,
    /// The next block to yield in the current class, or [`NIL`].
    at: u32,
}

impl Iterator for ForwardClasses<'_> {
    type Item = (DevicePtr, BlockId, usize);

    fn next(&mut self) -> Option<Self::Item> {
        let f = self.f?;
        loop {
            let c = self.class?;
            if self.at != NIL {
                let id = self.at;
                let node = &self.nodes[id as usize];
                self.at = node.next;
                return Some((node.ptr, BlockId(id), c << UNIT_SHIFT));
            }
            self.class = f.bitmap.next_at_or_above(c + 1);
            self.at = self.class.map_or(NIL, |c| f.head(c));
        }
    }
}

/// Walks the exact classes downward from `class`, each class in descending address order.
struct BackwardClasses<'a> {
    f: Option<&'a StreamFree>,
    nodes: &'a [Node],
    class: Option<usize>,
    /// The rest of the current class, in address order (yielded from the back).
    pending: SmallVec<[(DevicePtr, BlockId); 4]>,
    /// Whether `pending` holds the current class.
    loaded: bool,
}

impl Iterator for BackwardClasses<'_> {
    type Item = (DevicePtr, BlockId, usize);

    fn next(&mut self) -> Option<Self::Item> {
        let f = self.f?;
        loop {
            let c = self.class?;
            if !self.loaded {
                let mut at = f.head(c);
                while at != NIL {
                    let node = &self.nodes[at as usize];
                    self.pending.push((node.ptr, BlockId(at)));
                    at = node.next;
                }
                self.loaded = true;
            }
            if let Some((ptr, id)) = self.pending.pop() {
                return Some((ptr, id, c << UNIT_SHIFT));
            }
            self.class = f.bitmap.prev_below(c);
            self.loaded = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn key(stream: u64, size: usize, ptr: u64, id: u32) -> SizeKey {
        SizeKey {
            stream: StreamId(stream),
            size,
            ptr,
            id: BlockId(id),
        }
    }

    #[test]
    fn bitmap_finds_neighbours_across_levels() {
        let mut b = Bitmap::default();
        for c in [1usize, 63, 64, 4095, 4096, 70000, CLASSES - 1] {
            b.set(c);
        }
        assert_eq!(b.next_at_or_above(0), Some(1));
        assert_eq!(b.next_at_or_above(2), Some(63));
        assert_eq!(b.next_at_or_above(65), Some(4095));
        assert_eq!(b.next_at_or_above(4097), Some(70000));
        assert_eq!(b.next_at_or_above(70001), Some(CLASSES - 1));
        assert_eq!(b.next_at_or_above(CLASSES), None);
        assert_eq!(b.prev_below(CLASSES), Some(CLASSES - 1));
        assert_eq!(b.prev_below(70000), Some(4096));
        assert_eq!(b.prev_below(64), Some(63));
        assert_eq!(b.prev_below(1), None);
        b.clear(63);
        b.clear(64);
        assert_eq!(b.next_at_or_above(2), Some(4095));
        assert_eq!(b.prev_below(4095), Some(1));
    }

    /// The index behaves exactly like a BTreeSet of (stream, size, ptr) keys, with each block id
    /// in it at most once (as in the allocator: a block is in one place at a time).
    #[test]
    fn matches_a_btree_set_on_random_operations() {
        let mut idx = FreeIndex::default();
        let mut model: BTreeSet<SizeKey> = BTreeSet::new();
        let mut state = 0x1234_5678_9abc_def0u64;
        let mut rnd = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let sizes = [
            512usize,
            1024,
            2 << 20,
            (2 << 20) - 512,
            20 << 20,
            64 << 20,
            100 << 20,
            3 << 30,
        ];
        for _ in 0..20_000 {
            let r = rnd();
            let k = key(
                r % 3,
                sizes[(r >> 8) as usize % sizes.len()] + ((r >> 16) as usize % 4) * 512,
                ((r >> 24) % 64) * 512,
                ((r >> 24) % 64) as u32,
            );
            if r & (1 << 40) != 0 {
                let same_id = model.iter().find(|m| m.id == k.id).copied();
                match same_id {
                    // The same block again: refused.
                    Some(m) if m == k => assert!(!idx.insert(k)),
                    // The block is in the index under another key: a caller never does this.
                    Some(_) => {}
                    None => assert_eq!(idx.insert(k), model.insert(k)),
                }
            } else {
                assert_eq!(idx.remove(&k), model.remove(&k));
            }
            assert_eq!(idx.len(), model.len());
            let probe_stream = StreamId(rnd() % 3);
            let probe_size = sizes[rnd() as usize % sizes.len()];
            let lower = SizeKey::lower(probe_stream, probe_size);
            let want: Vec<_> = model
                .range(lower..)
                .take_while(|k| k.stream == probe_stream)
                .copied()
                .collect();
            assert_eq!(
                idx.range_from(probe_stream, probe_size).collect::<Vec<_>>(),
                want
            );
            let want_rev: Vec<_> = model
                .range(..lower)
                .rev()
                .take_while(|k| k.stream == probe_stream)
                .copied()
                .collect();
            assert_eq!(
                idx.range_below_rev(probe_stream, probe_size)
                    .collect::<Vec<_>>(),
                want_rev
            );
        }
        assert_eq!(
            idx.iter().collect::<Vec<_>>(),
            model.iter().copied().collect::<Vec<_>>()
        );
        for k in &model {
            assert!(idx.contains(k));
        }
    }
}
