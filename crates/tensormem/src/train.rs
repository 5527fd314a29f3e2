//! `tensormem train`: live Dynamic Tensor Rematerialization on a real training loop.
//!
//! A multi-layer perceptron or a one-block transformer classifier trains with SGD on
//! synthetic data (seeded: noisy copies of one random prototype per class), forward and
//! hand-written backward as `aten` ops on the host-backed simulated device
//! ([`aten::sim::install`]) through the `checkpoint` crate's live runtime. Each step is one
//! runtime, as in the DTR prototype's training loops: inputs and weights enter as checkpointed
//! constants, the step records its calls (forward, backward, SGD update), the new weights leave
//! with `decheckpoint`, and everything else is released. The same training runs once without a
//! budget (the baseline) and once under a hard budget on the caching allocator's allocated
//! bytes, or, with [`TrainOptions::device_budget`], on a host-backed simulated device whose
//! capacity is the budget (the allocator's misses drive the evictions,
//! [`checkpoint::device_budget`]); [`smallest_feasible`] searches the smallest budget that
//! still runs.

use std::fmt::Write as _;
use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

use aten::{Generator, Reduction, Tensor, TensorOptions};
use c10_core::{Device, ScalarType};
use c10_cuda::{CachingAllocator, SimDevice};
use checkpoint::live::{
    CheckpointTensor, CostModel, LiveConfig, LiveError, LiveProfile, LiveResult, LiveRuntime,
};
use checkpoint::{Config, Error, Heuristic, Strategy};

/// Which model trains.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Model {
    /// `layers` hidden layers of `width` with ReLU, then a linear classifier; biases.
    Mlp,
    /// One single-head self-attention block with residual connections and a ReLU feed-forward
    /// layer of `4 × width`, mean-pooled over `seq` tokens, then a linear classifier.
    Transformer,
}

impl Model {
    /// `mlp` or `transformer`.
    pub fn name(self) -> &'static str {
        match self {
            Model::Mlp => "mlp",
            Model::Transformer => "transformer",
        }
    }
}

impl std::str::FromStr for Model {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "mlp" => Ok(Model::Mlp),
            "transformer" => Ok(Model::Transformer),
            other => Err(format!(
                "unknown model {other:?} (expected mlp or transformer)"
            )),
        }
    }
}

/// What to train and how.
#[derive(Clone, Debug)]
pub struct TrainOptions {
    /// The model.
    pub model: Model,
    /// Samples per step.
    pub batch: i64,
    /// Input features (the MLP) or the model width (the transformer's `d_model`).
    pub features: i64,
    /// Hidden width (the MLP); the transformer uses `features`.
    pub width: i64,
    /// Hidden layers (the MLP).
    pub layers: usize,
    /// Tokens per sample (the transformer).
    pub seq: i64,
    /// Classes.
    pub classes: i64,
    /// SGD steps.
    pub steps: usize,
    /// Learning rate.
    pub lr: f64,
    /// Seed of the data and the initial weights.
    pub seed: u64,
    /// Eviction heuristic.
    pub heuristic: Heuristic,
    /// Measured or estimated op costs.
    pub cost: CostModel,
    /// Hash every value and compare every recomputation with it.
    pub check_remat: bool,
    /// A step whose rematerialization compute passes `(limit - 1) ×` the baseline's compute
    /// per step stops with thrashing (simrd's cut-off; 2.0 there).
    pub overhead_limit: f64,
    /// The simulated device index.
    pub device: u8,
    /// The budget is a device's capacity: each budgeted run installs a fresh host-backed
    /// simulated device of that many bytes ([`aten::sim::install`]) and evicts on the caching
    /// allocator's misses; nothing is counted.
    pub device_budget: bool,
    /// How to make room on a miss under a device budget (default [`Strategy::Window`], not the
    /// library's [`Strategy::WindowMoveAll`]: the live driver cannot copy blocks, so there
    /// `window-move-all` is only `window`'s plans made for whole 2 MiB small segments, which
    /// evicts more on small devices; see the README).
    pub strategy: Strategy,
}

