//! Helpers shared by the engine's integration tests: the engine matrix and a hang guard.

#![allow(dead_code)]

use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use engine::{Engine, EngineConfig, EngineKind};

/// How long a test body may run before it is declared hung.
pub const HANG_LIMIT: Duration = Duration::from_secs(60);

/// Runs `f` on its own thread and fails the test if it does not finish within [`HANG_LIMIT`]
/// (an engine bug must fail CI, never hang it). Panics inside `f` are propagated.
pub fn no_hang<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let handle = std::thread::spawn(move || {
        let out = f();
        let _ = tx.send(());
        out
    });
    match rx.recv_timeout(HANG_LIMIT) {
        Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => match handle.join() {
            Ok(out) => out,
            Err(panic) => std::panic::resume_unwind(panic),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("test body did not finish within {HANG_LIMIT:?}: the engine hung")
        }
    }
}

/// One engine of the matrix.
pub fn build(kind: EngineKind, workers: usize) -> Arc<dyn Engine> {
    EngineConfig::new(kind)
        .cpu_workers(workers)
        .build()
        .expect("engine config is valid")
}

/// Every engine kind, the threaded ones with 1, 2 and 4 workers.
pub fn all_engines() -> Vec<(String, Arc<dyn Engine>)> {
    let mut out = vec![("naive".to_string(), build(EngineKind::Naive, 1))];
    for workers in [1, 2, 4] {
        out.push((
            format!("pooled/{workers}"),
            build(EngineKind::Pooled, workers),
        ));
        out.push((
            format!("per-device/{workers}"),
            build(EngineKind::PerDevice, workers),
        ));
    }
    out
}

/// The threaded engines with `workers` workers.
pub fn threaded(workers: usize) -> Vec<(String, Arc<dyn Engine>)> {
    vec![
        (
            format!("pooled/{workers}"),
            build(EngineKind::Pooled, workers),
        ),
        (
            format!("per-device/{workers}"),
            build(EngineKind::PerDevice, workers),
        ),
    ]
}
