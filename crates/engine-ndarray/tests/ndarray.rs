//! MXNet's NDArray over aten (`engine-ndarray`): a random program of async tensor
//! ops equals the same program run synchronously on aten, bit for bit, on every engine and on
//! the simulated device; host copies check sizes and wait for pending writes (or reads); op
//! errors are delivered once and skip dependent ops; dropped arrays keep their memory until
//! their pending ops ran; views share the variable.

// The engine's test helpers (the engine matrix, the hang guard), shared rather than copied.
#[path = "../../engine/tests/common/mod.rs"]
mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use aten::{Generator, Tensor, TensorOptions};
use c10_core::{Device, ScalarType};
use engine::workloads::SplitMix64;
use engine::{Engine, EngineKind};
use engine_ndarray::{NDArray, NDArrayError};

/// `sim:0` for the tests that compute on the simulated device, `sim:1` only for the memory
/// accounting test (its statistics must not see other tests' tensors).
fn sim() {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        aten::sim::install(2, 64 << 20).expect("install the simulated devices");
    });
}

const SIDE: i64 = 8;
const ARRAYS: usize = 20;
const STEPS: usize = 200;

/// One step of a random program over the array slots.
#[derive(Debug, Clone, Copy)]
enum Step {
    Add(usize, usize, usize),
    Sub(usize, usize, usize),
    Mul(usize, usize, usize),
    /// `d = (a @ b) * 0.125`: two pushes.
    MatMul(usize, usize, usize),
    Relu(usize, usize),
    Tanh(usize, usize),
    /// `d = a.sum(dim 1, keepdim) + b`: a reduction, then a broadcast.
    SumAdd(usize, usize, usize),
    /// `d += a` in place (`a` may be `d`).
    AddInPlace(usize, usize),
    /// `d *= 0.5` in place.
    Halve(usize),
    /// `d = tanh(a copied to the other device) copied back`.
    RoundTrip(usize, usize),
    /// `d <- a` (MXNet's CopyFromTo into an existing array).
    CopyFrom(usize, usize),
    /// `d <- host data` (SyncCopyFromCPU) drawn from the seed.
    Load(usize, u64),
    /// Read `a` back to the host mid-program (SyncCopyToCPU).
    Read(usize),
}

fn program(seed: u64) -> Vec<Step> {
    let mut rng = SplitMix64::new(seed);
    let mut pick = move |n: usize| (rng.next_u64() % n as u64) as usize;
    (0..STEPS)
        .map(|_| {
            let (a, b, d) = (pick(ARRAYS), pick(ARRAYS), pick(ARRAYS));
            match pick(13) {
                0 => Step::Add(a, b, d),
                1 => Step::Sub(a, b, d),
                2 => Step::Mul(a, b, d),
                3 => Step::MatMul(a, b, d),
                4 => Step::Relu(a, d),
                5 => Step::Tanh(a, d),
                6 => Step::SumAdd(a, b, d),
                7 => Step::AddInPlace(d, a),
                8 => Step::Halve(d),
                9 => Step::RoundTrip(a, d),
                10 => Step::CopyFrom(d, a),
                11 => Step::Load(d, pick(1 << 30) as u64),
                _ => Step::Read(a),
            }
        })
        .collect()
}

fn host_data(seed: u64) -> Vec<f32> {
    let mut rng = SplitMix64::new(seed);
    (0..SIDE * SIDE)
        .map(|_| (rng.next_u64() % 2001) as f32 / 1000.0 - 1.0)
        .collect()
}

fn initial(seed: u64, device: Device) -> Vec<Tensor> {
    let mut generator = Generator::new(seed);
    (0..ARRAYS)
        .map(|_| {
            Tensor::rand(
                &[SIDE, SIDE],
                &mut generator,
                TensorOptions::new().device(device),
            )
            .unwrap()
        })
        .collect()
}

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

