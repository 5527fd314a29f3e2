//! The allocator configuration: `PYTORCH_CUDA_ALLOC_CONF` parsing, validation and printing.
//!
//! [`AllocatorConfig`] is PyTorch's `CUDAAllocatorConfig` / `AcceleratorAllocatorConfig` as a
//! plain value: [`AllocatorConfig::parse`] reads PyTorch's configuration string,
//! [`Display`](fmt::Display) prints the canonical string back (only the knobs that differ from
//! the defaults, in a fixed order), and [`AllocatorConfig::to_settings`] /
//! [`AllocatorConfig::from_settings`] convert to and from the `allocator_settings` dict of a
//! memory snapshot. [`AllocatorConfig::builder`] sets knobs from Rust, with the same checks.
//!
//! Nothing here reads the environment except [`AllocatorConfig::from_env`], and nothing in the
//! crate calls it implicitly: the caller decides when the environment matters.
//!
//! # Syntax
//!
//! Comma-separated `key:value` pairs, as PyTorch accepts them:
//!
//! ```text
//! max_split_size_mb:128, roundup_power2_divisions:[256:4,512:2,>:1], expandable_segments:True
//! ```
//!
//! - Whitespace around keys, values and punctuation is ignored. (PyTorch deletes every space,
//!   even inside a token; here `1 28` is an invalid value, not `128`.)
//! - The empty string, or only whitespace, is the default configuration.
//! - A key given twice: the last one wins. For `roundup_power2_divisions` each occurrence starts
//!   from all-zero divisions (PyTorch lets a later list patch the earlier one's entries).
//! - One trailing comma is tolerated (`expandable_segments:True,`), as PyTorch does; an empty
//!   item anywhere else (`a:1,,b:2`, a leading comma) is a [`ConfigError::Syntax`].
//! - Integers are plain decimal digits. PyTorch's `stoi`/`stoull` also take a sign or trailing
//!   junk (`128MB` reads as 128); those are invalid values here.
//!
//! ```
//! use c10_cuda::config::{AllocatorConfig, MIB};
//!
//! let config: AllocatorConfig = "expandable_segments:True, max_split_size_mb:128".parse()?;
//! assert_eq!(config.max_split_size, Some(128 * MIB));
//! assert!(config.expandable_segments);
//! assert_eq!(config.to_string(), "max_split_size_mb:128,expandable_segments:True");
//! # Ok::<(), c10_cuda::config::ConfigError>(())
//! ```

use std::fmt;
use std::str::FromStr;

use crate::rules::TorchVersion;

mod builder;
mod knobs;
mod parse;

pub use builder::AllocatorConfigBuilder;
pub use knobs::AllocatorConfig;

use knobs::KNOBS;
use parse::{Parser, invalid, lex};

/// One mebibyte (1 MiB = 2^20 bytes): the unit of every `*_mb` knob.
pub const MIB: usize = 1 << 20;

/// Number of power-of-two size intervals of `roundup_power2_divisions`: 1 MiB, 2 MiB, ...,
/// 32 GiB (the last one also holds everything larger), PyTorch's `kRoundUpPowerOfTwoIntervals`.
pub const ROUNDUP_POWER2_INTERVALS: usize = 16;

/// The smallest `max_split_size_mb` and `max_non_split_rounding_mb` accepted, in MiB: PyTorch's
/// `kLargeBuffer / kMB` (20).
pub const MIN_SPLIT_SIZE_MB: usize = 20;

/// The largest `pinned_num_register_threads` (PyTorch's `pinned_max_register_threads()`).
pub const MAX_PINNED_REGISTER_THREADS: usize = 128;

/// The environment variables [`AllocatorConfig::from_env`] reads, first match wins.
pub const ENV_VARS: [&str; 2] = ["PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"];

/// Every key the configuration string accepts, in canonical (printing) order.
///
/// The ROCm spellings `release_lock_on_hipmalloc` and `pinned_use_hip_host_register` are also
/// accepted, as aliases of the CUDA ones.
pub const ALLOWED_KEYS: &[&str] = &knobs::NAMES;

