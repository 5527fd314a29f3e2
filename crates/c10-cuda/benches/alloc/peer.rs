//! The peer: cubecl-runtime 0.10's `MemoryManagement` over a byte-counting storage (feature
//! `bench-peer-cubecl`), configured as cubecl-cuda configures it (default
//! `MemoryConfiguration::SubSlices`, largest page = device memory / 4, alignment 512). A free is
//! dropping the handle, as in cubecl. Streams play no part (cubecl has one per server).

use std::collections::HashMap;
use std::sync::Arc;

use cubecl_ir::MemoryDeviceProperties;
use cubecl_runtime::logging::ServerLogger;
use cubecl_runtime::memory_management::{
    ManagedMemoryHandle, MemoryConfiguration, MemoryManagement, MemoryManagementOptions,
};
use cubecl_runtime::server::IoError;
use cubecl_runtime::storage::{ComputeStorage, StorageHandle, StorageId, StorageUtilization};

use crate::ours::DEVICE_MEMORY;
use crate::timing::Runner;
use crate::trace::{Op, Trace};

/// cubecl-cuda's allocation unit.
const ALIGN: u64 = 512;

/// A storage that hands out ids and counts bytes; no memory behind it.
#[derive(Default)]
pub struct CountingStorage {
    sizes: HashMap<StorageId, u64>,
    current: u64,
    /// The most bytes held at once.
    pub peak: u64,
}

impl ComputeStorage for CountingStorage {
    type Resource = ();

    fn alignment(&self) -> usize {
        ALIGN as usize
    }

    fn get(&mut self, _handle: &StorageHandle) {}

    fn alloc(&mut self, size: u64) -> Result<StorageHandle, IoError> {
        let id = StorageId::new();
        self.sizes.insert(id, size);
        self.current += size;
        self.peak = self.peak.max(self.current);
        Ok(StorageHandle::new(
            id,
            StorageUtilization { offset: 0, size },
        ))
    }

    fn dealloc(&mut self, id: StorageId) {
        if let Some(size) = self.sizes.remove(&id) {
            self.current -= size;
        }
    }

    fn flush(&mut self) {}
}

pub type Peer = MemoryManagement<CountingStorage>;

/// cubecl-cuda's main GPU memory management.
pub fn new_peer() -> Peer {
    let properties = MemoryDeviceProperties {
        max_page_size: DEVICE_MEMORY as u64 / 4,
        alignment: ALIGN,
    };
    MemoryManagement::from_configuration(
        CountingStorage::default(),
        &properties,
        MemoryConfiguration::SubSlices,
        Arc::new(ServerLogger::default()),
        MemoryManagementOptions::new("Main GPU Memory"),
    )
}

/// Replays of a trace on the peer: `cold` builds a new memory management (untimed) for every
/// replay (cubecl has no `emptyCache` that returns every page); warm keeps its pages.
pub struct Cubecl<'t> {
    trace: &'t Trace,
    cold: bool,
    mm: Peer,
    handles: Vec<Option<ManagedMemoryHandle>>,
}

impl<'t> Cubecl<'t> {
    pub fn new(trace: &'t Trace, cold: bool) -> Self {
        Cubecl {
            trace,
            cold,
            mm: new_peer(),
            handles: vec![None; trace.slots],
        }
    }

    /// Peak reserved bytes of one replay from empty, as `memory_usage().bytes_reserved`
    /// reports it (checked against the storage's own count).
    pub fn peak_reserved(trace: &Trace) -> u64 {
        let mut peer = Cubecl::new(trace, true);
        peer.replay();
        // Without an explicit cleanup pages are never returned: the final figure is the peak.
        let reported = peer.mm.memory_usage().bytes_reserved;
        let counted = peer.mm.storage().peak;
        assert_eq!(
            reported, counted,
            "{}: memory_usage vs storage count",
            trace.name
        );
        reported
    }
}

impl Runner for Cubecl<'_> {
    #[inline(never)]
    fn replay(&mut self) {
        let (mm, handles) = (&mut self.mm, &mut self.handles);
        for &op in &self.trace.ops {
            match op {
                Op::Alloc { size, slot, .. } => {
                    let h = mm
                        .reserve(size as u64)
                        .unwrap_or_else(|e| panic!("{}: reserve({size}): {e}", self.trace.name));
                    handles[slot as usize] = Some(h);
                }
                Op::Free { slot } => drop(handles[slot as usize].take()),
            }
        }
    }

    fn reset(&mut self) {
        self.handles.iter_mut().for_each(|h| drop(h.take()));
        if self.cold {
            // Built before the old one is dropped, as for ours.
            let fresh = new_peer();
            drop(std::mem::replace(&mut self.mm, fresh));
        }
    }
}