/// The program run synchronously on aten: the final arrays and the mid-program reads.
fn run_sync(
    steps: &[Step],
    seed: u64,
    device: Device,
    other: Device,
) -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    let mut x = initial(seed, device);
    let mut reads = Vec::new();
    for &step in steps {
        match step {
            Step::Add(a, b, d) => x[d] = x[a].add(&x[b]).unwrap(),
            Step::Sub(a, b, d) => x[d] = x[a].sub(&x[b]).unwrap(),
            Step::Mul(a, b, d) => x[d] = x[a].mul(&x[b]).unwrap(),
            Step::MatMul(a, b, d) => x[d] = x[a].matmul(&x[b]).unwrap().mul_scalar(0.125).unwrap(),
            Step::Relu(a, d) => x[d] = x[a].relu().unwrap(),
            Step::Tanh(a, d) => x[d] = x[a].tanh().unwrap(),
            Step::SumAdd(a, b, d) => {
                x[d] = x[a].sum(&[1], true).unwrap().add(&x[b]).unwrap();
            }
            Step::AddInPlace(d, a) => x[d].add_(&x[a]).unwrap(),
            Step::Halve(d) => x[d].mul_scalar_(0.5).unwrap(),
            Step::RoundTrip(a, d) => {
                x[d] = x[a].to(other).unwrap().tanh().unwrap().to(device).unwrap();
            }
            Step::CopyFrom(d, a) => x[d].copy_(&x[a]).unwrap(),
            Step::Load(d, s) => x[d].sync_copy_from_cpu(&host_data(s)).unwrap(),
            Step::Read(a) => reads.push(bits(&x[a].to_vec::<f32>().unwrap())),
        }
    }
    let finals = x
        .iter()
        .map(|t| bits(&t.to_vec::<f32>().unwrap()))
        .collect();
    (finals, reads)
}

/// The same program pushed to `engine` through NDArray.
fn run_async(
    engine: &Arc<dyn Engine>,
    steps: &[Step],
    seed: u64,
    device: Device,
    other: Device,
) -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    let mut x: Vec<NDArray> = initial(seed, device)
        .into_iter()
        .map(|t| NDArray::new(engine, t).unwrap())
        .collect();
    let mut reads = Vec::new();
    for &step in steps {
        match step {
            Step::Add(a, b, d) => x[d] = x[a].add(&x[b]).unwrap(),
            Step::Sub(a, b, d) => x[d] = x[a].sub(&x[b]).unwrap(),
            Step::Mul(a, b, d) => x[d] = x[a].mul(&x[b]).unwrap(),
            Step::MatMul(a, b, d) => x[d] = x[a].matmul(&x[b]).unwrap().mul_scalar(0.125).unwrap(),
            Step::Relu(a, d) => x[d] = x[a].relu().unwrap(),
            Step::Tanh(a, d) => x[d] = x[a].tanh().unwrap(),
            Step::SumAdd(a, b, d) => {
                x[d] = x[a].sum(&[1], true).unwrap().add(&x[b]).unwrap();
            }
            Step::AddInPlace(d, a) => x[d].add_(&x[a]).unwrap(),
            Step::Halve(d) => x[d].mul_scalar_(0.5).unwrap(),
            Step::RoundTrip(a, d) => {
                x[d] = x[a]
                    .copy_to(other)
                    .unwrap()
                    .tanh()
                    .unwrap()
                    .copy_to(device)
                    .unwrap();
            }
            Step::CopyFrom(d, a) => x[d].copy_from(&x[a]).unwrap(),
            Step::Load(d, s) => x[d].sync_copy_from_cpu(&host_data(s)).unwrap(),
            Step::Read(a) => reads.push(bits(&x[a].to_vec::<f32>().unwrap())),
        }
    }
    let finals = x
        .iter()
        .map(|t| bits(&t.to_vec::<f32>().unwrap()))
        .collect();
    engine.wait_for_all().unwrap();
    (finals, reads)
}

fn check_program(device: Device, other: Device, seeds: &[u64]) {
    for &seed in seeds {
        let steps = program(seed);
        let expected = run_sync(&steps, seed, device, other);
        assert!(
            !expected.1.is_empty(),
            "seed {seed}: the program reads nothing back"
        );
        for (name, engine) in common::all_engines() {
            let got = run_async(&engine, &steps, seed, device, other);
            assert!(
                got.1 == expected.1,
                "{name}, seed {seed}: a mid-program read differs"
            );
            for (i, (g, e)) in got.0.iter().zip(&expected.0).enumerate() {
                assert!(
                    g == e,
                    "{name}, seed {seed}: array {i} differs from synchronous aten"
                );
            }
        }
    }
}

