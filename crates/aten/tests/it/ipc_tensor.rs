//! Tensors shared between processes on the host-backed simulated device
//! (`Tensor::share_ipc` / `Tensor::from_ipc`, PyTorch's `reduce_tensor` /
//! `rebuild_cuda_tensor`): geometry and bytes survive the trip, the segment is opened once, a
//! counted share keeps the producer's block, bad and stale input are errors, and a second
//! process runs a kernel on the shared bytes.
#![cfg(target_os = "linux")]

use std::process::{Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use aten::ipc::IpcTensor;
use aten::{Error, Tensor, TensorOptions};
use c10_core::Device;
use c10_cuda::{CachingAllocator, SimDevice};
use c10_cuda_ipc::{IpcError, ipc_collect, open_segment_count};
use parking_lot::Mutex;

/// One shareable install per test process (tests run as threads of one process under
/// `cargo test`; installing again would change the front under another test).
fn front() -> &'static Arc<CachingAllocator<SimDevice>> {
    static FRONT: OnceLock<Arc<CachingAllocator<SimDevice>>> = OnceLock::new();
    FRONT.get_or_init(|| aten::sim::install_shareable(1, 256 << 20).expect("install"))
}

/// Tests that count this process's open segments or its limbo take this lock.
static SERIAL: Mutex<()> = Mutex::new(());

fn sim() -> TensorOptions {
    TensorOptions::new().device(Device::sim(0))
}

#[test]
fn ipc_tensor_geometry_and_bytes_survive_the_trip() {
    let _serial = SERIAL.lock();
    front();
    let base = Tensor::arange(0.0, 24.0, 1.0, sim()).unwrap();
    // A non-contiguous view at a storage offset.
    let view = base
        .view(&[4, 6])
        .unwrap()
        .transpose(0, 1)
        .unwrap()
        .narrow(0, 1, 3)
        .unwrap();
    let shared = view.share_ipc().unwrap();
    assert_eq!(shared.sizes, [3, 4]);
    assert_eq!(shared.strides, [1, 6]);
    assert_eq!(shared.storage_offset, 1);
    assert_eq!(shared.storage_nbytes, 96);
    let decoded = IpcTensor::from_bytes(&shared.to_bytes()).unwrap();
    assert_eq!(decoded, shared);
    let before = open_segment_count();
    let opened = Tensor::from_ipc(&decoded, Device::sim(0)).unwrap();
    let again = Tensor::from_ipc(&decoded, Device::sim(0)).unwrap();
    assert_eq!(
        open_segment_count(),
        before + 1,
        "one mapping for both tensors"
    );
    assert_eq!(
        opened.to_vec::<f32>().unwrap(),
        view.to_vec::<f32>().unwrap()
    );
    // A kernel on the opened tensor writes the producer's bytes.
    opened.add_scalar_(100.0).unwrap();
    assert_eq!(
        view.to_vec::<f32>().unwrap(),
        [
            101.0, 107.0, 113.0, 119.0, 102.0, 108.0, 114.0, 120.0, 103.0, 109.0, 115.0, 121.0
        ]
    );
    assert_eq!(
        again.to_vec::<f32>().unwrap(),
        view.to_vec::<f32>().unwrap()
    );
    drop((opened, again));
    assert_eq!(open_segment_count(), before);
}

#[test]
fn ipc_tensor_keeps_the_producer_block_until_the_consumer_drops() {
    let _serial = SERIAL.lock();
    let front = front();
    let allocated = || front.memory_stats(0).unwrap()["allocated_bytes.all.current"];
    // Blocks of earlier tests whose consumers are done go first (each share collects too).
    ipc_collect();
    let start = allocated();
    let t = Tensor::full(&[1000], 7.0, sim()).unwrap();
    let shared = t.share_ipc().unwrap();
    drop(t);
    assert_eq!(allocated(), start + 4096, "kept for the consumer");
    let consumer = Tensor::from_ipc(&shared, Device::sim(0)).unwrap();
    assert_eq!(
        consumer.sum(&[0], false).unwrap().item::<f32>().unwrap(),
        7000.0
    );
    drop(consumer);
    assert!(ipc_collect());
    assert_eq!(allocated(), start);
    match Tensor::from_ipc(&shared, Device::sim(0)) {
        Err(Error::Ipc {
            source: IpcError::Stale(_),
            ..
        }) => {}
        other => panic!("expected a stale handle, got {other:?}"),
    }
}

