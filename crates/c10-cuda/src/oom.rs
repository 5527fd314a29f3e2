//! TEMPORARY stub of the out-of-memory error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutOfMemoryError {
    pub device: u8,
    pub requested: u64,
    pub rounded: u64,
    pub segment_size: u64,
    pub device_total: u64,
    pub device_free: u64,
    pub allocated: u64,
    pub reserved: u64,
    pub allowed: Option<u64>,
    pub expandable_segments: bool,
    pub max_split_size: Option<u64>,
    pub stream: u64,
}
impl std::fmt::Display for OutOfMemoryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { write!(f, "CUDA out of memory. Tried to allocate {} bytes", self.requested) }
}
impl std::error::Error for OutOfMemoryError {}