#[test]
fn async_ops_equal_synchronous_aten_bit_for_bit() {
    common::no_hang(|| check_program(Device::cpu(), Device::cpu(), &[1, 2, 3]));
}

#[test]
fn async_ops_equal_synchronous_aten_on_the_simulated_device() {
    sim();
    common::no_hang(|| check_program(Device::sim(0), Device::cpu(), &[4]));
}

fn float(engine: &Arc<dyn Engine>, values: &[f32], shape: &[i64]) -> NDArray {
    NDArray::from_slice(engine, values, shape, Device::cpu()).unwrap()
}

/// Pushes an op writing `a` that blocks until the returned sender sends (or is dropped), then
/// fills `a` with `value`.
fn gated_write(a: &NDArray, value: f64) -> mpsc::Sender<()> {
    let (tx, rx) = mpsc::channel::<()>();
    NDArray::push_op("gated_write", &[], &[a], move |_, outs| {
        let _ = rx.recv();
        outs[0].fill_(value)?;
        Ok(())
    })
    .unwrap();
    tx
}

/// Pushes an op reading `a` that blocks until the returned sender sends, then reports the
/// values it read.
fn gated_read(a: &NDArray) -> (mpsc::Sender<()>, mpsc::Receiver<Vec<f32>>) {
    let (tx, rx) = mpsc::channel::<()>();
    let (seen_tx, seen_rx) = mpsc::channel();
    NDArray::push_op("gated_read", &[a], &[], move |ins, _| {
        let _ = rx.recv();
        let _ = seen_tx.send(ins[0].to_vec::<f32>()?);
        Ok(())
    })
    .unwrap();
    (tx, seen_rx)
}

/// A negative check that a correct implementation always passes: the blocked call must not
/// have finished while the op it waits for is held back (a broken one would finish at once).
fn assert_still_waiting(done: &mpsc::Receiver<()>, what: &str) {
    match done.recv_timeout(Duration::from_millis(50)) {
        Err(RecvTimeoutError::Timeout) => {}
        other => panic!("{what} returned while the op it must wait for was blocked: {other:?}"),
    }
}

#[test]
fn sync_copy_to_cpu_waits_for_a_pending_write() {
    common::no_hang(|| {
        for workers in [1, 2] {
            for (name, engine) in common::threaded(workers) {
                let a = float(&engine, &[1.0, 2.0, 3.0, 4.0], &[4]);
                let release = gated_write(&a, 7.0);
                let (started_tx, started) = mpsc::channel();
                let (done_tx, done) = mpsc::channel();
                let reader = a.clone();
                let copier = std::thread::spawn(move || {
                    started_tx.send(()).unwrap();
                    let mut out = [0f32; 4];
                    reader.sync_copy_to_cpu(&mut out).unwrap();
                    done_tx.send(()).unwrap();
                    out
                });
                started.recv().unwrap();
                assert_still_waiting(&done, &format!("{name}: sync_copy_to_cpu"));
                release.send(()).unwrap();
                assert_eq!(copier.join().unwrap(), [7.0; 4], "{name}");
                assert_eq!(a.var().version(), 1, "{name}");
            }
        }
    });
}

#[test]
fn sync_copy_from_cpu_waits_for_pending_reads_and_wait_to_read_does_not() {
    common::no_hang(|| {
        for workers in [1, 2] {
            for (name, engine) in common::threaded(workers) {
                let a = float(&engine, &[1.0, 2.0, 3.0, 4.0], &[4]);
                let (release, seen) = gated_read(&a);
                // A pending read does not block wait_to_read (MXNet's WaitToRead).
                a.wait_to_read().unwrap();
                let (done_tx, done) = mpsc::channel();
                let writer = a.clone();
                let copier = std::thread::spawn(move || {
                    writer.sync_copy_from_cpu(&[9.0f32; 4]).unwrap();
                    done_tx.send(()).unwrap();
                });
                assert_still_waiting(&done, &format!("{name}: sync_copy_from_cpu"));
                release.send(()).unwrap();
                copier.join().unwrap();
                // The reader ran first and saw the old values; the copy landed after it.
                assert_eq!(seen.recv().unwrap(), [1.0, 2.0, 3.0, 4.0], "{name}");
                assert_eq!(a.to_vec::<f32>().unwrap(), [9.0; 4], "{name}");
            }
        }
    });
}

