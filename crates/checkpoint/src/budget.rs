//! The hard budget: evict BEFORE an allocation until the allocation fits, so memory never
//! exceeds the budget (the prototype's budget was soft: it evicted after each op).

use std::time::Instant;

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::runtime::{EvictReason, Runtime};

/// simrd's budget for a ratio of the unbudgeted peak: `floor(ratio × peak)` bytes (Python's
/// `int(baseline_memory * r)`, the same double-precision product).
pub fn budget_for_ratio(peak_bytes: u64, ratio: f64) -> u64 {
    let b = peak_bytes as f64 * ratio;
    if b <= 0.0 { 0 } else { b as u64 }
}

impl<B: Backend> Runtime<B> {
    /// Evicts storages chosen by the heuristic until `bytes` more fit under the budget (simrd's
    /// `_free`). Without a budget it does nothing.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] when the pool runs dry first; [`Error::Backend`] when a free
    /// fails.
    pub fn make_room(&mut self, bytes: u64) -> Result<()> {
        let Some(budget) = self.config.budget else {
            return Ok(());
        };
        while self.used_bytes().saturating_add(bytes) > budget {
            let start = Instant::now();
            let victim = self.choose();
            self.profile.search_ns += start.elapsed().as_nanos() as u64;
            let Some(s) = victim else {
                return Err(Error::OutOfMemory {
                    requested: bytes,
                    used: self.used_bytes(),
                    budget,
                });
            };
            self.evict(s, EvictReason::Heuristic)?;
        }
        Ok(())
    }

    /// Bytes in use as the budget counts them: the backend's allocator figure when it has
    /// one ([`Backend::allocated_bytes`]), else the core's count of storage bytes.
    pub fn used_bytes(&self) -> u64 {
        self.backend.allocated_bytes().unwrap_or(self.memory)
    }

    /// Evicts the heuristic's choice now, if there is one; returns whether it freed anything.
    /// This is what a caching-allocator free-memory callback
    /// (`CachingAllocator::register_free_memory_callback`, run on a cache miss before the
    /// allocator asks the device for more) would do; the live driver evicts before each call
    /// instead ([`Runtime::make_room`]; [`crate::live`] says why).
    ///
    /// # Errors
    /// [`Error::Backend`] when freeing fails.
    pub fn evict_one(&mut self) -> Result<bool> {
        let start = Instant::now();
        let victim = self.choose();
        self.profile.search_ns += start.elapsed().as_nanos() as u64;
        match victim {
            Some(s) => {
                self.evict(s, EvictReason::Heuristic)?;
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratio_budget_floors_like_python() {
        // int(10061179152 * 0.4) == 4024471660 in Python.
        assert_eq!(budget_for_ratio(10_061_179_152, 0.4), 4_024_471_660);
        assert_eq!(budget_for_ratio(100, 0.3), 30);
        assert_eq!(budget_for_ratio(7, 0.0), 0);
    }
}
