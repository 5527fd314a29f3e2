//! Pinned memory and IPC of CUDA tensors on a real GPU: `pin_memory` / `is_pinned`, host-to-GPU
//! copies staged through (or straight from) pinned blocks, and a CUDA tensor opened by a second
//! process. Compiled only with `--features gpu-tests` (`cargo xtask gpu-test`).
#![cfg(target_os = "linux")]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use aten::ipc::IpcTensor;
use aten::{Tensor, TensorOptions};
use c10_core::{Device, DeviceType};

fn gpu() -> Device {
    let found = c10_cuda_driver::probe();
    assert!(
        found.is_available(),
        "GPU tests need a CUDA device: {found}"
    );
    Device::cuda(0)
}

#[test]
fn gpu_pinned_tensors_and_staged_copies() -> aten::Result<()> {
    let cuda = gpu();
    let cpu = Tensor::arange(0.0, 4096.0, 1.0, TensorOptions::new())?;
    let pinned = cpu.pin_memory()?;
    assert!(pinned.is_pinned() && !cpu.is_pinned());
    assert_eq!(pinned.device(), Device::cpu());
    // Straight from the pinned tensor, then from pageable memory through a staging block.
    let a = pinned.to(cuda)?;
    let b = cpu.to(cuda)?;
    assert_eq!(a.to_vec::<f32>()?, cpu.to_vec::<f32>()?);
    assert_eq!(b.to_vec::<f32>()?, cpu.to_vec::<f32>()?);
    let stats = aten::pinned::host_memory_stats(DeviceType::Cuda);
    assert!(stats["num_host_alloc"] >= 1, "{stats:?}");
    assert_eq!(
        stats["active_requests.current"], 1,
        "only `pinned` holds a block: {stats:?}"
    );
    // The sync copies stage through pinned blocks too.
    let mut out = vec![0f32; 4096];
    b.sync_copy_to_cpu(&mut out)?;
    assert_eq!(out, cpu.to_vec::<f32>()?);
    b.sync_copy_from_cpu(&vec![1f32; 4096])?;
    assert_eq!(
        b.sum(&[0], false)?.to(Device::cpu())?.item::<f32>()?,
        4096.0
    );
    Ok(())
}

const CHILD: &str = "TENSORMEM_ATEN_GPU_IPC_CHILD";

#[test]
fn gpu_ipc_cuda_tensor_opened_by_a_second_process() -> aten::Result<()> {
    if let Ok(hex) = std::env::var(CHILD) {
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        let shared = Tensor::from_ipc(&IpcTensor::from_bytes(&bytes)?, gpu())?;
        println!(
            "ATEN-GPU-IPC values={:?}",
            shared.to(Device::cpu())?.to_vec::<f32>()?
        );
        shared.sync_copy_from_cpu(&[9f32, 8., 7., 6.])?;
        return Ok(());
    }
    let cuda = gpu();
    let t = Tensor::arange(0.0, 4.0, 1.0, TensorOptions::new())?.to(cuda)?;
    let hex: String = t
        .share_ipc()?
        .to_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            test_path("gpu_ipc_cuda_tensor_opened_by_a_second_process").as_str(),
            "--exact",
            "--nocapture",
        ])
        .env(CHILD, hex)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the child did not finish in 120 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("ATEN-GPU-IPC values=[0.0, 1.0, 2.0, 3.0]"),
        "{stdout}"
    );
    assert_eq!(t.to(Device::cpu())?.to_vec::<f32>()?, [9.0, 8.0, 7.0, 6.0]);
    Ok(())
}

/// The libtest name of this module's test `name` (`<module path>::name`, without the crate), as
/// `--exact` wants it when the binary runs itself again as the child.
fn test_path(name: &str) -> String {
    match module_path!().split_once("::") {
        Some((_, module)) => format!("{module}::{name}"),
        None => name.to_string(),
    }
}
