//! CUDA IPC between two real processes on a GPU: `cuIpcGetMemHandle` / `cuIpcOpenMemHandle` of a
//! regular segment, and the exported pages of an expandable segment (`pidfd_getfd`). Compiled
//! only with `--features gpu-tests` (`cargo xtask gpu-test`).
//!
//! Each test runs this binary again as its child. For the expandable segment the *child* is the
//! producer and the parent the consumer, since `pidfd_getfd` needs the consumer to be allowed to
//! trace the producer (under Yama's `ptrace_scope` 1 only an ancestor may).
#![cfg(target_os = "linux")]

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use c10_cuda::CachingAllocator;
use c10_cuda::config::AllocatorConfig;
use c10_cuda::device::DevicePtr;
use c10_cuda_driver::{CudaDevice, probe};
use c10_cuda_ipc::{IpcError, IpcFront, IpcHandle, SegmentHandle, open_segment_count};

const MIB: usize = 1 << 20;
const ROLE: &str = "TENSORMEM_GPU_IPC_ROLE";
const HANDLE: &str = "TENSORMEM_GPU_IPC_HANDLE";

fn gpu_front(config: &str) -> Arc<CachingAllocator<CudaDevice>> {
    let found = probe();
    assert!(
        found.is_available(),
        "GPU tests need a CUDA device: {found}"
    );
    let config: AllocatorConfig = config.parse().unwrap();
    Arc::new(CachingAllocator::new(vec![CudaDevice::new(0).unwrap()], config).unwrap())
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| ((i * 13 + 5) % 251) as u8 ^ seed)
        .collect()
}

fn write(front: &CachingAllocator<CudaDevice>, ptr: DevicePtr, bytes: &[u8]) {
    front
        .with_device(0, |a| a.device().copy_htod(ptr, bytes))
        .unwrap()
        .unwrap();
}

fn read(front: &CachingAllocator<CudaDevice>, ptr: DevicePtr, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    front
        .with_device(0, |a| a.device().copy_dtoh(&mut out, ptr))
        .unwrap()
        .unwrap();
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

/// Kills and reaps a child left running when the test fails.
struct Reap(Option<Child>);

impl Drop for Reap {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The libtest name of this module's test `name` (`<module path>::name`, without the crate), as
/// `--exact` wants it when the binary runs itself again as the child.
fn test_path(name: &str) -> String {
    match module_path!().split_once("::") {
        Some((_, module)) => format!("{module}::{name}"),
        None => name.to_string(),
    }
}

fn spawn_self(test: &str, env: &[(&str, String)]) -> Reap {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        &test_path(test),
        "--exact",
        "--nocapture",
        "--test-threads=1",
    ])
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit());
    for (k, v) in env {
        cmd.env(k, v);
    }
    Reap(Some(cmd.spawn().unwrap()))
}

/// Waits (up to two minutes) for the child and returns its remaining stdout.
fn finish(mut reap: Reap) -> String {
    let deadline = Instant::now() + Duration::from_secs(120);
    let child = reap.0.as_mut().unwrap();
    while child.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "the child did not finish in 120 s"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = reap.0.take().unwrap().wait_with_output().unwrap();
    assert!(out.status.success(), "child failed: {}", out.status);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn gpu_ipc_regular_segment_between_two_processes() {
    const LEN: usize = 3 * MIB + 4096;
    if std::env::var(ROLE).as_deref() == Ok("consumer") {
        let handle = IpcHandle::from_bytes(&unhex(&std::env::var(HANDLE).unwrap())).unwrap();
        let front = gpu_front("");
        let opened = front
            .open_ipc_handle(0, &handle)
            .expect("cuIpcOpenMemHandle");
        let again = front.open_ipc_handle(0, &handle).expect("cached");
        let ptr = opened.get() as DevicePtr;
        println!(
            "GPU-IPC segments={} same={}",
            open_segment_count(),
            again.get() == opened.get()
        );
        println!(
            "GPU-IPC matches={}",
            read(&front, ptr, LEN) == pattern(LEN, 1)
        );
        write(&front, ptr, &pattern(LEN, 2));
        drop((opened, again));
        let stats = front.memory_stats(0).unwrap();
        println!(
            "GPU-IPC closed segments={} allocated={}",
            open_segment_count(),
            stats["allocated_bytes.all.current"]
        );
        return;
    }
    let front = gpu_front("");
    let ptr = front.raw_alloc(0, LEN).unwrap();
    write(&front, ptr, &pattern(LEN, 1));
    let handle = front.ipc_handle(ptr).unwrap();
    assert!(matches!(handle.segment, SegmentHandle::CudaMalloc { .. }));
    // CUDA refuses to open a handle in the process that made it: an error, not a crash.
    assert!(front.open_ipc_handle(0, &handle).is_err());
    let before = front.memory_stats(0).unwrap();
    let child = spawn_self(
        "gpu_ipc_regular_segment_between_two_processes",
        &[(ROLE, "consumer".into()), (HANDLE, hex(&handle.to_bytes()))],
    );
    let stdout = finish(child);
    let said: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.split_once("GPU-IPC ").map(|(_, s)| s))
        .collect();
    assert_eq!(
        said,
        [
            "segments=1 same=true",
            "matches=true",
            "closed segments=0 allocated=0"
        ],
        "{stdout}"
    );
    assert!(
        read(&front, ptr, LEN) == pattern(LEN, 2),
        "the child's writes are visible"
    );
    assert_eq!(front.memory_stats(0).unwrap(), before);
    front.raw_delete(ptr).unwrap();
}

