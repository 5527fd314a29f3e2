//! Which scripts a PyTorch program can produce: the private-pool calls as `torch.cuda.MemPool`,
//! `torch.cuda.use_mem_pool` and CUDA graph captures make them, checked before a script runs.
//!
//! A script drives the allocator's pool API directly (`beginAllocateToPool`,
//! `endAllocateToPool`, `releasePool`), so it can say what no program can: release a pool
//! twice, or release the reference a begun pool's context holds. Real PyTorch then reads freed
//! memory (a pool released to use count 0 while allocations are still routed to it made
//! torch-oracle crash with SIGSEGV, issue 29), so such a script compares nothing. What a
//! program does, from PyTorch's source:
//!
//! * `MemPool()` makes the pool at use count 1 (the object's own reference); its destructor
//!   (`pool_delete`) releases that reference once, and runs once.
//! * `use_mem_pool(pool)` (torch/cuda/memory.py) calls `beginAllocate...ToPool` (+1), and on
//!   leaving the block `endAllocateToPool` and then `releasePool` (-1): a begin's reference is
//!   released only after its end.
//! * A capture (`torch.cuda.graph`, into a `graph_pool_handle()`, a MemPool's id or the graph's
//!   own pool) begins the pool on the capture stream (+1) and ends it at capture end; the
//!   graph's reset or destruction releases it (-1), once per capture.
//!
//! So [`check`] follows each pool's use count as the allocator keeps it and refuses a script
//! that releases a reference nobody holds ([`ApiError::NoReference`]), releases the one a begun
//! pool's context holds ([`ApiError::ReleaseWhileBegun`]), ends a pool that is not begun
//! ([`ApiError::EndNotBegun`]), begins a MemPool whose references are all gone
//! ([`ApiError::MemPoolGone`]), deletes what is not a MemPool ([`ApiError::DeleteNotMemPool`]),
//! or begins or deletes a MemPool after its destructor ran ([`ApiError::AfterDelete`]). Ops
//! that only read (`pool_use_count`, `empty_cache P`, `snapshot P`) and what the allocator
//! itself refuses with an error (a second begin of a begun pool, a name never created) are
//! left to run: PyTorch reports those as errors, which the comparison checks.

use std::collections::HashMap;

use crate::script::{Op, PoolKind, Script};

/// Why a script is not one a PyTorch program can produce. `op` is the op's position in the
/// script (from 1, `env` lines not counted); `text` is the op as written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// A `pool_release` (or `pool_delete`) with no reference left to release: every begin's
    /// and the MemPool's own were released already, or the pool was never begun.
    #[error(
        "op {op} (`{text}`): {pool} has no reference left to release (use count 0): a program \
         releases a pool once per use_mem_pool block or capture, and a MemPool once more when \
         it goes away"
    )]
    NoReference {
        /// Position of the op.
        op: usize,
        /// The op.
        text: String,
        /// The pool.
        pool: String,
    },
    /// A release while the pool is begun that would take the reference its begin holds (the
    /// use count would fall below 1 while allocations are routed to the pool).
    #[error(
        "op {op} (`{text}`): {pool} is begun and its begin holds the last reference: \
         use_mem_pool and a capture release a pool only after pool_end"
    )]
    ReleaseWhileBegun {
        /// Position of the op.
        op: usize,
        /// The op.
        text: String,
        /// The pool.
        pool: String,
    },
    /// A `pool_end` of a pool that is not begun (a program ends only what it began).
    #[error("op {op} (`{text}`): {pool} is not begun")]
    EndNotBegun {
        /// Position of the op.
        op: usize,
        /// The op.
        text: String,
        /// The pool.
        pool: String,
    },
    /// A `pool_begin` of a MemPool whose references are all released (the object is gone).
    #[error(
        "op {op} (`{text}`): {pool}'s MemPool has released its own reference (it is gone): \
         no program can use it again"
    )]
    MemPoolGone {
        /// Position of the op.
        op: usize,
        /// The op.
        text: String,
        /// The pool.
        pool: String,
    },
    /// A `pool_delete` of a graph pool handle or a capture's own pool (only a MemPool has a
    /// destructor).
    #[error("op {op} (`{text}`): {pool} is not a MemPool (only a MemPool is deleted)")]
    DeleteNotMemPool {
        /// Position of the op.
        op: usize,
        /// The op.
        text: String,
        /// The pool.
        pool: String,
    },
    /// A `pool_begin` or a second `pool_delete` of a MemPool after its destructor ran.
    #[error("op {op} (`{text}`): {pool}'s MemPool was deleted already (its destructor runs once)")]
    AfterDelete {
        /// Position of the op.
        op: usize,
        /// The op.
        text: String,
        /// The pool.
        pool: String,
    },
}

/// A pool as the check follows it.
struct Pool {
    kind: PoolKind,
    /// The use count the allocator keeps (a handle's or a capture's pool: 0 until begun).
    uses: i64,
    begun: bool,
    deleted: bool,
}

/// Refuses `script` when no PyTorch program can make its private-pool calls (see the module
/// docs).
///
/// # Errors
/// The first [`ApiError`] in the script.
pub fn check(script: &Script) -> Result<(), ApiError> {
    let mut pools: HashMap<&str, Pool> = HashMap::new();
    for (k, op) in script.ops.iter().enumerate() {
        let at = |pool: &str| (k + 1, op.to_string(), pool.to_owned());
        match op {
            Op::PoolCreate { pool, kind, .. } => {
                // A name used twice is the driver's error (and the oracle's), not a release.
                pools.entry(pool).or_insert(Pool {
                    kind: *kind,
                    uses: i64::from(*kind == PoolKind::Mempool),
                    begun: false,
                    deleted: false,
                });
            }
            Op::PoolBegin { pool, .. } => {
                let Some(p) = pools.get_mut(pool.as_str()) else {
                    continue;
                };
                if p.kind == PoolKind::Mempool {
                    if p.deleted {
                        let (op, text, pool) = at(pool);
                        return Err(ApiError::AfterDelete { op, text, pool });
                    }
                    if p.uses <= 0 {
                        let (op, text, pool) = at(pool);
                        return Err(ApiError::MemPoolGone { op, text, pool });
                    }
                }
                // The allocator adds the user even when it then refuses a second begin.
                p.uses += 1;
                p.begun = true;
            }
            Op::PoolEnd(pool) => {
                let Some(p) = pools.get_mut(pool.as_str()) else {
                    continue;
                };
                if !p.begun {
                    let (op, text, pool) = at(pool);
                    return Err(ApiError::EndNotBegun { op, text, pool });
                }
                p.begun = false;
            }
            Op::PoolRelease(pool) | Op::PoolDelete(pool) => {
                let Some(p) = pools.get_mut(pool.as_str()) else {
                    continue;
                };
                if let Op::PoolDelete(_) = op {
                    if p.kind != PoolKind::Mempool {
                        let (op, text, pool) = at(pool);
                        return Err(ApiError::DeleteNotMemPool { op, text, pool });
                    }
                    if p.deleted {
                        let (op, text, pool) = at(pool);
                        return Err(ApiError::AfterDelete { op, text, pool });
                    }
                }
                if p.uses <= 0 {
                    let (op, text, pool) = at(pool);
                    return Err(ApiError::NoReference { op, text, pool });
                }
                if p.begun && p.uses <= 1 {
                    let (op, text, pool) = at(pool);
                    return Err(ApiError::ReleaseWhileBegun { op, text, pool });
                }
                p.uses -= 1;
                if let Op::PoolDelete(_) = op {
                    p.deleted = true;
                }
            }
            _ => {}
        }
    }
    Ok(())
}
