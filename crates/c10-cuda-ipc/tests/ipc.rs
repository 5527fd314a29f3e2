//! Sharing simulated device memory between processes (PyTorch's `shareIpcHandle` /
//! `getIpcDevPtr`): the handle's encoding, opening once per process, stale and bad handles,
//! expandable segments, the keep-alive of counted shares, and a real second process.
//!
//! `ipc_two_processes_share_a_sim_block` runs this test binary again as its child (the same test
//! in child mode, selected with `--exact` and told so by an environment variable), so it works
//! under both `cargo test` and nextest and leaves no process behind.
#![cfg(target_os = "linux")]

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use c10_core::{Allocator, DataPtr, Storage};
use c10_cuda::config::AllocatorConfig;
use c10_cuda::{CachingAllocator, SimDevice};
use c10_cuda_ipc::{
    self as ipc, IpcError, IpcFront, IpcHandle, RefCounterHandle, SegmentHandle, SimRegion,
    ipc_collect, open_segment_count,
};
use parking_lot::Mutex;
use rstest::rstest;

const MIB: usize = 1 << 20;

/// The tests that look at this process's open-segment count or its limbo take this lock, so that
/// `cargo test` (threads in one process) does not mix their counts.
static SERIAL: Mutex<()> = Mutex::new(());

fn shareable_front(config: &str) -> (Arc<CachingAllocator<SimDevice>>, SimDevice) {
    let sim = SimDevice::host_backed(0, 256 * MIB).with_shareable_memory(true);
    let config: AllocatorConfig = config.parse().expect("config");
    let front = Arc::new(CachingAllocator::new(vec![sim.clone()], config).expect("front"));
    (front, sim)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| ((i * 7 + 3) % 251) as u8 ^ seed).collect()
}

/// The bytes a `DataPtr` from `open_ipc_handle` points at.
fn opened_bytes(ptr: &DataPtr, len: usize) -> Vec<u8> {
    // SAFETY: the DataPtr keeps the opened mapping alive for at least `len` bytes (the block
    // size checked by open_ipc_handle); no one writes it concurrently in these tests.
    unsafe { std::slice::from_raw_parts(ptr.get(), len) }.to_vec()
}

fn write_opened(ptr: &DataPtr, bytes: &[u8]) {
    // SAFETY: as in `opened_bytes`; the mapping is shared read/write memory and this test is
    // its only writer now.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr.get(), bytes.len()) };
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
        .collect()
}

fn sim_segment(region: SimRegion) -> SegmentHandle {
    SegmentHandle::Sim {
        region,
        pid: 4242,
        fd: 17,
        nonce: 0x0123_4567_89ab_cdef,
        region_size: 2 * MIB as u64,
        map_offset: 0,
        map_size: 2 * MIB as u64,
    }
}

fn sample_handle(segment: SegmentHandle, counted: bool) -> IpcHandle {
    IpcHandle {
        device: 1,
        segment,
        offset: 512,
        size: 1024,
        ref_counter: counted.then_some(RefCounterHandle {
            pid: 4242,
            fd: 18,
            nonce: 99,
            slot: 3,
        }),
    }
}

#[rstest]
#[case::sim_segment(sample_handle(sim_segment(SimRegion::Segment), false))]
#[case::sim_reservation_counted(sample_handle(sim_segment(SimRegion::Reservation), true))]
#[case::cuda_malloc(sample_handle(
    SegmentHandle::CudaMalloc { handle: [0xa5; 64], size: 20 * MIB as u64 },
    true
))]
#[case::cuda_expandable(sample_handle(
    SegmentHandle::CudaExpandable { pid: 7, page_size: 2 * MIB as u64, fds: vec![5, 6, 9] },
    false
))]
fn ipc_handle_round_trips_through_bytes(#[case] handle: IpcHandle) {
    let bytes = handle.to_bytes();
    assert_eq!(bytes[0], ipc::HANDLE_VERSION);
    assert_eq!(IpcHandle::from_bytes(&bytes).unwrap(), handle);
    // Every strict prefix is refused as truncated, never a panic.
    for cut in 0..bytes.len() {
        let err = IpcHandle::from_bytes(&bytes[..cut]).unwrap_err();
        assert!(
            matches!(err, IpcError::Malformed(ref m) if m.contains("truncated")),
            "prefix of {cut} bytes: {err}"
        );
    }
}