/// Which allocator serves device memory (`backend:native` or `backend:cudaMallocAsync`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Backend {
    /// PyTorch's own caching allocator (`native`, the default).
    #[default]
    Native,
    /// CUDA's stream-ordered allocator (`cudaMallocAsync`). PyTorch warns that it ignores
    /// `max_split_size_mb`, `roundup_power2_divisions` and `garbage_collection_threshold`;
    /// see [`ConfigWarning::AsyncBackendIgnoresNativeOptions`].
    CudaMallocAsync,
}

impl Backend {
    /// The spelling in the configuration string.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Native => "native",
            Backend::CudaMallocAsync => "cudaMallocAsync",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A configuration string (or snapshot settings) that cannot be used.
///
/// Every message names the key and what it accepts.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A key this allocator does not know.
    #[error("unknown allocator config key \"{key}\": expected one of {}", .allowed.join(", "))]
    UnknownKey {
        /// The key as written (whitespace around it removed).
        key: String,
        /// The keys that are accepted ([`ALLOWED_KEYS`]).
        allowed: &'static [&'static str],
    },
    /// A known key with a value out of its range or of the wrong form.
    #[error("invalid value \"{value}\" for allocator config key \"{key}\": expected {expected}")]
    InvalidValue {
        /// The key (as spelled in the input, or the snapshot settings key).
        key: &'static str,
        /// The offending value as written (for a list entry, the offending part of it).
        value: String,
        /// What the key accepts.
        expected: String,
    },
    /// The string does not follow the `key:value,key:value` grammar.
    #[error("syntax error in allocator config \"{input}\" at byte {position}: expected {expected}")]
    Syntax {
        /// The whole configuration string.
        input: String,
        /// Byte offset of the problem in `input` (its length when the string ended early).
        position: usize,
        /// What should have been there.
        expected: String,
    },
}

/// A note about a configuration: a combination of settings that parses but may not do what was
/// meant, or a setting the device cannot honour.
///
/// This is the crate's one warnings channel. [`AllocatorConfig::validate_warnings`] gives the
/// notes that depend on the configuration alone; an allocator keeps those of the configuration
/// it actually runs with, together with the device-dependent ones
/// ([`ConfigWarning::ExpandableSegmentsUnsupported`]), in
/// [`crate::DeviceCachingAllocator::warnings`], set at construction and by every
/// `set_config`. Nothing is printed: a caller shows them as it likes (`Display` gives one
/// line).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum ConfigWarning {
    /// `expandable_segments:True` on a device without virtual memory management: the allocator
    /// turned expandable segments off and uses regular segments, as PyTorch does (which warns
    /// "expandable_segments not supported on this platform").
    ExpandableSegmentsUnsupported {
        /// The device index.
        device: u8,
    },
    /// `garbage_collection_threshold` is set but no `per_process_memory_fraction` is: the
    /// threshold is a fraction of the allowed memory, so without a cap it never triggers.
    /// PyTorch ignores it silently (pytorch#106660); a fraction set later at run time
    /// (`set_per_process_memory_fraction`) makes it effective.
    GcThresholdWithoutMemoryFraction {
        /// The configured threshold.
        threshold: f64,
    },
    /// `expandable_segments` together with `max_split_size_mb`. PyTorch asserted on this
    /// combination (pytorch#119452, pytorch#123548); this allocator supports it, so this is
    /// informational only.
    ExpandableSegmentsWithMaxSplitSize {
        /// The configured `max_split_size`, bytes.
        max_split_size: usize,
    },
    /// `backend:cudaMallocAsync` with options only the native allocator uses (PyTorch warns
    /// the same way).
    AsyncBackendIgnoresNativeOptions {
        /// The native-only keys that are set to non-default values.
        options: Vec<&'static str>,
    },
}