#[test]
fn host_copies_need_exactly_the_array_size_and_dtype() {
    common::no_hang(|| {
        for (name, engine) in common::all_engines() {
            let a = NDArray::zeros(&engine, &[2, 2], ScalarType::Float).unwrap();
            let err = a.sync_copy_from_cpu(&[1.0f32; 3]).unwrap_err();
            let text = err.to_string();
            assert!(text.contains("memory size do not match"), "{name}: {text}");
            assert!(
                text.contains("16 bytes") && text.contains("12 bytes"),
                "{name}: {text}"
            );
            assert!(matches!(
                err.tensor_error(),
                Some(aten::Error::MemorySizeMismatch {
                    expected: 16,
                    actual: 12,
                    ..
                })
            ));
            let err = a.sync_copy_to_cpu(&mut [0f32; 5]).unwrap_err();
            assert!(
                matches!(
                    err.tensor_error(),
                    Some(aten::Error::MemorySizeMismatch {
                        expected: 16,
                        actual: 20,
                        ..
                    })
                ),
                "{name}: {err}"
            );
            let err = a.sync_copy_to_cpu(&mut [0f64; 2]).unwrap_err();
            assert!(
                matches!(err.tensor_error(), Some(aten::Error::DtypeMismatch { .. })),
                "{name}: {err}"
            );
            assert!(!err.is_op_failure());
            // A matching buffer works.
            a.sync_copy_from_cpu(&[1.0f32, 2.0, 3.0, 4.0]).unwrap();
            assert_eq!(a.to_vec::<f32>().unwrap(), [1.0, 2.0, 3.0, 4.0], "{name}");
        }
        // The buffer is checked before waiting: a blocked write does not delay the error.
        for (name, engine) in common::threaded(1) {
            let a = NDArray::zeros(&engine, &[4], ScalarType::Float).unwrap();
            let release = gated_write(&a, 1.0);
            assert!(a.sync_copy_to_cpu(&mut [0f32; 3]).is_err(), "{name}");
            assert!(a.sync_copy_from_cpu(&[0f32; 5]).is_err(), "{name}");
            release.send(()).unwrap();
            assert_eq!(a.to_vec::<f32>().unwrap(), [1.0; 4], "{name}");
        }
    });
}

#[test]
fn shape_errors_are_reported_by_the_call() {
    common::no_hang(|| {
        for (name, engine) in common::all_engines() {
            let a = NDArray::zeros(&engine, &[2, 3], ScalarType::Float).unwrap();
            let b = NDArray::zeros(&engine, &[4, 5], ScalarType::Float).unwrap();
            let err = a.add(&b).unwrap_err();
            assert!(
                matches!(
                    err.tensor_error(),
                    Some(aten::Error::BroadcastMismatch { .. })
                ),
                "{name}: {err}"
            );
            let err = a.matmul(&a).unwrap_err();
            assert!(err.to_string().contains("(2x3 and 2x3)"), "{name}: {err}");
            let row = NDArray::zeros(&engine, &[3], ScalarType::Float).unwrap();
            let err = row.add_(&a).unwrap_err();
            assert!(
                matches!(err.tensor_error(), Some(aten::Error::ShapeMismatch { .. })),
                "{name}: {err}"
            );
            assert!(a.copy_from(&b).is_err(), "{name}");
            let err = a.sum(&[2], false).unwrap_err();
            assert!(
                matches!(err.tensor_error(), Some(aten::Error::DimOutOfRange { .. })),
                "{name}: {err}"
            );
            assert!(a.sum(&[1, -1], false).is_err(), "{name}");
            // Nothing was pushed: the arrays are clean.
            assert_eq!((a.var().version(), b.var().version()), (0, 0), "{name}");
            engine.wait_for_all().unwrap();
        }
    });
}