/// The encoding of `sample_handle(sim_segment(Segment), false)` with one byte replaced.
fn corrupted(at: usize, value: u8) -> Vec<u8> {
    let mut bytes = sample_handle(sim_segment(SimRegion::Segment), false).to_bytes();
    bytes[at] = value;
    bytes
}

#[rstest]
#[case::empty(vec![], "truncated: version")]
#[case::other_version(corrupted(0, 2), "version 2, expected 1")]
#[case::unknown_kind(corrupted(18, b'q'), "unknown segment kind 0x71")]
#[case::bad_counter_flag({let b = corrupted(0, 1); let n = b.len(); let mut b = b; b[n - 1] = 7; b}, "counter flag 7")]
#[case::trailing_byte({let mut b = corrupted(0, 1); b.push(0); b}, "1 trailing bytes")]
#[case::block_outside_segment(
    sample_handle(sim_segment(SimRegion::Segment), false).to_bytes().into_iter().enumerate()
        .map(|(i, b)| if i == 9 { 0xff } else { b }).collect(),
    "does not fit"
)]
#[case::counter_slot_out_of_range({
    let mut h = sample_handle(sim_segment(SimRegion::Segment), true);
    h.ref_counter.as_mut().unwrap().slot = 10_000;
    h.to_bytes()
}, "counter slot 10000 of a file of 10000")]
#[case::no_pages(
    sample_handle(SegmentHandle::CudaExpandable { pid: 7, page_size: 2 << 20, fds: vec![] }, false).to_bytes(),
    "0 pages"
)]
fn ipc_malformed_handles_are_errors(#[case] bytes: Vec<u8>, #[case] expected: &str) {
    match IpcHandle::from_bytes(&bytes) {
        Err(IpcError::Malformed(message)) => assert!(
            message.contains(expected),
            "expected {expected:?} in {message:?}"
        ),
        other => panic!("expected a malformed-handle error, got {other:?}"),
    }
}

#[test]
fn ipc_opening_the_same_segment_twice_maps_it_once() {
    let _serial = SERIAL.lock();
    let (front, sim) = shareable_front("");
    let a = front.raw_alloc(0, 1000).unwrap();
    let b = front.raw_alloc(0, 5000).unwrap();
    sim.write(a, &pattern(1000, 0)).unwrap();
    sim.write(b, &pattern(5000, 1)).unwrap();
    let (ha, hb) = (front.ipc_handle(a).unwrap(), front.ipc_handle(b).unwrap());
    // Both blocks sit in one 2 MiB small-pool segment: one segment handle, two offsets.
    assert_eq!(ha.segment, hb.segment);
    let (base, segment_size) = front.get_base_allocation(a).unwrap();
    assert_eq!(segment_size, 2 * MIB);
    assert_eq!(
        (ha.offset, ha.size, hb.offset, hb.size),
        (a - base, 1024, b - base, 5120)
    );
    assert!(
        matches!(ha.segment, SegmentHandle::Sim { region: SimRegion::Segment, map_size, .. } if map_size == 2 * MIB as u64)
    );
    let before = open_segment_count();
    let first = front.open_ipc_handle(0, &ha).unwrap();
    let again = front.open_ipc_handle(0, &ha).unwrap();
    let other = front.open_ipc_handle(0, &hb).unwrap();
    assert_eq!(
        open_segment_count(),
        before + 1,
        "one mapping for three opens"
    );
    assert_eq!(first.get(), again.get());
    assert_eq!(
        other.get() as u64 - first.get() as u64,
        hb.offset - ha.offset
    );
    // The opened mapping shows the producer's bytes and the producer sees writes through it.
    assert_eq!(opened_bytes(&first, 1000), pattern(1000, 0));
    assert_eq!(opened_bytes(&other, 5000), pattern(5000, 1));
    write_opened(&other, &pattern(5000, 9));
    let mut back = vec![0u8; 5000];
    sim.read(b, &mut back).unwrap();
    assert_eq!(back, pattern(5000, 9));
    // Opening counts nowhere in the allocator's statistics.
    let stats = front.memory_stats(0).unwrap();
    assert_eq!(stats["allocated_bytes.all.current"], 1024 + 5120);
    assert_eq!(stats["reserved_bytes.all.current"], 2 << 20);
    drop((first, again));
    assert_eq!(open_segment_count(), before + 1, "still used by `other`");
    drop(other);
    assert_eq!(open_segment_count(), before, "closed with its last user");
    front.raw_delete(a).unwrap();
    front.raw_delete(b).unwrap();
}

