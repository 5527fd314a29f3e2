//! The best-fit index of a pool's free blocks, ordered by `(stream, size, rank, address)` exactly
//! as PyTorch's `std::set<Block*, BlockComparatorSize>`, but with O(1) size-class lookups. `rank`
//! is the segment's registration counter under torch 2.15's rules and 0 under 2.7's (whose order
//! is `(stream, size, address)`), so one index serves both: the rule is chosen when blocks are
//! made, never per lookup.
//!
//! Layout, per stream:
//! - **Size classes.** A block of `size` bytes is in class `(size - 1) / 512` up to
//!   [`EXACT_LIMIT`] (64 MiB): one class per 512-byte size, sizes `(512c, 512(c + 1)]`. Above
//!   it, one class per 2 MiB of size (the last class takes every size from about 256 GiB up):
//!   262,144 classes in all. The small pool's index folds every size from its largest request
//!   (1 MiB) up into one top class, 2,047 ([`FreeIndex::for_requests_up_to`]): every block there
//!   fits every request (a search takes its first block), and a split segment's remainder,
//!   alone in it, is re-keyed in place when it is split again or merges back (a warm
//!   alloc/free pair).
//! - **Bitmap.** Bit `c` set = class `c` non-empty: 4,096 words (32 KiB, allocated once per
//!   stream, never grown), a summary word per 64 of them (bit `w`: word `w` is non-zero) and one
//!   top word over the 64 summary words. A search checks the requested class's own word first,
//!   then the summary word of the next words, and the top word only when that summary word is
//!   empty (never in the small pool, whose words share summary word 0). Setting a class is
//!   branch-free (three `|=`), or one `|=` when a key moves to a class of the word it left
//!   (`rekey`: a block split or merged by a few pages); clearing one is a single `&=`: the upper levels
//!   may keep stale bits for emptied words, which the next search that meets them clears. Indexes are masked
//!   to the array sizes, so the bitmap has no bounds checks.
//! - **Class heads.** A flat `Vec<u32>` of each class's first block (or [`NIL`]), presized for
//!   the pool's usual sizes (the small pool: all 2,048 classes, 8 KiB) and grown only when a
//!   free block of a larger class arrives (4 bytes per class up to the largest class used: 1 MiB
//!   at most, for a block of 256 GiB). Every class with its bit set, and every present block's
//!   class, is below the table's length, so those lookups skip the bounds check.
//! - **Class lists.** Each class is a doubly linked list of its blocks sorted by `(size, rank,
//!   address)` (in an exact class all sizes are equal, unless a search size is not a multiple of
//!   512), usually zero to a handful long, threaded through a node table indexed by
//!   [`BlockId`] (shared by the pool's streams): removing a known block is O(1) and nothing is
//!   allocated per block. The table grows before an id is linked and never shrinks, so a linked
//!   id indexes it without a bounds check. A class that grows past [`LONG_CLASS`] blocks (many
//!   free blocks of one size that cannot merge: a fragmented small pool) becomes a long class
//!   ([`LongClass`]): a vector of its ids sorted with the first block last (binary searches;
//!   taking the first block is a pop), or past [`SORTED_MAX`] blocks a B-tree, so inserting
//!   into it stays O(log n); it returns to a list when it shrinks to [`SHORT_CLASS`].
//!
//! Iteration order is the same total order as PyTorch's set, so every decision (best fit, ties
//! to the lowest address, release order) is unchanged.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};

use rustc_hash::FxHashMap;
use smallvec::SmallVec;

use crate::block::{BlockId, SizeKey};
use crate::device::{DevicePtr, StreamId};

/// Sizes up to this many bytes (64 MiB) have one class per 512-byte size.
pub(crate) const EXACT_LIMIT: usize = 64 << 20;
const UNIT_SHIFT: u32 = 9;
const EXACT_CLASSES: usize = EXACT_LIMIT >> UNIT_SHIFT; // 131072
/// Above [`EXACT_LIMIT`], one class per this many bytes of size (2 MiB).
const COARSE_SHIFT: u32 = 21;
const CLASSES: usize = 2 * EXACT_CLASSES; // 262144: up to 64 MiB + 256 GiB
/// Bitmap words (one bit per class).
const WORDS: usize = CLASSES / 64; // 4096
/// Summary words (one bit per bitmap word).
const SUMMARY_WORDS: usize = WORDS / 64; // 64

/// Class heads a pool's stream starts with at most (64 KiB of heads: sizes up to 8 MiB); the
/// large pool's grow from there to the largest class it holds.
const INITIAL_HEADS_MAX: usize = 1 << 14;
/// Class heads are grown in steps of this many classes (16 KiB).
const HEADS_STEP: usize = 4096;

/// Node-table entries a new index starts with (it grows for larger block ids).
const INITIAL_NODES: usize = 1024;

/// No block: the end of a class list, or an empty class.
const NIL: u32 = u32::MAX;

/// `prev` and `next` of a node whose class is a long class ([`LongClass`]).
const TREE: u32 = u32::MAX - 2;

/// A class list longer than this becomes a long class ([`LongClass`]). Walking a list of up to
/// this many blocks is cheaper than a search: at 32, the shared trace
/// `lm2.7b_ctx512_forward_bf16` replayed warm (classes of 64 to 128 equal blocks) was 15%
/// slower when long classes were B-trees, and with sorted vectors 624 instructions per pair
/// against 608 at 128 (64: 624 too; callgrind, 2026-12-07).
pub(crate) const LONG_CLASS: usize = 128;

/// A long class this short returns to a list.
pub(crate) const SHORT_CLASS: usize = 32;

/// A sorted long class longer than this moves to a B-tree (an insert or a removal moves up to
/// this many ids, 8 KiB); a B-tree class of half as many returns to a sorted vector.
pub(crate) const SORTED_MAX: usize = 2048;

/// The order of a block in its class, made total by its id.
type Order = (usize, u64, DevicePtr, u32);

/// A B-tree class: its blocks by `(size, rank, address, id)`.
type ClassTree = BTreeSet<Order>;

