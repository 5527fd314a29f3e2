//! The shared types of private pools, with no allocator behind them: pool ids (PyTorch's
//! `MempoolId_t`), stream filters (the `filter` of `beginAllocateToPool`) and the errors of the
//! pool calls. Re-exported from `private_pool`.

use std::fmt;
use std::thread::ThreadId;

use crate::device::StreamId;
use crate::rules::TorchVersion;

/// The id of a memory pool (PyTorch's `MempoolId_t`, a pair of `unsigned long long`).
///
/// `(0, 0)` ([`MempoolId::DEFAULT`]) names the default pools. PyTorch numbers the others:
/// `torch.cuda.MemPool()` and `torch.cuda.graph_pool_handle()` take `(0, n)` from one counter,
/// a CUDA graph captured without a pool takes `(n, 0)` from another.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MempoolId {
    /// The first half (`CaptureId_t`: the capture's id for a graph's own pool, else 0).
    pub first: u64,
    /// The second half (the user-created pool's number, else 0).
    pub second: u64,
}

impl MempoolId {
    /// `(0, 0)`: the default pools.
    pub const DEFAULT: MempoolId = MempoolId {
        first: 0,
        second: 0,
    };

    /// The id `(first, second)`.
    pub const fn new(first: u64, second: u64) -> MempoolId {
        MempoolId { first, second }
    }

    /// Whether this is `(0, 0)`, the default pools.
    pub fn is_default(self) -> bool {
        self == MempoolId::DEFAULT
    }

    /// The key `torch.cuda.memory_stats()` uses for the pool in
    /// `reserved_bytes_by_private_pools`: the halves joined by `_` (`"0_1"`).
    pub fn stats_key(self) -> String {
        format!("{}_{}", self.first, self.second)
    }
}

impl fmt::Display for MempoolId {
    /// As Python prints the tuple: `(0, 1)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "({}, {})", self.first, self.second)
    }
}

/// Which allocations a begun pool takes: the `filter` of PyTorch's
/// `beginAllocateToPool(device, mempool_id, filter)` (a `std::function<bool(cudaStream_t)>`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StreamFilter {
    /// Every allocation on the device.
    All,
    /// Allocations on one stream (what a CUDA graph capture on that stream routes).
    Stream(StreamId),
    /// Allocations made by one thread (`torch.cuda.use_mem_pool`'s filter: the calling
    /// thread's, `_cuda_beginAllocateCurrentThreadToPool`).
    Thread(ThreadId),
}

impl StreamFilter {
    /// Whether an allocation on `stream`, made by the calling thread, goes to the pool.
    pub fn accepts(&self, stream: StreamId) -> bool {
        match self {
            StreamFilter::All => true,
            StreamFilter::Stream(s) => *s == stream,
            StreamFilter::Thread(t) => std::thread::current().id() == *t,
        }
    }

    /// The filter `torch.cuda.use_mem_pool` begins a pool with: the calling thread's.
    pub fn current_thread() -> StreamFilter {
        StreamFilter::Thread(std::thread::current().id())
    }
}

/// Why a private-pool call was refused. Each is one of PyTorch's checks or internal
/// assertions (named in the message); where PyTorch changed state before the assertion
/// failed, so does this allocator (said in the variant's doc).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    /// No pool with that id (never made, or forgotten after it was freed).
    #[error(
        "no private pool {id} on device {device} (PyTorch: INTERNAL ASSERT FAILED \
         `it != graph_pools.end()`)"
    )]
    NotFound {
        /// The device.
        device: u8,
        /// The id asked for.
        id: MempoolId,
    },
    /// `(0, 0)` names the default pools, not a private one.
    #[error("the pool id (0, 0) is the default pools, not a private pool")]
    DefaultId,
    /// An existing pool can be shared only while another user holds it (begin or incref at
    /// use count 0 or less).
    #[error(
        "private pool {id} has use count {use_count}: it can only be joined while another user \
         holds it (PyTorch: INTERNAL ASSERT FAILED `it->second->use_count > 0`)"
    )]
    NotLive {
        /// The pool.
        id: MempoolId,
        /// Its use count.
        use_count: i64,
    },
    /// The pool is begun already. As in PyTorch, its use count was incremented before the
    /// check and stays so.
    #[error("beginAllocateToPool: already recording to mempool_id {id}")]
    AlreadyRecording {
        /// The pool.
        id: MempoolId,
    },
    /// `end_allocate_to_pool` of a pool that is not begun.
    #[error("endAllocatePool: not currently recording to mempool_id {id}")]
    NotRecording {
        /// The pool.
        id: MempoolId,
    },
    /// `release_pool` took the use count below 0. As in PyTorch, the count stays decremented.
    #[error(
        "releasePool of {id} took its use count to {use_count} (PyTorch: INTERNAL ASSERT FAILED \
         `uc >= 0`)"
    )]
    ReleasedTooOften {
        /// The pool.
        id: MempoolId,
        /// Its use count now.
        use_count: i64,
    },
    /// torch 2.7: `empty_cache` while a pool is begun (2.7 counts a begun pool as a CUDA
    /// graph capture, during which nothing may be synchronized). `num_sync_all_streams` was
    /// counted first, as in PyTorch; nothing was freed.
    #[error(
        "empty_cache while {begun} private pool(s) are begun: torch 2.7 refuses it (PyTorch: \
         INTERNAL ASSERT FAILED `captures_underway.empty()`); end the pools first"
    )]
    CaptureUnderway {
        /// How many pools are begun.
        begun: usize,
    },
    /// A freeable pool whose use count is not 0 (it was released below 0). The default pools
    /// (for a global `empty_cache`) were emptied first, as in PyTorch.
    #[error(
        "freeable private pool {id} has use count {use_count} (PyTorch: INTERNAL ASSERT FAILED \
         `it->second->use_count == 0`)"
    )]
    FreeableInUse {
        /// The pool.
        id: MempoolId,
        /// Its use count.
        use_count: i64,
    },
    /// A segment of the pool was given back while its count of device allocations was 0
    /// (expandable segments: PyTorch counts one allocation per request that maps pages but one
    /// release per unmapping, so the two can disagree). The pages were unmapped first, as in
    /// PyTorch.
    #[error(
        "private pool {id}: a release found no device allocation counted (PyTorch: INTERNAL \
         ASSERT FAILED `cudaMalloc_count > 0`)"
    )]
    NoAllocationCounted {
        /// The pool.
        id: MempoolId,
    },
    /// An allocation routed to a begun pool that was forgotten meanwhile (it was freeable and
    /// emptied while begun).
    #[error(
        "an allocation on stream {stream} is routed to private pool {id}, which no longer exists \
         (PyTorch: INTERNAL ASSERT FAILED `it1 != graph_pools.end()`)"
    )]
    RoutedToMissingPool {
        /// The pool.
        id: MempoolId,
        /// The allocation's stream.
        stream: u64,
    },
    /// A call the followed PyTorch version does not have.
    #[error("{what} is not in torch {version}'s allocator")]
    Unsupported {
        /// The call.
        what: &'static str,
        /// The version followed.
        version: TorchVersion,
    },
    /// torch 2.7's `~MemPool` asserts the pool's use count is 1 (it would abort the process);
    /// nothing was changed.
    #[error(
        "torch 2.7's MemPool destructor needs use count 1, pool {id} has {use_count} (end and \
         release every use_mem_pool first)"
    )]
    DestructorInUse {
        /// The pool.
        id: MempoolId,
        /// Its use count.
        use_count: i64,
    },
}