#[test]
fn gpu_ipc_expandable_segment_pages_between_two_processes() {
    const LEN: usize = 30 * MIB;
    if std::env::var(ROLE).as_deref() == Ok("producer") {
        let front = gpu_front("expandable_segments:True");
        let first = front.raw_alloc(0, 3 * MIB).unwrap();
        let ptr = front.raw_alloc(0, LEN).unwrap();
        write(&front, ptr, &pattern(LEN, 3));
        let handle = front.ipc_handle(ptr).expect("export the pages");
        println!("GPU-IPC handle={}", hex(&handle.to_bytes()));
        std::io::stdout().flush().unwrap();
        // Wait until the parent has opened, checked, written and closed.
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).unwrap();
        println!(
            "GPU-IPC written={}",
            read(&front, ptr, LEN) == pattern(LEN, 4)
        );
        front.raw_delete(ptr).unwrap();
        front.raw_delete(first).unwrap();
        return;
    }
    let mut child = spawn_self(
        "gpu_ipc_expandable_segment_pages_between_two_processes",
        &[(ROLE, "producer".into())],
    );
    let stdout = child.0.as_mut().unwrap().stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let handle = loop {
        let line = lines.next().expect("the child printed its handle").unwrap();
        if let Some((_, h)) = line.split_once("GPU-IPC handle=") {
            break IpcHandle::from_bytes(&unhex(h.trim())).unwrap();
        }
    };
    let SegmentHandle::CudaExpandable { ref fds, .. } = handle.segment else {
        panic!("an expandable handle: {handle:?}");
    };
    assert!(!fds.is_empty());
    let front = gpu_front("");
    let opened = front.open_ipc_handle(0, &handle).expect("import the pages");
    let ptr = opened.get() as DevicePtr;
    assert!(read(&front, ptr, LEN) == pattern(LEN, 3));
    write(&front, ptr, &pattern(LEN, 4));
    drop(opened);
    assert_eq!(open_segment_count(), 0);
    child
        .0
        .as_mut()
        .unwrap()
        .stdin
        .take()
        .unwrap()
        .write_all(b"done\n")
        .unwrap();
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    finish(child);
    assert!(
        rest.iter().any(|l| l.contains("GPU-IPC written=true")),
        "{rest:?}"
    );
}

#[test]
fn gpu_ipc_bad_handles_are_errors() {
    let front = gpu_front("");
    let garbage = IpcHandle {
        device: 0,
        segment: SegmentHandle::CudaMalloc {
            handle: [0x5a; 64],
            size: 2 * MIB as u64,
        },
        offset: 0,
        size: 512,
        ref_counter: None,
    };
    assert!(matches!(
        front.open_ipc_handle(0, &garbage).unwrap_err(),
        IpcError::Stale(_) | IpcError::Device(_)
    ));
    let no_process = IpcHandle {
        segment: SegmentHandle::CudaExpandable {
            pid: 0x3fff_fff0,
            page_size: 2 * MIB as u64,
            fds: vec![3],
        },
        ..garbage.clone()
    };
    assert!(matches!(
        front.open_ipc_handle(0, &no_process).unwrap_err(),
        IpcError::Stale(_)
    ));
    assert_eq!(open_segment_count(), 0);
}
