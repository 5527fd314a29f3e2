//! TEMPORARY stub of the allocator configuration (replaced by the full parser).
#[derive(Clone, Debug, PartialEq)]
pub struct AllocatorConfig {
    pub max_split_size: Option<usize>,
    pub max_non_split_rounding: usize,
    pub roundup_power2_divisions: [usize; 16],
    pub garbage_collection_threshold: f64,
    pub expandable_segments: bool,
    pub per_process_memory_fraction: Option<f64>,
}
impl Default for AllocatorConfig {
    fn default() -> Self {
        Self { max_split_size: None, max_non_split_rounding: 20 << 20, roundup_power2_divisions: [0; 16], garbage_collection_threshold: 0.0, expandable_segments: false, per_process_memory_fraction: None }
    }
}
impl AllocatorConfig {
    pub fn roundup_power2_divisions_for(&self, size: usize) -> usize {
        let log = (usize::BITS - 1 - size.max(1).leading_zeros()) as usize;
        let idx = log.saturating_sub(20).min(15);
        self.roundup_power2_divisions[idx]
    }
    pub fn max_split_size_or_max(&self) -> usize { self.max_split_size.unwrap_or(usize::MAX) }
    pub fn gc_enabled(&self) -> bool { self.garbage_collection_threshold > 0.0 }
}
