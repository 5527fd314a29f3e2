//! `FakeCuda`: the simulated device of the differential tests, a [`DeviceMemory`] that behaves
//! exactly as torch-oracle's fake CUDA runtime (`src/fakecudart.c`) and logs every call as the
//! oracle prints it.
//!
//! What it mirrors: device memory is a counter (`cudaMalloc` and `cuMemCreate` fail when the
//! outstanding bytes would pass `FAKECUDA_TOTAL_MEM`); addresses come from one bump range shared
//! by `cudaMalloc` (aligned to `FAKECUDA_ALIGN`, 2 MiB by default) and address reservations,
//! upward from `0x200000000000` or downward from its top (`FAKECUDA_TOPDOWN=1`), never reused;
//! every `cudaMalloc` and reservation takes the next segment index; streams count their recorded
//! and completed event records, and an event completes when its stream's work up to it is done.
//!
//! Our [`DeviceMemory::map`] maps one page (PyTorch: `cuMemCreate` per page, then `cuMemMap`
//! per page); a map that fails makes the allocator unmap the pages it mapped in that call, which
//! PyTorch never mapped (it releases the created handles). The log shows such a rollback as
//! PyTorch does it: the mapped pages' `cuMemMap` lines go, a `cuMemRelease` per page comes.

use std::collections::BTreeMap;
use std::sync::Arc;

use c10_cuda::device::{DeviceError, DeviceMemory, DevicePtr, EventId, MemInfo, StreamId};
use parking_lot::Mutex;

use crate::trace::{DevCall, Line};

/// The fake's fixed address range: `va_base` and its length (16 TiB).
pub const VA_BASE: u64 = 0x2000_0000_0000;
const VA_LEN: u64 = 16 << 40;

/// The fake's knobs (`FAKECUDA_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FakeConfig {
    /// Device bytes (`FAKECUDA_TOTAL_MEM`, default 80 GiB).
    pub total_mem: u64,
    /// `cudaMalloc` alignment (`FAKECUDA_ALIGN`, default 2 MiB).
    pub align: u64,
    /// Addresses downward from the top (`FAKECUDA_TOPDOWN=1`).
    pub topdown: bool,
}