/// A class of more than [`LONG_CLASS`] blocks (many free blocks of one size that cannot merge:
/// whole segments, a fragmented pool). Its nodes are marked [`TREE`]; its head slot holds its
/// first block.
#[derive(Clone, Debug)]
enum LongClass {
    /// Up to [`SORTED_MAX`] blocks: their ids in descending `(size, rank, address, id)` order,
    /// so the first block is last: taking it (best fit's usual pick) is a pop, and a block
    /// that sorts near it (a segment freed again) moves few ids. Searches are binary.
    Sorted(Vec<u32>),
    /// More: a B-tree, so an insert stays O(log n).
    Tree(ClassTree),
}

/// The order of linked block `id` (its node holds its key).
#[inline(always)]
fn order_of(nodes: &[Node], id: u32) -> Order {
    let n = &nodes[id as usize];
    (n.size, n.rank, n.ptr, id)
}

/// The class of a free block of `size` bytes (always below [`CLASSES`]).
#[inline(always)]
fn class_of(size: usize) -> usize {
    // The offset of the block's last byte (`usize::MAX` for size 0, whose class is 0).
    let last = size.wrapping_sub(1);
    if last < EXACT_LIMIT {
        last >> UNIT_SHIFT
    } else if size == 0 {
        0
    } else {
        (EXACT_CLASSES + ((last - EXACT_LIMIT) >> COARSE_SHIFT)).min(CLASSES - 1)
    }
}

/// A three-level bitmap over the size classes: bit set = class non-empty (see the module
/// documentation). The upper levels are a superset: a word's summary bit (and its summary
/// word's top bit) is set whenever the word is non-zero, but clearing a class leaves them set;
/// a search that meets such a stale bit clears it. So clearing a class is one `&=`, and a
/// block that moves between classes of one word (a split segment and its remainder) leaves
/// the upper levels alone. Searches take `&self`, so the upper levels are atomics used with
/// `Relaxed` loads and stores (plain moves): a stale bit two searches both clear, or one
/// clears and the other keeps, is still a superset.
#[derive(Debug)]
struct Bitmap {
    /// Bit `c % 64` of word `c / 64`: class `c` is non-empty.
    words: Box<[u64; WORDS]>,
    /// Bit `w % 64` of word `w / 64`: `words[w]` may be non-zero (set if it is).
    summary: [AtomicU64; SUMMARY_WORDS],
    /// Bit `i`: `summary[i]` may be non-zero (set if it is).
    top: AtomicU64,
}

impl Default for Bitmap {
    fn default() -> Self {
        Bitmap {
            words: Box::new([0; WORDS]),
            summary: std::array::from_fn(|_| AtomicU64::new(0)),
            top: AtomicU64::new(0),
        }
    }
}

impl Clone for Bitmap {
    fn clone(&self) -> Self {
        Bitmap {
            words: self.words.clone(),
            summary: std::array::from_fn(|i| AtomicU64::new(load(&self.summary[i]))),
            top: AtomicU64::new(load(&self.top)),
        }
    }
}