impl Default for TrainOptions {
    fn default() -> Self {
        TrainOptions {
            model: Model::Mlp,
            batch: 512,
            features: 128,
            width: 128,
            layers: 8,
            seq: 32,
            classes: 10,
            steps: 5,
            lr: 0.05,
            seed: 1,
            heuristic: Heuristic::DtrEq,
            cost: CostModel::Measured,
            check_remat: true,
            overhead_limit: 2.0,
            device: 0,
            device_budget: false,
            strategy: Strategy::Window,
        }
    }
}

/// What one training run did. Bytes and ns throughout.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunReport {
    /// The budget (`None`: the baseline).
    pub budget: Option<u64>,
    /// Loss after each step's forward pass.
    pub losses: Vec<f32>,
    /// The allocator's `allocated_bytes.all.peak` over the run (peak stats reset at its start).
    pub peak_allocated: u64,
    /// The allocator's `reserved_bytes.all.peak` over the run (cache emptied at its start).
    pub peak_reserved: u64,
    /// Compute of the program's calls (measured or estimated).
    pub base_compute_ns: u64,
    /// Compute spent rematerializing.
    pub remat_compute_ns: u64,
    /// Wall-clock time choosing victims.
    pub search_ns: u64,
    /// Evictions by the heuristic.
    pub evictions: u64,
    /// Evictions when a last reference died.
    pub eager_evictions: u64,
    /// Calls rerun.
    pub remats: u64,
    /// Values hashed on first computation (debug check).
    pub hashed: u64,
    /// Recomputed values compared with their first computation, all equal (debug check).
    pub remat_checked: u64,
    /// Wall-clock time of the whole run.
    pub wall_ns: u64,
}

impl RunReport {
    /// Base plus rematerialization compute.
    pub fn compute_ns(&self) -> u64 {
        self.base_compute_ns + self.remat_compute_ns
    }

    /// This run's compute over `baseline`'s (simrd's overhead).
    pub fn overhead(&self, baseline: &RunReport) -> f64 {
        self.compute_ns() as f64 / baseline.compute_ns().max(1) as f64
    }
}

/// Host tensors of one step's data.
struct Batch {
    x: Tensor,
    y: Tensor,
    onehot: Tensor,
}

fn host_err(op: &'static str) -> impl FnOnce(aten::Error) -> LiveError {
    move |source| LiveError::Op {
        op: op.into(),
        source,
    }
}

impl TrainOptions {
    fn input_shape(&self) -> Vec<i64> {
        match self.model {
            Model::Mlp => vec![self.batch, self.features],
            Model::Transformer => vec![self.batch, self.seq, self.features],
        }
    }

    /// The parameters' shapes and init scales (He for ReLU layers).
    fn param_shapes(&self) -> Vec<(Vec<i64>, f64)> {
        let he = |fan_in: i64| (2.0 / fan_in as f64).sqrt();
        match self.model {
            Model::Mlp => {
                let mut v = Vec::new();
                let mut fan_in = self.features;
                for _ in 0..self.layers {
                    v.push((vec![fan_in, self.width], he(fan_in)));
                    v.push((vec![self.width], 0.0));
                    fan_in = self.width;
                }
                v.push((vec![fan_in, self.classes], he(fan_in)));
                v.push((vec![self.classes], 0.0));
                v
            }
            Model::Transformer => {
                let d = self.features;
                let f = 4 * d;
                let s = 1.0 / (d as f64).sqrt();
                vec![
                    (vec![d, d], s),                       // Wq
                    (vec![d, d], s),                       // Wk
                    (vec![d, d], s),                       // Wv
                    (vec![d, d], s),                       // Wo
                    (vec![d, f], he(d)),                   // W1
                    (vec![f, d], 1.0 / (f as f64).sqrt()), // W2
                    (vec![d, self.classes], s),            // Wc
                ]
            }
        }
    }

    fn init_params(&self) -> LiveResult<Vec<Tensor>> {
        let mut g = Generator::new(self.seed.wrapping_mul(0x9e37_79b9).wrapping_add(17));
        self.param_shapes()
            .into_iter()
            .map(|(shape, scale)| {
                if scale == 0.0 {
                    Tensor::zeros(&shape, ScalarType::Float)
                } else {
                    Tensor::randn(&shape, &mut g, TensorOptions::new())?.mul_scalar(scale)
                }
            })
            .collect::<aten::Result<Vec<_>>>()
            .map_err(host_err("init"))
    }