#[test]
fn ipc_stale_and_foreign_handles_are_errors() {
    let _serial = SERIAL.lock();
    let (front, _sim) = shareable_front("");
    let a = front.raw_alloc(0, 4096).unwrap();
    let handle = front.ipc_handle(a).unwrap();
    let SegmentHandle::Sim {
        pid,
        fd,
        nonce,
        region_size,
        ..
    } = handle.segment.clone()
    else {
        panic!("a simulated handle");
    };
    let with_segment = |segment: SegmentHandle| IpcHandle {
        segment,
        ..handle.clone()
    };
    let variant = |pid: u32, fd: i32, nonce: u64, region_size: u64| SegmentHandle::Sim {
        region: SimRegion::Segment,
        pid,
        fd,
        nonce,
        region_size,
        map_offset: 0,
        map_size: region_size,
    };
    let cases = [
        ("another nonce", variant(pid, fd, nonce ^ 1, region_size)),
        ("not a memfd (stdin)", variant(pid, 0, nonce, region_size)),
        (
            "no such descriptor",
            variant(pid, 1 << 20, nonce, region_size),
        ),
        (
            "no such process",
            variant(0x3fff_fff0, fd, nonce, region_size),
        ),
        (
            "another size",
            variant(pid, fd, nonce, region_size + 2 * MIB as u64),
        ),
    ];
    for (what, segment) in cases {
        let err = front
            .open_ipc_handle(0, &with_segment(segment))
            .unwrap_err();
        assert!(matches!(err, IpcError::Stale(_)), "{what}: {err}");
    }
    // The real handle opens; after the block is freed and its segment released, it is stale.
    drop(front.open_ipc_handle(0, &handle).unwrap());
    front.raw_delete(a).unwrap();
    front.empty_cache().unwrap();
    let err = front.open_ipc_handle(0, &handle).unwrap_err();
    assert!(matches!(err, IpcError::Stale(_)), "{err}");
    // An unknown device and an unknown pointer are errors too.
    assert!(matches!(
        front.open_ipc_handle(3, &handle).unwrap_err(),
        IpcError::Allocator(_)
    ));
    assert!(matches!(
        front.ipc_handle(a).unwrap_err(),
        IpcError::UnknownPointer { .. }
    ));
}

#[rstest]
#[case::host_backed_not_shareable(SimDevice::host_backed(0, 64 * MIB))]
#[case::address_only(SimDevice::address_only(0, 64 * MIB))]
fn ipc_needs_shareable_host_memory(#[case] sim: SimDevice) {
    let front = CachingAllocator::new(vec![sim], AllocatorConfig::default()).unwrap();
    let a = front.raw_alloc(0, 4096).unwrap();
    let err = front.ipc_handle(a).unwrap_err();
    assert!(matches!(err, IpcError::Unsupported(_)), "{err}");
    front.raw_delete(a).unwrap();
}

