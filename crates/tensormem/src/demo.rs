//! The built-in demo: the alloc/free sequence of a small transformer's training steps, derived
//! from its layer shapes, replayed under PyTorch's standard configurations on a simulated
//! 24 GiB GPU. Needs no data files, so `tensormem` works on a fresh clone.

use std::io::Write;

use c10_cuda::history::TraceAction;

use crate::model::{FormatNotes, RecordedEvent, RecordedSettings, Snapshot};
use crate::replay::{ReplayOptions, replay};
use crate::report;
use crate::sweep::{standard_configs, sweep};

/// The shapes of the demo model (a GPT-style decoder, fp32).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DemoModel {
    /// Transformer blocks.
    pub layers: usize,
    /// Model width.
    pub d_model: usize,
    /// Attention heads.
    pub heads: usize,
    /// Sequence length.
    pub seq: usize,
    /// Batch size.
    pub batch: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// Training steps to record.
    pub steps: usize,
}

impl Default for DemoModel {
    fn default() -> Self {
        DemoModel {
            layers: 6,
            d_model: 1024,
            heads: 16,
            seq: 512,
            batch: 8,
            vocab: 32000,
            steps: 2,
        }
    }
}

/// Builds trace events: allocations get unique fake addresses; each free is followed by its
/// `free_completed`, as one stream without `record_stream` records them.
struct Recorder {
    events: Vec<RecordedEvent>,
    next_addr: u64,
}

impl Recorder {
    fn alloc(&mut self, bytes: usize) -> (u64, u64) {
        let addr = self.next_addr;
        self.next_addr += (bytes as u64).div_ceil(512).max(1) * 512;
        self.events.push(RecordedEvent::new(
            TraceAction::Alloc,
            addr,
            bytes as u64,
            0,
        ));
        (addr, bytes as u64)
    }

    fn free(&mut self, t: (u64, u64)) {
        for action in [TraceAction::FreeRequested, TraceAction::FreeCompleted] {
            self.events.push(RecordedEvent::new(action, t.0, t.1, 0));
        }
    }
}

const F32: usize = 4;

/// The alloc/free sequence of `model.steps` training steps (forward, backward, AdamW) as a
/// from-empty snapshot.
pub fn workload(model: &DemoModel) -> Snapshot {
    let m = model;
    let mut r = Recorder {
        events: Vec::new(),
        next_addr: 0x7f00_0000_0000,
    };
    let tokens = m.batch * m.seq;
    let d = m.d_model;
    // Parameters: embedding, per layer (ln1, qkv, proj, ln2, fc1, fc2), final ln, lm head tied.
    let mut params = vec![r.alloc(m.vocab * d * F32)];
    for _ in 0..m.layers {
        for numel in [
            2 * d,
            d * 3 * d + 3 * d,
            d * d + d,
            2 * d,
            d * 4 * d + 4 * d,
            4 * d * d + d,
        ] {
            params.push(r.alloc(numel * F32));
        }
    }
    params.push(r.alloc(2 * d * F32));
    let mut grads: Vec<(u64, u64)> = Vec::new();
    let mut adam: Vec<(u64, u64)> = Vec::new();
    let act = tokens * d * F32;
    for step in 0..m.steps {
        let ids = r.alloc(tokens * 8);
        let mut saved = vec![r.alloc(act)]; // embedding output
        for _ in 0..m.layers {
            let ln1 = r.alloc(act);
            let qkv = r.alloc(3 * act);
            let scores = r.alloc(m.batch * m.heads * m.seq * m.seq * F32);
            let probs = r.alloc(m.batch * m.heads * m.seq * m.seq * F32);
            r.free(scores);
            let ctx = r.alloc(act);
            let proj = r.alloc(act);
            let resid1 = r.alloc(act);
            let ln2 = r.alloc(act);
            let fc1 = r.alloc(4 * act);
            let gelu = r.alloc(4 * act);
            let fc2 = r.alloc(act);
            let resid2 = r.alloc(act);
            r.free(proj);
            r.free(fc2);
            saved.extend([ln1, qkv, probs, ctx, resid1, ln2, fc1, gelu, resid2]);
        }
        let lnf = r.alloc(act);
        let logits = r.alloc(tokens * m.vocab * F32);
        let loss = r.alloc(F32);
        // Backward: d(logits) replaces logits, then each layer in reverse.
        let dlogits = r.alloc(tokens * m.vocab * F32);
        r.free(logits);
        if grads.is_empty() {
            grads = params.iter().map(|&(_, b)| r.alloc(b as usize)).collect();
        }
        let mut dx = r.alloc(act);
        r.free(dlogits);
        r.free(lnf);
        for _ in 0..m.layers {
            let layer: Vec<_> = saved.split_off(saved.len() - 9);
            for (k, t) in layer.into_iter().enumerate().rev() {
                // The gradient w.r.t. each saved activation has its size; it lives briefly.
                let g = r.alloc(t.1 as usize);
                if k % 3 == 0 {
                    let tmp = r.alloc(act);
                    r.free(tmp);
                }
                r.free(t);
                r.free(dx);
                dx = g;
            }
        }
        r.free(dx);
        for t in saved.drain(..) {
            r.free(t);
        }
        r.free(ids);
        r.free(loss);
        // AdamW: two moment buffers per parameter, made at the first step.
        if adam.is_empty() {
            for &(_, b) in &params {
                adam.push(r.alloc(b as usize));
                adam.push(r.alloc(b as usize));
            }
        }
        for &(_, b) in &params {
            let tmp = r.alloc(b as usize);
            r.free(tmp);
        }
        if step + 1 < m.steps {
            // zero_grad(set_to_none=True) frees the gradients.
            for g in grads.drain(..) {
                r.free(g);
            }
        }
    }
    Snapshot {
        segments: Vec::new(),
        traces: vec![r.events],
        settings: RecordedSettings::Absent,
        external_annotations: None,
        format: FormatNotes {
            encoding: "built-in",
            ..FormatNotes::default()
        },
    }
}

/// Runs the demo and writes its report to `out`.
///
/// # Errors
/// An I/O error writing the report, or an allocator failure (not expected).
pub fn run(out: &mut dyn Write) -> Result<(), Box<dyn std::error::Error>> {
    let model = DemoModel::default();
    let snap = workload(&model);
    let capacity = 24usize << 30;
    writeln!(
        out,
        "tensormem demo: {} training steps of a {}-layer transformer (d_model {}, {} heads, \
         batch {} x {} tokens, vocab {}, fp32),\nreplayed through PyTorch's caching allocator \
         rules on a simulated 24 GiB GPU ({} allocator events).",
        model.steps,
        model.layers,
        model.d_model,
        model.heads,
        model.batch,
        model.seq,
        model.vocab,
        snap.traces[0].len()
    )?;
    let base = ReplayOptions::new(Default::default(), capacity, true);
    let rows = sweep(&snap, 0, &standard_configs(), &base, &mut |_, _, _| {})?;
    write!(out, "{}", report::sweep_table(&rows, capacity))?;
    let default = replay(
        &snap,
        0,
        &ReplayOptions::new(Default::default(), capacity, true),
        &mut |_, _| {},
    )?;
    write!(out, "{}", report::summaries(&default, 0))?;
    writeln!(
        out,
        "\nNext: replay a real snapshot from torch.cuda.memory._dump_snapshot():\n  \
         tensormem replay snapshot.pickle --sweep --device-memory 80GiB"
    )?;
    Ok(())
}
