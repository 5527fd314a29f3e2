//! The rules that differ between PyTorch versions, and our deliberate fixes with PyTorch's own
//! behaviour beside them (`Rules::pytorch_exact`). Every expected value here is what the real
//! allocators did on the same calls (torch-oracle, torch 2.7.1 and 2.15.0; the differential tests
//! of `crates/oracle-diff` re-check them on random scripts).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use c10_cuda::config::{AllocatorConfig, MIB};
use c10_cuda::device::{DeviceError, DeviceMemory, DevicePtr, EventId, MemInfo, StreamId};
use c10_cuda::{DeviceCachingAllocator, Error, Rules, SimDevice, TorchVersion};
use rstest::rstest;

const GIB: usize = 1 << 30;
const S0: StreamId = StreamId::DEFAULT;

use crate::support::allocator_with as allocator;

fn is_oom(r: &c10_cuda::Result<c10_cuda::Allocation>) -> bool {
    matches!(r, Err(Error::OutOfMemory(_)))
}

/// pytorch#189504 (torch-oracle's `examples/oom_pending_free.ops`, same in both versions): on a
/// 1 GiB device, x (8 MiB) shares a full 20 MiB segment with a live 12 MiB block, the rest of the
/// device is taken, and x is recorded on a side stream and freed. PyTorch: `alloc 8MiB` fails after synchronizing x's event (1 retry, 1 OOM)
/// and the same request right after succeeds at x's address. Ours finds x's block after the
/// release step and succeeds at once.
#[rstest]
#[case::torch_2_7(TorchVersion::V2_7)]
#[case::torch_2_15(TorchVersion::V2_15)]
fn pytorch_189504_pending_free(#[case] version: TorchVersion) {
    for fixed in [false, true] {
        let rules = if fixed {
            Rules::new(version)
        } else {
            Rules::pytorch_exact(version)
        };
        let (dev, mut a) = allocator(GIB, "", rules);
        let side = dev.new_stream();
        // x and n fill one 20 MiB segment; `fill` takes the rest of the device.
        let x = a.malloc(8 * MIB, S0).unwrap().ptr;
        let n = a.malloc(12 * MIB, S0).unwrap().ptr;
        assert_eq!(n, x + (8 * MIB) as u64);
        a.malloc(1004 * MIB, S0).unwrap();
        a.record_stream(x, side).unwrap();
        a.free(x).unwrap();
        let got = a.malloc(8 * MIB, S0);
        let s = a.stats();
        if fixed {
            assert_eq!(got.unwrap().ptr, x);
            assert_eq!((s.num_alloc_retries, s.num_ooms), (0, 0));
        } else {
            assert!(is_oom(&got), "{got:?}");
            assert_eq!((s.num_alloc_retries, s.num_ooms), (1, 1));
            assert_eq!(a.malloc(8 * MIB, S0).unwrap().ptr, x);
        }
        assert_eq!(s.num_sync_all_streams, 1);
        a.check_invariants().unwrap();
    }
}