    /// Step `step`'s samples: a seeded random class each, and inputs that are its class's
    /// fixed random prototype (one per class, the same for every step) plus unit Gaussian noise
    /// (on every token, for the transformer).
    fn batch(&self, step: usize) -> LiveResult<Batch> {
        let e = || host_err("data");
        let d = self.features as usize;
        let classes = self.classes as usize;
        let mut proto_gen = Generator::new(self.seed ^ 0x7ea_c4e5);
        let protos = Tensor::randn(
            &[self.classes, self.features],
            &mut proto_gen,
            TensorOptions::new(),
        )
        .and_then(|t| t.to_vec::<f32>())
        .map_err(e())?;
        let mut g = Generator::new(self.seed.wrapping_add(1000 + step as u64));
        let draws = Tensor::rand(&[self.batch], &mut g, TensorOptions::new())
            .and_then(|t| t.to_vec::<f32>())
            .map_err(e())?;
        let labels: Vec<i64> = draws
            .iter()
            .map(|&u| ((u * classes as f32) as usize).min(classes - 1) as i64)
            .collect();
        let mut x = Tensor::randn(&self.input_shape(), &mut g, TensorOptions::new())
            .and_then(|t| t.to_vec::<f32>())
            .map_err(e())?;
        let per_sample = x.len() / labels.len().max(1);
        for (b, &c) in labels.iter().enumerate() {
            let proto = &protos[c as usize * d..(c as usize + 1) * d];
            for (v, p) in x[b * per_sample..(b + 1) * per_sample]
                .iter_mut()
                .zip(proto.iter().cycle())
            {
                *v += p;
            }
        }
        let mut hot = vec![0f32; labels.len() * classes];
        for (i, &c) in labels.iter().enumerate() {
            hot[i * classes + c as usize] = 1.0;
        }
        Ok(Batch {
            x: Tensor::from_vec(x, &self.input_shape()).map_err(e())?,
            y: Tensor::from_vec(labels, &[self.batch]).map_err(e())?,
            onehot: Tensor::from_vec(hot, &[self.batch, self.classes]).map_err(e())?,
        })
    }
}

/// Softmax cross-entropy: the loss and `dlogits = (softmax - onehot) / batch`.
fn loss_and_grad<'a>(
    rt: &'a LiveRuntime,
    logits: &CheckpointTensor<'a>,
    y: &CheckpointTensor<'a>,
    onehot: &CheckpointTensor<'a>,
    batch: i64,
) -> LiveResult<(CheckpointTensor<'a>, CheckpointTensor<'a>)> {
    let loss = logits.log_softmax(1)?.nll_loss(y, Reduction::Mean)?;
    loss.pin()?;
    rt.annotate_log("BACKWARD")?;
    let dlogits = logits
        .softmax(1)?
        .sub(onehot)?
        .mul_scalar(1.0 / batch as f64)?;
    Ok((loss, dlogits))
}

/// `p - lr * grad`, pinned: the updated weights leave the step (as an optimizer writes into
/// plain parameters outside the checkpointed graph), so evicting them would only mean
/// recomputing the whole backward pass behind them later.
fn sgd<'a>(
    p: &CheckpointTensor<'a>,
    grad: &CheckpointTensor<'a>,
    lr: f64,
) -> LiveResult<CheckpointTensor<'a>> {
    let new = p.sub(&grad.mul_scalar(lr)?)?;
    new.pin()?;
    Ok(new)
}

