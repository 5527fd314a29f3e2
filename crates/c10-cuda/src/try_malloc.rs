//! `try_malloc`: a malloc that reports a miss instead of raising out of memory, so that the
//! allocator's owner can make room (evict, free, defragment) outside any allocator call and
//! retry.
//!
//! PyTorch runs its free-memory callbacks from inside `malloc` (after a cache miss, before it
//! asks the device), and MegEngine's DTR evicts when an allocation fails; both re-enter the
//! owner while the allocator is in the middle of a request. Here the allocator returns instead:
//! [`DeviceCachingAllocator::try_malloc`] runs PyTorch's whole path (process events, best fit,
//! a new segment, release of oversize blocks, release of every cached segment and retry) and,
//! where [`DeviceCachingAllocator::malloc`] would raise [`crate::Error::OutOfMemory`], returns
//! [`MallocOutcome::Miss`] with the request ([`Request`]) and the device's figures, recording no
//! OOM. The owner reads the segments ([`DeviceCachingAllocator::segments`],
//! [`DeviceCachingAllocator::plan_room`]), frees what it chooses, and calls again.

use crate::allocator::{Allocation, DeviceCachingAllocator, Params};
use crate::device::{DeviceMemory, StreamId};
use crate::error::Result;
use crate::placement::Placement;
use crate::segment_view::Pool;

/// What a request becomes in the allocator (PyTorch's `AllocParams`). Bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// Bytes asked for.
    pub requested: usize,
    /// The rounded size (`round_size`): the block handed out holds at least this.
    pub size: usize,
    /// The segment a miss asks the device for (`get_allocation_size`); with expandable
    /// segments, pages of 2 MiB (small pool) or 20 MiB (large pool) are mapped instead.
    pub alloc_size: usize,
    /// The pool that serves it.
    pub pool: Pool,
    /// The allocation stream: only that stream's blocks can serve it.
    pub stream: StreamId,
}

/// A request the allocator could not serve without growing past what the device gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Miss {
    /// The request.
    pub request: Request,
    /// Bytes the device still had free (`cudaMemGetInfo`'s free) after every cached segment
    /// was released.
    pub device_free: usize,
    /// Bytes reserved by this allocator (`reserved_bytes.all.current`).
    pub reserved: usize,
    /// Bytes allocated (`allocated_bytes.all.current`).
    pub allocated: usize,
}

/// The result of [`DeviceCachingAllocator::try_malloc`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MallocOutcome {
    /// Served.
    Allocated(Allocation),
    /// Not served; the owner may free blocks and retry.
    Miss(Miss),
}

impl MallocOutcome {
    /// The allocation, if served.
    pub fn allocation(self) -> Option<Allocation> {
        match self {
            MallocOutcome::Allocated(a) => Some(a),
            MallocOutcome::Miss(_) => None,
        }
    }
}

impl<D: DeviceMemory> DeviceCachingAllocator<D> {
    /// How the allocator would serve a request of `size` bytes on `stream` (PyTorch's
    /// `AllocParams`: rounded size, segment size, pool).
    pub fn request(&self, size: usize, stream: StreamId) -> Request {
        Self::request_of(&self.sized(size, stream))
    }

    fn request_of(p: &Params) -> Request {
        Request {
            requested: p.orig_size,
            size: p.size,
            alloc_size: p.alloc_size,
            pool: Pool::of(p.small),
            stream: p.stream,
        }
    }

    /// [`Self::malloc`] without free-memory callbacks, that returns [`MallocOutcome::Miss`]
    /// where `malloc` would raise out of memory. On a miss the allocator is as a failed
    /// `malloc` leaves it (events processed, every wholly free cached segment released, the
    /// retry counted in `num_alloc_retries`) except that no OOM is recorded (`num_ooms` and
    /// the history's `oom` entry stay as they were). On a hit it is exactly `malloc`.
    ///
    /// # Errors
    /// [`crate::Error::Device`] when the device fails in another way than running out of
    /// memory.
    pub fn try_malloc(&mut self, size: usize, stream: StreamId) -> Result<MallocOutcome> {
        self.try_malloc_placed(size, stream, Placement::Low)
    }

    /// [`Self::try_malloc`] with an allocation hint: with [`Placement::High`] a split block
    /// hands out its high addresses (the block chosen is the same best fit).
    ///
    /// # Errors
    /// As [`Self::try_malloc`].
    pub fn try_malloc_placed(
        &mut self,
        size: usize,
        stream: StreamId,
        placement: Placement,
    ) -> Result<MallocOutcome> {
        self.process_events()?;
        let mut p = self.params(size, stream)?;
        let found = match self.get_free_block(&p) {
            Some(id) => Some(id),
            None => self.find_or_grow(&mut p, false)?,
        };
        let Some(mut id) = found else {
            let device_free = self.device.mem_get_info().map(|i| i.free).unwrap_or(0);
            return Ok(MallocOutcome::Miss(Miss {
                request: Self::request_of(&p),
                device_free,
                reserved: self.reserved_bytes(),
                allocated: self.allocated_bytes(),
            }));
        };
        if placement == Placement::High {
            id = self.split_high(&p, id);
        }
        Ok(MallocOutcome::Allocated(self.alloc_found_block(&p, id)))
    }
}
