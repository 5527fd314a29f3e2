//! `CappedDevice`: any device with a capacity limit, so that the caching allocator can never
//! reserve more than a budget (a device-memory budget enforced by the device, as a smaller GPU
//! would).
//!
//! It wraps a [`DeviceMemory`] (a `c10_cuda_driver::CudaDevice` on a real GPU, or a
//! [`crate::SimDevice`]) and refuses `malloc` and `map` with [`DeviceError::OutOfMemory`] once
//! the bytes it holds would pass the limit; `mem_get_info` reports the limit as the total. The
//! allocator then takes its usual out-of-memory path (release the cache, retry, or report a
//! miss through [`crate::DeviceCachingAllocator::try_malloc`]). Unlike PyTorch's per-process
//! memory fraction (`set_per_process_memory_fraction`, [`crate::DeviceCachingAllocator::set_memory_fraction`]),
//! the limit is in bytes and holds for every allocator over the device.

use std::collections::BTreeMap;

use parking_lot::Mutex;

use crate::device::{DeviceError, DeviceMemory, DevicePtr, EventId, MemInfo, StreamId};

/// A device whose usable memory is at most `limit` bytes.
#[derive(Debug)]
pub struct CappedDevice<D: DeviceMemory> {
    inner: D,
    limit: usize,
    state: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    /// Bytes of live segments and mapped pages.
    used: usize,
    /// Live segments and mapped ranges: address -> bytes.
    ranges: BTreeMap<DevicePtr, usize>,
}

impl<D: DeviceMemory> CappedDevice<D> {
    /// `inner` limited to `limit` bytes.
    pub fn new(inner: D, limit: usize) -> Self {
        CappedDevice {
            inner,
            limit,
            state: Mutex::new(Held::default()),
        }
    }

    /// The limit, bytes.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes held now (segments and mapped pages through this wrapper).
    pub fn used(&self) -> usize {
        self.state.lock().used
    }

    /// The wrapped device (for copies, streams and anything else the trait does not cover).
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// Runs `get` (which takes `size` bytes from the inner device at the address it returns)
    /// if the limit allows, under the lock so that two threads cannot both pass the check.
    fn take(
        &self,
        size: usize,
        get: impl FnOnce() -> Result<DevicePtr, DeviceError>,
    ) -> Result<DevicePtr, DeviceError> {
        let mut s = self.state.lock();
        if s.used.saturating_add(size) > self.limit {
            return Err(DeviceError::OutOfMemory { size });
        }
        let ptr = get()?;
        s.used += size;
        s.ranges.insert(ptr, size);
        Ok(ptr)
    }

    fn forget(&self, ptr: DevicePtr) {
        let mut s = self.state.lock();
        if let Some(size) = s.ranges.remove(&ptr) {
            s.used -= size;
        }
    }
}

impl<D: DeviceMemory> DeviceMemory for CappedDevice<D> {
    fn index(&self) -> u8 {
        self.inner.index()
    }

    fn device_type(&self) -> c10_core::DeviceType {
        self.inner.device_type()
    }

    /// The inner device's figures with the limit as total and free at most what the limit
    /// leaves.
    fn mem_get_info(&self) -> Result<MemInfo, DeviceError> {
        let info = self.inner.mem_get_info()?;
        let used = self.state.lock().used;
        Ok(MemInfo {
            free: info.free.min(self.limit.saturating_sub(used)),
            total: info.total.min(self.limit),
        })
    }

    fn malloc(&self, size: usize) -> Result<DevicePtr, DeviceError> {
        self.take(size, || self.inner.malloc(size))
    }

    fn free(&self, ptr: DevicePtr, size: usize) -> Result<(), DeviceError> {
        self.inner.free(ptr, size)?;
        self.forget(ptr);
        Ok(())
    }

    fn create_event(&self) -> Result<EventId, DeviceError> {
        self.inner.create_event()
    }

    fn record_event(&self, event: EventId, stream: StreamId) -> Result<(), DeviceError> {
        self.inner.record_event(event, stream)
    }

    fn query_event(&self, event: EventId) -> Result<bool, DeviceError> {
        self.inner.query_event(event)
    }

    fn synchronize_event(&self, event: EventId) -> Result<(), DeviceError> {
        self.inner.synchronize_event(event)
    }

    fn destroy_event(&self, event: EventId) {
        self.inner.destroy_event(event);
    }

    fn supports_virtual_memory(&self) -> bool {
        self.inner.supports_virtual_memory()
    }

    fn reserve_address_range(&self, size: usize) -> Result<DevicePtr, DeviceError> {
        self.inner.reserve_address_range(size)
    }

    fn release_address_range(&self, ptr: DevicePtr, size: usize) -> Result<(), DeviceError> {
        self.inner.release_address_range(ptr, size)
    }

    fn map(&self, ptr: DevicePtr, size: usize) -> Result<(), DeviceError> {
        self.take(size, || self.inner.map(ptr, size).map(|()| ptr))
            .map(drop)
    }

    fn unmap(&self, ptr: DevicePtr, size: usize) -> Result<(), DeviceError> {
        self.inner.unmap(ptr, size)?;
        self.forget(ptr);
        Ok(())
    }

    fn synchronize_stream(&self, stream: StreamId) -> Result<(), DeviceError> {
        self.inner.synchronize_stream(stream)
    }
}
