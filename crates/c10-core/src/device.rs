//! Where memory lives: [`DeviceType`] and [`Device`], parsed and printed as PyTorch spells them.
//!
//! `"cpu"`, `"cuda"`, `"cuda:0"`, `"sim:1"` round-trip through `Display` and `FromStr`. The
//! grammar is c10's (`c10/core/Device.cpp`): `name(:index)?` where `name` is a known device type
//! and `index` is a decimal number without sign or leading zeros.
//!
//! One deliberate difference from c10: c10's `DeviceIndex` is an `int8_t` where `-1` means "no
//! index, the current device". Here the index is an `Option<DeviceIndex>` with `DeviceIndex = u8`,
//! so "no index" is `None` and negative indices cannot be represented at all.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// Error reason for a name that is not a device type.
const UNKNOWN_TYPE: &str = "unknown device type (expected cpu, cuda, meta or sim)";

/// A device ordinal, as c10's `DeviceIndex` (which is `int8_t`; see the module docs for why this
/// one is unsigned).
pub type DeviceIndex = u8;

/// The kind of device a piece of memory lives on, as c10's `DeviceType`.
///
/// `Display` and `FromStr` use the lowercase names PyTorch prints (`cpu`, `cuda`, `meta`), plus
/// `sim` for this project's simulated device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum DeviceType {
    /// Host memory, as c10's `DeviceType::CPU` (`"cpu"`).
    Cpu = 0,
    /// An NVIDIA GPU, as c10's `DeviceType::CUDA` (`"cuda"`).
    Cuda = 1,
    /// A device with no storage at all (shapes only), as c10's `DeviceType::Meta` (`"meta"`).
    Meta = 2,
    /// This project's simulated device, used to test allocators without a GPU (`"sim"`).
    Sim = 3,
}

impl DeviceType {
    /// Number of device types; valid values of [`DeviceType::index`] are `0..COUNT`.
    pub const COUNT: usize = 4;

    /// Every device type, in declaration order.
    pub const ALL: [DeviceType; Self::COUNT] = [
        DeviceType::Cpu,
        DeviceType::Cuda,
        DeviceType::Meta,
        DeviceType::Sim,
    ];

    /// The lowercase name PyTorch prints (`"cpu"`, `"cuda"`, `"meta"`, `"sim"`), as c10's
    /// `DeviceTypeName(type, /*lower_case=*/true)`.
    pub const fn name(self) -> &'static str {
        match self {
            DeviceType::Cpu => "cpu",
            DeviceType::Cuda => "cuda",
            DeviceType::Meta => "meta",
            DeviceType::Sim => "sim",
        }
    }

    /// A dense index in `0..DeviceType::COUNT`, for per-device-type tables such as the allocator
    /// registry.
    pub const fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for DeviceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DeviceType {
    type Err = Error;

    /// Parses a lowercase device type name (`"cuda"`), as c10's `parse_type`.
    ///
    /// # Errors
    /// [`Error::InvalidDevice`] when the name is not one of `cpu`, `cuda`, `meta`, `sim`.
    fn from_str(s: &str) -> Result<Self> {
        DeviceType::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| Error::InvalidDevice {
                input: s.to_owned(),
                reason: UNKNOWN_TYPE,
            })
    }
}

/// A device type plus an optional index, as c10's `Device` (`cuda:0`).
///
/// `index == None` means "the current device of that type", as c10's index `-1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Device {
    device_type: DeviceType,
    index: Option<DeviceIndex>,
}

impl Device {
    /// A device of `device_type` with an optional `index`, as c10's `Device(type, index)`.
    pub const fn new(device_type: DeviceType, index: Option<DeviceIndex>) -> Self {
        Device { device_type, index }
    }

    /// The CPU device with no index (`"cpu"`), as c10's `Device(kCPU)`.
    pub const fn cpu() -> Self {
        Device::new(DeviceType::Cpu, None)
    }

    /// CUDA device number `index` (`"cuda:{index}"`), as c10's `Device(kCUDA, index)`.
    pub const fn cuda(index: DeviceIndex) -> Self {
        Device::new(DeviceType::Cuda, Some(index))
    }

    /// Simulated device number `index` (`"sim:{index}"`).
    pub const fn sim(index: DeviceIndex) -> Self {
        Device::new(DeviceType::Sim, Some(index))
    }

    /// The meta device (`"meta"`), as c10's `Device(kMeta)`.
    pub const fn meta() -> Self {
        Device::new(DeviceType::Meta, None)
    }

    /// The device type, as c10's `Device::type()`.
    pub const fn device_type(self) -> DeviceType {
        self.device_type
    }

    /// The device index, `None` for "current device", as c10's `Device::index()` (which returns
    /// `-1` for none).
    pub const fn index(self) -> Option<DeviceIndex> {
        self.index
    }

    /// Whether an index is set, as c10's `Device::has_index()`.
    pub const fn has_index(self) -> bool {
        self.index.is_some()
    }

    /// Whether this is a CPU device, as c10's `Device::is_cpu()`.
    pub const fn is_cpu(self) -> bool {
        matches!(self.device_type, DeviceType::Cpu)
    }

    /// Whether this is a CUDA device, as c10's `Device::is_cuda()`.
    pub const fn is_cuda(self) -> bool {
        matches!(self.device_type, DeviceType::Cuda)
    }
}

impl From<DeviceType> for Device {
    /// The device of that type with no index.
    fn from(device_type: DeviceType) -> Self {
        Device::new(device_type, None)
    }
}

impl fmt::Display for Device {
    /// `type` or `type:index`, as c10's `operator<<(std::ostream&, const Device&)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.index {
            Some(index) => write!(f, "{}:{}", self.device_type, index),
            None => write!(f, "{}", self.device_type),
        }
    }
}

impl FromStr for Device {
    type Err = Error;

    /// Parses `"cpu"`, `"cuda:0"`, `"sim:1"`, as c10's `Device(const std::string&)`.
    ///
    /// # Errors
    /// [`Error::InvalidDevice`], naming the string and what was expected, when the string is
    /// empty, the type is unknown (`"gpu"`), the index is missing (`"cuda:"`), not a plain
    /// decimal number (`"cuda:x"`, `"cuda:-1"`, `"cuda:01"`), followed by more text
    /// (`"cuda:0:1"`), or larger than [`DeviceIndex::MAX`] (`"cpu:256"`).
    fn from_str(s: &str) -> Result<Self> {
        let invalid = |reason| Error::InvalidDevice {
            input: s.to_owned(),
            reason,
        };
        if s.is_empty() {
            return Err(invalid("device string must not be empty"));
        }
        let (name, index) = match s.split_once(':') {
            None => (s, None),
            Some((name, index)) => (name, Some(index)),
        };
        let device_type: DeviceType = name.parse().map_err(|_| invalid(UNKNOWN_TYPE))?;
        let Some(index) = index else {
            return Ok(Device::new(device_type, None));
        };
        if index.is_empty() {
            return Err(invalid("expected a device index after ':'"));
        }
        if index.contains(':') {
            return Err(invalid("expected at most one ':' (type:index)"));
        }
        if !index.bytes().all(|b| b.is_ascii_digit()) {
            return Err(invalid(
                "device index must be a non-negative decimal integer",
            ));
        }
        if index.len() > 1 && index.starts_with('0') {
            return Err(invalid("device index must not have leading zeros"));
        }
        let index: DeviceIndex = index
            .parse()
            .map_err(|_| invalid("device index out of range (expected 0..=255)"))?;
        Ok(Device::new(device_type, Some(index)))
    }
}
