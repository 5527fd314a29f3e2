//! The prototype's Python-facing API (`torch.checkpoint`, `torch.decheckpoint`, ...), by name,
//! on [`Runtime`]. The live driver maps its tensor handles to [`TensorId`]s and calls these.

use std::io::{self, Write};

use crate::backend::Backend;
use crate::error::Result;
use crate::graph::{StorageId, TensorId};
use crate::log_writer::LogWriter;
use crate::profile::Profile;
use crate::runtime::Runtime;

impl<B: Backend> Runtime<B> {
    /// `checkpoint(t)`: wraps an existing value of `bytes` as a checkpointed constant. It has
    /// no rematerializer, so it is never evicted (an input or a weight).
    ///
    /// # Errors
    /// [`crate::Error::OutOfMemory`] when it does not fit the budget.
    pub fn checkpoint(&mut self, bytes: u64) -> Result<TensorId> {
        self.constant(bytes)
    }

    /// `is_checkpoint(t)`: whether `t` is a tensor of this runtime.
    pub fn is_checkpoint(&self, t: TensorId) -> bool {
        t.index() < self.tensors.len()
    }

    /// `uncheckpoint(t)`: the value of `t`, rematerialized if it was evicted; returns the
    /// storage holding it.
    ///
    /// # Errors
    /// [`crate::Error::UnknownTensor`] when `t` is not a tensor of this runtime; as
    /// [`Runtime::rematerialize`] otherwise.
    pub fn uncheckpoint(&mut self, t: TensorId) -> Result<StorageId> {
        self.rematerialize(t)?;
        self.storage_of(t)
    }

    /// `decheckpoint(t)`: as [`Runtime::uncheckpoint`], but a tensor this runtime does not
    /// manage passes through (`Ok(None)`).
    ///
    /// # Errors
    /// As [`Runtime::rematerialize`].
    pub fn decheckpoint(&mut self, t: TensorId) -> Result<Option<StorageId>> {
        if !self.is_checkpoint(t) {
            return Ok(None);
        }
        self.uncheckpoint(t).map(Some)
    }

    /// `set_memory_budget(bytes)`: the hard budget.
    ///
    /// # Errors
    /// [`crate::Error::OutOfMemory`] when memory cannot get under it at once.
    pub fn set_memory_budget(&mut self, bytes: u64) -> Result<()> {
        self.set_budget(Some(bytes))
    }

    /// `unset_memory_budget()`: no budget.
    pub fn unset_memory_budget(&mut self) {
        self.config.budget = None;
    }

    /// `toggle_sampling(on)`: search about sqrt(n) random candidates instead of all.
    pub fn toggle_sampling(&mut self, on: bool) {
        self.config.sampling = on;
    }

    /// `toggle_ignore_small_tensors(on)`: skip storages under 1% of the average size.
    pub fn toggle_ignore_small_tensors(&mut self, on: bool) {
        self.config.ignore_small_tensors = on;
    }

    /// `clear_checkpointpool()`: forgets every current eviction candidate (they stay in memory
    /// and become candidates again after their next use), as the prototype clears its pool
    /// between iterations.
    pub fn clear_checkpointpool(&mut self) {
        for s in std::mem::take(&mut self.pool) {
            self.storages[s.index()].pool_slot = crate::graph::NONE;
        }
    }

    /// `base_compute_time()`: compute of the program's own calls, ns.
    pub fn base_compute_time(&self) -> u64 {
        self.profile.base_compute_ns
    }

    /// `remat_compute_time()`: compute spent rematerializing, ns.
    pub fn remat_compute_time(&self) -> u64 {
        self.profile.remat_compute_ns
    }

    /// `search_time()`: wall-clock time spent choosing victims, ns.
    pub fn search_time(&self) -> u64 {
        self.profile.search_ns
    }

    /// Evictions by the heuristic so far.
    pub fn eviction_count(&self) -> u64 {
        self.profile.evictions
    }

    /// Rematerializations so far.
    pub fn remat_count(&self) -> u64 {
        self.profile.remats
    }

    /// `reset_profile()`: zeroes the counters (the peak restarts from current memory).
    pub fn reset_profile(&mut self) {
        self.profile = Profile {
            peak_bytes: self.memory,
            ..Profile::default()
        };
    }

    /// `new_log(out)`: starts an operator log in the paper's format; the driver writes its
    /// events through [`Runtime::log_mut`].
    pub fn new_log(&mut self, out: Box<dyn Write + Send>) {
        self.log = Some(LogWriter::new(out));
    }

    /// `annotate_log(text)`: an `ANNOTATE` line (`START`, `BACKWARD`); no-op without a log.
    ///
    /// # Errors
    /// I/O errors of the log.
    pub fn annotate_log(&mut self, text: &str) -> io::Result<()> {
        match &mut self.log {
            Some(w) => w.annotate(text),
            None => Ok(()),
        }
    }

    /// The open log, if any.
    pub fn log_mut(&mut self) -> Option<&mut LogWriter<Box<dyn Write + Send>>> {
        self.log.as_mut()
    }
}