#[test]
fn an_op_error_is_delivered_once_on_wait_to_read_and_skips_dependents() {
    common::no_hang(|| {
        for workers in [1, 2] {
            for (name, engine) in common::threaded(workers) {
                let ran = Arc::new(AtomicUsize::new(0));
                // A dependent op that writes `output` from `input` and counts its runs. Chained
                // as a write, it is done before a wait on a later array of the chain returns
                // (a reader is released together with the waiter, so it may run after the
                // error was delivered and not be skipped).
                let count_into = |input: &NDArray, output: &NDArray| {
                    let ran = Arc::clone(&ran);
                    NDArray::push_op("count", &[input], &[output], move |_, _| {
                        ran.fetch_add(1, Ordering::SeqCst);
                        Ok(())
                    })
                    .unwrap();
                };
                let a = float(&engine, &[1.0, 2.0, 3.0, 4.0], &[2, 2]);

                // The output of a failing op: the error comes on its wait_to_read, once.
                let wide = NDArray::zeros(&engine, &[2, 2], ScalarType::Double).unwrap();
                let c = a.matmul(&wide).unwrap(); // aten checks dtypes when the kernel runs
                let err = c.wait_to_read().unwrap_err();
                assert!(err.is_op_failure(), "{name}: {err}");
                assert!(
                    err.to_string().contains("op `matmul` failed"),
                    "{name}: {err}"
                );
                assert!(
                    matches!(err.tensor_error(), Some(aten::Error::DtypeMismatch { .. })),
                    "{name}: {err}"
                );
                c.wait_to_read().unwrap();
                engine.wait_for_all().unwrap();

                // Dependents of a failed op are skipped and inherit its error.
                let c = a.matmul(&wide).unwrap();
                let d = c.relu().unwrap(); // skipped
                let e = NDArray::zeros(&engine, &[2, 2], ScalarType::Float).unwrap();
                count_into(&d, &e); // skipped
                let f = e.tanh().unwrap(); // skipped
                let err = f.wait_to_read().unwrap_err();
                assert!(
                    err.to_string().contains("op `matmul` failed"),
                    "{name}: {err}"
                );
                assert_eq!(ran.load(Ordering::SeqCst), 0, "{name}: a dependent op ran");
                // Delivered once: every array that shared it is clean now.
                for array in [&c, &d, &e, &f] {
                    array.wait_to_read().unwrap();
                }
                engine.wait_for_all().unwrap();

                // A shape mismatch inside a pushed op.
                let g = NDArray::zeros(&engine, &[2, 2], ScalarType::Float).unwrap();
                let square = NDArray::zeros(&engine, &[3, 3], ScalarType::Float).unwrap();
                NDArray::push_op("bad_matmul", &[&a, &square], &[&g], |ins, outs| {
                    outs[0].copy_(&ins[0].matmul(&ins[1])?)?;
                    Ok(())
                })
                .unwrap();
                let h = g.add(&a).unwrap(); // skipped
                count_into(&h, &e); // skipped
                let err = e.wait_to_read().unwrap_err();
                assert!(
                    matches!(err.tensor_error(), Some(aten::Error::ShapeMismatch { .. })),
                    "{name}: {err}"
                );
                assert!(err.to_string().contains("bad_matmul"), "{name}: {err}");
                assert_eq!(ran.load(Ordering::SeqCst), 0, "{name}: a dependent op ran");
                g.wait_to_read().unwrap();
                h.wait_to_write().unwrap();

                // Once delivered, the arrays are usable again.
                g.fill_(3.0).unwrap();
                let k = g.add(&a).unwrap();
                count_into(&k, &e);
                assert_eq!(k.to_vec::<f32>().unwrap(), [4.0, 5.0, 6.0, 7.0], "{name}");
                engine.wait_for_all().unwrap();
                assert_eq!(ran.load(Ordering::SeqCst), 1, "{name}");
            }
        }
    });
}

#[test]
fn the_naive_engine_reports_an_op_error_from_the_call() {
    let engine = common::build(EngineKind::Naive, 1);
    let a = NDArray::zeros(&engine, &[2], ScalarType::Float).unwrap();
    let wide = NDArray::zeros(&engine, &[2], ScalarType::Double).unwrap();
    let err: NDArrayError = a.matmul(&wide).unwrap_err();
    assert!(err.is_op_failure(), "{err}");
    assert!(matches!(
        err.tensor_error(),
        Some(aten::Error::DtypeMismatch { .. })
    ));
    a.wait_to_read().unwrap();
    engine.wait_for_all().unwrap();
}

