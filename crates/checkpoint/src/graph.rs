//! The DTR graph: operators, tensors and storages (alias pools) as index-addressed arenas.
//!
//! Every tensor ever created stays in the graph (the paper: released tensors "can be
//! recomputed and count in e* and equivalence classes"); only a storage's memory comes and
//! goes. Indices (`u32`) instead of `Rc` links keep the bookkeeping O(1) per access.

use std::fmt;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(pub u32);

        impl $name {
            /// The index into the runtime's arena.
            #[inline]
            pub fn index(self) -> usize {
                self.0 as usize
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.0)
            }
        }
    };
}

id_type!(
    /// A tensor of the runtime (the prototype's `CheckpointTensorCell`): one output of one
    /// operator call. Views are tensors of their own that share a storage.
    TensorId
);
id_type!(
    /// A storage (the prototype's `AliasPool`): the bytes shared by a tensor and its views,
    /// the unit of eviction.
    StorageId
);
id_type!(
    /// An operator call (the prototype's `Rematerializer`): a closure plus its inputs, rerun to
    /// rematerialize its outputs together.
    OpId
);

/// "No index" marker for optional `u32` slots.
pub(crate) const NONE: u32 = u32::MAX;

/// Where a storage's bytes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StorageState {
    /// Created by an operator call that has not run yet.
    Pending,
    /// In memory.
    Material,
    /// Evicted: not in memory, recomputable from its operator.
    Evicted,
    /// Banished: freed for good and detached from the graph (simrd's `banish`).
    Banished,
}

/// One operator call.
#[derive(Debug)]
pub(crate) struct Op {
    /// Compute cost in ns (measured or logged).
    pub cost: u64,
    /// Input tensors, in argument order (duplicates allowed).
    pub args: Vec<TensorId>,
    /// First output tensor; outputs are `first_output .. first_output + outputs`.
    pub first_output: u32,
    /// Number of outputs.
    pub outputs: u32,
    /// Bytes of the outputs that own fresh storage (aliases count 0).
    pub total_size: u64,
}

/// One tensor.
#[derive(Debug)]
pub(crate) struct Tensor {
    pub op: OpId,
    pub storage: StorageId,
    /// Bytes this output allocates (0 for an alias).
    pub size: u64,
    /// Whether the tensor's value exists (an alias is undefined after its storage was evicted,
    /// even once the storage is back, until its view op reruns).
    pub defined: bool,
    /// Whether the tensor shares an existing storage (a view).
    pub is_alias: bool,
    /// External references (handles held by the program; simrd's `ref_ext`).
    pub ext_refs: u32,
}

/// One storage (alias pool).
#[derive(Debug)]
pub(crate) struct Storage {
    /// Bytes.
    pub size: u64,
    /// Sum of the costs of the distinct operators of its tensors, in ns (simrd's
    /// `Storage.compute`: the root op plus the view ops).
    pub compute: u64,
    /// The last operator whose cost was added to `compute` (tensors of one op are added
    /// together, so this keeps the sum over distinct ops).
    pub last_op: u32,
    pub state: StorageState,
    pub pinned: bool,
    pub constant: bool,
    /// Locks held by running operators and pins (simrd's `ref_int`).
    pub locks: u32,
    /// External references summed over its tensors (simrd's `ref_ext`).
    pub ext_refs: u32,
    /// Its tensors, the root first.
    pub tensors: Vec<TensorId>,
    /// Storages of the inputs of its tensors' ops (excluding itself).
    pub parents: Vec<StorageId>,
    /// Storages of the ops that read its tensors (excluding itself).
    pub children: Vec<StorageId>,
    /// The clock at the last access (simrd's `last_access_int`), in ns of simulated time.
    pub last_access: u64,
    /// Position in the eviction pool, or `NONE`.
    pub pool_slot: u32,
    /// Order of entry into the pool (ties in the heuristic go to the latest entry, as in
    /// simrd's list scan with `<=`).
    pub pool_seq: u64,
    /// Union-find node of its equivalence class while evicted (h_DTR^eq), or `NONE`.
    pub eq_node: u32,
    /// Undefined tensors of other storages that read one of its tensors (simrd V1's
    /// `evicted_dependents`, for banishing).
    pub undefined_children: u32,
    /// Its bytes were handed to a new version by an in-place update (device budget): they no
    /// longer count for it, and its eviction frees nothing.
    pub donated: bool,
}

impl Storage {
    pub fn new(size: u64) -> Self {
        Storage {
            size,
            compute: 0,
            last_op: NONE,
            state: StorageState::Pending,
            pinned: false,
            constant: false,
            locks: 0,
            ext_refs: 0,
            tensors: Vec::new(),
            parents: Vec::new(),
            children: Vec::new(),
            last_access: 0,
            pool_slot: NONE,
            pool_seq: 0,
            eq_node: NONE,
            undefined_children: 0,
            donated: false,
        }
    }

    #[inline]
    pub fn is_material(&self) -> bool {
        self.state == StorageState::Material
    }
}

/// Whether `x` is one of the last few entries of an adjacency list (a cheap dedup; duplicates
/// further back are harmless, every user dedups or marks visits).
#[inline]
pub(crate) fn has_recent(list: &[StorageId], x: StorageId) -> bool {
    list.iter().rev().take(8).any(|&y| y == x)
}