/// The issue-13 case: expandable segments and a memory fraction of 0.5 on a 16 GiB device.
/// PyTorch (both versions) checks the limit against the request rounded to 2 MiB (8190 MiB) and
/// maps 410 whole 20 MiB pages: 8200 MiB reserved, over the 8192 MiB allowed. Ours refuses it:
/// the limit holds, and the message says the fraction is the limit.
#[rstest]
#[case::torch_2_7(TorchVersion::V2_7, "")]
#[case::torch_2_15(TorchVersion::V2_15, "")]
#[case::torch_2_15_conf_key(TorchVersion::V2_15, ",per_process_memory_fraction:0.5")]
fn expandable_segments_respect_the_fraction(#[case] version: TorchVersion, #[case] key: &str) {
    for fixed in [false, true] {
        let rules = if fixed {
            Rules::new(version)
        } else {
            Rules::pytorch_exact(version)
        };
        let (_dev, mut a) = allocator(16 * GIB, &format!("expandable_segments:True{key}"), rules);
        if key.is_empty() {
            a.set_memory_fraction(0.5).unwrap();
        }
        let got = a.malloc(8190 * MIB, S0);
        if fixed {
            let Err(Error::OutOfMemory(e)) = got else {
                panic!("expected OOM, got {got:?}");
            };
            assert_eq!(a.reserved_bytes(), 0);
            assert_eq!(e.segment_size, (8200 * MIB) as u64);
            assert!(e.fraction_limited());
            assert!(
                e.to_string()
                    .contains("per-process memory fraction is the limit")
            );
            // What fits under the limit still works: 409 pages.
            let ok = a.malloc(8180 * MIB, S0).unwrap();
            assert_eq!(ok.size, 8180 * MIB);
            assert_eq!(a.reserved_bytes(), 8180 * MIB);
        } else {
            assert_eq!(got.unwrap().size, 8190 * MIB);
            assert_eq!(a.reserved_bytes(), 8200 * MIB);
        }
        assert!(fixed == (a.reserved_bytes() <= 8 * GIB));
        a.check_invariants().unwrap();
    }
}

/// A simulated device that counts address reservations and their releases.
#[derive(Clone)]
struct Reservations {
    inner: SimDevice,
    reserved: Arc<AtomicUsize>,
    released: Arc<AtomicUsize>,
}

impl DeviceMemory for Reservations {
    fn index(&self) -> u8 {
        self.inner.index()
    }
    fn mem_get_info(&self) -> Result<MemInfo, DeviceError> {
        self.inner.mem_get_info()
    }
    fn malloc(&self, size: usize) -> Result<DevicePtr, DeviceError> {
        self.inner.malloc(size)
    }
    fn free(&self, ptr: DevicePtr, size: usize) -> Result<(), DeviceError> {
        self.inner.free(ptr, size)
    }
    fn create_event(&self) -> Result<EventId, DeviceError> {
        self.inner.create_event()
    }
    fn record_event(&self, event: EventId, stream: StreamId) -> Result<(), DeviceError> {
        self.inner.record_event(event, stream)
    }
    fn query_event(&self, event: EventId) -> Result<bool, DeviceError> {
        self.inner.query_event(event)
    }
    fn synchronize_event(&self, event: EventId) -> Result<(), DeviceError> {
        self.inner.synchronize_event(event)
    }
    fn destroy_event(&self, event: EventId) {
        self.inner.destroy_event(event);
    }
    fn supports_virtual_memory(&self) -> bool {
        true
    }
    fn reserve_address_range(&self, size: usize) -> Result<DevicePtr, DeviceError> {
        self.reserved.fetch_add(1, Ordering::Relaxed);
        self.inner.reserve_address_range(size)
    }
    fn release_address_range(&self, ptr: DevicePtr, size: usize) -> Result<(), DeviceError> {
        self.released.fetch_add(1, Ordering::Relaxed);
        self.inner.release_address_range(ptr, size)
    }
    fn map(&self, ptr: DevicePtr, size: usize) -> Result<(), DeviceError> {
        self.inner.map(ptr, size)
    }
    fn unmap(&self, ptr: DevicePtr, size: usize) -> Result<(), DeviceError> {
        self.inner.unmap(ptr, size)
    }
}