#[test]
fn results_have_aten_s_promoted_dtypes() {
    for (name, engine) in common::threaded(1) {
        let f = NDArray::from_slice(&engine, &[1.0f32, 2.0], &[2], Device::cpu()).unwrap();
        let d = NDArray::from_slice(&engine, &[0.5f64, 0.25], &[2], Device::cpu()).unwrap();
        let l = NDArray::from_slice(&engine, &[-5i64, 7], &[2], Device::cpu()).unwrap();
        let m = NDArray::from_slice(&engine, &[-2i64, 2], &[2], Device::cpu()).unwrap();
        let sum = f.add(&d).unwrap();
        assert_eq!(sum.dtype(), ScalarType::Double, "{name}");
        assert_eq!(sum.to_vec::<f64>().unwrap(), [1.5, 2.25], "{name}");
        let q = l.div(&m).unwrap();
        assert_eq!(q.dtype(), ScalarType::Float, "{name}");
        assert_eq!(q.to_vec::<f32>().unwrap(), [2.5, 3.5], "{name}");
        let s = l.add_scalar(0.5).unwrap();
        assert_eq!(s.to_vec::<f32>().unwrap(), [-4.5, 7.5], "{name}");
        assert_eq!(l.exp().unwrap().dtype(), ScalarType::Float, "{name}");
        assert_eq!(
            l.mul(&m).unwrap().to_vec::<i64>().unwrap(),
            [10, 14],
            "{name}"
        );
        engine.wait_for_all().unwrap();
    }
}

#[test]
fn dropped_arrays_keep_their_memory_until_their_pending_ops_ran() {
    sim();
    common::no_hang(|| {
        let front = aten::sim::installed().expect("installed");
        let allocated = || front.memory_stats(1).unwrap()["allocated_bytes.all.current"];
        for (name, engine) in common::threaded(2) {
            let before = allocated();
            let values: Vec<f32> = (0..16).map(|v| v as f32).collect();
            let a = NDArray::from_slice(&engine, &values, &[4, 4], Device::sim(1)).unwrap();
            let b = NDArray::from_slice(&engine, &values, &[4, 4], Device::sim(1)).unwrap();
            let release = gated_write(&a, 1.0);
            let c = a.matmul(&b).unwrap(); // pending behind the gated write
            let all_three = allocated();
            let block = (all_three - before) / 3;
            assert!(block >= 64, "{name}: {before} -> {all_three}");
            drop(a);
            drop(b);
            assert_eq!(
                allocated(),
                all_three,
                "{name}: freed while ops were pending"
            );
            release.send(()).unwrap();
            // Each row of c is the column sums of b: 24, 28, 32, 36.
            let row = [24.0, 28.0, 32.0, 36.0];
            assert_eq!(c.to_vec::<f32>().unwrap(), row.repeat(4), "{name}");
            engine.wait_for_all().unwrap();
            assert_eq!(
                allocated(),
                before + block,
                "{name}: a or b outlived its ops"
            );
            drop(c);
            engine.wait_for_all().unwrap();
            assert_eq!(allocated(), before, "{name}");
        }
    });
}

#[test]
fn views_share_the_variable_and_the_memory() {
    common::no_hang(|| {
        for (name, engine) in common::all_engines() {
            let a = NDArray::zeros(&engine, &[4, 2], ScalarType::Float).unwrap();
            let top = a.slice(0, 2).unwrap();
            let flat = a.reshape(&[8]).unwrap();
            assert_eq!(top.var(), a.var());
            assert_eq!(flat.shape(), [8]);
            top.fill_(1.0).unwrap();
            flat.add_scalar_(1.0).unwrap();
            drop(a); // the views keep the array alive
            assert_eq!(
                flat.to_vec::<f32>().unwrap(),
                [2.0, 2.0, 2.0, 2.0, 1.0, 1.0, 1.0, 1.0],
                "{name}"
            );
            assert_eq!(top.var().version(), 2, "{name}");
        }
    });
}