/// One MLP step: returns the loss and the updated parameters (in `params` order).
fn mlp_step<'a>(
    rt: &'a LiveRuntime,
    o: &TrainOptions,
    params: &[CheckpointTensor<'a>],
    x: &CheckpointTensor<'a>,
    y: &CheckpointTensor<'a>,
    onehot: &CheckpointTensor<'a>,
) -> LiveResult<(CheckpointTensor<'a>, Vec<CheckpointTensor<'a>>)> {
    let n = params.len() / 2;
    // Forward: h[0] = x, z[i] = h[i] W[i] + b[i], h[i+1] = relu(z[i]).
    let mut hs: Vec<CheckpointTensor<'a>> = vec![x.clone()];
    let mut zs: Vec<CheckpointTensor<'a>> = Vec::with_capacity(n);
    for i in 0..n {
        let z = hs[i].mm(&params[2 * i])?.add(&params[2 * i + 1])?;
        if i + 1 < n {
            hs.push(z.relu()?);
        }
        zs.push(z);
    }
    let logits = zs.pop().expect("at least one layer");
    let (loss, mut dz) = loss_and_grad(rt, &logits, y, onehot, o.batch)?;
    drop(logits);
    // Backward, releasing each saved activation after its last use (as autograd does).
    let mut new = vec![None; params.len()];
    for i in (0..n).rev() {
        let h = hs.pop().expect("saved input");
        let dw = h.t()?.mm(&dz)?;
        drop(h);
        let db = dz.sum(&[0], false)?;
        if i > 0 {
            let dh = dz.mm(&params[2 * i].t()?)?;
            let z = zs.pop().expect("saved pre-activation");
            dz = dh.threshold_backward(&z, 0.0)?;
        }
        new[2 * i] = Some(sgd(&params[2 * i], &dw, o.lr)?);
        new[2 * i + 1] = Some(sgd(&params[2 * i + 1], &db, o.lr)?);
    }
    Ok((loss, new.into_iter().map(|p| p.expect("updated")).collect()))
}

/// One transformer step: returns the loss and the updated parameters.
fn transformer_step<'a>(
    rt: &'a LiveRuntime,
    o: &TrainOptions,
    params: &[CheckpointTensor<'a>],
    x: &CheckpointTensor<'a>,
    y: &CheckpointTensor<'a>,
    onehot: &CheckpointTensor<'a>,
) -> LiveResult<(CheckpointTensor<'a>, Vec<CheckpointTensor<'a>>)> {
    let (b, t, d) = (o.batch, o.seq, o.features);
    let scale = 1.0 / (d as f64).sqrt();
    let [wq, wk, wv, wo, w1, w2, wc] = params else {
        return Err(LiveError::InvalidArgument(
            "the transformer has 7 parameters".into(),
        ));
    };
    // Forward.
    let x2 = x.view(&[b * t, d])?;
    let q = x2.mm(wq)?.view(&[b, t, d])?;
    let k = x2.mm(wk)?.view(&[b, t, d])?;
    let v = x2.mm(wv)?.view(&[b, t, d])?;
    let p = q.bmm(&k.transpose(1, 2)?)?.mul_scalar(scale)?.softmax(2)?;
    let a = p.bmm(&v)?.view(&[b * t, d])?;
    let r1 = a.mm(wo)?.add(&x2)?;
    let f1 = r1.mm(w1)?;
    let g = f1.relu()?;
    let r2 = g.mm(w2)?.add(&r1)?;
    let pooled = r2.view(&[b, t, d])?.mean(&[1], false)?;
    drop(r2);
    let logits = pooled.mm(wc)?;
    let (loss, dlogits) = loss_and_grad(rt, &logits, y, onehot, b)?;
    drop(logits);
    // Backward.
    let dwc = pooled.t()?.mm(&dlogits)?;
    drop(pooled);
    let dr2 = dlogits
        .mm(&wc.t()?)?
        .unsqueeze(1)?
        .expand(&[b, t, d])?
        .mul_scalar(1.0 / t as f64)?
        .view(&[b * t, d])?;
    drop(dlogits);
    let dw2 = g.t()?.mm(&dr2)?;
    drop(g);
    let df1 = dr2.mm(&w2.t()?)?.threshold_backward(&f1, 0.0)?;
    drop(f1);
    let dw1 = r1.t()?.mm(&df1)?;
    drop(r1);
    let dr1 = df1.mm(&w1.t()?)?.add(&dr2)?;
    drop((df1, dr2));
    let dwo = a.t()?.mm(&dr1)?;
    drop(a);
    let da = dr1.mm(&wo.t()?)?.view(&[b, t, d])?;
    drop(dr1);
    let dv = p.transpose(1, 2)?.bmm(&da)?.view(&[b * t, d])?;
    let dp = da.bmm(&v.transpose(1, 2)?)?;
    drop((da, v));
    // Softmax backward: ds = p * (dp - sum(dp * p, -1)), times the score scale.
    let sm = dp.mul(&p)?.sum(&[2], true)?;
    let ds = dp.sub(&sm)?.mul(&p)?.mul_scalar(scale)?;
    drop((dp, sm, p));
    let dq = ds.bmm(&k)?.view(&[b * t, d])?;
    let dk = ds.transpose(1, 2)?.bmm(&q)?.view(&[b * t, d])?;
    drop((ds, q, k));
    let x2t = x2.t()?;
    let dwq = x2t.mm(&dq)?;
    let dwk = x2t.mm(&dk)?;
    let dwv = x2t.mm(&dv)?;
    drop((dq, dk, dv, x2t, x2));
    let grads = [dwq, dwk, dwv, dwo, dw1, dw2, dwc];
    let new = params
        .iter()
        .zip(&grads)
        .map(|(p, g)| sgd(p, g, o.lr))
        .collect::<LiveResult<Vec<_>>>()?;
    Ok((loss, new))
}

