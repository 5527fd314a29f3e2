//! Frees into a fragmented small pool: `n` 512-byte blocks are allocated, every other one of
//! the first half is freed (n/4 free blocks of one size that cannot merge), then every other
//! block of the second half is freed, each one landing after all the others in its size class.
//! Prints the mean time of those frees, in ns.
//!
//! `cargo run --release -p c10-cuda --example fragmented_free -- 40000`
//!
//! This is the case that makes a sorted list per size class O(n) per insert; the free-block
//! index moves such a class to a B-tree (`src/free_index.rs`), so the time stays flat as `n`
//! grows. A quick check, not a benchmark: the criterion benches are in `benches/alloc/`.

use std::time::Instant;

use c10_cuda::config::AllocatorConfig;
use c10_cuda::device::StreamId;
use c10_cuda::{DeviceCachingAllocator, SimDevice};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = match std::env::args().nth(1) {
        Some(arg) => arg
            .parse()
            .map_err(|e| format!("block count {arg:?}: {e}"))?,
        None => 40_000,
    };
    let mut alloc = DeviceCachingAllocator::new(
        SimDevice::address_only(0, 80 << 30),
        AllocatorConfig::default(),
    )?;
    let ptrs = (0..n)
        .map(|_| alloc.malloc(512, StreamId::DEFAULT).map(|a| a.ptr))
        .collect::<Result<Vec<_>, _>>()?;
    let (low, high) = ptrs.split_at(n / 2);
    for &ptr in low.iter().step_by(2) {
        alloc.free(ptr)?;
    }
    let start = Instant::now();
    let mut frees = 0u32;
    for &ptr in high.iter().step_by(2) {
        alloc.free(ptr)?;
        frees += 1;
    }
    let ns = start.elapsed().as_nanos() as f64 / f64::from(frees.max(1));
    println!(
        "{frees} frees into a class of {} to {} free 512-byte blocks: {ns:.1} ns each",
        low.len().div_ceil(2),
        low.len().div_ceil(2) + frees as usize
    );
    Ok(())
}