#[test]
fn reductions_softmax_and_in_place_ops_match_aten() {
    common::no_hang(|| {
        let values: Vec<f32> = (0..12).map(|v| v as f32 - 5.5).collect();
        let t = Tensor::from_slice(&values, &[3, 4]).unwrap();
        let ints = Tensor::from_slice(&[1i32, 2, 3, 4], &[2, 2]).unwrap();
        for (name, engine) in common::all_engines() {
            let a = float(&engine, &values, &[3, 4]);
            let same = |nd: &NDArray, t: &Tensor| {
                assert_eq!(nd.shape(), t.sizes(), "{name}");
                assert_eq!(
                    bits(&nd.to_vec::<f32>().unwrap()),
                    bits(&t.to_vec::<f32>().unwrap()),
                    "{name}"
                );
            };
            same(&a.sum(&[], false).unwrap(), &t.sum(&[], false).unwrap());
            same(&a.sum(&[0], true).unwrap(), &t.sum(&[0], true).unwrap());
            same(
                &a.mean(&[-1], false).unwrap(),
                &t.mean(&[-1], false).unwrap(),
            );
            same(&a.softmax(1).unwrap(), &t.softmax(1).unwrap());
            same(&a.sigmoid().unwrap(), &t.sigmoid().unwrap());
            same(
                &a.exp().unwrap().neg().unwrap(),
                &t.exp().unwrap().neg().unwrap(),
            );
            let col = float(&engine, &[1.0, 2.0, 3.0], &[3, 1]);
            let tcol = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3, 1]).unwrap();
            same(&a.div(&col).unwrap(), &t.div(&tcol).unwrap());
            let b = a.add_scalar(1.0).unwrap();
            b.mul_(&col).unwrap();
            b.sub_(&a).unwrap();
            b.relu_().unwrap();
            let tb = t.add_scalar(1.0).unwrap();
            tb.mul_(&tcol).unwrap();
            tb.sub_(&t).unwrap();
            tb.relu_().unwrap();
            same(&b, &tb);
            // Integer sums are Long, as aten's.
            let i = NDArray::new(&engine, ints.deep_clone().unwrap()).unwrap();
            let s = i.sum(&[1], false).unwrap();
            assert_eq!(s.dtype(), ScalarType::Long, "{name}");
            assert_eq!(s.to_vec::<i64>().unwrap(), [3, 7], "{name}");
            // Matrix-vector products drop the vector's dimension.
            let v = float(&engine, &[1.0, 1.0, 1.0, 1.0], &[4]);
            let mv = a.matmul(&v).unwrap();
            assert_eq!(mv.shape(), [3], "{name}");
            assert_eq!(mv.to_vec::<f32>().unwrap(), [-16.0, 0.0, 16.0], "{name}");
            engine.wait_for_all().unwrap();
        }
    });
}

#[test]
fn copies_between_the_host_and_the_simulated_device() {
    sim();
    common::no_hang(|| {
        for (name, engine) in common::all_engines() {
            let a = float(&engine, &[1.0, 2.0, 3.0], &[3]);
            let on_sim = a.copy_to(Device::sim(0)).unwrap();
            assert_eq!(on_sim.context(), engine::Context::sim(0), "{name}");
            let doubled = on_sim.add(&on_sim).unwrap();
            let back = NDArray::zeros(&engine, &[3], ScalarType::Float).unwrap();
            back.copy_from(&doubled).unwrap();
            assert_eq!(back.to_vec::<f32>().unwrap(), [2.0, 4.0, 6.0], "{name}");
            assert_eq!(doubled.device(), Device::sim(0), "{name}");
            // Tensors on two devices in one kernel: aten refuses when the op runs.
            let err = match a.add(&on_sim) {
                Ok(mixed) => mixed.wait_to_read().unwrap_err(),
                Err(e) => e, // the naive engine
            };
            assert!(
                matches!(err.tensor_error(), Some(aten::Error::DeviceMismatch { .. })),
                "{name}: {err}"
            );
            engine.wait_for_all().unwrap();
        }
    });
}

#[test]
fn push_op_needs_an_array() {
    let err = NDArray::push_op("nothing", &[], &[], |_, _| Ok(())).unwrap_err();
    assert!(err.to_string().contains("at least one"), "{err}");
}
