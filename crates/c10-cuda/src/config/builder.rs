//! [`AllocatorConfigBuilder`]: an [`AllocatorConfig`] set field by field from PyTorch's
//! defaults (or from another config), checked by [`AllocatorConfig::validate`] when built.

use super::{AllocatorConfig, Backend, ConfigError, ROUNDUP_POWER2_INTERVALS};

/// Builds an [`AllocatorConfig`]: start from [`AllocatorConfig::builder`] (PyTorch's defaults)
/// or [`AllocatorConfig::to_builder`], set what differs, then [`build`](Self::build), which
/// refuses a combination that [`AllocatorConfig::validate`] refuses, with the same
/// [`ConfigError`] the configuration string would give.
///
/// Each setter sets the field of the same name, in the field's units (bytes for sizes, not the
/// string's MiB); see the fields of [`AllocatorConfig`] for what each means and accepts.
///
/// ```
/// use c10_cuda::config::{AllocatorConfig, ConfigError, MIB};
///
/// let config = AllocatorConfig::builder()
///     .max_split_size(128 * MIB)
///     .expandable_segments(true)
///     .build()?;
/// assert_eq!(config, "max_split_size_mb:128,expandable_segments:True".parse()?);
///
/// // The checks of the configuration string apply: 19 MiB is below the 20 MiB minimum.
/// let refused = AllocatorConfig::builder().max_split_size(19 * MIB).build();
/// assert!(matches!(refused, Err(ConfigError::InvalidValue { key: "max_split_size_mb", .. })));
/// # Ok::<(), ConfigError>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
#[must_use = "a builder makes nothing until `build` is called"]
pub struct AllocatorConfigBuilder {
    config: AllocatorConfig,
}

impl AllocatorConfig {
    /// A builder starting from PyTorch's defaults ([`AllocatorConfig::default`]).
    pub fn builder() -> AllocatorConfigBuilder {
        AllocatorConfigBuilder::default()
    }

    /// A builder starting from this configuration.
    pub fn to_builder(&self) -> AllocatorConfigBuilder {
        AllocatorConfigBuilder {
            config: self.clone(),
        }
    }
}

impl AllocatorConfigBuilder {
    /// The configuration, once [`AllocatorConfig::validate`] accepts it.
    ///
    /// # Errors
    /// [`ConfigError::InvalidValue`] naming the configuration-string key of the first field
    /// out of range (in the order `validate` checks them).
    pub fn build(self) -> Result<AllocatorConfig, ConfigError> {
        self.config.validate()?;
        Ok(self.config)
    }

    /// [`AllocatorConfig::max_split_size`], bytes (`None`: unlimited).
    pub fn max_split_size(mut self, bytes: impl Into<Option<usize>>) -> Self {
        self.config.max_split_size = bytes.into();
        self
    }

    /// [`AllocatorConfig::max_non_split_rounding`], bytes.
    pub fn max_non_split_rounding(mut self, bytes: usize) -> Self {
        self.config.max_non_split_rounding = bytes;
        self
    }

    /// [`AllocatorConfig::roundup_power2_divisions`], one entry per power-of-two interval.
    pub fn roundup_power2_divisions(
        mut self,
        divisions: [usize; ROUNDUP_POWER2_INTERVALS],
    ) -> Self {
        self.config.roundup_power2_divisions = divisions;
        self
    }

    /// [`AllocatorConfig::garbage_collection_threshold`] (0 is off).
    pub fn garbage_collection_threshold(mut self, threshold: f64) -> Self {
        self.config.garbage_collection_threshold = threshold;
        self
    }

    /// [`AllocatorConfig::expandable_segments`].
    pub fn expandable_segments(mut self, on: bool) -> Self {
        self.config.expandable_segments = on;
        self
    }

    /// [`AllocatorConfig::per_process_memory_fraction`] (`None`: no cap).
    pub fn per_process_memory_fraction(mut self, fraction: impl Into<Option<f64>>) -> Self {
        self.config.per_process_memory_fraction = fraction.into();
        self
    }

    /// [`AllocatorConfig::backend`].
    pub fn backend(mut self, backend: Backend) -> Self {
        self.config.backend = backend;
        self
    }

    /// [`AllocatorConfig::release_lock_on_cudamalloc`].
    pub fn release_lock_on_cudamalloc(mut self, on: bool) -> Self {
        self.config.release_lock_on_cudamalloc = on;
        self
    }

    /// [`AllocatorConfig::pinned_use_cuda_host_register`].
    pub fn pinned_use_cuda_host_register(mut self, on: bool) -> Self {
        self.config.pinned_use_cuda_host_register = on;
        self
    }

    /// [`AllocatorConfig::pinned_num_register_threads`].
    pub fn pinned_num_register_threads(mut self, threads: usize) -> Self {
        self.config.pinned_num_register_threads = threads;
        self
    }

    /// [`AllocatorConfig::pinned_reserve_segment_size_mb`], MiB (0: not set).
    pub fn pinned_reserve_segment_size_mb(mut self, mb: usize) -> Self {
        self.config.pinned_reserve_segment_size_mb = mb;
        self
    }

    /// [`AllocatorConfig::pinned_use_background_threads`].
    pub fn pinned_use_background_threads(mut self, on: bool) -> Self {
        self.config.pinned_use_background_threads = on;
        self
    }

    /// [`AllocatorConfig::graph_capture_record_stream_reuse`].
    pub fn graph_capture_record_stream_reuse(mut self, on: bool) -> Self {
        self.config.graph_capture_record_stream_reuse = on;
        self
    }
}
