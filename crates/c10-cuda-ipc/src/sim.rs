//! The simulated device's IPC backend: handles of host-backed segments (and of the pages of
//! expandable reservations) that live in shareable `memfd_create` regions, and their opening
//! in another process (see the `remote` module for how the region is found and checked).

use c10_cuda::sim::{HostRegion, SharedLookup, SharedRegionInfo};
use c10_cuda::{SimDevice, SimMode};

use crate::{IpcError, IpcMemory, OpenedMemory, SegmentHandle, ShareRange, SimRegion};

impl IpcMemory for SimDevice {
    /// The memfd region behind `range` (the whole segment, or the reservation's pages covering
    /// the block), as process id, descriptor, nonce and range.
    ///
    /// # Errors
    /// [`IpcError::Unsupported`] on an address-only device or for memory allocated while the
    /// device was not [`SimDevice::with_shareable_memory`]; [`IpcError::UnknownPointer`] when the
    /// range is not memory of this device.
    fn export_ipc(&self, range: &ShareRange) -> Result<SegmentHandle, IpcError> {
        if self.mode() != SimMode::HostBacked {
            return Err(IpcError::Unsupported(
                "an address-only simulated device has no bytes to share".into(),
            ));
        }
        let region = |kind: HostRegion, base: u64| -> Result<SharedRegionInfo, IpcError> {
            match self.shared_region(kind, base) {
                SharedLookup::Found(region) => Ok(region),
                SharedLookup::Unknown => Err(IpcError::UnknownPointer { ptr: base }),
                SharedLookup::NotShareable => Err(IpcError::Unsupported(
                    "this memory is not in a shareable region: make the host-backed device \
                     with_shareable_memory(true) before allocating it"
                        .into(),
                )),
            }
        };
        let pid = std::process::id();
        match *range {
            ShareRange::Segment { base, size } => {
                let region = region(HostRegion::Segment, base)?;
                if region.size != size {
                    return Err(IpcError::UnknownPointer { ptr: base });
                }
                Ok(SegmentHandle::Sim {
                    region: SimRegion::Segment,
                    pid,
                    fd: region.fd,
                    nonce: region.nonce,
                    region_size: size as u64,
                    map_offset: 0,
                    map_size: size as u64,
                })
            }
            ShareRange::Expandable {
                reservation,
                reservation_size,
                begin,
                len,
                ..
            } => {
                let region = region(HostRegion::Reservation, reservation)?;
                let end = begin + len as u64;
                if region.size != reservation_size
                    || begin < reservation
                    || end > reservation + reservation_size as u64
                {
                    return Err(IpcError::UnknownPointer { ptr: begin });
                }
                Ok(SegmentHandle::Sim {
                    region: SimRegion::Reservation,
                    pid,
                    fd: region.fd,
                    nonce: region.nonce,
                    region_size: reservation_size as u64,
                    map_offset: begin - reservation,
                    map_size: len as u64,
                })
            }
        }
    }

    /// Maps a simulated region of another process (any simulated device can open one: the bytes
    /// are host memory).
    ///
    /// # Errors
    /// [`IpcError::Stale`] when the region is gone; [`IpcError::Unsupported`] for CUDA handles.
    fn open_ipc(&self, segment: &SegmentHandle) -> Result<OpenedMemory, IpcError> {
        let SegmentHandle::Sim {
            region,
            pid,
            fd,
            nonce,
            region_size,
            map_offset,
            map_size,
        } = *segment
        else {
            return Err(IpcError::Unsupported(
                "a simulated device cannot open CUDA memory".into(),
            ));
        };
        let mapping = crate::remote::open_remote(
            region.kind(),
            pid,
            fd,
            nonce,
            region_size,
            map_offset,
            map_size,
        )
        .map_err(crate::remote_error)?;
        Ok(OpenedMemory {
            base: mapping.addr(),
            len: mapping.len(),
            host: true,
            closer: Box::new(mapping),
        })
    }
}