impl fmt::Display for ConfigWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigWarning::ExpandableSegmentsUnsupported { device } => write!(
                f,
                "expandable_segments not supported on device {device}: using regular segments"
            ),
            ConfigWarning::GcThresholdWithoutMemoryFraction { threshold } => write!(
                f,
                "garbage_collection_threshold:{threshold} has no effect without a per-process \
                 memory fraction (set per_process_memory_fraction, or call \
                 set_per_process_memory_fraction); PyTorch ignores it silently (pytorch#106660)"
            ),
            ConfigWarning::ExpandableSegmentsWithMaxSplitSize { max_split_size } => write!(
                f,
                "expandable_segments:True with max_split_size_mb:{}: PyTorch asserted on this \
                 combination (pytorch#119452, pytorch#123548); this allocator supports it \
                 (blocks of {} MiB or more are not split)",
                max_split_size / MIB,
                max_split_size / MIB
            ),
            ConfigWarning::AsyncBackendIgnoresNativeOptions { options } => write!(
                f,
                "backend:cudaMallocAsync ignores {}: they apply to the native allocator only",
                options.join(", ")
            ),
        }
    }
}

/// One value of PyTorch's snapshot `allocator_settings` dict (a pickled Python builtin).
#[derive(Clone, Debug, PartialEq)]
pub enum SettingValue {
    /// A Python `str`.
    Str(String),
    /// A Python `int`.
    Int(i64),
    /// A Python `float`.
    Float(f64),
    /// A Python `bool`.
    Bool(bool),
    /// A Python `dict` of `str` to `int` (only `roundup_power2_divisions`).
    Map(Vec<(String, i64)>),
}

impl fmt::Display for SettingValue {
    /// Python-like rendering, used in error messages.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SettingValue::Str(s) => write!(f, "'{s}'"),
            SettingValue::Int(n) => write!(f, "{n}"),
            SettingValue::Float(x) => write!(f, "{x:?}"),
            SettingValue::Bool(b) => f.write_str(if *b { "True" } else { "False" }),
            SettingValue::Map(entries) => {
                f.write_str("{")?;
                for (i, (k, v)) in entries.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "'{k}': {v}")?;
                }
                f.write_str("}")
            }
        }
    }
}

impl AllocatorConfig {
    /// Parses PyTorch's configuration string (see the [module docs](self) for the syntax).
    ///
    /// Knobs not named keep their defaults; the empty string is the default configuration.
    pub fn parse(input: &str) -> Result<Self, ConfigError> {
        Self::parse_for(input, TorchVersion::NEWEST)
    }

    /// Parses the configuration string as `torch`'s allocator reads it.
    ///
    /// Differences (checked against the real allocators): torch 2.7 rejects the
    /// `per_process_memory_fraction` key, requires `max_split_size_mb` and
    /// `max_non_split_rounding_mb` to be more than 20 (2.15: at least 20), and starts the `>`
    /// fill of a `roundup_power2_divisions` list at the last key's own interval (2.15: at the
    /// next one), so `[256:4,512:2,>:1]` leaves 512 MiB at 1 and `[>:2]` sets every interval
    /// (2.15 leaves the first, below 2 MiB, at 0).
    ///
    /// # Errors
    /// As [`AllocatorConfig::parse`].
    pub fn parse_for(input: &str, torch: TorchVersion) -> Result<Self, ConfigError> {
        Parser {
            input,
            toks: lex(input),
            i: 0,
            torch,
        }
        .parse()
    }

