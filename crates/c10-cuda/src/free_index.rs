//! The best-fit index of a pool's free blocks, ordered by `(stream, size, rank, address)` exactly
//! as PyTorch's `std::set<Block*, BlockComparatorSize>`, but with O(1) size-class lookups. `rank`
//! is the segment's registration counter under torch 2.15's rules and 0 under 2.7's (whose order
//! is `(stream, size, address)`), so one index serves both: the rule is chosen when blocks are
//! made, never per lookup.
//!
//! Per stream, the blocks are spread over size classes: one class per 512-byte size below
//! [`EXACT_LIMIT`] (64 MiB), then one class per 2 MiB of size above it (the last class takes
//! every size from about 256 GiB up). A three-level bitmap finds the next non-empty class at
//! or above a size in a few `trailing_zeros`. Each class is a doubly linked list of its blocks
//! sorted by `(size, rank, address)` (in an exact class all sizes are equal), usually
//! zero to a handful long, threaded through a node table indexed by [`BlockId`]: removing a
//! known block is O(1) and nothing is allocated per block. A class that grows past
//! [`LONG_CLASS`] blocks (many free blocks of one size that cannot merge: a fragmented small
//! pool) moves to a B-tree, so inserting into it stays O(log n); it returns to a list when it
//! shrinks to [`SHORT_CLASS`]. Class heads live in lazily
//! allocated pages of 64 classes; the bitmap's lowest level starts sized for the pool and grows
//! with the largest class used. Iteration order is the same total order as PyTorch's set, so
//! every decision (best fit, ties to the lowest address, release order) is unchanged.

use std::collections::BTreeSet;

use rustc_hash::FxHashMap;
use smallvec::SmallVec;

use crate::block::{BlockId, SizeKey};
use crate::device::{DevicePtr, StreamId};

/// Sizes below this many bytes (64 MiB) have one class per 512-byte size.
pub(crate) const EXACT_LIMIT: usize = 64 << 20;
const UNIT_SHIFT: u32 = 9;
const EXACT_CLASSES: usize = EXACT_LIMIT >> UNIT_SHIFT; // 131072
/// Above [`EXACT_LIMIT`], one class per this many bytes of size (2 MiB).
const COARSE_SHIFT: u32 = 21;
const CLASSES: usize = 2 * EXACT_CLASSES; // 262144: up to 64 MiB + 256 GiB
const L0_WORDS: usize = CLASSES / 64; // 4096
const L1_WORDS: usize = L0_WORDS / 64; // 64

/// Node-table entries a new index starts with (it grows for larger block ids).
const INITIAL_NODES: usize = 1024;

/// No block: the end of a class list, or an empty class.
const NIL: u32 = u32::MAX;

/// `prev` and `next` of a node whose class is kept in a B-tree.
const TREE: u32 = u32::MAX - 2;

/// A class list longer than this moves to a B-tree. Walking a list of up to this many blocks is
/// cheaper than the B-tree's search: at 32, the shared trace `lm2.7b_ctx512_forward_bf16`
/// replayed warm (classes of 64 to 128 equal blocks) was 15% slower.
pub(crate) const LONG_CLASS: usize = 128;

/// A B-tree class this short returns to a list.
pub(crate) const SHORT_CLASS: usize = 32;

/// A long class: its blocks by `(size, rank, address, id)`.
type ClassTree = BTreeSet<(usize, u64, DevicePtr, u32)>;

/// The class of a free block of `size` bytes.
#[inline(always)]
fn class_of(size: usize) -> usize {
    if size < EXACT_LIMIT {
        size >> UNIT_SHIFT
    } else {
        (EXACT_CLASSES + ((size - EXACT_LIMIT) >> COARSE_SHIFT)).min(CLASSES - 1)
    }
}

/// A three-level bitmap over the size classes: bit set = class non-empty. The lowest level
/// covers only the classes up to the highest one set so far (the small pool's start with 128
/// words, enough for a free 2 MiB segment).
#[derive(Clone, Debug)]
struct Bitmap {
    l0: Vec<u64>,
    l1: [u64; L1_WORDS],
    l2: u64,
}

