//! Our allocator in the bench: the device it runs on and the replay runners.
//!
//! [`FakeRuntime`] is the device of every timed replay: a [`DeviceMemory`] that does what
//! torch-oracle's fake CUDA runtime does for `cudaMalloc` and `cudaFree` (`src/fakecudart.c`:
//! a lock, a bump of the next address aligned to 2 MiB, a table append; `cudaFree` looks the
//! base up from the table's end and swaps the last entry in), so both allocators pay the same
//! for their device calls. It has no events and no virtual memory: the shared traces need
//! neither (one stream, no `record_stream`, the default config).

use c10_cuda::config::AllocatorConfig;
use c10_cuda::device::{DeviceError, DeviceMemory, DevicePtr, EventId, MemInfo, StreamId};
use c10_cuda::{CachingAllocator, DeviceCachingAllocator};
use parking_lot::Mutex;

use crate::timing::Runner;
use crate::trace::{Op, Trace};

/// Device memory of every allocator in the bench: an 80 GiB GPU (torch-oracle's default
/// `FAKECUDA_TOTAL_MEM`; the largest trace reserved about 57 GiB in PyTorch).
pub const DEVICE_MEMORY: usize = 80 << 30;

/// torch-oracle's `va_base`.
const VA_BASE: u64 = 0x2000_0000_0000;

/// torch-oracle's `FAKECUDA_ALIGN` default.
const MALLOC_ALIGN: u64 = 2 << 20;

#[derive(Debug)]
struct State {
    next: u64,
    outstanding: u64,
    /// Live `cudaMalloc`s: `(address, bytes)`.
    segments: Vec<(u64, u64)>,
}

/// The fake CUDA runtime's `cudaMalloc`/`cudaFree`, as a [`DeviceMemory`].
#[derive(Debug)]
pub struct FakeRuntime {
    state: Mutex<State>,
}

impl FakeRuntime {
    pub fn new() -> Self {
        FakeRuntime {
            state: Mutex::new(State {
                next: VA_BASE,
                outstanding: 0,
                segments: Vec::with_capacity(64),
            }),
        }
    }

    /// Starts the address space again from `va_base` (torch-oracle's `fakecuda_reset_va`);
    /// false (nothing changed) while a segment is live.
    pub fn reset_va(&self) -> bool {
        let mut s = self.state.lock();
        if !s.segments.is_empty() {
            return false;
        }
        s.next = VA_BASE;
        true
    }
}

fn unsupported(what: &'static str) -> DeviceError {
    DeviceError::Unsupported { what }
}

impl DeviceMemory for FakeRuntime {
    fn index(&self) -> u8 {
        0
    }

    fn mem_get_info(&self) -> Result<MemInfo, DeviceError> {
        let s = self.state.lock();
        Ok(MemInfo {
            free: DEVICE_MEMORY - s.outstanding as usize,
            total: DEVICE_MEMORY,
        })
    }

    fn malloc(&self, size: usize) -> Result<DevicePtr, DeviceError> {
        let mut s = self.state.lock();
        let size64 = size as u64;
        if size == 0 || s.outstanding + size64 > DEVICE_MEMORY as u64 {
            return Err(DeviceError::OutOfMemory { size });
        }
        let addr = s.next.next_multiple_of(MALLOC_ALIGN);
        s.next = addr + size64;
        s.segments.push((addr, size64));
        s.outstanding += size64;
        Ok(addr)
    }

    fn free(&self, ptr: DevicePtr, _size: usize) -> Result<(), DeviceError> {
        let mut s = self.state.lock();
        let Some(i) = s.segments.iter().rposition(|&(a, _)| a == ptr) else {
            return Err(DeviceError::Invalid {
                what: "segment address",
                value: ptr,
            });
        };
        let (_, size) = s.segments.swap_remove(i);
        s.outstanding -= size;
        Ok(())
    }

    fn create_event(&self) -> Result<EventId, DeviceError> {
        Err(unsupported("events"))
    }

    fn record_event(&self, _event: EventId, _stream: StreamId) -> Result<(), DeviceError> {
        Err(unsupported("events"))
    }

    fn query_event(&self, _event: EventId) -> Result<bool, DeviceError> {
        Err(unsupported("events"))
    }

    fn synchronize_event(&self, _event: EventId) -> Result<(), DeviceError> {
        Err(unsupported("events"))
    }

    fn destroy_event(&self, _event: EventId) {}

    fn supports_virtual_memory(&self) -> bool {
        false
    }

    fn reserve_address_range(&self, _size: usize) -> Result<DevicePtr, DeviceError> {
        Err(unsupported("virtual memory"))
    }

    fn release_address_range(&self, _ptr: DevicePtr, _size: usize) -> Result<(), DeviceError> {
        Err(unsupported("virtual memory"))
    }

    fn map(&self, _ptr: DevicePtr, _size: usize) -> Result<(), DeviceError> {
        Err(unsupported("virtual memory"))
    }

    fn unmap(&self, _ptr: DevicePtr, _size: usize) -> Result<(), DeviceError> {
        Err(unsupported("virtual memory"))
    }
}

/// A new device allocator on a fresh [`FakeRuntime`] with the default config.
pub fn new_allocator() -> DeviceCachingAllocator<FakeRuntime> {
    DeviceCachingAllocator::new(FakeRuntime::new(), AllocatorConfig::default())
        .expect("the fake runtime reports its memory")
}

