//! The out-of-memory error value and its message.
//!
//! [`OutOfMemoryError`] carries every figure PyTorch's `OutOfMemoryError` message prints
//! (`c10/cuda/CUDACachingAllocator.cpp`, `DeviceCachingAllocator::malloc`), as typed fields, and
//! its `Display` follows PyTorch's wording with two deliberate fixes:
//! - PyTorch's "Tried to allocate" prints the segment size (`alloc_size`) rather than what the
//!   caller asked for; ours prints the request, and the segment when the two differ.
//! - PyTorch always ends with the `expandable_segments:True` hint, even when expandable segments
//!   are already on or when reserved-but-unallocated memory is tiny; ours picks the hint that fits
//!   the state (see [`OutOfMemoryError`]'s `Display`).

use std::fmt;

use crate::rules::TorchVersion;
use crate::summary::format_size;

/// PyTorch's documentation sentence that ends every out-of-memory message.
const DOCS: &str = "See documentation for Memory Management \
                    (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)";

/// The caching allocator could not satisfy a request (PyTorch's `torch.OutOfMemoryError`,
/// raised by `DeviceCachingAllocator::malloc` after the whole retry chain failed).
///
/// All sizes are bytes. The message (`Display`) reads, with sizes as [`format_size`] prints them:
///
/// ```text
/// CUDA out of memory. Tried to allocate 3.50 MiB (a 20.00 MiB segment). GPU 0 has a total
/// capacity of 8.00 GiB of which 12.00 MiB is free. Of the allocated memory 5.00 GiB is
/// allocated by PyTorch, and 2.50 GiB is reserved by PyTorch but unallocated. <hints> See
/// documentation for Memory Management (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)
/// ```
///
/// `"X allowed; "` precedes "Of the allocated memory" when a memory fraction is set, as in
/// PyTorch. Then the hints that fit the state:
/// - when the memory-fraction limit was the binding constraint (`allowed` is set and
///   `reserved + segment_size > allowed`, PyTorch's own refusal test): says so and suggests
///   raising `per_process_memory_fraction`;
/// - with expandable segments off and reserved-but-unallocated memory large (nonzero and at least
///   a quarter of `reserved`, or at least `segment_size`; see [`OutOfMemoryError::fragmented`]):
///   PyTorch's `expandable_segments:True` suggestion (also after the fraction hint);
/// - otherwise, unless the fraction hint was given: fragmentation is not the cause (expandable
///   segments are on, or the unallocated part is small); reduce memory use or free tensors;
/// - with expandable segments on under torch 2.15's rules ([`OutOfMemoryError::torch`]), what
///   2.15 adds: a note that each expandable segment reserves about 9/8 of the device's memory in
///   virtual address space, per stream and pool, in case the process runs out of address space.
///
/// Unlike PyTorch, the docs sentence is separated by single spaces (PyTorch prints two before
/// "See" and two before the link). `max_split_size` and `stream` are carried for callers and logs;
/// the message does not print them.
///
/// `#[non_exhaustive]`: only the allocator makes one (more figures may be added); read the
/// fields, match with `..`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct OutOfMemoryError {
    /// The device index (PyTorch's `device`).
    pub device: u8,
    /// What the caller asked for, unrounded (PyTorch's `orig_size`).
    pub requested: u64,
    /// `round_size(requested)`: the block size the allocator looked for (PyTorch's `size`).
    pub rounded: u64,
    /// The device allocation that failed: the segment size for this request (PyTorch's
    /// `alloc_size`, the figure PyTorch prints after "Tried to allocate").
    pub segment_size: u64,
    /// Total device memory (`cudaMemGetInfo`'s total).
    pub device_total: u64,
    /// Free device memory when the error was raised (`cudaMemGetInfo`'s free).
    pub device_free: u64,
    /// Bytes handed out to callers: `allocated_bytes.all.current`.
    pub allocated: u64,
    /// Bytes held by the allocator: `reserved_bytes.all.current`.
    pub reserved: u64,
    /// The per-process memory fraction limit in bytes (`allowed_memory_maximum`), when a fraction
    /// is set.
    pub allowed: Option<u64>,
    /// Whether `expandable_segments:True` was in effect.
    pub expandable_segments: bool,
    /// The configured `max_split_size` in bytes; `None` when unlimited.
    pub max_split_size: Option<u64>,
    /// The stream the request was made on (its raw handle or id).
    pub stream: u64,
    /// The PyTorch version whose rules the allocator followed (the message's last note
    /// depends on it).
    pub torch: TorchVersion,
}