impl Default for Bitmap {
    fn default() -> Self {
        Bitmap {
            l0: Vec::new(),
            l1: [0; L1_WORDS],
            l2: 0,
        }
    }
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
            self.l1[(w >> 6) % L1_WORDS] |= 1 << (w & 63);
            self.l2 |= 1 << ((w >> 6) & 63);
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
            let i = (w >> 6) % L1_WORDS;
            self.l1[i] &= !(1 << (w & 63));
            if self.l1[i] == 0 {
                self.l2 &= !(1 << i);
            }
        }
    }

    /// Word `w` of the lowest level (0 beyond the covered classes).
    #[inline(always)]
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

/// Classes per lazily allocated page of class heads (256 bytes: a page is filled when first
/// used, so small pages keep a fresh allocator's first requests cheap).
const PAGE: usize = 64;

/// One page of class heads: the first block of each class, or [`NIL`].
type HeadPage = Box<[u32; PAGE]>;

/// One stream's free blocks.
#[derive(Clone, Debug, Default)]
struct StreamFree {
    bitmap: Bitmap,
    /// Class -> its first block, in pages of [`PAGE`] classes allocated on first use (a direct
    /// index without hashing; memory grows with the size ranges in use).
    heads: Vec<Option<HeadPage>>,
    /// The classes longer than [`LONG_CLASS`] blocks (their head is still in `heads`).
    trees: FxHashMap<u32, ClassTree>,
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

/// A free block's links in its class list (indexed by block id). A node is live (its block is
/// in a class list) unless `next == DEAD`; the key fields order the list and make removal
/// exact.
#[derive(Clone, Copy, Debug)]
struct Node {
    ptr: DevicePtr,
    size: usize,
    rank: u64,
    stream: StreamId,
    prev: u32,
    next: u32,
}

impl Node {
    /// The order within a class list.
    #[inline(always)]
    fn order(&self) -> (usize, u64, DevicePtr) {
        (self.size, self.rank, self.ptr)
    }
}

/// `next` of a node whose block is not in a class list.
const DEAD: u32 = u32::MAX - 1;

const DEAD_NODE: Node = Node {
    ptr: 0,
    size: 0,
    rank: 0,
    stream: StreamId(0),
    prev: NIL,
    next: DEAD,
};

/// The free blocks of one pool in `(stream, size, rank, address)` order. A block id is in the index
/// at most once.
#[derive(Clone, Debug)]
pub(crate) struct FreeIndex {
    /// Per stream, sorted by stream (PyTorch orders streams by handle value).
    streams: Vec<(StreamId, StreamFree)>,
    /// Class-list links, by block id.
    nodes: Vec<Node>,
    len: usize,
    /// Bitmap words a new stream's lowest level starts with: enough for the pool's usual sizes,
    /// so that filling a pool from empty does not grow it step by step.
    words: usize,
    /// A stream list made ready when the index was built, taken by the first stream to arrive
    /// (so that an allocator's first requests do not pay for it).
    spare: Option<StreamFree>,
}

impl Default for FreeIndex {
    fn default() -> Self {
        FreeIndex::for_sizes_up_to(usize::MAX)
    }
}

impl FreeIndex {
    /// An empty index whose per-stream bitmaps start sized for free blocks of up to `size`
    /// bytes (larger ones still work: the bitmap grows). The small pool's blocks are at most one
    /// 2 MiB segment; the large pool's can be anything.
    pub(crate) fn for_sizes_up_to(size: usize) -> Self {
        let words = (class_of(size) / 64 + 1)
            .next_power_of_two()
            .clamp(64, L0_WORDS);
        let mut index = FreeIndex {
            streams: Vec::with_capacity(4),
            nodes: vec![DEAD_NODE; INITIAL_NODES],
            len: 0,
            words,
            spare: None,
        };
        index.spare = Some(index.new_stream());
        index
    }