    /// Reads the configuration from the environment: the first of [`ENV_VARS`] that is set
    /// (`PYTORCH_CUDA_ALLOC_CONF`, then `PYTORCH_ALLOC_CONF`), or the default when neither is.
    ///
    /// The order is what PyTorch's code does today (`AcceleratorAllocatorConfig::instance` and
    /// `CUDAAllocatorConfig::instance` read `PYTORCH_CUDA_ALLOC_CONF` first "to keep the parsing
    /// order stable"), although its header comment calls `PYTORCH_ALLOC_CONF` the primary
    /// variable and one intermediate version read it first. A variable that is set but empty
    /// counts as set, as in PyTorch. `PYTORCH_HIP_ALLOC_CONF` (ROCm) is not read.
    ///
    /// This is the only function of the crate that reads the environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_env_with(|name| std::env::var_os(name))
    }

    /// [`from_env`](AllocatorConfig::from_env) with a custom variable lookup (for tests, or
    /// for an environment captured elsewhere). A value that is not UTF-8 is an
    /// [`ConfigError::InvalidValue`] for that variable.
    pub fn from_env_with(
        lookup: impl Fn(&str) -> Option<std::ffi::OsString>,
    ) -> Result<Self, ConfigError> {
        for name in ENV_VARS {
            if let Some(value) = lookup(name) {
                return match value.to_str() {
                    Some(text) => Self::parse(text),
                    None => Err(invalid(name, &value.to_string_lossy(), "UTF-8 text")),
                };
            }
        }
        Ok(Self::default())
    }

    /// Checks that every field is in the range [`parse`](AllocatorConfig::parse) produces
    /// (useful for a config built by hand). Errors name the configuration-string key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        KNOBS.iter().try_for_each(|knob| (knob.check)(self))
    }

    /// The interval index of `size` bytes in [`roundup_power2_divisions`]: `floor(log2(size)) - 20`
    /// clamped to `0..=15` (sizes below 1 MiB, and 0, use index 0; 32 GiB and above index 15).
    ///
    /// [`roundup_power2_divisions`]: AllocatorConfig::roundup_power2_divisions
    #[inline]
    pub fn roundup_power2_index(size: usize) -> usize {
        // Below 1 MiB (the allocator's small requests): index 0 without the logarithm.
        if size < MIB {
            return 0;
        }
        (size.ilog2() as usize - MIB.trailing_zeros() as usize).min(ROUNDUP_POWER2_INTERVALS - 1)
    }

    /// The number of power-of-two divisions that applies to a request of `size` bytes
    /// (PyTorch's `roundup_power2_divisions(size)`); 0 or 1 mean no power-of-two rounding.
    #[inline]
    pub fn roundup_power2_divisions_for(&self, size: usize) -> usize {
        self.roundup_power2_divisions[Self::roundup_power2_index(size)]
    }

    /// `max_split_size` in bytes, `usize::MAX` when unlimited (PyTorch's `max_split_size()`).
    #[inline]
    pub fn max_split_size_or_max(&self) -> usize {
        self.max_split_size.unwrap_or(usize::MAX)
    }

    /// Whether `garbage_collection_threshold` is set. The allocator collects only when a
    /// per-process memory fraction is also in force (from this config or set at run time).
    #[inline]
    pub fn gc_enabled(&self) -> bool {
        self.garbage_collection_threshold > 0.0
    }

    /// Notes about combinations that parse but may not do what was meant (see
    /// [`ConfigWarning`]; never [`ConfigWarning::ExpandableSegmentsUnsupported`], which needs a
    /// device). Empty for the default configuration. An allocator records these for the
    /// configuration it runs with in [`crate::DeviceCachingAllocator::warnings`].
    pub fn validate_warnings(&self) -> Vec<ConfigWarning> {
        let mut warnings = Vec::new();
        if self.gc_enabled() && self.per_process_memory_fraction.is_none() {
            warnings.push(ConfigWarning::GcThresholdWithoutMemoryFraction {
                threshold: self.garbage_collection_threshold,
            });
        }
        if let (true, Some(max_split_size)) = (self.expandable_segments, self.max_split_size) {
            warnings.push(ConfigWarning::ExpandableSegmentsWithMaxSplitSize { max_split_size });
        }
        if self.backend == Backend::CudaMallocAsync {
            let options: Vec<&'static str> = KNOBS
                .iter()
                .filter(|knob| knob.native_only && (knob.print)(self).is_some())
                .map(|knob| knob.name)
                .collect();
            if !options.is_empty() {
                warnings.push(ConfigWarning::AsyncBackendIgnoresNativeOptions { options });
            }
        }
        warnings
    }

    /// PyTorch's snapshot `allocator_settings` dict, in PyTorch's key order:
    /// `PYTORCH_CUDA_ALLOC_CONF` (this config's canonical string; PyTorch stores the string it
    /// last parsed), `max_split_size` (bytes, -1 when unlimited), `garbage_collection_threshold`,
    /// `expandable_segments`, `pinned_num_register_threads`, `release_lock_on_cudamalloc`,
    /// `pinned_use_cuda_host_register`, `roundup_power2_divisions` (MiB key `"1"`, `"2"`, ...,
    /// `"32768"` to divisions) and `graph_capture_record_stream_reuse`.
    ///
    /// Byte counts and divisions above `i64::MAX` saturate (PyTorch's `int64_t` cast wraps).
    pub fn to_settings(&self) -> Vec<(&'static str, SettingValue)> {
        let mut rows: Vec<_> = KNOBS
            .iter()
            .filter_map(|knob| knob.snapshot.as_ref())
            .collect();
        rows.sort_by_key(|row| row.order);
        std::iter::once((
            "PYTORCH_CUDA_ALLOC_CONF",
            SettingValue::Str(self.to_string()),
        ))
        .chain(rows.into_iter().map(|row| (row.key, (row.write)(self))))
        .collect()
    }

    /// Rebuilds a config from a snapshot's `allocator_settings` (the shape of
    /// [`to_settings`](AllocatorConfig::to_settings)), for replaying the snapshot.
    ///
    /// A non-empty `PYTORCH_CUDA_ALLOC_CONF` string is parsed and wins (it is what PyTorch
    /// parsed, and the only place our extensions such as `per_process_memory_fraction`
    /// appear). Otherwise the fields are read: missing ones keep their defaults, unknown keys
    /// (from newer PyTorch versions) are ignored, `max_split_size` -1 means unlimited, a
    /// `float` field also takes an `int`. The result is [validated](AllocatorConfig::validate).
    /// When a key appears twice, the last one counts.
    pub fn from_settings<K: AsRef<str>>(
        settings: &[(K, SettingValue)],
    ) -> Result<Self, ConfigError> {
        let get = |name: &str| {
            settings
                .iter()
                .rev()
                .find(|(k, _)| k.as_ref() == name)
                .map(|(_, v)| v)
        };
        let wrong = |key: &'static str, value: &SettingValue, expected: &str| {
            invalid(key, &value.to_string(), expected)
        };
        match get("PYTORCH_CUDA_ALLOC_CONF") {
            Some(SettingValue::Str(s)) if !s.trim().is_empty() => return Self::parse(s),
            Some(SettingValue::Str(_)) | None => {}
            Some(other) => return Err(wrong("PYTORCH_CUDA_ALLOC_CONF", other, "a str")),
        }
        let mut config = AllocatorConfig::default();
        let mut rows: Vec<_> = KNOBS
            .iter()
            .filter_map(|knob| knob.snapshot.as_ref())
            .collect();
        rows.sort_by_key(|row| row.order);
        for row in rows {
            if let Some(value) = get(row.key) {
                (row.read)(&mut config, value)?;
            }
        }
        config.validate()?;
        Ok(config)
    }
}

impl FromStr for AllocatorConfig {
    type Err = ConfigError;

    /// Same as [`AllocatorConfig::parse`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for AllocatorConfig {
    /// The canonical configuration string: only the knobs that differ from the defaults, in
    /// the order of [`ALLOWED_KEYS`], comma-separated without spaces; empty for the default.
    /// For a config that passes [`validate`](AllocatorConfig::validate), parsing the output
    /// gives the same config back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut sep = "";
        for knob in KNOBS {
            if let Some(value) = (knob.print)(self) {
                write!(f, "{sep}{}:{value}", knob.name)?;
                sep = ",";
            }
        }
        Ok(())
    }
}