impl OutOfMemoryError {
    /// Bytes reserved by the allocator but not handed out: `reserved - allocated` (saturating),
    /// the "reserved by PyTorch but unallocated" figure of the message.
    pub fn reserved_but_unallocated(&self) -> u64 {
        self.reserved.saturating_sub(self.allocated)
    }

    /// Whether the memory-fraction limit refused the segment: `allowed` is set and
    /// `reserved + segment_size > allowed`.
    pub fn fraction_limited(&self) -> bool {
        self.allowed
            .is_some_and(|allowed| self.reserved.saturating_add(self.segment_size) > allowed)
    }

    /// Whether reserved-but-unallocated memory is large enough to blame fragmentation: nonzero
    /// and at least a quarter of `reserved` or at least `segment_size`.
    pub fn fragmented(&self) -> bool {
        let unallocated = self.reserved_but_unallocated();
        unallocated > 0
            && (u128::from(unallocated) * 4 >= u128::from(self.reserved)
                || unallocated >= self.segment_size)
    }
}

impl fmt::Display for OutOfMemoryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CUDA out of memory. Tried to allocate {}",
            format_size(self.requested)
        )?;
        if self.segment_size != self.requested {
            write!(f, " (a {} segment)", format_size(self.segment_size))?;
        }
        write!(
            f,
            ". GPU {} has a total capacity of {} of which {} is free. ",
            self.device,
            format_size(self.device_total),
            format_size(self.device_free)
        )?;
        if let Some(allowed) = self.allowed {
            write!(f, "{} allowed; ", format_size(allowed))?;
        }
        write!(
            f,
            "Of the allocated memory {} is allocated by PyTorch, and {} is reserved by PyTorch \
             but unallocated. ",
            format_size(self.allocated),
            format_size(self.reserved_but_unallocated())
        )?;
        let limited = self.fraction_limited();
        if let Some(allowed) = self.allowed.filter(|_| limited) {
            write!(
                f,
                "The per-process memory fraction is the limit: {} reserved plus this {} segment \
                 exceeds the {} allowed. Raise per_process_memory_fraction \
                 (torch.cuda.set_per_process_memory_fraction) if the device has room. ",
                format_size(self.reserved),
                format_size(self.segment_size),
                format_size(allowed)
            )?;
        }
        if self.expandable_segments {
            if !limited {
                f.write_str(
                    "Expandable segments are on, so fragmentation is not the cause: reduce \
                     memory use or free tensors that are no longer needed. ",
                )?;
            }
        } else if self.fragmented() {
            f.write_str(
                "Reserved but unallocated memory is large: try setting \
                 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation. ",
            )?;
        } else if !limited {
            f.write_str(
                "Reserved but unallocated memory is small, so fragmentation is not the cause: \
                 reduce memory use or free tensors that are no longer needed. ",
            )?;
        }
        if self.expandable_segments && self.torch >= TorchVersion::V2_15 {
            f.write_str(
                "If the process runs out of virtual address space (VSZ) instead: each expandable \
                 segment reserves about 9/8 of the device's memory, per stream and pool (torch \
                 2.15's expandable_segments_reserve lowers it). ",
            )?;
        }
        f.write_str(DOCS)
    }
}

impl std::error::Error for OutOfMemoryError {}

#[cfg(test)]
mod tests;