/// A log destination for one training step.
pub type LogSink = Box<dyn Write + Send>;

/// The initial parameters on the host (seeded; He init for ReLU layers, zero biases).
///
/// # Errors
/// [`LiveError::Op`] from aten.
pub fn init_params(o: &TrainOptions) -> LiveResult<Vec<Tensor>> {
    o.init_params()
}

/// One SGD step in a fresh runtime on `front`'s device `o.device`: the step's data and
/// `params` enter as constants (host tensors are copied to the device under the budget, device
/// tensors adopted), forward, backward and update run as live calls, and the updated parameters
/// leave with `decheckpoint`. Returns the loss, the new parameters (on the device) and the
/// runtime's counters. With `log`, the step's events are written in the DTR paper's format.
///
/// # Errors
/// As [`train`].
pub fn step(
    front: &Arc<CachingAllocator<SimDevice>>,
    o: &TrainOptions,
    params: Vec<Tensor>,
    index: usize,
    budget: Option<u64>,
    remat_limit_ns: Option<u64>,
    log: Option<LogSink>,
) -> LiveResult<(f32, Vec<Tensor>, LiveProfile)> {
    let data = o.batch(index)?;
    let on_device = o.device_budget && budget.is_some();
    let config = LiveConfig {
        runtime: Config {
            budget: if on_device { None } else { budget },
            heuristic: o.heuristic,
            remat_limit_ns,
            seed: o.seed,
            strategy: o.strategy,
            ..Config::default()
        },
        check_remat: o.check_remat,
        cost: o.cost,
        device_budget: on_device,
    };
    let rt = LiveRuntime::new(Arc::clone(front), Device::sim(o.device), config)?;
    if let Some(sink) = log {
        rt.new_log(sink);
        rt.annotate_log("START")?;
    }
    let (loss, new) = {
        let x = rt.checkpoint(data.x)?;
        let y = rt.checkpoint(data.y)?;
        let onehot = rt.checkpoint(data.onehot)?;
        let ps = params
            .into_iter()
            .map(|p| rt.checkpoint(p))
            .collect::<LiveResult<Vec<_>>>()?;
        let (loss, new) = match o.model {
            Model::Mlp => mlp_step(&rt, o, &ps, &x, &y, &onehot)?,
            Model::Transformer => transformer_step(&rt, o, &ps, &x, &y, &onehot)?,
        };
        drop((ps, x, y, onehot));
        let value = loss
            .decheckpoint()?
            .item::<f32>()
            .map_err(host_err("loss"))?;
        let new = new
            .iter()
            .map(CheckpointTensor::decheckpoint)
            .collect::<LiveResult<Vec<_>>>()?;
        (value, new)
    };
    rt.close_log()?;
    Ok((loss, new, rt.profile()))
}

