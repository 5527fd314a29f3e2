//! Size rules: PyTorch's constants, `round_size`, `get_allocation_size` and `should_split`.

use crate::config::AllocatorConfig;

/// Every request is rounded up to a multiple of this many bytes (PyTorch's `kMinBlockSize`).
pub const MIN_BLOCK_SIZE: usize = 512;
/// Rounded sizes up to this many bytes go to the small pool (PyTorch's `kSmallSize`, 1 MiB).
pub const SMALL_SIZE: usize = 1 << 20;
/// Segment size for small-pool misses (PyTorch's `kSmallBuffer`, 2 MiB).
pub const SMALL_BUFFER: usize = 2 << 20;
/// Segment size for large requests below [`MIN_LARGE_ALLOC`] (PyTorch's `kLargeBuffer`, 20 MiB).
pub const LARGE_BUFFER: usize = 20 << 20;
/// From this size on, a segment is the request rounded to [`ROUND_LARGE`] (PyTorch's
/// `kMinLargeAlloc`, 10 MiB).
pub const MIN_LARGE_ALLOC: usize = 10 << 20;
/// Large segments are rounded up to a multiple of this (PyTorch's `kRoundLarge`, 2 MiB).
pub const ROUND_LARGE: usize = 2 << 20;

/// Rounds a request of `size` bytes to the block size the allocator hands out, in bytes
/// (PyTorch's `round_size`).
///
/// Below 512 bytes: 512. With `roundup_power2_divisions` d > 1 for the size's interval and
/// `size > 512 * d`: the next of d equal steps inside `[2^k, 2^(k+1))` (powers of two stay).
/// Otherwise: the next multiple of 512. Saturates at `usize::MAX` rounded down to 512 instead of
/// overflowing.
#[inline]
pub fn round_size(size: usize, config: &AllocatorConfig) -> usize {
    if size < MIN_BLOCK_SIZE {
        return MIN_BLOCK_SIZE;
    }
    let divisions = config.roundup_power2_divisions_for(size);
    // Saturating: any power of two is a valid division count, and 512 * 2^55 overflows.
    if divisions > 1 && size > MIN_BLOCK_SIZE.saturating_mul(divisions) {
        // The step is a multiple of 512 here; only saturation at the top can break that.
        roundup_power2_next_division(size, divisions).min(usize::MAX & !(MIN_BLOCK_SIZE - 1))
    } else {
        round_up(size, MIN_BLOCK_SIZE)
    }
}

/// PyTorch's `roundup_power2_next_division`: rounds `size` up to the next of `divisions` equal
/// steps between the surrounding powers of two. `divisions` is a power of two >= 2.
pub fn roundup_power2_next_division(size: usize, divisions: usize) -> usize {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1usize << (usize::BITS - 1 - size.leading_zeros());
    let step = floor >> divisions.trailing_zeros();
    if step == 0 {
        return floor.saturating_mul(2);
    }
    let low = size & !(step - 1);
    if low == size {
        size
    } else {
        low.saturating_add(step)
    }
}

/// The segment size requested from the device on a miss for a rounded `size`, in bytes
/// (PyTorch's `get_allocation_size`): up to 1 MiB -> 2 MiB; below 10 MiB -> 20 MiB; otherwise
/// `size` rounded up to a multiple of 2 MiB.
#[inline]
pub fn get_allocation_size(size: usize) -> usize {
    if size <= SMALL_SIZE {
        SMALL_BUFFER
    } else if size < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        round_up(size, ROUND_LARGE)
    }
}

/// Whether a free block of `block_size` bytes serving a rounded request of `size` bytes is split,
/// leaving the remainder in the pool (PyTorch's `should_split`).
///
/// Small pool, or any pool with expandable segments: when the remainder is at least 512 bytes.
/// Large pool: when `size < max_split_size` and the remainder is more than 1 MiB.
#[inline]
pub fn should_split(
    block_size: usize,
    size: usize,
    small_pool: bool,
    config: &AllocatorConfig,
) -> bool {
    let remaining = block_size - size;
    if small_pool || config.expandable_segments {
        remaining >= MIN_BLOCK_SIZE
    } else {
        size < config.max_split_size_or_max() && remaining > SMALL_SIZE
    }
}

/// Whether a rounded request of `size` bytes is served from the small pool (PyTorch's
/// `get_pool`: `size <= kSmallSize`).
#[inline]
pub fn is_small(size: usize) -> bool {
    size <= SMALL_SIZE
}

/// `size` rounded up to a multiple of `to` (a power of two), saturating.
fn round_up(size: usize, to: usize) -> usize {
    match size.checked_add(to - 1) {
        Some(s) => s & !(to - 1),
        None => usize::MAX & !(to - 1),
    }
}
