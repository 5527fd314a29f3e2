//! The CUDA probe and `CudaDevice::new` on any machine: with no driver, no device or a GPU they
//! must answer without panicking, and consistently with each other.

use c10_cuda::device::{DeviceError, DeviceMemory};
use c10_cuda_driver::{CudaDevice, Probe, cuda_available, probe};

#[test]
fn probe_never_panics_and_agrees_with_cuda_available() {
    let first = probe();
    println!("{first}");
    assert_eq!(first.is_available(), cuda_available());
    assert_eq!(
        probe(),
        first,
        "the probe is deterministic on an unchanged machine"
    );
    match &first {
        Probe::NoDriver { searched } => {
            assert!(
                searched.iter().any(|name| name.contains("cuda")),
                "the searched names include the driver library: {searched:?}"
            );
            assert_eq!(first.devices(), 0);
        }
        Probe::NoDevice | Probe::DriverError(_) => assert_eq!(first.devices(), 0),
        Probe::Available { devices, .. } => assert!(*devices > 0),
    }
}

#[test]
fn device_new_errors_instead_of_panicking_without_a_gpu() {
    match probe() {
        Probe::NoDriver { .. } | Probe::NoDevice => {
            let err = CudaDevice::new(0).expect_err("no driver or device, yet a CudaDevice");
            assert!(matches!(err, DeviceError::Unsupported { .. }), "{err:?}");
            assert!(err.to_string().contains("CUDA"), "{err}");
        }
        Probe::DriverError(_) => {
            let err = CudaDevice::new(0).expect_err("a failing driver, yet a CudaDevice");
            assert!(matches!(err, DeviceError::Driver { .. }), "{err:?}");
        }
        Probe::Available { devices, .. } => {
            let device = CudaDevice::new(0).expect("the probe found a device");
            assert_eq!(device.index(), 0);
            if devices < 256 {
                let err = CudaDevice::new(u8::MAX).expect_err("ordinal beyond the device count");
                assert!(matches!(err, DeviceError::Invalid { .. }), "{err:?}");
            }
        }
    }
}

#[test]
fn probe_lines() {
    let no_driver = Probe::NoDriver {
        searched: vec!["libcuda.so".into()],
    };
    let library = format!(
        "{}cuda{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    assert_eq!(
        no_driver.to_string(),
        format!("no CUDA driver: {library} could not be loaded (searched the dynamic loader path)")
    );
    assert_eq!(
        Probe::NoDevice.to_string(),
        "CUDA driver loaded, but it reports 0 devices"
    );
    assert_eq!(
        Probe::DriverError("cuInit failed: CUDA_ERROR_UNKNOWN (unknown error)".into()).to_string(),
        "CUDA driver loaded, but initializing it failed: cuInit failed: CUDA_ERROR_UNKNOWN (unknown error)"
    );
    let one = Probe::Available {
        devices: 1,
        driver_version: 12080,
    };
    assert_eq!(one.to_string(), "CUDA driver 12.8 loaded: 1 device");
    let eight = Probe::Available {
        devices: 8,
        driver_version: 13000,
    };
    assert_eq!(eight.to_string(), "CUDA driver 13.0 loaded: 8 devices");
    assert!(one.is_available() && !Probe::NoDevice.is_available() && !no_driver.is_available());
    assert_eq!(eight.devices(), 8);
}

#[test]
fn cuda_device_is_a_shareable_device_memory() {
    fn assert_send_sync<T: Send + Sync + 'static>() {}
    assert_send_sync::<CudaDevice>();
    let _object: Option<Box<dyn DeviceMemory>> =
        None::<Box<CudaDevice>>.map(|d| d as Box<dyn DeviceMemory>);
}