impl Default for FakeConfig {
    fn default() -> Self {
        FakeConfig {
            total_mem: 80 << 30,
            align: 2 << 20,
            topdown: false,
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Range {
    size: u64,
    seg: i64,
}

#[derive(Debug, Default)]
struct StreamState {
    recorded: u64,
    done: u64,
}

#[derive(Debug)]
struct State {
    cfg: FakeConfig,
    va_next: u64,
    seg_counter: i64,
    mallocs: BTreeMap<u64, Range>,
    reservations: BTreeMap<u64, Range>,
    outstanding: u64,
    peak: u64,
    streams: BTreeMap<i64, StreamState>,
    /// Event id -> (stream, sequence number), once recorded.
    events: BTreeMap<u64, (i64, u64)>,
    next_event: u64,
    counters: BTreeMap<&'static str, i64>,
    log: Vec<Line>,
    /// The run of pages mapped one after the other (contiguous addresses, no other call in
    /// between): `(address, index of their cuMemMap line)`; `rolling_back` once the page right
    /// after the run failed to map (our `ExpandableSegment::map` then unmaps the run, last page
    /// first, before any other call).
    recent_maps: Vec<(u64, usize)>,
    rolling_back: bool,
}

/// The fake CUDA device (cheap to clone: clones share the device).
#[derive(Clone, Debug)]
pub struct FakeCuda {
    state: Arc<Mutex<State>>,
}

const COUNTERS: [&str; 16] = [
    "cudaMalloc",
    "cudaMalloc_failed",
    "cudaFree",
    "cuMemCreate",
    "cuMemCreate_failed",
    "cuMemRelease",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cudaEventRecord",
    "cudaEventSynchronize",
    "cudaEventSynchronize_waited",
    "device_bytes",
    "device_bytes_peak",
    "pending_event_records",
];

impl FakeCuda {
    /// A fresh device.
    pub fn new(cfg: FakeConfig) -> FakeCuda {
        FakeCuda {
            state: Arc::new(Mutex::new(State {
                cfg,
                va_next: if cfg.topdown {
                    VA_BASE + VA_LEN
                } else {
                    VA_BASE
                },
                seg_counter: 0,
                mallocs: BTreeMap::new(),
                reservations: BTreeMap::new(),
                outstanding: 0,
                peak: 0,
                streams: BTreeMap::new(),
                events: BTreeMap::new(),
                next_event: 0,
                counters: COUNTERS.iter().map(|&k| (k, 0)).collect(),
                log: Vec::new(),
                recent_maps: Vec::new(),
                rolling_back: false,
            })),
        }
    }

    /// Appends an op line to the log (the driver's lines interleave with the device's).
    pub fn push(&self, line: Line) {
        let mut s = self.state.lock();
        s.end_map_run();
        s.log.push(line);
    }

    /// Takes the log.
    pub fn take_log(&self) -> Vec<Line> {
        std::mem::take(&mut self.state.lock().log)
    }

    /// The segment (cudaMalloc allocation or reservation) holding `addr`: its index and base.
    pub fn segment_of(&self, addr: u64) -> Option<(i64, u64)> {
        let s = self.state.lock();
        for map in [&s.mallocs, &s.reservations] {
            if let Some((&base, r)) = map.range(..=addr).next_back() {
                if addr - base < r.size {
                    return Some((r.seg, base));
                }
            }
        }
        None
    }

    /// Completes every event record of `stream` (every stream's for `None`): the script's
    /// `sync`. Returns the records completed.
    pub fn complete_stream(&self, stream: Option<i64>) -> u64 {
        let mut s = self.state.lock();
        s.end_map_run();
        let mut n = 0;
        for (id, st) in s.streams.iter_mut() {
            if stream.is_none_or(|x| x == *id) {
                n += st.recorded - st.done;
                st.done = st.recorded;
            }
        }
        n
    }

    /// The fake's counters as the oracle's `fake` object has them (the subset compared).
    pub fn counters(&self) -> BTreeMap<String, i64> {
        let s = self.state.lock();
        let mut out: BTreeMap<String, i64> = s
            .counters
            .iter()
            .map(|(k, v)| ((*k).to_owned(), *v))
            .collect();
        out.insert("device_bytes".into(), s.outstanding as i64);
        out.insert("device_bytes_peak".into(), s.peak as i64);
        let pending: u64 = s.streams.values().map(|st| st.recorded - st.done).sum();
        out.insert("pending_event_records".into(), pending as i64);
        out
    }

    /// The names of the counters [`FakeCuda::counters`] reports.
    pub fn counter_names() -> &'static [&'static str] {
        &COUNTERS
    }
}

impl State {
    fn bump(&mut self, k: &'static str) {
        *self.counters.entry(k).or_insert(0) += 1;
    }

    fn end_map_run(&mut self) {
        self.recent_maps.clear();
        self.rolling_back = false;
    }

    fn va_take(&mut self, size: u64, align: u64) -> Option<u64> {
        if self.cfg.topdown {
            if self.va_next - VA_BASE < size {
                return None;
            }
            let t = (self.va_next - size) & !(align - 1);
            if t < VA_BASE {
                return None;
            }
            self.va_next = t;
            Some(t)
        } else {
            let a = self.va_next.checked_add(align - 1)? & !(align - 1);
            if a.checked_add(size)? > VA_BASE + VA_LEN {
                return None;
            }
            self.va_next = a + size;
            Some(a)
        }
    }

    fn take_physical(&mut self, size: u64) -> bool {
        if self.outstanding + size > self.cfg.total_mem {
            return false;
        }
        self.outstanding += size;
        self.peak = self.peak.max(self.outstanding);
        true
    }

    fn reservation_of(&self, addr: u64) -> (i64, u64) {
        match self.reservations.range(..=addr).next_back() {
            Some((&base, r)) if addr - base < r.size => (r.seg, addr - base),
            _ => (-1, 0),
        }
    }

    fn stream_id(stream: StreamId) -> i64 {
        stream.0 as i64
    }
}

fn oom(size: usize) -> DeviceError {
    DeviceError::OutOfMemory { size }
}

impl DeviceMemory for FakeCuda {
    fn index(&self) -> u8 {
        0
    }

    fn mem_get_info(&self) -> Result<MemInfo, DeviceError> {
        let s = self.state.lock();
        Ok(MemInfo {
            free: (s.cfg.total_mem - s.outstanding) as usize,
            total: s.cfg.total_mem as usize,
        })
    }

    fn malloc(&self, size: usize) -> Result<DevicePtr, DeviceError> {
        let mut s = self.state.lock();
        s.end_map_run();
        let size64 = size as u64;
        let addr = if s.outstanding + size64 <= s.cfg.total_mem {
            let align = s.cfg.align;
            s.va_take(size64, align)
        } else {
            None
        };
        let Some(addr) = addr else {
            s.bump("cudaMalloc_failed");
            s.log.push(Line::Ev(DevCall::Malloc {
                size: size64,
                seg: None,
            }));
            return Err(oom(size));
        };
        let seg = s.seg_counter;
        s.seg_counter += 1;
        s.mallocs.insert(addr, Range { size: size64, seg });
        s.take_physical(size64);
        s.bump("cudaMalloc");
        s.log.push(Line::Ev(DevCall::Malloc {
            size: size64,
            seg: Some(seg),
        }));
        Ok(addr)
    }

    fn free(&self, ptr: DevicePtr, size: usize) -> Result<(), DeviceError> {
        let mut s = self.state.lock();
        s.end_map_run();
        let Some(r) = s.mallocs.remove(&ptr) else {
            return Err(DeviceError::Invalid {
                what: "segment address",
                value: ptr,
            });
        };
        debug_assert_eq!(r.size, size as u64);
        s.outstanding -= r.size;
        s.bump("cudaFree");
        s.log.push(Line::Ev(DevCall::Free {
            size: r.size,
            seg: r.seg,
        }));
        Ok(())
    }

    fn create_event(&self) -> Result<EventId, DeviceError> {
        let mut s = self.state.lock();
        let id = s.next_event;
        s.next_event += 1;
        Ok(EventId(id))
    }

    fn record_event(&self, event: EventId, stream: StreamId) -> Result<(), DeviceError> {
        let mut s = self.state.lock();
        s.end_map_run();
        let sid = State::stream_id(stream);
        let st = s.streams.entry(sid).or_default();
        st.recorded += 1;
        let seq = st.recorded;
        s.events.insert(event.0, (sid, seq));
        s.bump("cudaEventRecord");
        s.log.push(Line::Ev(DevCall::EventRecord { stream: sid }));
        Ok(())
    }

    fn query_event(&self, event: EventId) -> Result<bool, DeviceError> {
        let s = self.state.lock();
        Ok(match s.events.get(&event.0) {
            Some(&(sid, seq)) => s.streams.get(&sid).is_none_or(|st| seq <= st.done),
            None => true,
        })
    }

    fn synchronize_event(&self, event: EventId) -> Result<(), DeviceError> {
        let mut s = self.state.lock();
        s.end_map_run();
        s.bump("cudaEventSynchronize");
        let (sid, n) = match s.events.get(&event.0).copied() {
            Some((sid, seq)) => {
                let st = s.streams.entry(sid).or_default();
                let n = seq.saturating_sub(st.done);
                st.done = st.done.max(seq);
                (sid, n)
            }
            None => (-1, 0),
        };
        if n > 0 {
            s.bump("cudaEventSynchronize_waited");
        }
        s.log.push(Line::Ev(DevCall::EventSync {
            stream: sid,
            completed: n,
        }));
        Ok(())
    }

    fn destroy_event(&self, event: EventId) {
        self.state.lock().events.remove(&event.0);
    }

    fn supports_virtual_memory(&self) -> bool {
        true
    }

    fn reserve_address_range(&self, size: usize) -> Result<DevicePtr, DeviceError> {
        let mut s = self.state.lock();
        s.end_map_run();
        let size64 = size as u64;
        let Some(addr) = s.va_take(size64, 2 << 20) else {
            s.log.push(Line::Ev(DevCall::Reserve {
                size: size64,
                seg: None,
            }));
            return Err(DeviceError::Driver {
                call: "cuMemAddressReserve",
                message: "CUDA_ERROR_OUT_OF_MEMORY".into(),
            });
        };
        let seg = s.seg_counter;
        s.seg_counter += 1;
        s.reservations.insert(addr, Range { size: size64, seg });
        s.bump("cuMemAddressReserve");
        s.log.push(Line::Ev(DevCall::Reserve {
            size: size64,
            seg: Some(seg),
        }));
        Ok(addr)
    }

    fn release_address_range(&self, ptr: DevicePtr, size: usize) -> Result<(), DeviceError> {
        let mut s = self.state.lock();
        s.end_map_run();
        let seg = s.reservations.remove(&ptr).map_or(-1, |r| r.seg);
        s.bump("cuMemAddressFree");
        s.log.push(Line::Ev(DevCall::AddressFree {
            size: size as u64,
            seg,
        }));
        Ok(())
    }

    fn map(&self, ptr: DevicePtr, size: usize) -> Result<(), DeviceError> {
        let mut s = self.state.lock();
        let size64 = size as u64;
        let follows_run = s
            .recent_maps
            .last()
            .is_some_and(|&(p, _)| p + size64 == ptr);
        if !follows_run || s.rolling_back {
            s.end_map_run();
        }
        if !s.take_physical(size64) {
            s.bump("cuMemCreate_failed");
            s.log.push(Line::Ev(DevCall::Create {
                size: size64,
                ok: false,
            }));
            s.rolling_back = true;
            return Err(oom(size));
        }
        s.bump("cuMemCreate");
        s.bump("cuMemMap");
        let (seg, offset) = s.reservation_of(ptr);
        s.log.push(Line::Ev(DevCall::Create {
            size: size64,
            ok: true,
        }));
        let at = s.log.len();
        s.log.push(Line::Ev(DevCall::Map {
            size: size64,
            seg,
            offset,
        }));
        s.recent_maps.push((ptr, at));
        Ok(())
    }

    /// As the oracle's fake `cudaStreamSynchronize`: every event recorded on the stream so far
    /// completes (not logged: the comparison leaves these calls out).
    fn synchronize_stream(&self, stream: StreamId) -> Result<(), DeviceError> {
        let mut s = self.state.lock();
        let st = s.streams.entry(State::stream_id(stream)).or_default();
        st.done = st.recorded;
        Ok(())
    }

    fn unmap(&self, ptr: DevicePtr, size: usize) -> Result<(), DeviceError> {
        let mut s = self.state.lock();
        let size64 = size as u64;
        s.outstanding -= size64;
        let rolled_back = s.rolling_back && s.recent_maps.last().is_some_and(|&(p, _)| p == ptr);
        if rolled_back {
            // PyTorch never mapped this page: it created the handle and releases it.
            let (_, at) = s.recent_maps.pop().expect("checked above");
            s.log.remove(at);
            *s.counters.entry("cuMemMap").or_insert(0) -= 1;
            s.bump("cuMemRelease");
            s.log.push(Line::Ev(DevCall::Release { size: size64 }));
            return Ok(());
        }
        s.end_map_run();
        let (seg, offset) = s.reservation_of(ptr);
        s.bump("cuMemUnmap");
        s.bump("cuMemRelease");
        s.log.push(Line::Ev(DevCall::Unmap {
            size: size64,
            seg,
            offset,
        }));
        s.log.push(Line::Ev(DevCall::Release { size: size64 }));
        Ok(())
    }
}
