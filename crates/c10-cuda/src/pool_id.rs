//! Pool ids and stream filters (PyTorch's `MempoolId_t` and the `filter` of
//! `beginAllocateToPool`): the shared types of the private pools, with no allocator behind them.

use std::fmt;
use std::thread::ThreadId;

use crate::device::StreamId;

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
