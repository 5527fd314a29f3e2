//! Snapshot of every error message, so wording changes are reviewed.

use c10_core::{Device, DeviceType, Error, ScalarType};

#[test]
fn error_messages() {
    let errors = [
        "cuda:".parse::<Device>().unwrap_err(),
        "gpu".parse::<Device>().unwrap_err(),
        "cpu:256".parse::<Device>().unwrap_err(),
        Error::OutOfMemory {
            requested: 1 << 62,
            device: Device::cpu(),
        },
        Error::OutOfMemory {
            requested: 4096,
            device: Device::cuda(1),
        },
        Error::SizeOverflow { nbytes: usize::MAX },
        Error::NotResizable {
            nbytes: 16,
            requested: 32,
        },
        Error::ExceedsCapacity {
            requested: 3,
            capacity: 2,
        },
        Error::MissingAllocator,
        Error::NoAllocator {
            device_type: DeviceType::Meta,
        },
        Error::DeviceMismatch {
            expected: DeviceType::Cpu,
            actual: DeviceType::Sim,
        },
        Error::RawAllocationUnsupported {
            device_type: DeviceType::Cuda,
            reason: "the allocator has no raw deleter",
        },
        "float128".parse::<ScalarType>().unwrap_err(),
    ];
    let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
    insta::assert_snapshot!(text.join("\n"));
}