/// Trains for `o.steps` steps under `budget` (bytes of allocated memory; `None`: the baseline)
/// on `front`'s device `o.device`, which must be idle: its cache is emptied and its peak
/// statistics reset first. `remat_limit_ns` stops a step that spends more than that
/// rematerializing (thrashing). With `log`, the last step's events are written in the DTR
/// paper's format.
///
/// With [`TrainOptions::device_budget`] and a budget, the run does not use `front`: it installs
/// a fresh host-backed simulated device whose capacity is the budget (the devices `0..=o.device`
/// of a new [`aten::sim::install`]) and runs there; reserved bytes can never pass it.
///
/// # Errors
/// [`LiveError`]: out of memory or thrashing under the budget (`LiveError::Runtime`), a loud
/// failure of the budget ([`LiveError::BudgetExceeded`]) or of the remat check
/// ([`LiveError::RematMismatch`]), a log write error.
pub fn train(
    front: &Arc<CachingAllocator<SimDevice>>,
    o: &TrainOptions,
    budget: Option<u64>,
    remat_limit_ns: Option<u64>,
    log: Option<LogSink>,
) -> LiveResult<RunReport> {
    match budget {
        Some(capacity) if o.device_budget => {
            let config = front
                .with_device(o.device, |d| d.config().clone())
                .map_err(|e| LiveError::InvalidArgument(format!("sim:{}: {e}", o.device)))?;
            let bytes = usize::try_from(capacity).unwrap_or(usize::MAX);
            let device =
                aten::sim::install_with_config(o.device + 1, bytes, config).map_err(|e| {
                    LiveError::InvalidArgument(format!("a {capacity}-byte device: {e}"))
                })?;
            let run = train_on(&device, o, budget, remat_limit_ns, log);
            // Later tensors go to the caller's device again.
            aten::sim::reinstall(front).map_err(|e| LiveError::InvalidArgument(e.to_string()))?;
            run
        }
        _ => train_on(front, o, budget, remat_limit_ns, log),
    }
}

fn train_on(
    front: &Arc<CachingAllocator<SimDevice>>,
    o: &TrainOptions,
    budget: Option<u64>,
    remat_limit_ns: Option<u64>,
    mut log: Option<LogSink>,
) -> LiveResult<RunReport> {
    let dev = o.device;
    let cuda = |e: c10_cuda::Error| LiveError::InvalidArgument(format!("sim:{dev}: {e}"));
    front.empty_cache().map_err(cuda)?;
    front.reset_peak_stats(dev).map_err(cuda)?;
    let start = Instant::now();
    let mut report = RunReport {
        budget,
        ..RunReport::default()
    };
    let mut params = o.init_params()?;
    for i in 0..o.steps {
        let sink = if i + 1 == o.steps { log.take() } else { None };
        let (loss, new, p) = step(front, o, params, i, budget, remat_limit_ns, sink)?;
        params = new;
        report.losses.push(loss);
        report.base_compute_ns += p.runtime.base_compute_ns;
        report.remat_compute_ns += p.runtime.remat_compute_ns;
        report.search_ns += p.runtime.search_ns;
        report.evictions += p.runtime.evictions;
        report.eager_evictions += p.runtime.eager_evictions;
        report.remats += p.runtime.remats;
        report.hashed += p.counters.hashed;
        report.remat_checked += p.counters.remat_checked;
    }
    drop(params);
    report.wall_ns = start.elapsed().as_nanos() as u64;
    let stats = front.memory_stats(dev).map_err(cuda)?;
    report.peak_allocated = stats["allocated_bytes.all.peak"].max(0) as u64;
    report.peak_reserved = stats["reserved_bytes.all.peak"].max(0) as u64;
    if let (Some(b), true) = (budget, o.device_budget) {
        if report.peak_reserved > b {
            return Err(LiveError::Internal {
                message: format!(
                    "{} bytes reserved on a device of {b} bytes",
                    report.peak_reserved
                ),
            });
        }
    } else if let Some(b) = budget {
        if report.peak_allocated > b {
            return Err(LiveError::BudgetExceeded {
                op: "training".into(),
                allocated: report.peak_allocated,
                budget: b,
            });
        }
    }
    Ok(report)
}

/// Whether `e` means the budget is too small (out of memory, or thrashing past the limit).
pub fn is_infeasible(e: &LiveError) -> bool {
    matches!(
        e,
        LiveError::Runtime(Error::OutOfMemory { .. } | Error::Thrashing { .. })
    )
}