#[test]
fn ipc_expandable_blocks_share_their_pages() {
    let _serial = SERIAL.lock();
    let (front, sim) = shareable_front("expandable_segments:True");
    let first = front.raw_alloc(0, 3 * MIB).unwrap();
    let block = front.raw_alloc(0, 30 * MIB).unwrap();
    // The first and last 64 KiB of the block: on page 0 and on page 1.
    let tail = block + (30 * MIB - 65536) as u64;
    sim.write(block, &pattern(65536, 5)).unwrap();
    sim.write(tail, &pattern(65536, 6)).unwrap();
    let handle = front.ipc_handle(block).unwrap();
    let SegmentHandle::Sim {
        region,
        map_offset,
        map_size,
        ..
    } = handle.segment
    else {
        panic!("a simulated handle");
    };
    // Large-pool pages are 20 MiB: the block at 3 MiB..33 MiB of the segment (right after the
    // first block) lies on pages 0 and 1.
    assert_eq!(region, SimRegion::Reservation);
    assert_eq!((map_offset, map_size), (0, 40 * MIB as u64));
    assert_eq!(handle.offset, block - first);
    assert_eq!(handle.size, 30 * MIB as u64);
    let opened = front.open_ipc_handle(0, &handle).unwrap();
    let bytes = opened_bytes(&opened, 30 * MIB);
    assert_eq!(bytes[..65536], pattern(65536, 5));
    assert_eq!(bytes[30 * MIB - 65536..], pattern(65536, 6));
    write_opened(&opened, &[0xee; 64]);
    let mut back = [0u8; 64];
    sim.read(block, &mut back).unwrap();
    assert_eq!(back, [0xee; 64]);
    drop(opened);
    front.raw_delete(block).unwrap();
    front.raw_delete(first).unwrap();
}

/// A storage of `len` bytes from `front`'s device 0 holding `pattern(len, seed)`.
fn pattern_storage(
    front: &Arc<CachingAllocator<SimDevice>>,
    sim: &SimDevice,
    len: usize,
    seed: u8,
) -> Storage {
    let allocator: Arc<dyn Allocator> = Arc::new(front.allocator(0).unwrap());
    let storage = Storage::new(len, allocator, false).unwrap();
    sim.write(storage.data_ptr() as u64, &pattern(len, seed))
        .unwrap();
    storage
}

#[test]
fn ipc_counted_share_keeps_the_block_until_the_consumer_is_done() {
    let _serial = SERIAL.lock();
    let (front, sim) = shareable_front("");
    let storage = pattern_storage(&front, &sim, 3 * MIB, 2);
    let handle = front.share_storage(&storage).unwrap();
    assert!(handle.ref_counter.is_some());
    let limbo = ipc::shared_block_count();
    drop(storage);
    // The producer dropped its storage: the limbo keeps the block for the consumer.
    let allocated =
        |f: &CachingAllocator<SimDevice>| f.memory_stats(0).unwrap()["allocated_bytes.all.current"];
    assert_eq!(allocated(&front), 3 << 20);
    assert!(!ipc_collect(), "the counter is still 1");
    assert_eq!(allocated(&front), 3 << 20);
    let consumer = front.open_ipc_handle(0, &handle).unwrap();
    let second = front.open_ipc_handle(0, &handle).unwrap();
    assert_eq!(opened_bytes(&consumer, 3 * MIB), pattern(3 * MIB, 2));
    drop(consumer);
    assert!(!ipc_collect(), "the second DataPtr still holds a reference");
    drop(second);
    assert!(ipc_collect(), "every consumer is done");
    assert_eq!(ipc::shared_block_count(), limbo - 1);
    assert_eq!(allocated(&front), 0);
    // The counter is zero now: the handle is stale even though its segment is still cached.
    let err = front.open_ipc_handle(0, &handle).unwrap_err();
    assert!(
        matches!(err, IpcError::Stale(ref m) if m.contains("is zero")),
        "{err}"
    );
}

#[test]
fn ipc_share_storage_refuses_what_it_cannot_keep_alive() {
    let (front, sim) = shareable_front("");
    let allocator: Arc<dyn Allocator> = Arc::new(front.allocator(0).unwrap());
    let resizable = Storage::new(4096, Arc::clone(&allocator), true).unwrap();
    let err = front.share_storage(&resizable).unwrap_err();
    assert!(
        matches!(err, IpcError::Storage(ref m) if m.contains("resizable")),
        "{err}"
    );
    let empty = Storage::new(0, allocator, false).unwrap();
    assert!(matches!(
        front.share_storage(&empty).unwrap_err(),
        IpcError::Storage(_)
    ));
    drop(sim);
}

