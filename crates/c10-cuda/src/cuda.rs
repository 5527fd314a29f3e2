//! The CUDA backend of [`crate::device::DeviceMemory`] on cudarc, and the runtime GPU probe.
