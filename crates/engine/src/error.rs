//! The crate's error enum and the error slots that carry an op's failure to the variables it
//! writes, delivered once (MXNet's `exception_handling.md`), with no unlocked shared list.

use std::sync::Arc;

use crate::sync::Mutex;

/// What an op's function returns: `Ok(())` or any error (it is stored on the variables the op
/// writes and reported by the next `wait_for_var`, `throw` or `wait_for_all`, as MXNet stores
/// an op's exception).
pub type OpResult = Result<(), Box<dyn std::error::Error + Send + Sync + 'static>>;

/// Everything that can go wrong in the engine.
///
/// The first three variants are op failures: they are produced by an op and delivered exactly
/// once, by the first `wait_for_var` / `wait_to_write` / `throw` on a variable the failed op
/// (or an op skipped because of it) wrote, or by `wait_for_all`. The others are returned by the
/// call that caused them.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// An op's function returned an error (or its async completion reported one).
    #[error("op `{op}` failed: {source}")]
    OpFailed {
        /// The op's name (`PushOptions::name`, MXNet's `opr_name`).
        op: &'static str,
        /// The error the op returned.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
    /// An op's function panicked; the panic was caught on the worker.
    #[error("op `{op}` panicked: {message}")]
    OpPanicked {
        /// The op's name.
        op: &'static str,
        /// The panic payload when it was a string, else a placeholder.
        message: String,
    },
    /// An async op's [`crate::Completion`] was dropped without being called.
    #[error("async op `{op}` dropped its completion handle without calling it")]
    CompletionDropped {
        /// The op's name.
        op: &'static str,
    },
    /// The variable was deleted (`delete_variable`); it can no longer be pushed to. (MXNet would
    /// run the op on freed memory; here the push is refused.)
    #[error("variable {var} was deleted (delete_variable) and cannot be used by a new op")]
    VarDeleted {
        /// The variable's id ([`crate::Var::id`]).
        var: u64,
    },
    /// The variable was created by another engine.
    #[error("variable {var} belongs to another engine")]
    ForeignVar {
        /// The variable's id.
        var: u64,
    },
    /// The operator was deleted (`delete_operator`); it can no longer be pushed.
    #[error("operator `{op}` was deleted (delete_operator) and cannot be pushed")]
    OperatorDeleted {
        /// The operator's name.
        op: &'static str,
    },
    /// A wait was called from inside an op of the same engine (it would wait on work that
    /// needs the caller's thread, or on the caller itself: MXNet deadlocks here).
    #[error("{call} called from inside an op of the same engine would deadlock")]
    WaitInsideOp {
        /// The wait that was refused (`wait_for_var`, `wait_to_write`, `wait_for_all`).
        call: &'static str,
    },
    /// The engine is stopped (`stop`): pushes are refused until `start`.
    #[error("the engine is stopped (call start() first)")]
    Stopped,
    /// A device index the engine cannot route (per-device engines serve indices below
    /// [`crate::MAX_DEVICES`]).
    #[error("device index {index} is out of range (the engine serves 0..{max})")]
    DeviceOutOfRange {
        /// The requested device index.
        index: u32,
        /// The number of device indices served per device type.
        max: u32,
    },
    /// A configuration value (from [`crate::EngineConfig`] or the environment) is invalid.
    #[error("invalid engine configuration: {key}={value:?}: {reason}")]
    Config {
        /// The setting, e.g. `TENSORMEM_ENGINE_TYPE`.
        key: String,
        /// The value that was given.
        value: String,
        /// What was expected.
        reason: &'static str,
    },
}

/// Shorthand for `Result<T, EngineError>`.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;

impl EngineError {
    /// Whether this is an op failure (stored on variables and delivered once) rather than an
    /// error of the call that returned it.
    pub fn is_op_failure(&self) -> bool {
        matches!(
            self,
            EngineError::OpFailed { .. }
                | EngineError::OpPanicked { .. }
                | EngineError::CompletionDropped { .. }
        )
    }

    /// The error of a caught panic.
    pub(crate) fn from_panic(op: &'static str, payload: Box<dyn std::any::Any + Send>) -> Self {
        let message = if let Some(s) = payload.downcast_ref::<&'static str>() {
            (*s).to_string()
        } else if let Some(s) = payload.downcast_ref::<String>() {
            s.clone()
        } else {
            "<non-string panic payload>".to_string()
        };
        EngineError::OpPanicked { op, message }
    }
}

/// One op failure, shared by every variable it poisons (MXNet's `shared_ptr<exception_ptr>`).
///
/// Taking the error out empties it for every holder at once: that is how an error is delivered
/// exactly once.
#[derive(Debug)]
pub(crate) struct ErrorSlot(Mutex<Option<EngineError>>);

impl ErrorSlot {
    pub(crate) fn new(error: EngineError) -> Arc<Self> {
        Arc::new(ErrorSlot(Mutex::new(Some(error))))
    }

    /// Whether the error is still undelivered.
    pub(crate) fn is_set(&self) -> bool {
        self.0.lock().is_some()
    }

    /// Delivers the error: the first caller gets it, every later one gets `None`.
    pub(crate) fn take(&self) -> Option<EngineError> {
        self.0.lock().take()
    }
}

/// The engine-wide list of failures, in the order they happened, for `wait_for_all` (MXNet's
/// `global_exception_refs_`, which its workers write without a lock; this one is locked).
#[derive(Debug)]
pub(crate) struct ErrorList(Mutex<Vec<Arc<ErrorSlot>>>);

impl ErrorList {
    pub(crate) fn new() -> Self {
        ErrorList(Mutex::new(Vec::new()))
    }

    /// Records a new failure and returns its slot.
    pub(crate) fn record(&self, error: EngineError) -> Arc<ErrorSlot> {
        let slot = ErrorSlot::new(error);
        let mut list = self.0.lock();
        // Drop slots already delivered by wait_for_var/throw, so the list stays small.
        if list.len() >= 64 {
            list.retain(|s| s.is_set());
        }
        list.push(Arc::clone(&slot));
        slot
    }

    /// `wait_for_all`'s report: the first undelivered failure; every other one is cleared
    /// (delivered to nobody), as MXNet's `WaitForAll` rethrows the first and clears all.
    pub(crate) fn take_first_and_clear(&self) -> Option<EngineError> {
        let slots = std::mem::take(&mut *self.0.lock());
        let mut first = None;
        for slot in slots {
            let error = slot.take();
            if first.is_none() {
                first = error;
            }
        }
        first
    }
}