/// The thrashing limit for runs compared with `baseline`: `(limit - 1) ×` its compute per step.
pub fn remat_limit(o: &TrainOptions, baseline: &RunReport) -> u64 {
    let per_step = baseline.compute_ns() / o.steps.max(1) as u64;
    ((o.overhead_limit - 1.0).max(0.0) * per_step as f64) as u64
}

/// The result of [`smallest_feasible`].
#[derive(Clone, Debug)]
pub struct Search {
    /// The smallest feasible ratio found (of the baseline's peak allocated bytes).
    pub ratio: f64,
    /// Its budget, bytes.
    pub budget: u64,
    /// Its run.
    pub run: RunReport,
    /// Runs tried.
    pub tries: usize,
}

/// Bisects the budget ratio in (0, 1] of `baseline.peak_allocated` for `iterations` rounds:
/// the smallest ratio whose run completes without running out of memory or thrashing.
///
/// # Errors
/// Any [`LiveError`] other than out of memory and thrashing.
pub fn smallest_feasible(
    front: &Arc<CachingAllocator<SimDevice>>,
    o: &TrainOptions,
    baseline: &RunReport,
    iterations: usize,
) -> LiveResult<Search> {
    let limit = Some(remat_limit(o, baseline));
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    let mut best: Option<Search> = None;
    let mut tries = 0;
    for _ in 0..iterations {
        let mid = (lo + hi) / 2.0;
        let budget = checkpoint::budget_for_ratio(baseline.peak_allocated, mid);
        tries += 1;
        match train(front, o, Some(budget), limit, None) {
            Ok(run) => {
                hi = mid;
                best = Some(Search {
                    ratio: mid,
                    budget,
                    run,
                    tries: 0,
                });
            }
            Err(e) if is_infeasible(&e) => lo = mid,
            Err(e) => return Err(e),
        }
    }
    let mut s = match best {
        Some(s) => s,
        None => {
            tries += 1;
            // A device also holds the cache's rounding: give it what the baseline reserved.
            let budget = if o.device_budget {
                baseline.peak_reserved.max(baseline.peak_allocated)
            } else {
                baseline.peak_allocated
            };
            let run = train(front, o, Some(budget), limit, None)?;
            Search {
                ratio: budget as f64 / baseline.peak_allocated.max(1) as f64,
                budget,
                run,
                tries: 0,
            }
        }
    };
    s.tries = tries;
    Ok(s)
}

/// `1,234,567`.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn mib(bytes: u64) -> String {
    format!("{:.2} MiB", bytes as f64 / (1u64 << 20) as f64)
}

fn ms(ns: u64) -> String {
    format!("{:.1} ms", ns as f64 / 1e6)
}

/// How the budget was chosen, for the report.
#[derive(Clone, Debug)]
pub enum BudgetChoice {
    /// `--budget`.
    Bytes,
    /// `--ratio`.
    Ratio(f64),
    /// The search: ratio and runs tried.
    Searched {
        /// The smallest feasible ratio found.
        ratio: f64,
        /// Runs tried.
        tries: usize,
    },
}