/// A relaxed load of an upper-level bitmap word.
#[inline(always)]
fn load(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

/// A relaxed store of an upper-level bitmap word.
#[inline(always)]
fn store(a: &AtomicU64, v: u64) {
    a.store(v, Ordering::Relaxed);
}

impl Bitmap {
    /// Marks class `c` non-empty.
    #[inline(always)]
    fn set(&mut self, c: usize) {
        debug_assert!(c < CLASSES);
        let w = (c >> 6) & (WORDS - 1);
        self.words[w] |= 1 << (c & 63);
        *self.summary[w >> 6].get_mut() |= 1 << (w & 63);
        *self.top.get_mut() |= 1 << (w >> 6);
    }

    /// Marks class `c` non-empty when its word's upper-level bits are known to be set (its word
    /// was non-zero since the last search: see [`Bitmap`]), so only the word changes.
    #[inline(always)]
    fn set_in_set_word(&mut self, c: usize) {
        debug_assert!(c < CLASSES);
        self.words[(c >> 6) & (WORDS - 1)] |= 1 << (c & 63);
    }

    /// Marks class `c` empty (its word's upper-level bits stay: see [`Bitmap`]).
    #[inline(always)]
    fn clear(&mut self, c: usize) {
        debug_assert!(c < CLASSES);
        self.words[(c >> 6) & (WORDS - 1)] &= !(1 << (c & 63));
    }

    /// The lowest non-empty class `>= c`.
    #[inline(always)]
    fn next_at_or_above(&self, c: usize) -> Option<usize> {
        if c >= CLASSES {
            return None;
        }
        let w = c >> 6;
        let m = self.words[w] & (!0u64 << (c & 63));
        if m != 0 {
            return Some((w << 6) | m.trailing_zeros() as usize);
        }
        let w = self.next_word_above(w)?;
        Some((w << 6) | self.words[w].trailing_zeros() as usize)
    }

    /// The lowest non-zero word `> w`, clearing the stale upper-level bits it passes.
    #[inline(always)]
    fn next_word_above(&self, w: usize) -> Option<usize> {
        let mut w = w + 1;
        while w < WORDS {
            let i = w >> 6;
            let s = load(&self.summary[i]);
            let m = s & (!0u64 << (w & 63));
            if m != 0 {
                let found = (i << 6) | m.trailing_zeros() as usize;
                if self.words[found] != 0 {
                    return Some(found);
                }
                // A stale summary bit.
                store(&self.summary[i], s & !(1 << (found & 63)));
                w = found + 1;
                continue;
            }
            if s == 0 {
                // A stale top bit (or none).
                store(&self.top, load(&self.top) & !(1 << i));
            }
            // The summary words above `i` (`!1 << i` keeps bits `i + 1..`, none for `i = 63`).
            let t = load(&self.top) & (!1u64 << i);
            if t == 0 {
                return None;
            }
            w = (t.trailing_zeros() as usize) << 6;
        }
        None
    }

    /// The highest non-empty class `< c`.
    #[inline]
    fn prev_below(&self, c: usize) -> Option<usize> {
        let c = c.min(CLASSES);
        if c == 0 {
            return None;
        }
        let last = c - 1;
        let w = last >> 6;
        let m = self.words[w] & (!0u64 >> (63 - (last & 63)));
        if m != 0 {
            return Some((w << 6) | (63 - m.leading_zeros() as usize));
        }
        let w = self.prev_word_below(w)?;
        Some((w << 6) | (63 - self.words[w].leading_zeros() as usize))
    }

    /// The highest non-zero word `< w`, clearing the stale upper-level bits it passes.
    #[inline]
    fn prev_word_below(&self, w: usize) -> Option<usize> {
        let mut w = w;
        while w > 0 {
            let last = w - 1;
            let i = last >> 6;
            let s = load(&self.summary[i]);
            let m = s & (!0u64 >> (63 - (last & 63)));
            if m != 0 {
                let found = (i << 6) | (63 - m.leading_zeros() as usize);
                if self.words[found] != 0 {
                    return Some(found);
                }
                // A stale summary bit.
                store(&self.summary[i], s & !(1 << (found & 63)));
                w = found;
                continue;
            }
            if s == 0 {
                // A stale top bit (or none).
                store(&self.top, load(&self.top) & !(1 << i));
            }
            // The summary words below `i`.
            let t = load(&self.top) & ((1u64 << i) - 1);
            if t == 0 {
                return None;
            }
            w = (64 - t.leading_zeros() as usize) << 6;
        }
        None
    }
}

/// One stream's free blocks.
#[derive(Clone, Debug)]
struct StreamFree {
    bitmap: Bitmap,
    /// Class -> its first block, or [`NIL`]. Invariant: every class whose bitmap bit is set is
    /// below `heads.len()` (a class is set only after its head slot exists), and `heads` never
    /// shrinks.
    heads: Vec<u32>,
    /// The classes longer than [`LONG_CLASS`] blocks (their head is still in `heads`).
    trees: FxHashMap<u32, LongClass>,
}

impl StreamFree {
    /// An empty stream list with heads for classes `..classes`.
    fn new(classes: usize) -> Self {
        StreamFree {
            bitmap: Bitmap::default(),
            heads: vec![NIL; classes],
            trees: FxHashMap::default(),
        }
    }

    /// The first block of class `c`, or [`NIL`] (any class).
    #[inline]
    fn head(&self, c: usize) -> u32 {
        self.heads.get(c).copied().unwrap_or(NIL)
    }

    /// The head slot of class `c`, which is non-empty or holds a present block (so `c <
    /// heads.len()`).
    #[inline(always)]
    fn head_of_used(&mut self, c: usize) -> &mut u32 {
        debug_assert!(c < self.heads.len(), "class {c} has no head slot");
        // SAFETY: `c < self.heads.len()`: the caller's class has its bitmap bit set or holds a
        // present block, and `insert` grows `heads` to cover a class before it links a block
        // into it (then sets its bit); `heads` never shrinks.
        unsafe { self.heads.get_unchecked_mut(c) }
    }

    /// The first block of non-empty class `c` (one found in the bitmap).
    #[inline(always)]
    fn head_of_set(&self, c: usize) -> u32 {
        debug_assert!(c < self.heads.len(), "class {c} has no head slot");
        // SAFETY: as in `head_of_used`: a class whose bit is set is below `heads.len()`.
        unsafe { *self.heads.get_unchecked(c) }
    }

    /// Grows `heads` to cover class `c`.
    #[cold]
    #[inline(never)]
    fn grow_heads(&mut self, c: usize) {
        let len = (c + 1).next_multiple_of(HEADS_STEP).min(CLASSES);
        self.heads.reserve_exact(len - self.heads.len());
        self.heads.resize(len, NIL);
    }
}

/// A free block's links in its class list (indexed by block id). A node is live (its block is
/// in a class list) unless `next == DEAD`; the key fields order the list and make removal
/// exact.
#[derive(Clone, Copy, Debug)]
struct Node {
    prev: u32,
    next: u32,
    ptr: DevicePtr,
    size: usize,
    rank: u64,
    stream: StreamId,
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

/// The node table: by block id, the class-list links of the pool's free blocks. Invariant:
/// every id the index links (a class head, a node's `prev`/`next`, a tree entry) or was
/// checked on the way in (`insert` grows the table before it links an id) is below the table's
/// length, and the table never shrinks; so those ids index it without a bounds check.
#[derive(Clone, Debug)]
struct Nodes(Vec<Node>);

impl Nodes {
    /// The node of linked (or just checked) id `id`.
    #[inline(always)]
    fn at(&self, id: u32) -> &Node {
        debug_assert!((id as usize) < self.0.len(), "node id {id} not linked");
        // SAFETY: `id < self.0.len()` by the table's invariant: callers pass only linked ids
        // (read from a head, a link or a tree) or one `insert` checked against the length.
        unsafe { self.0.get_unchecked(id as usize) }
    }

    /// [`Self::at`], mutable.
    #[inline(always)]
    fn at_mut(&mut self, id: u32) -> &mut Node {
        debug_assert!((id as usize) < self.0.len(), "node id {id} not linked");
        // SAFETY: as in `at`.
        unsafe { self.0.get_unchecked_mut(id as usize) }
    }
}

/// The free blocks of one pool in `(stream, size, rank, address)` order. A block id is in the index
/// at most once.
#[derive(Clone, Debug)]
pub(crate) struct FreeIndex {
    /// Per stream, sorted by stream (PyTorch orders streams by handle value).
    streams: Vec<(StreamId, StreamFree)>,
    /// Class-list links, by block id.
    nodes: Nodes,
    len: usize,
    /// Class heads a new stream starts with: enough for the pool's usual sizes, so that filling
    /// a pool from empty does not grow them step by step.
    classes: usize,
    /// The last class: a block whose class ([`class_of`]) is above it is in it. The small
    /// pool's is the class of its largest request ([`FreeIndex::for_requests_up_to`]), so that
    /// a split segment's remainder and the segment it merges back into share a class and move
    /// in place ([`FreeIndex::rekey`]); the large pool's is the last of all
    /// ([`CLASSES`]` - 1`).
    top: usize,
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
    /// An empty index whose per-stream class heads start sized for free blocks of up to `size`
    /// bytes, at most [`INITIAL_HEADS_MAX`] classes (larger ones still work: the heads grow).
    /// The small pool's blocks are at most one 2 MiB segment; the large pool's can be anything.
    pub(crate) fn for_sizes_up_to(size: usize) -> Self {
        FreeIndex::with_top(size, CLASSES - 1)
    }

    /// An empty index for a pool whose searches are for at most `size` bytes (the small pool:
    /// [`crate::sizes::SMALL_SIZE`]): every larger free block is in `size`'s class, sorted as
    /// any class, where such a search takes the first block (every block there is at least
    /// `size` bytes). Best fit is unchanged (a search for more bytes walks the class).
    pub(crate) fn for_requests_up_to(size: usize) -> Self {
        FreeIndex::with_top(usize::MAX, class_of(size))
    }

    /// An empty index whose last class is `top`, its heads sized for blocks of up to `size`
    /// bytes.
    fn with_top(size: usize, top: usize) -> Self {
        let classes = (class_of(size).min(top) + 1).min(INITIAL_HEADS_MAX);
        FreeIndex {
            streams: Vec::with_capacity(4),
            nodes: Nodes(vec![DEAD_NODE; INITIAL_NODES]),
            len: 0,
            classes,
            top,
            spare: Some(StreamFree::new(classes)),
        }
    }

    /// The class of a free block of `size` bytes in this index: [`class_of`], at most
    /// [`Self::top`].
    #[inline(always)]
    fn class(&self, size: usize) -> usize {
        class_of(size).min(self.top)
    }

    /// Bytes of memory the index holds (its tables' capacities), for sizing checks.
    #[cfg(test)]
    fn heap_bytes(&self) -> usize {
        let stream = |f: &StreamFree| {
            std::mem::size_of::<StreamFree>()
                + std::mem::size_of::<[u64; WORDS]>()
                + f.heads.capacity() * std::mem::size_of::<u32>()
        };
        self.streams.iter().map(|(_, f)| stream(f)).sum::<usize>()
            + self.spare.as_ref().map_or(0, stream)
            + self.nodes.0.capacity() * std::mem::size_of::<Node>()
    }

    #[inline(always)]
    fn stream(&self, s: StreamId) -> Option<&StreamFree> {
        match self.streams.as_slice() {
            [(id, f)] => (*id == s).then_some(f),
            many => many.iter().find(|(id, _)| *id == s).map(|(_, f)| f),
        }
    }

    /// The index in `streams` of stream `s`, adding its list if it has none.
    #[cold]
    #[inline(never)]
    fn stream_index(&mut self, s: StreamId) -> usize {
        match self.streams.iter().position(|(id, _)| *id == s) {
            Some(i) => i,
            None => {
                let at = self.streams.partition_point(|(id, _)| *id < s);
                let classes = self.classes;
                let f = self
                    .spare
                    .take()
                    .unwrap_or_else(|| StreamFree::new(classes));
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
        if self
            .nodes
            .0
            .get(k.id.raw() as usize)
            .is_some_and(|n| n.next != DEAD)
        {
            return false;
        }
        self.insert_absent(k);
        true
    }

    /// Inserts the key of a block that is not in the index (a pool's insert: a block enters
    /// its pool only from outside it; checked in debug builds).
    #[inline(always)]
    pub(crate) fn insert_absent(&mut self, k: SizeKey) {
        let id = k.id.raw();
        debug_assert!(
            self.nodes.0.get(id as usize).is_none_or(|n| n.next == DEAD),
            "block {id} is already in the index"
        );
        if id as usize >= self.nodes.0.len() {
            self.grow_nodes(id);
        }
        let top = self.top;
        // Usually the pool's only stream.
        let f = match self.streams.as_mut_slice() {
            [(s, f)] if *s == k.stream => f,
            _ => {
                let s = self.stream_index(k.stream);
                &mut self.streams[s].1
            }
        };
        let c = class_of(k.size).min(top);
        if c >= f.heads.len() {
            f.grow_heads(c);
        }
        link::<false>(&mut self.nodes, f, c, &k, false);
        self.len += 1;
    }

    /// Grows the node table to cover block id `id`.
    #[cold]
    #[inline(never)]
    fn grow_nodes(&mut self, id: u32) {
        let len = (id as usize + 1).next_power_of_two().max(INITIAL_NODES);
        self.nodes.0.resize(len, DEAD_NODE);
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
        // The key is present (the caller's contract), so its id is linked.
        let node = self.nodes.at(k.id.raw());
        let (prev, next) = (node.prev, node.next);
        if prev == TREE {
            self.remove_from_tree(k.id.raw());
            return;
        }
        if prev == NIL {
            // The block heads its class: the key names the class and stream.
            let c = self.class(k.size);
            let f = match self.streams.as_mut_slice() {
                [(_, f)] => f,
                many => match many.iter_mut().find(|(s, _)| *s == k.stream) {
                    Some((_, f)) => f,
                    None => unreachable!("a present key's stream has a list"),
                },
            };
            *f.head_of_used(c) = next;
            if next == NIL {
                f.bitmap.clear(c);
            }
        } else {
            self.nodes.at_mut(prev).next = next;
        }
        if next != NIL {
            self.nodes.at_mut(next).prev = prev;
        }
        self.nodes.at_mut(k.id.raw()).next = DEAD;
        self.len -= 1;
    }

    /// Moves a present key `old` to `new`, a key of the same block (same id and stream) with
    /// another address and size: the remainder of a split, which keeps the split block's id, or
    /// a free block that the freed block below it merges into (the allocator's `merge_up`).
    /// The same as `remove_present(old)` then `insert(new)`, without the presence checks, the
    /// second stream lookup and the count; a key alone in its class that stays in it changes
    /// its node alone.
    #[inline(always)]
    pub(crate) fn rekey(&mut self, old: &SizeKey, new: &SizeKey) {
        debug_assert!(old.id == new.id && old.stream == new.stream && old.rank == new.rank);
        debug_assert!(
            self.contains(old),
            "re-keying a key that is not in the index"
        );
        let node = self.nodes.at(old.id.raw());
        let (prev, next) = (node.prev, node.next);
        let c_old = self.class(old.size);
        let c = self.class(new.size);
        if c == c_old && prev == NIL && next == NIL {
            // The key stays in its class, alone there (a small-pool segment's remainder, in
            // the small pool's top class): the node changes alone.
            let n = self.nodes.at_mut(old.id.raw());
            (n.ptr, n.size) = (new.ptr, new.size);
            return;
        }
        let f = match self.streams.as_mut_slice() {
            [(s, f)] if *s == old.stream && prev != TREE => f,
            _ => {
                // Several streams, or a long class: the general path.
                self.remove_present(old);
                self.insert(*new);
                return;
            }
        };
        // Unlink `old` from its class list (as `remove_present`).
        if prev == NIL
            && next == NIL
            && c != c_old
            && c >> 6 == c_old >> 6
            && f.heads.get(c) == Some(&NIL)
        {
            // `old` alone in its class moves to an empty class of the same word (a block split
            // or merged by a few pages): one bitmap word update, the upper levels of the word
            // already set (as `link` with `word_set`).
            let id = new.id.raw();
            *f.head_of_used(c_old) = NIL;
            *f.head_of_used(c) = id;
            let w = &mut f.bitmap.words[(c >> 6) & (WORDS - 1)];
            *w = (*w & !(1 << (c_old & 63))) | (1 << (c & 63));
            let n = self.nodes.at_mut(id);
            (n.prev, n.next, n.ptr, n.size) = (NIL, NIL, new.ptr, new.size);
            return;
        }
        if prev == NIL {
            *f.head_of_used(c_old) = next;
            if next == NIL {
                f.bitmap.clear(c_old);
            }
        } else {
            self.nodes.at_mut(prev).next = next;
        }
        if next != NIL {
            self.nodes.at_mut(next).prev = prev;
        }
        // Link `new` (as `insert`). `old`'s class was non-empty, so the upper levels of its
        // word are set: a remainder in the same word (a split small-pool segment's always is)
        // sets its class's bit alone.
        if c >= f.heads.len() {
            f.grow_heads(c);
        }
        link::<true>(&mut self.nodes, f, c, new, c >> 6 == c_old >> 6);
    }

    /// [`Self::remove_present`] for a block of a long class.
    #[cold]
    #[inline(never)]
    fn remove_from_tree(&mut self, id: u32) {
        let k = self.nodes.0[id as usize];
        let c = self.class(k.size);
        let nodes = &self.nodes.0;
        let Some((_, f)) = self.streams.iter_mut().find(|(s, _)| *s == k.stream) else {
            unreachable!("a present key's stream has a list");
        };
        let Some(long) = f.trees.get_mut(&(c as u32)) else {
            unreachable!("a tree node's class has a tree");
        };
        let order = (k.size, k.rank, k.ptr, id);
        // The class's length and first block after the removal.
        let (len, first) = match long {
            LongClass::Sorted(v) => {
                if v.last() == Some(&id) {
                    // The first block (best fit's pick).
                    v.pop();
                } else {
                    let at = v.partition_point(|&x| order_of(nodes, x) > order);
                    debug_assert_eq!(v.get(at), Some(&id));
                    v.remove(at);
                }
                (v.len(), v.last().copied().unwrap_or(NIL))
            }
            LongClass::Tree(tree) => {
                tree.remove(&order);
                let len = tree.len();
                let first = tree.first().map_or(NIL, |&(_, _, _, at)| at);
                if len <= SORTED_MAX / 2 {
                    // Back to a sorted vector (still long).
                    let v: Vec<u32> = tree.iter().rev().map(|&(_, _, _, at)| at).collect();
                    *long = LongClass::Sorted(v);
                }
                (len, first)
            }
        };
        self.nodes.0[id as usize].next = DEAD;
        self.len -= 1;
        if len > SHORT_CLASS {
            *f.head_of_used(c) = first;
            return;
        }
        // Short again: back to a list (possibly empty).
        let Some(LongClass::Sorted(v)) = f.trees.remove(&(c as u32)) else {
            unreachable!("a short long class is a sorted vector");
        };
        let mut prev = NIL;
        for &at in v.iter().rev() {
            let n = &mut self.nodes.0[at as usize];
            n.prev = prev;
            n.next = NIL;
            if prev == NIL {
                *f.head_of_used(c) = at;
            } else {
                self.nodes.0[prev as usize].next = at;
            }
            prev = at;
        }
        if prev == NIL {
            *f.head_of_used(c) = NIL;
            f.bitmap.clear(c);
        }
    }

    /// Whether the key is present.
    #[inline]
    pub(crate) fn contains(&self, k: &SizeKey) -> bool {
        self.nodes.0.get(k.id.raw() as usize).is_some_and(|n| {
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
        let c0 = self.class(size);
        let mut c = f.bitmap.next_at_or_above(c0)?;
        let mut id = f.head_of_set(c);
        if c == c0 && self.nodes.at(id).size < size {
            // The class of `size` holds smaller blocks than `size` (its first one is): a coarse
            // class holds several sizes, and an exact class is below a `size` that is not a
            // multiple of 512.
            if self.nodes.at(id).prev == TREE {
                id = long_lower_bound(&self.nodes.0, &f.trees[&(c as u32)], size);
            } else {
                while id != NIL && self.nodes.at(id).size < size {
                    id = self.nodes.at(id).next;
                }
            }
            if id == NIL {
                c = f.bitmap.next_at_or_above(c + 1)?;
                id = f.head_of_set(c);
            }
        }
        let node = self.nodes.at(id);
        Some(SizeKey {
            stream,
            size: node.size,
            rank: node.rank,
            ptr: node.ptr,
            id: BlockId::new(id),
        })
    }

    /// Keys of `stream` with size `>= size`, ascending by `(size, rank, address)`.
    pub(crate) fn range_from(
        &self,
        stream: StreamId,
        size: usize,
    ) -> impl Iterator<Item = SizeKey> + '_ {
        let f = self.stream(stream);
        let start = f.and_then(|f| f.bitmap.next_at_or_above(self.class(size)));
        ForwardClasses {
            f,
            nodes: &self.nodes.0,
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
        let start = f.and_then(|f| f.bitmap.prev_below(self.class(size).saturating_add(1)));
        BackwardClasses {
            f,
            nodes: &self.nodes.0,
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

/// Links block `k` (whose id is below the node table's length) into class `c` of `f` (whose
/// head slot exists) at its `(size, rank, address)` position, and marks the class non-empty
/// (its word alone when `word_set`: the bitmap's upper levels already cover `c`'s word). A
/// list that grows past [`LONG_CLASS`] becomes a long class ([`LongClass`]). `REKEYED`: `k`'s node already holds
/// its rank and stream (a [`FreeIndex::rekey`] keeps both), so a list link writes the rest.
#[inline(always)]
fn link<const REKEYED: bool>(
    nodes: &mut Nodes,
    f: &mut StreamFree,
    c: usize,
    k: &SizeKey,
    word_set: bool,
) {
    let order = (k.size, k.rank, k.ptr);
    let StreamFree {
        bitmap,
        heads,
        trees,
    } = f;
    debug_assert!(c < heads.len(), "class {c} has no head slot");
    // SAFETY: `c < heads.len()`: the caller checked it (growing `heads` if needed).
    let head = unsafe { heads.get_unchecked_mut(c) };
    let (prev, next) = if *head == NIL {
        *head = k.id.raw();
        if word_set {
            bitmap.set_in_set_word(c);
        } else {
            bitmap.set(c);
        }
        (NIL, NIL)
    } else if nodes.at(*head).prev == TREE {
        write_node(nodes, k, TREE, TREE);
        return link_long(&mut nodes.0, head, trees, c, k.id.raw());
    } else if nodes.at(*head).order() > order {
        let next = *head;
        *head = k.id.raw();
        nodes.at_mut(next).prev = k.id.raw();
        (NIL, next)
    } else {
        // Walk to the last block before `k` (class lists are short).
        let mut at = *head;
        let mut steps = 0;
        loop {
            let n = nodes.at(at).next;
            if n == NIL || nodes.at(n).order() > order {
                break;
            }
            at = n;
            steps += 1;
            if steps == LONG_CLASS {
                to_long(&mut nodes.0, *head, trees, c);
                write_node(nodes, k, TREE, TREE);
                return link_long(&mut nodes.0, head, trees, c, k.id.raw());
            }
        }
        let next = nodes.at(at).next;
        nodes.at_mut(at).next = k.id.raw();
        if next != NIL {
            nodes.at_mut(next).prev = k.id.raw();
        }
        (at, next)
    };
    if REKEYED {
        let n = nodes.at_mut(k.id.raw());
        (n.prev, n.next, n.ptr, n.size) = (prev, next, k.ptr, k.size);
    } else {
        write_node(nodes, k, prev, next);
    }
}

/// Stores block `k`'s node: its key and its links.
#[inline(always)]
fn write_node(nodes: &mut Nodes, k: &SizeKey, prev: u32, next: u32) {
    *nodes.at_mut(k.id.raw()) = Node {
        prev,
        next,
        ptr: k.ptr,
        size: k.size,
        rank: k.rank,
        stream: k.stream,
    };
}

/// Moves the list of class `c` starting at `head` (more than [`LONG_CLASS`] blocks) into a
/// long class.
#[cold]
#[inline(never)]
fn to_long(nodes: &mut [Node], head: u32, trees: &mut FxHashMap<u32, LongClass>, c: usize) {
    let mut ids = Vec::with_capacity(2 * LONG_CLASS);
    let mut at = head;
    while at != NIL {
        let n = &mut nodes[at as usize];
        ids.push(at);
        at = n.next;
        n.prev = TREE;
        n.next = TREE;
    }
    ids.reverse();
    trees.insert(c as u32, LongClass::Sorted(ids));
}

/// Links block `id` (whose node holds its key, marked [`TREE`]) into the long class `c` (whose
/// first block is `*head`). Cold functions take the id, not the key, so that the hot paths keep
/// the key in registers.
#[cold]
#[inline(never)]
fn link_long(
    nodes: &mut [Node],
    head: &mut u32,
    trees: &mut FxHashMap<u32, LongClass>,
    c: usize,
    id: u32,
) {
    let Some(long) = trees.get_mut(&(c as u32)) else {
        unreachable!("a tree node's class has a tree");
    };
    let order = order_of(nodes, id);
    match long {
        LongClass::Sorted(v) => {
            // Descending: the new block goes after every larger one.
            let at = if order < order_of(nodes, *head) {
                v.len()
            } else {
                v.partition_point(|&x| order_of(nodes, x) > order)
            };
            if at == v.len() {
                *head = id;
            }
            v.insert(at, id);
            if v.len() > SORTED_MAX {
                let tree: ClassTree = v.iter().map(|&x| order_of(nodes, x)).collect();
                *long = LongClass::Tree(tree);
            }
        }
        LongClass::Tree(tree) => {
            tree.insert(order);
            if order < order_of(nodes, *head) {
                *head = id;
            }
        }
    }
}

/// The first block of long class `long` of size `>= size`, or [`NIL`].
#[cold]
#[inline(never)]
fn long_lower_bound(nodes: &[Node], long: &LongClass, size: usize) -> u32 {
    match long {
        LongClass::Sorted(v) => {
            // Descending: the blocks of at least `size` bytes come first; the last of them.
            let larger = v.partition_point(|&x| nodes[x as usize].size >= size);
            larger.checked_sub(1).map_or(NIL, |i| v[i])
        }
        LongClass::Tree(tree) => tree
            .range((size, 0, 0, 0)..)
            .next()
            .map_or(NIL, |&(_, _, _, at)| at),
    }
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
        let found = |(size, rank, ptr, id): Order| Found {
            ptr,
            size,
            rank,
            id: BlockId::new(id),
        };
        match &f.trees[&(c as u32)] {
            LongClass::Sorted(v) => out.extend(v.iter().rev().map(|&x| found(order_of(nodes, x)))),
            LongClass::Tree(tree) => out.extend(tree.iter().copied().map(found)),
        }
        return;
    }
    let mut at = head;
    while at != NIL {
        let node = &nodes[at as usize];
        out.extend([Found {
            ptr: node.ptr,
            size: node.size,
            rank: node.rank,
            id: BlockId::new(at),
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
            id: BlockId::new(id),
        }
    }

    /// Classes never decrease with size (so a walk up from a size's class sees every larger
    /// block), are exact up to 64 MiB, 2 MiB wide above it, and end at the last class; a whole
    /// small-pool segment and its remainder after a 512-byte split share the last word of the
    /// small pool's 64.
    #[test]
    fn classes_grow_with_size() {
        assert_eq!(class_of(0), 0);
        assert_eq!(class_of(1), 0);
        assert_eq!(class_of(512), 0);
        assert_eq!(class_of(513), 1);
        assert_eq!(class_of(crate::sizes::SMALL_BUFFER), 4095);
        assert_eq!(class_of(crate::sizes::SMALL_BUFFER - 512), 4094);
        assert_eq!(class_of(EXACT_LIMIT - 512), EXACT_CLASSES - 2);
        assert_eq!(class_of(EXACT_LIMIT), EXACT_CLASSES - 1);
        assert_eq!(class_of(EXACT_LIMIT + 1), EXACT_CLASSES);
        assert_eq!(class_of(EXACT_LIMIT + (2 << 20)), EXACT_CLASSES);
        assert_eq!(class_of(EXACT_LIMIT + (2 << 20) + 512), EXACT_CLASSES + 1);
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
    /// sorted vector and back while the index keeps the ordered set's answers.
    #[test]
    fn long_classes_match_a_btree_set() {
        // About 256 blocks present per class: twice the length that makes a class long.
        let (sorted, trees) = long_classes_against_a_btree_set(8 * LONG_CLASS as u64, 20_000);
        assert_eq!(
            (sorted, trees),
            (2, 0),
            "both long classes sorted, none a B-tree"
        );
    }

    /// Longer classes (thousands of free blocks) move on to a B-tree, and back to a sorted
    /// vector and a list as they drain.
    #[test]
    fn very_long_classes_match_a_btree_set() {
        // About 2,560 blocks present per class, more than a sorted long class holds.
        let (_, trees) = long_classes_against_a_btree_set(5 * SORTED_MAX as u64, 30_000);
        assert_eq!(trees, 2, "both long classes moved to a B-tree");
    }

    /// Random inserts and removals of `ids` blocks (`rounds` of them, then every block removed)
    /// checked against a `BTreeSet`: the most sorted and B-tree long classes seen at once.
    fn long_classes_against_a_btree_set(ids: u64, rounds: usize) -> (usize, usize) {
        let mut idx = FreeIndex::default();
        let mut model: BTreeSet<SizeKey> = BTreeSet::new();
        let mut rnd = xorshift(0x9e37_79b9_7f4a_7c15u64);
        // Block i has one address; half are 512-byte blocks (one exact class), half lie in the
        // coarse class above 100 MiB with sizes 512 bytes apart; about half of them are present
        // at a time.
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
        let (mut sorted_seen, mut trees_seen) = (0, 0);
        // Then every block removed, in a random order.
        let mut drain: Vec<u32> = (0..ids as u32).collect();
        for i in (1..drain.len()).rev() {
            drain.swap(i, (rnd() % (i as u64 + 1)) as usize);
        }
        let picks = (0..rounds)
            .map(|_| (rnd() % ids) as u32)
            .collect::<Vec<_>>();
        let draining = picks.len();
        for (round, i) in picks.into_iter().chain(drain).enumerate() {
            let k = key_of(i);
            if model.contains(&k) {
                idx.remove_present(&k);
                model.remove(&k);
            } else if round < draining {
                assert!(idx.insert(k));
                model.insert(k);
            }
            assert_eq!(idx.len(), model.len());
            let longs = idx.streams.first().map(|(_, f)| &f.trees);
            let count = |tree: bool| {
                longs.map_or(0, |l| {
                    l.values()
                        .filter(|c| matches!(c, LongClass::Tree(_)) == tree)
                        .count()
                })
            };
            sorted_seen = sorted_seen.max(count(false));
            trees_seen = trees_seen.max(count(true));
            if round % 97 == 0 {
                assert_eq!(
                    idx.iter().collect::<Vec<_>>(),
                    model.iter().copied().collect::<Vec<_>>()
                );
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
            }
            for probe in [512, 513, 100 << 20, (100 << 20) + 1000, (100 << 20) + 3072] {
                let want = model
                    .range(SizeKey::lower(StreamId(0), probe)..)
                    .next()
                    .copied();
                assert_eq!(idx.lower_bound(StreamId(0), probe), want, "probe {probe}");
            }
        }
        assert_eq!(idx.len(), 0, "drained");
        (sorted_seen, trees_seen)
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

    /// The bitmap's searches agree with a scan of a plain set of classes, across all three
    /// levels (classes drawn near word and summary-word edges), stale upper-level bits
    /// included; and the upper levels always cover every non-zero word.
    #[test]
    fn bitmap_matches_a_scan() {
        let mut rnd = xorshift(0x0bad_5eed_u64);
        let mut b = Bitmap::default();
        let mut set: BTreeSet<usize> = BTreeSet::new();
        let edges = [
            0usize,
            1,
            62,
            63,
            64,
            4094,
            4095,
            4096,
            4097,
            131071,
            131072,
            CLASSES - 1,
        ];
        for round in 0..20_000 {
            if round % 97 == 0 {
                for (w, &word) in b.words.iter().enumerate() {
                    if word != 0 {
                        assert_ne!(load(&b.summary[w >> 6]) & (1 << (w & 63)), 0, "word {w}");
                        assert_ne!(load(&b.top) & (1 << (w >> 6)), 0, "word {w}");
                    }
                }
            }
            let r = rnd();
            // Edges, a dense range (many words emptied and refilled: stale upper-level bits
            // to skip and clear), and anywhere.
            let c = match r % 3 {
                0 => edges[(r >> 2) as usize % edges.len()],
                1 => (r >> 2) as usize % 8192,
                _ => (r >> 2) as usize % CLASSES,
            };
            if set.contains(&c) {
                b.clear(c);
                set.remove(&c);
            } else {
                b.set(c);
                set.insert(c);
            }
            for probe in [
                c,
                c + 1,
                c.saturating_sub(1),
                (rnd() as usize) % (CLASSES + 2),
            ] {
                assert_eq!(
                    b.next_at_or_above(probe),
                    set.range(probe..).next().copied(),
                    "next_at_or_above({probe})"
                );
                assert_eq!(
                    b.prev_below(probe),
                    set.range(..probe).next_back().copied(),
                    "prev_below({probe})"
                );
            }
        }
    }

    /// An index's tables stay small: fresh, the small pool's about 90 KiB (the node table 40
    /// KiB, the bitmap 32 KiB, the heads 16 KiB) and the large pool's about 140 KiB (64 KiB of
    /// heads); a stream holding a free 64 MiB block about 600 KiB, and one holding a free 1 TiB
    /// block (every class) about 1.1 MiB.
    #[test]
    fn tables_stay_small() {
        let small = FreeIndex::for_sizes_up_to(crate::sizes::SMALL_BUFFER);
        let large = FreeIndex::for_sizes_up_to(usize::MAX);
        assert!(small.heap_bytes() < 96 << 10, "{}", small.heap_bytes());
        // The small pool's: 2,048 classes (the top one from 1 MiB up), 8 KiB of heads.
        let mut small = FreeIndex::for_requests_up_to(crate::sizes::SMALL_SIZE);
        assert!(small.heap_bytes() < 88 << 10, "{}", small.heap_bytes());
        assert!(small.insert(key(0, 1 << 40, 0x1000_0000, 2)));
        assert!(small.heap_bytes() < 88 << 10, "{}", small.heap_bytes());
        assert!(large.heap_bytes() < 144 << 10, "{}", large.heap_bytes());
        let mut large = large;
        assert!(large.insert(key(0, 64 << 20, 0x1000, 1)));
        assert!(large.heap_bytes() < 608 << 10, "{}", large.heap_bytes());
        assert!(large.insert(key(0, 1 << 40, 0x1000_0000, 2)));
        assert!(large.heap_bytes() < 1200 << 10, "{}", large.heap_bytes());
    }

    /// One operation of the property test: insert or remove a key, remove block `id`'s key (if
    /// free), search, or re-key block `id` (if free) to a new size and address (its stream and
    /// rank kept).
    #[derive(Clone, Debug)]
    enum Op {
        Insert(SizeKey),
        Remove(SizeKey),
        RemoveId(u32),
        Search(u64, usize),
        Rekey(u32, usize, u64),
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        let size = prop_oneof![
            (1usize..16).prop_map(|u| u * 512),
            (4090usize..4097).prop_map(|u| u * 512),
            Just(EXACT_LIMIT),
            (0usize..8).prop_map(|u| EXACT_LIMIT + 1 + u * (1 << 20)),
            (0usize..4).prop_map(|u| (3 << 30) + u * 512),
        ];
        // Block `id` always has one address, as in the allocator; its size, stream and rank
        // vary between the times it is free.
        let k = (0u64..3, size.clone(), 0u64..3, 0u32..48).prop_map(|(stream, size, rank, id)| {
            ranked(stream, size, rank, u64::from(id) * 4096, id)
        });
        prop_oneof![
            3 => k.clone().prop_map(Op::Insert),
            2 => k.prop_map(Op::Remove),
            2 => (0u32..48).prop_map(Op::RemoveId),
            2 => (0u64..3, 0usize..(4 << 30)).prop_map(|(s, z)| Op::Search(s, z)),
            2 => (0u32..48, size, 0u64..4).prop_map(|(id, size, j)| Op::Rekey(id, size, j)),
        ]
    }

    /// `op` with its streams folded onto the first `streams` (one stream takes the one-stream
    /// paths).
    fn on_streams(op: Op, streams: u64) -> Op {
        let fold = |mut k: SizeKey| {
            k.stream = StreamId(k.stream.0 % streams);
            k
        };
        match op {
            Op::Insert(k) => Op::Insert(fold(k)),
            Op::Remove(k) => Op::Remove(fold(k)),
            Op::Search(s, size) => Op::Search(s % streams, size),
            other => other,
        }
    }

    proptest::proptest! {
        /// Random inserts, removes, re-keys and best-fit searches, on one to three streams, give
        /// the answers of a `BTreeSet` of `(stream, size, rank, address)` keys, with exact
        /// classes up to 64 MiB or with the small pool's top class (every size from 1 MiB up in
        /// one class; searches go above it too).
        #[test]
        fn matches_a_btree_set(
            streams in 1u64..4,
            small_top in proptest::bool::ANY,
            ops in proptest::collection::vec(op(), 1..400),
        ) {
            let mut idx = if small_top {
                FreeIndex::for_requests_up_to(crate::sizes::SMALL_SIZE)
            } else {
                FreeIndex::for_sizes_up_to(crate::sizes::SMALL_BUFFER)
            };
            let mut model: BTreeSet<SizeKey> = BTreeSet::new();
            for op in ops {
                match on_streams(op, streams) {
                    Op::Insert(k) => {
                        if !model.iter().any(|m| m.id == k.id) {
                            proptest::prop_assert!(idx.insert(k));
                            model.insert(k);
                        } else {
                            proptest::prop_assert_eq!(idx.insert(k), false);
                        }
                    }
                    Op::Remove(k) => {
                        if model.remove(&k) {
                            idx.remove_present(&k);
                        } else {
                            proptest::prop_assert!(!idx.remove(&k));
                        }
                    }
                    Op::RemoveId(id) => {
                        if let Some(k) = model.iter().find(|m| m.id.raw() == id).copied() {
                            model.remove(&k);
                            idx.remove_present(&k);
                        }
                    }
                    Op::Rekey(id, size, j) => {
                        if let Some(old) = model.iter().find(|m| m.id.raw() == id).copied() {
                            let ptr = u64::from(id) * 4096 + j * 512;
                            let new = ranked(old.stream.0, size, old.rank, ptr, id);
                            model.remove(&old);
                            model.insert(new);
                            idx.rekey(&old, &new);
                        }
                    }
                    Op::Search(s, size) => {
                        let s = StreamId(s);
                        let lower = SizeKey::lower(s, size);
                        let want = model.range(lower..).next().filter(|k| k.stream == s).copied();
                        proptest::prop_assert_eq!(idx.lower_bound(s, size), want);
                        let below: Vec<_> = model
                            .range(..lower)
                            .rev()
                            .take_while(|k| k.stream == s)
                            .copied()
                            .collect();
                        proptest::prop_assert_eq!(
                            idx.range_below_rev(s, size).collect::<Vec<_>>(),
                            below
                        );
                    }
                }
                proptest::prop_assert_eq!(idx.len(), model.len());
            }
            proptest::prop_assert_eq!(
                idx.iter().collect::<Vec<_>>(),
                model.iter().copied().collect::<Vec<_>>()
            );
        }
    }
}
