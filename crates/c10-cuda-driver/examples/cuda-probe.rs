//! Probes for a CUDA driver and devices and prints what it finds.
//!
//! `cargo run -p c10-cuda-driver --example cuda-probe`. Exits with status 1 when there is no usable
//! driver or no device (so `cargo xtask gpu-test` fails loudly instead of skipping every test),
//! 0 when at least one device answers.

use std::process::ExitCode;

use c10_cuda::device::DeviceMemory;
use c10_cuda_driver::{CudaDevice, Probe, probe};

const GIB: f64 = (1u64 << 30) as f64;

fn main() -> ExitCode {
    let found = probe();
    println!("{found}");
    let devices = match &found {
        Probe::Available { devices, .. } => *devices,
        Probe::NoDriver { searched } => {
            eprintln!("searched for: {}", searched.join(", "));
            return ExitCode::FAILURE;
        }
        Probe::NoDevice | Probe::DriverError(_) => return ExitCode::FAILURE,
    };
    let mut ok = true;
    for ordinal in 0..devices {
        match describe(ordinal) {
            Ok(line) => println!("{line}"),
            Err(e) => {
                println!("cuda:{ordinal}: {e}");
                ok = false;
            }
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// One line for device `ordinal`: name, total memory and virtual memory support.
fn describe(ordinal: usize) -> Result<String, Box<dyn std::error::Error>> {
    let index = u8::try_from(ordinal)?;
    let device = CudaDevice::new(index)?;
    let name = device.name()?;
    let info = device.mem_get_info()?;
    let vmm = match device.allocation_granularity() {
        Some(granularity) => format!("supported (granularity {granularity} bytes)"),
        None => "not supported".to_owned(),
    };
    Ok(format!(
        "cuda:{ordinal}: {name}, {} bytes total ({:.2} GiB), {} bytes free, virtual memory {vmm}",
        info.total,
        info.total as f64 / GIB,
        info.free,
    ))
}