/// The report `tensormem train` prints.
pub fn report(
    o: &TrainOptions,
    baseline: &RunReport,
    run: &RunReport,
    choice: &BudgetChoice,
) -> String {
    let mut out = String::new();
    let shape = match o.model {
        Model::Mlp => format!(
            "{} hidden layers of {}, {} features",
            o.layers, o.width, o.features
        ),
        Model::Transformer => format!(
            "one attention block, width {}, {} tokens",
            o.features, o.seq
        ),
    };
    let _ = writeln!(
        out,
        "tensormem train: {} ({shape}, {} classes), batch {}, {} SGD steps (lr {}, seed {})",
        o.model.name(),
        o.classes,
        o.batch,
        o.steps,
        o.lr,
        o.seed
    );
    let _ = writeln!(
        out,
        "sim:{} (host-backed simulated device, caching allocator); heuristic {}; costs {}; remat check {}",
        o.device,
        o.heuristic,
        match o.cost {
            CostModel::Measured => "measured",
            CostModel::Estimated => "estimated",
        },
        if o.check_remat { "on" } else { "off" }
    );
    let unit = match o.cost {
        CostModel::Measured => "ns",
        CostModel::Estimated => "units",
    };
    let _ = writeln!(
        out,
        "\nbaseline (no budget): peak allocated {} B ({}), peak reserved {} B ({}), compute {} {unit}",
        thousands(baseline.peak_allocated),
        mib(baseline.peak_allocated),
        thousands(baseline.peak_reserved),
        mib(baseline.peak_reserved),
        thousands(baseline.compute_ns())
    );
    let budget = run.budget.unwrap_or(0);
    let ratio = budget as f64 / baseline.peak_allocated.max(1) as f64;
    if o.device_budget {
        let _ = writeln!(
            out,
            "device-memory budget: the budget is the capacity of a host-backed simulated device; evictions on the allocator's misses, strategy {}",
            o.strategy
        );
    }
    match choice {
        BudgetChoice::Bytes => {
            let _ = writeln!(
                out,
                "budget: {} B (--budget), {ratio:.4} of the baseline peak",
                thousands(budget)
            );
        }
        BudgetChoice::Ratio(r) => {
            let _ = writeln!(
                out,
                "budget: {} B (--ratio {r}), {ratio:.4} of the baseline peak",
                thousands(budget)
            );
        }
        BudgetChoice::Searched { ratio: r, tries } => {
            let _ = writeln!(
                out,
                "budget: {} B, the smallest feasible ratio found, {r:.4} of the baseline peak ({tries} runs bisecting; below it: out of memory or thrashing past {}x)",
                thousands(budget),
                o.overhead_limit
            );
        }
    }
    let _ = writeln!(
        out,
        "\n{:>4}  {:>16}  {:>16}  bit-identical",
        "step", "loss (no budget)", "loss (budget)"
    );
    for (i, (a, b)) in baseline.losses.iter().zip(&run.losses).enumerate() {
        let _ = writeln!(
            out,
            "{:>4}  {:>16.8}  {:>16.8}  {}",
            i + 1,
            a,
            b,
            if a.to_bits() == b.to_bits() {
                "yes"
            } else {
                "NO"
            }
        );
    }
    let all_equal = baseline.losses.len() == run.losses.len()
        && baseline
            .losses
            .iter()
            .zip(&run.losses)
            .all(|(a, b)| a.to_bits() == b.to_bits());
    if o.device_budget {
        let _ = writeln!(
            out,
            "\nbudgeted run: peak reserved {} B {} device capacity {} B; peak allocated {} B",
            thousands(run.peak_reserved),
            if run.peak_reserved <= budget {
                "<="
            } else {
                "OVER"
            },
            thousands(budget),
            thousands(run.peak_allocated)
        );
    } else {
        let _ = writeln!(
            out,
            "\nbudgeted run: peak allocated {} B {} budget {} B; peak reserved {} B ({:.2}x the budget)",
            thousands(run.peak_allocated),
            if run.peak_allocated <= budget {
                "<="
            } else {
                "OVER"
            },
            thousands(budget),
            thousands(run.peak_reserved),
            run.peak_reserved as f64 / budget.max(1) as f64
        );
    }
    let _ = writeln!(
        out,
        "  evictions {} (and {} eager, at last release), rematerializations {}",
        thousands(run.evictions),
        thousands(run.eager_evictions),
        thousands(run.remats)
    );
    if o.check_remat {
        let _ = writeln!(
            out,
            "  remat check: {} values hashed, {} recomputed values bit-identical to their first computation",
            thousands(run.hashed),
            thousands(run.remat_checked)
        );
    }
    let _ = writeln!(
        out,
        "  compute: {} {unit} base + {} {unit} remat = overhead {:.3}x the baseline's {} {unit} (remat adds {:.1}% to this run's base)",
        thousands(run.base_compute_ns),
        thousands(run.remat_compute_ns),
        run.overhead(baseline),
        thousands(baseline.compute_ns()),
        100.0 * run.remat_compute_ns as f64 / run.base_compute_ns.max(1) as f64
    );
    let _ = writeln!(
        out,
        "  wall time: {} (baseline {}), eviction search {}",
        ms(run.wall_ns),
        ms(baseline.wall_ns),
        ms(run.search_ns)
    );
    let _ = writeln!(
        out,
        "losses with and without the budget: {}",
        if all_equal {
            "bit-identical"
        } else {
            "DIFFERENT"
        }
    );
    out
}