    /// An empty stream list, its bitmap and page table sized for the pool.
    fn new_stream(&self) -> StreamFree {
        let mut f = StreamFree::default();
        f.bitmap.l0 = vec![0; self.words];
        f.heads = vec![None; self.words * 64 / PAGE];
        f
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
                let f = self.spare.take().unwrap_or_else(|| self.new_stream());
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
        if id < self.nodes.len() && self.nodes[id].next == DEAD {
            if let [(s, f)] = self.streams.as_mut_slice() {
                let c = class_of(k.size);
                if *s == k.stream {
                    if let Some(Some(page)) = f.heads.get_mut(c / PAGE) {
                        let head = &mut page[c % PAGE];
                        link(&mut self.nodes, head, &mut f.bitmap, &mut f.trees, c, &k);
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
        let id = k.id.0 as usize;
        if id >= self.nodes.len() {
            let len = (id + 1).next_power_of_two().max(INITIAL_NODES);
            self.nodes.resize(len, DEAD_NODE);
        } else if self.nodes[id].next != DEAD {
            return false;
        }
        let s = self.stream_index(k.stream);
        let f = &mut self.streams[s].1;
        let c = class_of(k.size);
        f.head_mut(c);
        let Some(Some(page)) = f.heads.get_mut(c / PAGE) else {
            unreachable!("head_mut allocated the page");
        };
        let head = &mut page[c % PAGE];
        link(&mut self.nodes, head, &mut f.bitmap, &mut f.trees, c, &k);
        self.len += 1;
        true
    }

    /// Removes a key; false if it was absent.
    pub(crate) fn remove(&mut self, k: &SizeKey) -> bool {
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
        debug_assert!(self.contains(k), "removing a key that is not in the index");
        let id = k.id.0 as usize;
        let node = self.nodes[id];
        assert!(
            node.next != DEAD,
            "removing a block that is not in the index"
        );
        if node.prev == TREE {
            self.remove_from_tree(k.id.0, node);
            return;
        }
        if node.prev == NIL {
            // The node's own key names the class and stream whose head it is.
            let c = class_of(node.size);
            let f = match self.streams.as_mut_slice() {
                [(_, f)] => f,
                many => match many.iter_mut().find(|(s, _)| *s == node.stream) {
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

    /// [`Self::remove_present`] for a block of a long class.
    #[cold]
    #[inline(never)]
    fn remove_from_tree(&mut self, id: u32, node: Node) {
        let c = class_of(node.size);
        let Some((_, f)) = self.streams.iter_mut().find(|(s, _)| *s == node.stream) else {
            unreachable!("a present key's stream has a list");
        };
        let Some(tree) = f.trees.get_mut(&(c as u32)) else {
            unreachable!("a tree node's class has a tree");
        };
        tree.remove(&(node.size, node.rank, node.ptr, id));
        self.nodes[id as usize].next = DEAD;
        self.len -= 1;
        if tree.len() > SHORT_CLASS {
            if let Some(&(_, _, _, first)) = tree.first() {
                *f.head_mut(c) = first;
            }
            return;
        }
        // Short again: back to a list (possibly empty).
        let Some(tree) = f.trees.remove(&(c as u32)) else {
            unreachable!("the tree was just used");
        };
        let mut prev = NIL;
        for &(_, _, _, at) in &tree {
            let n = &mut self.nodes[at as usize];
            n.prev = prev;
            n.next = NIL;
            if prev == NIL {
                *f.head_mut(c) = at;
            } else {
                self.nodes[prev as usize].next = at;
            }
            prev = at;
        }
        if prev == NIL {
            *f.head_mut(c) = NIL;
            f.bitmap.clear(c);
        }
    }

    /// Whether the key is present.
    #[inline]
    pub(crate) fn contains(&self, k: &SizeKey) -> bool {
        self.nodes.get(k.id.0 as usize).is_some_and(|n| {
            n.next != DEAD
                && n.ptr == k.ptr
                && n.size == k.size
                && n.rank == k.rank
                && n.stream == k.stream
        })
    }

    /// The first key `>= (stream, size, 0, 0)` on `stream` (best fit), if any.
    #[inline(always)]
    pub(crate) fn lower_bound(&self, stream: StreamId, size: usize) -> Option<SizeKey> {
        let f = self.stream(stream)?;
        let c0 = class_of(size);
        let mut c = f.bitmap.next_at_or_above(c0)?;
        let mut id = f.head(c);
        if c == c0 {
            // The class of `size` may hold smaller blocks: a coarse class holds several sizes,
            // and an exact class is below a `size` that is not a multiple of 512.
            if self.nodes[id as usize].prev == TREE {
                id = f.trees[&(c as u32)]
                    .range((size, 0, 0, 0)..)
                    .next()
                    .map_or(NIL, |&(_, _, _, at)| at);
            } else {
                while id != NIL && self.nodes[id as usize].size < size {
                    id = self.nodes[id as usize].next;
                }
            }
            if id == NIL {
                c = f.bitmap.next_at_or_above(c + 1)?;
                id = f.head(c);
            }
        }
        let node = &self.nodes[id as usize];
        Some(SizeKey {
            stream,
            size: node.size,
            rank: node.rank,
            ptr: node.ptr,
            id: BlockId(id),
        })
    }

    /// Keys of `stream` with size `>= size`, ascending by `(size, rank, address)`.
    pub(crate) fn range_from(
        &self,
        stream: StreamId,
        size: usize,
    ) -> impl Iterator<Item = SizeKey> + '_ {
        let f = self.stream(stream);
        let start = f.and_then(|f| f.bitmap.next_at_or_above(class_of(size)));
        ForwardClasses {
            f,
            nodes: &self.nodes,
            class: start,
            pending: Vec::new(),
            next: 0,
            loaded: false,
        }
        .filter(move |n| n.size >= size)
        .map(move |n| SizeKey {
            stream,
            size: n.size,
            rank: n.rank,
            ptr: n.ptr,
            id: n.id,
        })
    }

    /// Keys of `stream` with size `< size`, descending by `(size, rank, address)`.
    pub(crate) fn range_below_rev(
        &self,
        stream: StreamId,
        size: usize,
    ) -> impl Iterator<Item = SizeKey> + '_ {
        let f = self.stream(stream);
        // The class of `size` itself may hold smaller blocks (a coarse class).
        let start = f.and_then(|f| f.bitmap.prev_below(class_of(size).saturating_add(1)));
        BackwardClasses {
            f,
            nodes: &self.nodes,
            class: start,
            pending: SmallVec::new(),
            loaded: false,
        }
        .filter(move |n| n.size < size)
        .map(move |n| SizeKey {
            stream,
            size: n.size,
            rank: n.rank,
            ptr: n.ptr,
            id: n.id,
        })
    }

    /// All keys in `(stream, size, rank, address)` order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = SizeKey> + '_ {
        self.streams
            .iter()
            .flat_map(move |(s, _)| self.range_from(*s, 0))
    }
}

/// Links block `k` into class `c` (whose first block is `*head`) at its `(size, rank, address)`
/// position, and marks the class non-empty. A list that grows past [`LONG_CLASS`] moves to a
/// B-tree.
#[inline(always)]
fn link(
    nodes: &mut [Node],
    head: &mut u32,
    bitmap: &mut Bitmap,
    trees: &mut FxHashMap<u32, ClassTree>,
    c: usize,
    k: &SizeKey,
) {
    let order = (k.size, k.rank, k.ptr);
    let (prev, next) = if *head == NIL {
        *head = k.id.0;
        bitmap.set(c);
        (NIL, NIL)
    } else if nodes[*head as usize].prev == TREE {
        return link_tree(nodes, head, trees, c, k);
    } else if nodes[*head as usize].order() > order {
        let next = *head;
        *head = k.id.0;
        nodes[next as usize].prev = k.id.0;
        (NIL, next)
    } else {
        // Walk to the last block before `k` (class lists are short).
        let mut at = *head;
        let mut steps = 0;
        loop {
            let n = nodes[at as usize].next;
            if n == NIL || nodes[n as usize].order() > order {
                break;
            }
            at = n;
            steps += 1;
            if steps == LONG_CLASS {
                to_tree(nodes, *head, trees, c);
                return link_tree(nodes, head, trees, c, k);
            }
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
        rank: k.rank,
        stream: k.stream,
        prev,
        next,
    };
}

/// Moves the list of class `c` starting at `head` into a B-tree.
#[cold]
#[inline(never)]
fn to_tree(nodes: &mut [Node], head: u32, trees: &mut FxHashMap<u32, ClassTree>, c: usize) {
    let mut tree = ClassTree::new();
    let mut at = head;
    while at != NIL {
        let n = &mut nodes[at as usize];
        tree.insert((n.size, n.rank, n.ptr, at));
        at = n.next;
        n.prev = TREE;
        n.next = TREE;
    }
    trees.insert(c as u32, tree);
}

/// Links block `k` into the B-tree of class `c` (whose first block is `*head`).
#[cold]
#[inline(never)]
fn link_tree(
    nodes: &mut [Node],
    head: &mut u32,
    trees: &mut FxHashMap<u32, ClassTree>,
    c: usize,
    k: &SizeKey,
) {
    let Some(tree) = trees.get_mut(&(c as u32)) else {
        unreachable!("a tree node's class has a tree");
    };
    tree.insert((k.size, k.rank, k.ptr, k.id.0));
    if (k.size, k.rank, k.ptr) < nodes[*head as usize].order() {
        *head = k.id.0;
    }
    nodes[k.id.0 as usize] = Node {
        ptr: k.ptr,
        size: k.size,
        rank: k.rank,
        stream: k.stream,
        prev: TREE,
        next: TREE,
    };
}

/// A block yielded by the class walks.
#[derive(Clone, Copy, Debug)]
struct Found {
    ptr: DevicePtr,
    size: usize,
    rank: u64,
    id: BlockId,
}

/// Walks the classes upward from `class`, each class in `(size, rank, address)` order.
struct ForwardClasses<'a> {
    f: Option<&'a StreamFree>,
    nodes: &'a [Node],
    class: Option<usize>,
    /// The current class, in ascending order.
    pending: Vec<Found>,
    /// The next entry of `pending` to yield.
    next: usize,
    /// Whether `pending` holds the current class.
    loaded: bool,
}

impl Iterator for ForwardClasses<'_> {
    type Item = Found;

    fn next(&mut self) -> Option<Found> {
        let f = self.f?;
        loop {
            let c = self.class?;
            if !self.loaded {
                self.pending.clear();
                load_class(f, self.nodes, c, &mut self.pending);
                self.next = 0;
                self.loaded = true;
            }
            if let Some(&found) = self.pending.get(self.next) {
                self.next += 1;
                return Some(found);
            }
            self.class = f.bitmap.next_at_or_above(c + 1);
            self.loaded = false;
        }
    }
}

/// Appends the blocks of class `c` to `out` in ascending `(size, rank, address)` order.
fn load_class(f: &StreamFree, nodes: &[Node], c: usize, out: &mut impl Extend<Found>) {
    let head = f.head(c);
    if head != NIL && nodes[head as usize].prev == TREE {
        out.extend(
            f.trees[&(c as u32)]
                .iter()
                .map(|&(size, rank, ptr, id)| Found {
                    ptr,
                    size,
                    rank,
                    id: BlockId(id),
                }),
        );
        return;
    }
    let mut at = head;
    while at != NIL {
        let node = &nodes[at as usize];
        out.extend([Found {
            ptr: node.ptr,
            size: node.size,
            rank: node.rank,
            id: BlockId(at),
        }]);
        at = node.next;
    }
}

/// Walks the classes downward from `class`, each class in descending `(size, rank, address)`
/// order.
struct BackwardClasses<'a> {
    f: Option<&'a StreamFree>,
    nodes: &'a [Node],
    class: Option<usize>,
    /// The rest of the current class, in ascending order (yielded from the back).
    pending: SmallVec<[Found; 4]>,
    /// Whether `pending` holds the current class.
    loaded: bool,
}

impl Iterator for BackwardClasses<'_> {
    type Item = Found;

    fn next(&mut self) -> Option<Found> {
        let f = self.f?;
        loop {
            let c = self.class?;
            if !self.loaded {
                load_class(f, self.nodes, c, &mut self.pending);
                self.loaded = true;
            }
            if let Some(found) = self.pending.pop() {
                return Some(found);
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

    /// A deterministic xorshift64 generator.
    fn xorshift(mut state: u64) -> impl FnMut() -> u64 {
        move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        }
    }

    fn key(stream: u64, size: usize, ptr: u64, id: u32) -> SizeKey {
        ranked(stream, size, 0, ptr, id)
    }

    fn ranked(stream: u64, size: usize, rank: u64, ptr: u64, id: u32) -> SizeKey {
        SizeKey {
            stream: StreamId(stream),
            size,
            rank,
            ptr,
            id: BlockId(id),
        }
    }

    /// Classes never decrease with size (so a walk up from a size's class sees every larger
    /// block), are exact below 64 MiB, 2 MiB wide above it, and end at the last class.
    #[test]
    fn classes_grow_with_size() {
        assert_eq!(class_of(512), 1);
        assert_eq!(class_of(EXACT_LIMIT - 512), EXACT_CLASSES - 1);
        assert_eq!(class_of(EXACT_LIMIT), EXACT_CLASSES);
        assert_eq!(class_of(EXACT_LIMIT + (2 << 20) - 512), EXACT_CLASSES);
        assert_eq!(class_of(EXACT_LIMIT + (2 << 20)), EXACT_CLASSES + 1);
        assert_eq!(class_of(usize::MAX), CLASSES - 1);
        let mut sizes: Vec<usize> = (10..63)
            .flat_map(|shift| [(1usize << shift) - 512, 1 << shift, (1 << shift) + 512])
            .collect();
        sizes.sort_unstable();
        let mut last = 0;
        for size in sizes {
            let c = class_of(size);
            assert!(
                c >= last && c < CLASSES,
                "class_of({size}) = {c} after {last}"
            );
            last = c;
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

    /// A search for a size that is not a multiple of 512 (an unvalidated `max_split_size`)
    /// skips the smaller blocks of its own exact class, as the ordered set does.
    #[test]
    fn lower_bound_of_an_unaligned_size_skips_smaller_blocks_of_its_class() {
        let mut idx = FreeIndex::default();
        assert!(idx.insert(key(0, 1536, 0x1000, 1)));
        assert!(idx.insert(key(0, 2048, 0x2000, 2)));
        assert_eq!(
            idx.lower_bound(StreamId(0), 1857),
            Some(key(0, 2048, 0x2000, 2))
        );
        assert_eq!(
            idx.lower_bound(StreamId(0), 1536),
            Some(key(0, 1536, 0x1000, 1))
        );
        assert_eq!(idx.lower_bound(StreamId(0), 2049), None);
        assert_eq!(idx.range_from(StreamId(0), 1857).count(), 1);
        assert_eq!(idx.range_below_rev(StreamId(0), 1857).count(), 1);
    }

    /// Long classes (hundreds of free blocks of one size, and of one coarse class) move to a
    /// B-tree and back while the index keeps the ordered set's answers.
    #[test]
    fn long_classes_match_a_btree_set() {
        let mut idx = FreeIndex::default();
        let mut model: BTreeSet<SizeKey> = BTreeSet::new();
        let mut rnd = xorshift(0x9e37_79b9_7f4a_7c15u64);
        // Ids 0..8 * LONG_CLASS: block i has one address; half are 512-byte blocks (one exact
        // class), half lie in the coarse class above 100 MiB with sizes 512 bytes apart; about
        // half of them are present at a time, twice the length that moves a class to a tree.
        let ids = 8 * LONG_CLASS as u64;
        let key_of = |i: u32| {
            let size = if i % 2 == 0 {
                512
            } else {
                (100 << 20) + (i as usize % 7) * 512
            };
            // Ranks that disagree with the address order (torch 2.15's oldest-segment-first).
            ranked(
                0,
                size,
                u64::from(i % 5),
                0x10_0000 + u64::from(i) * 4096,
                i,
            )
        };
        let mut trees_seen = 0;
        for round in 0..20_000 {
            let i = (rnd() % ids) as u32;
            let k = key_of(i);
            if model.contains(&k) {
                idx.remove_present(&k);
                model.remove(&k);
            } else {
                assert!(idx.insert(k));
                model.insert(k);
            }
            assert_eq!(idx.len(), model.len());
            trees_seen = trees_seen.max(idx.streams[0].1.trees.len());
            if round % 97 == 0 {
                assert_eq!(
                    idx.iter().collect::<Vec<_>>(),
                    model.iter().copied().collect::<Vec<_>>()
                );
            }
            for probe in [512, 513, 100 << 20, (100 << 20) + 1000, (100 << 20) + 3072] {
                let want = model
                    .range(SizeKey::lower(StreamId(0), probe)..)
                    .next()
                    .copied();
                assert_eq!(idx.lower_bound(StreamId(0), probe), want, "probe {probe}");
            }
        }
        let probe = (100 << 20) + 1000;
        let want: Vec<_> = model
            .range(..SizeKey::lower(StreamId(0), probe))
            .rev()
            .copied()
            .collect();
        assert_eq!(
            idx.range_below_rev(StreamId(0), probe).collect::<Vec<_>>(),
            want
        );
        assert_eq!(trees_seen, 2, "both long classes moved to a B-tree");
    }

    /// The index behaves exactly like a BTreeSet of (stream, size, rank, ptr) keys, with each block id
    /// in it at most once (as in the allocator: a block is in one place at a time).
    #[test]
    fn matches_a_btree_set_on_random_operations() {
        let mut idx = FreeIndex::default();
        let mut model: BTreeSet<SizeKey> = BTreeSet::new();
        let mut rnd = xorshift(0x1234_5678_9abc_def0u64);
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
            // Ranks (torch 2.15's segment registration counters) order equal sizes before the
            // address; a third of the keys keep rank 0, as under torch 2.7's rules.
            let k = ranked(
                r % 3,
                sizes[(r >> 8) as usize % sizes.len()] + ((r >> 16) as usize % 4) * 512,
                (r >> 44) % 3,
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
