//! The outstanding stream events of freed blocks (PyTorch's `cuda_events`): per stream, in the
//! order they were recorded, each with the block it holds back.

use std::collections::{BTreeMap, VecDeque};

use crate::block::BlockId;
use crate::device::{EventId, StreamId};

/// Outstanding events per stream, FIFO (PyTorch's `cuda_events`).
#[derive(Debug, Default)]
pub(crate) struct Events {
    queues: BTreeMap<StreamId, VecDeque<(EventId, BlockId)>>,
}

impl Events {
    /// Streams with outstanding events: 0 exactly when no event is outstanding.
    #[inline(always)]
    pub(crate) fn streams_waiting(&self) -> usize {
        self.queues.len()
    }

    /// An event recorded on `stream` that holds back block `id`.
    pub(crate) fn push(&mut self, stream: StreamId, event: EventId, id: BlockId) {
        self.queues
            .entry(stream)
            .or_default()
            .push_back((event, id));
    }

    /// The streams with outstanding events, in stream order.
    pub(crate) fn streams(&self) -> Vec<StreamId> {
        self.queues.keys().copied().collect()
    }

    /// The oldest outstanding event of `stream`.
    pub(crate) fn front(&self, stream: StreamId) -> Option<(EventId, BlockId)> {
        self.queues.get(&stream).and_then(|q| q.front()).copied()
    }

    /// Drops the oldest outstanding event of `stream` (forgetting the stream once it has none).
    pub(crate) fn pop_front(&mut self, stream: StreamId) {
        if let Some(q) = self.queues.get_mut(&stream) {
            q.pop_front();
            if q.is_empty() {
                self.queues.remove(&stream);
            }
        }
    }

    /// Takes every outstanding event, per stream in stream order, each stream's oldest first.
    pub(crate) fn take_all(&mut self) -> Vec<(StreamId, EventId, BlockId)> {
        std::mem::take(&mut self.queues)
            .into_iter()
            .flat_map(|(s, q)| q.into_iter().map(move |(e, id)| (s, e, id)))
            .collect()
    }
}