/// The environment variable that puts this test binary in child mode: the hex handle.
const CHILD_HANDLE: &str = "TENSORMEM_IPC_TEST_CHILD_HANDLE";
const BLOCK: usize = 3 * MIB + 100;

/// Lines of /proc/self/maps that map the region with `nonce`.
fn maps_of(nonce: u64) -> usize {
    let needle = format!("tensormem:sim-segment:{nonce:016x}");
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| l.contains(&needle))
        .count()
}

/// The child: opens the handle, checks and changes the bytes, drops the mapping, and reports.
fn run_child(hex_handle: &str) {
    let handle = IpcHandle::from_bytes(&unhex(hex_handle)).expect("handle");
    let SegmentHandle::Sim { nonce, pid, .. } = handle.segment else {
        panic!("a simulated handle");
    };
    assert_ne!(pid, std::process::id(), "the child is another process");
    // The consumer's own allocator: it never sees the opened bytes.
    let sim = SimDevice::host_backed(0, 64 * MIB);
    let front = CachingAllocator::new(vec![sim], AllocatorConfig::default()).unwrap();
    let opened = front
        .open_ipc_handle(0, &handle)
        .expect("open in the child");
    println!(
        "IPC-CHILD open segments={} maps={}",
        open_segment_count(),
        maps_of(nonce)
    );
    let expected = pattern(BLOCK, 0x5a);
    let matches = opened_bytes(&opened, BLOCK) == expected;
    println!("IPC-CHILD pattern matches={matches}");
    write_opened(&opened, &pattern(BLOCK, 0xc3));
    drop(opened);
    let stats = front.memory_stats(0).unwrap();
    println!(
        "IPC-CHILD dropped segments={} maps={} allocated={} reserved={}",
        open_segment_count(),
        maps_of(nonce),
        stats["allocated_bytes.all.current"],
        stats["reserved_bytes.all.current"]
    );
}

/// Kills and reaps the child if the parent fails before it exits.
struct Reap(Option<std::process::Child>);

impl Drop for Reap {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[test]
fn ipc_two_processes_share_a_sim_block() {
    if let Ok(handle) = std::env::var(CHILD_HANDLE) {
        run_child(&handle);
        return;
    }
    let _serial = SERIAL.lock();
    let (front, sim) = shareable_front("");
    let storage = pattern_storage(&front, &sim, BLOCK, 0x5a);
    let handle = front.share_storage(&storage).unwrap();
    let stats_before = front.memory_stats(0).unwrap();
    let child = Command::new(std::env::current_exe().unwrap())
        .args([
            "ipc_two_processes_share_a_sim_block",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_HANDLE, hex(&handle.to_bytes()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the child");
    let mut reap = Reap(Some(child));
    // Poll, so that a hung child fails the test (and is killed by `Reap`) instead of hanging it.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let child = reap.0.as_mut().unwrap();
        if child.try_wait().expect("wait for the child").is_some() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the child process did not finish within 120 s"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let output = reap
        .0
        .take()
        .unwrap()
        .wait_with_output()
        .expect("child output");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "child failed: {}\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.split_once("IPC-CHILD ").map(|(_, said)| said))
        .collect();
    assert_eq!(
        lines,
        [
            "open segments=1 maps=1",
            "pattern matches=true",
            "dropped segments=0 maps=0 allocated=0 reserved=0",
        ],
        "child said:\n{stdout}"
    );
    // The parent sees the child's bytes, and its own statistics did not move.
    let mut back = vec![0u8; BLOCK];
    sim.read(storage.data_ptr() as u64, &mut back).unwrap();
    assert!(
        back == pattern(BLOCK, 0xc3),
        "the child's writes are visible"
    );
    assert_eq!(front.memory_stats(0).unwrap(), stats_before);
    // The child returned its reference when it dropped the mapping: once the producer drops its
    // storage, collecting releases the block.
    drop(storage);
    assert!(ipc_collect());
    assert_eq!(
        front.memory_stats(0).unwrap()["allocated_bytes.all.current"],
        0
    );
}