/// A request that cannot be mapped on a 2 GiB device with expandable segments (2.1 GiB: 109
/// pages of 20 MiB, 102 fit). PyTorch (both versions) keeps the reservation made for it,
/// unmapped, through its release step and `empty_cache`, and the next request on the stream maps
/// into it. Ours releases it there and reserves again for the next request.
#[rstest]
#[case::torch_2_7(TorchVersion::V2_7)]
#[case::torch_2_15(TorchVersion::V2_15)]
fn never_mapped_reservations(#[case] version: TorchVersion) {
    for fixed in [false, true] {
        let rules = if fixed {
            Rules::new(version)
        } else {
            Rules::pytorch_exact(version)
        };
        let dev = Reservations {
            inner: SimDevice::address_only(0, 2 * GIB),
            reserved: Arc::default(),
            released: Arc::default(),
        };
        let config = AllocatorConfig::parse("expandable_segments:True").unwrap();
        let mut a = DeviceCachingAllocator::with_rules(dev.clone(), config, rules).unwrap();
        assert!(is_oom(&a.malloc(2_267_021_312, S0)));
        assert_eq!(dev.inner.mapped_pages(), vec![]);
        let fix = usize::from(fixed);
        // Ours also releases it in the release step before the retry, and reserves again.
        assert_eq!(dev.reserved.load(Ordering::Relaxed), 1 + fix);
        assert_eq!(dev.released.load(Ordering::Relaxed), fix);
        a.empty_cache().unwrap();
        assert_eq!(dev.released.load(Ordering::Relaxed), 2 * fix);
        assert_eq!(a.malloc(GIB, S0).unwrap().size, GIB);
        assert_eq!(dev.reserved.load(Ordering::Relaxed), 1 + 2 * fix);
        // 102 pages mapped and rolled back on the first try and on the retry, then 52.
        assert_eq!(dev.inner.counters().maps, 2 * 102 + 52);
        a.check_invariants().unwrap();
    }
}

/// torch 2.15 releases a new expandable segment at once when its address space (9/8 of the
/// device) cannot hold the request (here 3 GiB after `roundup_power2_divisions:2`, on a 2 GiB
/// device): no page is mapped. torch 2.7 maps pages until the device refuses.
#[rstest]
#[case::torch_2_7(TorchVersion::V2_7, true)]
#[case::torch_2_15(TorchVersion::V2_15, false)]
fn new_segment_too_small_for_the_request(#[case] version: TorchVersion, #[case] tries: bool) {
    let (dev, mut a) = allocator(
        2 * GIB,
        "roundup_power2_divisions:2,expandable_segments:True",
        Rules::pytorch_exact(version),
    );
    assert!(is_oom(&a.malloc(2_267_021_312, S0)));
    // 2.7 maps 102 of the 2 GiB / 20 MiB pages (twice: first try and retry), then unmaps them.
    assert_eq!(dev.counters().maps, if tries { 204 } else { 0 });
    assert_eq!(dev.mapped_pages(), vec![]);
    a.check_invariants().unwrap();
}

/// A memory fraction of exactly 1.0: torch 2.15 removes the limit (an oversize request reaches
/// the device, which refuses it twice: first try and retry); torch 2.7 keeps it at the device's
/// total and refuses without asking the device.
#[rstest]
#[case::torch_2_7(TorchVersion::V2_7, 0)]
#[case::torch_2_15(TorchVersion::V2_15, 2)]
fn fraction_one(#[case] version: TorchVersion, #[case] device_refusals: u64) {
    let (dev, mut a) = allocator(GIB, "", Rules::new(version));
    a.set_memory_fraction(1.0).unwrap();
    assert!(is_oom(&a.malloc(1100 * MIB, S0)));
    assert_eq!(dev.counters().failed_mallocs, device_refusals);
    // Within the device both succeed.
    assert_eq!(a.malloc(600 * MIB, S0).unwrap().size, 600 * MIB);
}

/// `memory_stats()` keys per version: 2.15 adds `num_oom_rejections`.
#[rstest]
#[case::torch_2_7(TorchVersion::V2_7, 122)]
#[case::torch_2_15(TorchVersion::V2_15, 123)]
fn stats_keys(#[case] version: TorchVersion, #[case] keys: usize) {
    let (_dev, a) = allocator(GIB, "", Rules::new(version));
    let m = a.stats().memory_stats();
    assert_eq!(m.len(), keys);
    assert_eq!(m.contains_key("num_oom_rejections"), keys == 123);
}