/// The stream handles of a trace's stream numbers (stream 0 is the default stream).
fn streams(trace: &Trace) -> Vec<StreamId> {
    (0..trace.streams).map(|s| StreamId(u64::from(s))).collect()
}

/// How a replay of ours starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// As torch-oracle's `--bench`: the blocks the last replay left live are freed, the cache
    /// is emptied, the device's addresses start again and the stats are reset.
    Cold,
    /// As `--bench-warm`: the live blocks are freed and the stats reset; segments stay cached.
    Warm,
    /// A new allocator (built untimed) for every replay.
    New,
}

/// Replays of a trace on [`DeviceCachingAllocator`] (its `malloc` and `free`: no lock).
pub struct Ours<'t> {
    trace: &'t Trace,
    start: Start,
    alloc: DeviceCachingAllocator<FakeRuntime>,
    /// The block of each slot; 0 once freed.
    ptrs: Vec<DevicePtr>,
    streams: Vec<StreamId>,
}

impl<'t> Ours<'t> {
    pub fn new(trace: &'t Trace, start: Start) -> Self {
        Ours {
            trace,
            start,
            alloc: new_allocator(),
            ptrs: vec![0; trace.slots],
            streams: streams(trace),
        }
    }

    /// The allocator (after a replay: its stats, its reserved bytes).
    pub fn allocator(&self) -> &DeviceCachingAllocator<FakeRuntime> {
        &self.alloc
    }
}

impl Runner for Ours<'_> {
    #[inline(never)]
    fn replay(&mut self) {
        let (alloc, ptrs) = (&mut self.alloc, &mut self.ptrs);
        for &op in &self.trace.ops {
            match op {
                Op::Alloc { size, slot, stream } => {
                    let a = alloc
                        .malloc(size, self.streams[stream as usize])
                        .unwrap_or_else(|e| panic!("{}: malloc({size}): {e}", self.trace.name));
                    ptrs[slot as usize] = a.ptr;
                }
                Op::Free { slot } => {
                    let ptr = std::mem::take(&mut ptrs[slot as usize]);
                    alloc
                        .free(std::hint::black_box(ptr))
                        .unwrap_or_else(|e| panic!("{}: free: {e}", self.trace.name));
                }
            }
        }
    }

    fn reset(&mut self) {
        if self.start == Start::New {
            // The new one is built before the old one is dropped: dropping first would let the
            // C heap hand pages back and charge their faults to the next replay.
            let fresh = new_allocator();
            drop(std::mem::replace(&mut self.alloc, fresh));
            self.ptrs.fill(0);
            return;
        }
        for ptr in &mut self.ptrs {
            if *ptr != 0 {
                self.alloc
                    .free(std::mem::take(ptr))
                    .expect("freeing a live block");
            }
        }
        if self.start == Start::Cold {
            self.alloc.empty_cache().expect("empty_cache");
            assert!(
                self.alloc.device().reset_va(),
                "{}: a segment outlived empty_cache",
                self.trace.name
            );
        }
        self.alloc.reset_peak_stats();
        self.alloc.reset_accumulated_stats();
    }
}

/// Replays of a trace through the multi-device front [`CachingAllocator`]
/// (`raw_alloc_with_stream` / `raw_delete`: the entry points torch-oracle times, with the
/// device lock and the pointer-to-device map), cold or warm as [`Ours`].
pub struct Front<'t> {
    trace: &'t Trace,
    cold: bool,
    alloc: CachingAllocator<FakeRuntime>,
    ptrs: Vec<DevicePtr>,
    streams: Vec<StreamId>,
}

impl<'t> Front<'t> {
    pub fn new(trace: &'t Trace, cold: bool) -> Self {
        Front {
            trace,
            cold,
            alloc: CachingAllocator::new(vec![FakeRuntime::new()], AllocatorConfig::default())
                .expect("the fake runtime reports its memory"),
            ptrs: vec![0; trace.slots],
            streams: streams(trace),
        }
    }
}

impl Runner for Front<'_> {
    #[inline(never)]
    fn replay(&mut self) {
        let (alloc, ptrs) = (&self.alloc, &mut self.ptrs);
        for &op in &self.trace.ops {
            match op {
                Op::Alloc { size, slot, stream } => {
                    ptrs[slot as usize] = alloc
                        .raw_alloc_with_stream(0, size, self.streams[stream as usize])
                        .unwrap_or_else(|e| panic!("{}: malloc({size}): {e}", self.trace.name));
                }
                Op::Free { slot } => {
                    let ptr = std::mem::take(&mut ptrs[slot as usize]);
                    alloc
                        .raw_delete(std::hint::black_box(ptr))
                        .unwrap_or_else(|e| panic!("{}: free: {e}", self.trace.name));
                }
            }
        }
    }

    fn reset(&mut self) {
        for ptr in &mut self.ptrs {
            // raw_delete ignores the null address: slots freed by the replay hold 0.
            self.alloc
                .raw_delete(std::mem::take(ptr))
                .expect("freeing a live block");
        }
        if self.cold {
            self.alloc.empty_cache().expect("empty_cache");
            let reset = self
                .alloc
                .with_device(0, |a| a.device().reset_va())
                .expect("device 0");
            assert!(reset, "{}: a segment outlived empty_cache", self.trace.name);
        }
        self.alloc.reset_peak_stats(0).expect("device 0");
        self.alloc.reset_accumulated_stats(0).expect("device 0");
    }
}