#[test]
fn ipc_tensor_bad_input_is_an_error() {
    let _serial = SERIAL.lock();
    front();
    for bytes in [
        b"".as_slice(),
        b"TMTENSO".as_slice(),
        b"NOTATENSOR".as_slice(),
        b"TMTENSOR\x02".as_slice(),
    ] {
        match IpcTensor::from_bytes(bytes) {
            Err(Error::Ipc {
                source: IpcError::Malformed(_),
                ..
            }) => {}
            other => panic!("{bytes:?}: expected a malformed handle, got {other:?}"),
        }
    }
    let t = Tensor::ones(&[8], sim()).unwrap();
    let mut bytes = t.share_ipc().unwrap().to_bytes();
    bytes.push(0);
    assert!(matches!(
        IpcTensor::from_bytes(&bytes),
        Err(Error::Ipc { .. })
    ));
    // CPU tensors are not shared through IPC handles; a sim handle does not open on the CPU.
    assert!(matches!(
        Tensor::ones(&[2], TensorOptions::new())
            .unwrap()
            .share_ipc(),
        Err(Error::UnsupportedDevice { .. })
    ));
    let shared = t.share_ipc().unwrap();
    assert!(matches!(
        Tensor::from_ipc(&shared, Device::cpu()),
        Err(Error::UnsupportedDevice { .. })
    ));
    // An empty tensor travels without a handle.
    let empty = Tensor::zeros(&[0, 3], sim()).unwrap().share_ipc().unwrap();
    assert!(empty.handle.is_none());
    let back = Tensor::from_ipc(
        &IpcTensor::from_bytes(&empty.to_bytes()).unwrap(),
        Device::sim(0),
    )
    .unwrap();
    assert_eq!(back.sizes(), [0, 3]);
}

const CHILD: &str = "TENSORMEM_ATEN_IPC_CHILD";

#[test]
fn ipc_tensor_second_process_runs_a_kernel_on_shared_bytes() {
    if let Ok(hex) = std::env::var(CHILD) {
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        aten::sim::install(1, 64 << 20).unwrap();
        let shared =
            Tensor::from_ipc(&IpcTensor::from_bytes(&bytes).unwrap(), Device::sim(0)).unwrap();
        println!(
            "ATEN-IPC-CHILD sum={}",
            shared.sum(&[0, 1], false).unwrap().item::<f32>().unwrap()
        );
        shared.mul_scalar_(2.0).unwrap();
        return;
    }
    let _serial = SERIAL.lock();
    front();
    let t = Tensor::arange(0.0, 12.0, 1.0, sim())
        .unwrap()
        .view(&[3, 4])
        .unwrap();
    let hex: String = t
        .share_ipc()
        .unwrap()
        .to_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            test_path("ipc_tensor_second_process_runs_a_kernel_on_shared_bytes").as_str(),
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, hex)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the child did not finish within 120 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("ATEN-IPC-CHILD sum=66"), "{stdout}");
    assert_eq!(
        t.to_vec::<f32>().unwrap(),
        (0..12).map(|i| 2.0 * i as f32).collect::<Vec<_>>()
    );
}

/// The libtest name of this module's test `name` (`<module path>::name`, without the crate), as
/// `--exact` wants it when the binary runs itself again as the child.
fn test_path(name: &str) -> String {
    match module_path!().split_once("::") {
        Some((_, module)) => format!("{module}::{name}"),
        None => name.to_string(),
    }
}
