//! [`AllocatorConfigBuilder`]: an [`AllocatorConfig`] set field by field from PyTorch's
//! defaults (or from another config), checked by [`AllocatorConfig::validate`] when built.
//! Its setters, one per field, are generated from the knob table (`knobs.rs`).

use super::{AllocatorConfig, ConfigError};

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
    /// The config being built (the setters are generated with the knob table).
    pub(super) config: AllocatorConfig,
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
}
