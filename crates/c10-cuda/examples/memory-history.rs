//! Writes a memory snapshot whose history carries Rust call sites, for PyTorch's viewer:
//!
//! ```sh
//! cargo run -p c10-cuda --example memory-history -- snapshot.pickle [caller|full]
//! python -m torch.cuda._memory_viz trace_plot snapshot.pickle -o snapshot.html
//! ```
//!
//! (or drop the pickle on <https://pytorch.org/memory_viz>). A few "layers" allocate their
//! activations through c10-core's `Allocator` and free them when dropped, as a training step
//! would; history is recorded with `context="all"` (PyTorch's default) and one-frame caller
//! locations (`caller`, the default) or full stacks (`full`).

use std::sync::Arc;

use c10_core::{Allocator, DataPtr};
use c10_cuda::call_site::{HistoryOptions, Stacks};
use c10_cuda::config::AllocatorConfig;
use c10_cuda::snapshot_pickle::snapshot_pickle;
use c10_cuda::{CachingAllocator, RecordContext, SimDevice};

fn linear(alloc: &dyn Allocator, batch: usize, width: usize) -> DataPtr {
    alloc
        .allocate(batch * width * 4)
        .expect("room on the device")
}

fn attention(alloc: &dyn Allocator, batch: usize, seq: usize) -> DataPtr {
    alloc
        .allocate(batch * seq * seq * 4)
        .expect("room on the device")
}

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args.next().unwrap_or_else(|| "snapshot.pickle".into());
    let stacks = match args.next().as_deref() {
        None | Some("caller") => Stacks::Caller,
        Some("full") => Stacks::Full,
        Some(other) => {
            eprintln!("memory-history: error: unknown stack kind {other:?} (caller or full)");
            std::process::exit(2);
        }
    };
    let config = AllocatorConfig::default();
    let front = Arc::new(
        CachingAllocator::new(vec![SimDevice::address_only(0, 16 << 30)], config.clone())
            .expect("a simulated device"),
    );
    front.record_memory_history(
        &HistoryOptions::new(100_000)
            .context(RecordContext::All)
            .stacks(stacks),
    );
    let alloc = front.allocator(0).expect("device 0");
    let weights: Vec<DataPtr> = (0..4).map(|_| linear(&alloc, 1024, 1024)).collect();
    for _step in 0..2 {
        let mut activations = Vec::new();
        for _layer in 0..4 {
            activations.push(linear(&alloc, 64, 4096));
            activations.push(attention(&alloc, 64, 128));
        }
        drop(activations);
    }
    let snapshot = front.snapshot();
    let bytes = snapshot_pickle(&snapshot, &config);
    if let Err(e) = std::fs::write(&path, bytes) {
        eprintln!("memory-history: error: cannot write {path}: {e}");
        std::process::exit(2);
    }
    drop(weights);
    println!(
        "wrote {path}: {} trace entries, {} segments",
        snapshot[0].trace.len(),
        snapshot[0].segments.len()
    );
}
