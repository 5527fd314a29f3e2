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

pub use builder::AllocatorConfigBuilder;

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
pub const ALLOWED_KEYS: &[&str] = &[
    "backend",
    "max_split_size_mb",
    "max_non_split_rounding_mb",
    "roundup_power2_divisions",
    "garbage_collection_threshold",
    "expandable_segments",
    "per_process_memory_fraction",
    "release_lock_on_cudamalloc",
    "pinned_use_cuda_host_register",
    "pinned_num_register_threads",
    "pinned_reserve_segment_size_mb",
    "pinned_use_background_threads",
    "graph_capture_record_stream_reuse",
];

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

/// The caching allocator's configuration (PyTorch's `CUDAAllocatorConfig`).
///
/// Make one with [`parse`](AllocatorConfig::parse) (the `PYTORCH_CUDA_ALLOC_CONF` string),
/// [`AllocatorConfig::builder`] or [`Default`]; all three give a config that passes
/// [`AllocatorConfig::validate`]. The struct is `#[non_exhaustive]` (new knobs are added as
/// PyTorch adds them), so other crates cannot write it as a struct literal; its fields stay
/// public for reading and for changing in place, and a config changed by hand should pass
/// `validate` again. Printing (`Display`) a valid config and parsing the result gives the same
/// config back.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct AllocatorConfig {
    /// Blocks of at least this many bytes are never split, and a request below it is never
    /// served from such a block (`max_split_size_mb:N`, stored as `N` MiB). `None` (the
    /// default) means unlimited. At least [`MIN_SPLIT_SIZE_MB`] MiB; larger values than
    /// `usize::MAX / MIB` MiB are clamped, as in PyTorch.
    pub max_split_size: Option<usize>,
    /// Bytes: how much larger than the request an unsplittable cached block may be and still
    /// be handed out whole (`max_non_split_rounding_mb:N`, stored as `N` MiB). Default 20 MiB;
    /// at least [`MIN_SPLIT_SIZE_MB`] MiB (PyTorch requires `>= 20`).
    pub max_non_split_rounding: usize,
    /// Number of divisions each power-of-two size interval is rounded up to
    /// (`roundup_power2_divisions`). Entry `i` covers sizes in `[2^(20+i), 2^(21+i))` bytes;
    /// entry 0 also covers sizes below 1 MiB and entry 15 everything from 32 GiB up
    /// (see [`AllocatorConfig::roundup_power2_divisions_for`]). Each entry is 0 or a power of two;
    /// 0 and 1 both mean "no power-of-two rounding". Default all 0.
    ///
    /// Syntax: `roundup_power2_divisions:4` sets every interval (a power of two; `0`, which
    /// PyTorch rejects in this form, is accepted here and means off). The list form
    /// `roundup_power2_divisions:[256:4,512:2,>:1]` has keys in MiB (powers of two; the index is
    /// `log2(key)`, clamped to 15) and values that are powers of two or 0. Entries apply left to
    /// right: the first key also fills every interval below it, each later key sets only its own
    /// interval, and `>` fills every interval *after* the last key given before it (when no key
    /// precedes it, every interval after the first: the one below 2 MiB keeps 0), as torch 2.15
    /// does.
    ///
    /// torch 2.7 started the `>` fill *at* the last key's index (index 0 without a key),
    /// overwriting it, so `[256:4,512:2,>:1]` left the 512 MiB interval at 1;
    /// [`AllocatorConfig::parse_for`] with torch 2.7 reads it that way.
    pub roundup_power2_divisions: [usize; ROUNDUP_POWER2_INTERVALS],
    /// Fraction of the allowed memory above which the allocator frees cached blocks that have
    /// not been reused for the longest (`garbage_collection_threshold:f`, `0 < f < 1`).
    /// 0 (the default) means off. Only effective together with a per-process memory fraction;
    /// see [`ConfigWarning::GcThresholdWithoutMemoryFraction`].
    pub garbage_collection_threshold: f64,
    /// Grow segments by mapping more pages instead of allocating new segments
    /// (`expandable_segments:True|False`, default `False`).
    pub expandable_segments: bool,
    /// Cap on this process's device memory as a fraction of the device's total,
    /// `0 < f <= 1` (`per_process_memory_fraction:f`). Our extension of the configuration string:
    /// PyTorch sets this only with `torch.cuda.set_per_process_memory_fraction(f)`. `None` (the
    /// default) means no cap.
    pub per_process_memory_fraction: Option<f64>,
    /// Which allocator backs device memory (`backend:native|cudaMallocAsync`, default native).
    /// Stored; this crate implements the native allocator.
    pub backend: Backend,
    /// Release the allocator lock around `cudaMalloc` (`release_lock_on_cudamalloc:True|False`,
    /// alias `release_lock_on_hipmalloc`). Accepted for compatibility; no effect here.
    pub release_lock_on_cudamalloc: bool,
    /// Pinned host memory through `cudaHostRegister` instead of `cudaHostAlloc`
    /// (`pinned_use_cuda_host_register:True|False`, alias `pinned_use_hip_host_register`); read
    /// by the pinned host allocator ([`crate::host_allocator::HostAllocatorConfig`]).
    pub pinned_use_cuda_host_register: bool,
    /// Threads used to register pinned memory (`pinned_num_register_threads:N`, a power of two
    /// from 1 to [`MAX_PINNED_REGISTER_THREADS`], default 1); read by the pinned host allocator.
    pub pinned_num_register_threads: usize,
    /// MiB reserved up front by the pinned host allocator (`pinned_reserve_segment_size_mb:N`,
    /// `N > 0`; 0, the default, means not set). Accepted for compatibility; no effect here.
    pub pinned_reserve_segment_size_mb: usize,
    /// Process pinned-memory events on a background thread
    /// (`pinned_use_background_threads:True|False`); read by the pinned host allocator.
    pub pinned_use_background_threads: bool,
    /// Reuse blocks freed during CUDA graph capture once their recorded streams are done
    /// (`graph_capture_record_stream_reuse:True|False`). Accepted for compatibility; no effect
    /// here.
    pub graph_capture_record_stream_reuse: bool,
}

impl Default for AllocatorConfig {
    /// PyTorch's defaults: everything off, unlimited split size, 20 MiB non-split rounding,
    /// one pinned register thread, native backend.
    fn default() -> Self {
        AllocatorConfig {
            max_split_size: None,
            max_non_split_rounding: MIN_SPLIT_SIZE_MB * MIB,
            roundup_power2_divisions: [0; ROUNDUP_POWER2_INTERVALS],
            garbage_collection_threshold: 0.0,
            expandable_segments: false,
            per_process_memory_fraction: None,
            backend: Backend::Native,
            release_lock_on_cudamalloc: false,
            pinned_use_cuda_host_register: false,
            pinned_num_register_threads: 1,
            pinned_reserve_segment_size_mb: 0,
            pinned_use_background_threads: false,
            graph_capture_record_stream_reuse: false,
        }
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

// ---------------------------------------------------------------------------------------------
// Keys

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Key {
    Backend,
    MaxSplitSize,
    MaxNonSplitRounding,
    RoundupPower2Divisions,
    GcThreshold,
    ExpandableSegments,
    PerProcessMemoryFraction,
    ReleaseLockOnCudamalloc,
    PinnedUseCudaHostRegister,
    PinnedNumRegisterThreads,
    PinnedReserveSegmentSize,
    PinnedUseBackgroundThreads,
    GraphCaptureRecordStreamReuse,
}

/// Spelling -> key, aliases included.
const KEY_TABLE: &[(&str, Key)] = &[
    ("backend", Key::Backend),
    ("max_split_size_mb", Key::MaxSplitSize),
    ("max_non_split_rounding_mb", Key::MaxNonSplitRounding),
    ("roundup_power2_divisions", Key::RoundupPower2Divisions),
    ("garbage_collection_threshold", Key::GcThreshold),
    ("expandable_segments", Key::ExpandableSegments),
    ("per_process_memory_fraction", Key::PerProcessMemoryFraction),
    ("release_lock_on_cudamalloc", Key::ReleaseLockOnCudamalloc),
    ("release_lock_on_hipmalloc", Key::ReleaseLockOnCudamalloc),
    (
        "pinned_use_cuda_host_register",
        Key::PinnedUseCudaHostRegister,
    ),
    (
        "pinned_use_hip_host_register",
        Key::PinnedUseCudaHostRegister,
    ),
    ("pinned_num_register_threads", Key::PinnedNumRegisterThreads),
    (
        "pinned_reserve_segment_size_mb",
        Key::PinnedReserveSegmentSize,
    ),
    (
        "pinned_use_background_threads",
        Key::PinnedUseBackgroundThreads,
    ),
    (
        "graph_capture_record_stream_reuse",
        Key::GraphCaptureRecordStreamReuse,
    ),
];

const EXPECT_MB: &str = "a whole number of MiB, at least 20";
const EXPECT_BOOL: &str = "True or False";
const EXPECT_DIVISIONS: &str = "a number of divisions that is a power of two (1, 2, 4, ...) or 0, \
                                or a list such as [256:4,512:2,>:1]";
const EXPECT_LIST_KEY: &str = "an interval size in MiB that is a power of two \
                               (1, 2, 4, ..., 32768; larger sizes share the last interval) or >";
const EXPECT_LIST_VALUE: &str = "a number of divisions that is a power of two (1, 2, 4, ...) or 0";
const EXPECT_GC: &str = "a number strictly between 0.0 and 1.0";
const EXPECT_FRACTION: &str = "a fraction greater than 0.0 and at most 1.0";
const EXPECT_BACKEND: &str = "native or cudaMallocAsync";
const EXPECT_THREADS: &str = "a power of two from 1 to 128";
const EXPECT_RESERVE: &str = "a whole number of MiB greater than 0";

impl Key {
    fn lookup(spelling: &str) -> Option<(&'static str, Key)> {
        KEY_TABLE
            .iter()
            .find(|(name, _)| *name == spelling)
            .copied()
    }

    fn expected(self) -> &'static str {
        match self {
            Key::Backend => EXPECT_BACKEND,
            Key::MaxSplitSize | Key::MaxNonSplitRounding => EXPECT_MB,
            Key::RoundupPower2Divisions => EXPECT_DIVISIONS,
            Key::GcThreshold => EXPECT_GC,
            Key::PerProcessMemoryFraction => EXPECT_FRACTION,
            Key::PinnedNumRegisterThreads => EXPECT_THREADS,
            Key::PinnedReserveSegmentSize => EXPECT_RESERVE,
            Key::ExpandableSegments
            | Key::ReleaseLockOnCudamalloc
            | Key::PinnedUseCudaHostRegister
            | Key::PinnedUseBackgroundThreads
            | Key::GraphCaptureRecordStreamReuse => EXPECT_BOOL,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Lexer: PyTorch's ConfigTokenizer, with byte positions and whitespace trimmed (not deleted).

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tok {
    Word,
    Colon,
    Comma,
    Open,
    Close,
}

#[derive(Clone, Copy, Debug)]
struct Token<'a> {
    kind: Tok,
    text: &'a str,
    pos: usize,
}

fn lex(input: &str) -> Vec<Token<'_>> {
    fn push_word<'a>(input: &'a str, start: usize, end: usize, out: &mut Vec<Token<'a>>) {
        let raw = &input[start..end];
        let text = raw.trim();
        if !text.is_empty() {
            let lead = raw.len() - raw.trim_start().len();
            out.push(Token {
                kind: Tok::Word,
                text,
                pos: start + lead,
            });
        }
    }
    let mut out = Vec::new();
    let mut word_start = 0;
    for (i, c) in input.char_indices() {
        let kind = match c {
            ',' => Tok::Comma,
            ':' => Tok::Colon,
            '[' => Tok::Open,
            ']' => Tok::Close,
            _ => continue,
        };
        push_word(input, word_start, i, &mut out);
        out.push(Token {
            kind,
            text: &input[i..i + 1],
            pos: i,
        });
        word_start = i + 1;
    }
    push_word(input, word_start, input.len(), &mut out);
    out
}

// ---------------------------------------------------------------------------------------------
// Parser

/// A value as written: one word, or a bracketed list of `key:value` entries.
enum Value<'a> {
    Scalar(Token<'a>),
    List {
        text: &'a str,
        entries: Vec<(Token<'a>, Token<'a>)>,
    },
}

struct Parser<'a> {
    input: &'a str,
    toks: Vec<Token<'a>>,
    i: usize,
    /// Whose rules: torch 2.7 reads some values differently (see [`AllocatorConfig::parse_for`]).
    torch: TorchVersion,
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<Token<'a>> {
        self.toks.get(self.i).copied()
    }

    fn pos(&self) -> usize {
        self.peek().map_or(self.input.len(), |t| t.pos)
    }

    fn syntax(&self, position: usize, expected: impl Into<String>) -> ConfigError {
        ConfigError::Syntax {
            input: self.input.to_owned(),
            position,
            expected: expected.into(),
        }
    }

    fn expect_key(&self) -> String {
        format!("a key (one of {})", ALLOWED_KEYS.join(", "))
    }

    fn parse(mut self) -> Result<AllocatorConfig, ConfigError> {
        let mut config = AllocatorConfig::default();
        while let Some(tok) = self.peek() {
            if tok.kind != Tok::Word {
                return Err(self.syntax(tok.pos, self.expect_key()));
            }
            self.i += 1;
            let (name, key) = Key::lookup(tok.text)
                .filter(|(_, k)| {
                    *k != Key::PerProcessMemoryFraction || self.torch.accepts_memory_fraction_key()
                })
                .ok_or_else(|| ConfigError::UnknownKey {
                    key: tok.text.to_owned(),
                    allowed: ALLOWED_KEYS,
                })?;
            match self.peek() {
                Some(t) if t.kind == Tok::Colon => self.i += 1,
                _ => return Err(self.syntax(self.pos(), format!("':' after key \"{name}\""))),
            }
            let value = self.value(name, key)?;
            config.apply(name, key, value, self.torch)?;
            match self.peek() {
                None => break,
                Some(t) if t.kind == Tok::Comma => self.i += 1,
                Some(t) => {
                    return Err(self.syntax(
                        t.pos,
                        format!("',' or the end of the config after the value of key \"{name}\""),
                    ));
                }
            }
        }
        Ok(config)
    }

    fn value(&mut self, name: &'static str, key: Key) -> Result<Value<'a>, ConfigError> {
        let Some(tok) = self.peek() else {
            return Err(self.syntax(
                self.input.len(),
                format!("a value for key \"{name}\": {}", key.expected()),
            ));
        };
        match tok.kind {
            Tok::Word => {
                self.i += 1;
                Ok(Value::Scalar(tok))
            }
            Tok::Open if key == Key::RoundupPower2Divisions => self.list(name, tok),
            Tok::Open => {
                // Only roundup_power2_divisions takes a list: report the whole list as the value.
                let close = self.toks[self.i..]
                    .iter()
                    .position(|t| t.kind == Tok::Close);
                let Some(close) = close.map(|n| self.i + n) else {
                    return Err(self.unclosed(name, tok));
                };
                let text = &self.input[tok.pos..=self.toks[close].pos];
                Err(invalid(name, text, key.expected()))
            }
            _ => Err(self.syntax(
                tok.pos,
                format!("a value for key \"{name}\": {}", key.expected()),
            )),
        }
    }

    fn unclosed(&self, name: &'static str, open: Token<'a>) -> ConfigError {
        self.syntax(
            self.input.len(),
            format!(
                "']' to close the list of key \"{name}\" opened at byte {}",
                open.pos
            ),
        )
    }

    fn list(&mut self, name: &'static str, open: Token<'a>) -> Result<Value<'a>, ConfigError> {
        self.i += 1;
        let mut entries = Vec::new();
        loop {
            let Some(tok) = self.peek() else {
                return Err(self.unclosed(name, open));
            };
            match tok.kind {
                Tok::Close => {
                    self.i += 1;
                    let text = &self.input[open.pos..=tok.pos];
                    return Ok(Value::List { text, entries });
                }
                Tok::Word => {}
                _ => {
                    return Err(self.syntax(
                        tok.pos,
                        format!("an entry such as 256:4 or >:1 in the list of key \"{name}\""),
                    ));
                }
            }
            self.i += 1;
            match self.peek() {
                Some(t) if t.kind == Tok::Colon => self.i += 1,
                None => return Err(self.unclosed(name, open)),
                Some(t) => {
                    return Err(self.syntax(
                        t.pos,
                        format!("':' after \"{}\" in the list of key \"{name}\"", tok.text),
                    ));
                }
            }
            let value = match self.peek() {
                Some(t) if t.kind == Tok::Word => t,
                None => return Err(self.unclosed(name, open)),
                Some(t) => {
                    return Err(self.syntax(
                        t.pos,
                        format!(
                            "a value after \"{}:\" in the list of key \"{name}\"",
                            tok.text
                        ),
                    ));
                }
            };
            self.i += 1;
            entries.push((tok, value));
            match self.peek() {
                Some(t) if t.kind == Tok::Comma => self.i += 1,
                Some(t) if t.kind == Tok::Close => {}
                None => return Err(self.unclosed(name, open)),
                Some(t) => {
                    return Err(self.syntax(
                        t.pos,
                        format!("',' or ']' after an entry in the list of key \"{name}\""),
                    ));
                }
            }
        }
    }
}

fn invalid(key: &'static str, value: &str, expected: &str) -> ConfigError {
    ConfigError::InvalidValue {
        key,
        value: value.to_owned(),
        expected: expected.to_owned(),
    }
}

/// Plain decimal digits only (no sign, no junk).
fn parse_uint(text: &str) -> Option<usize> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

fn parse_bool(name: &'static str, text: &str) -> Result<bool, ConfigError> {
    match text {
        "True" => Ok(true),
        "False" => Ok(false),
        _ => Err(invalid(name, text, EXPECT_BOOL)),
    }
}

/// `N` MiB with `N >= 20` (torch 2.7: `N > 20`), in bytes, clamped like PyTorch to
/// `usize::MAX / MIB` MiB.
fn parse_split_mb(
    name: &'static str,
    text: &str,
    torch: TorchVersion,
) -> Result<usize, ConfigError> {
    let least = if torch.split_mb_must_exceed_20() {
        MIN_SPLIT_SIZE_MB + 1
    } else {
        MIN_SPLIT_SIZE_MB
    };
    match parse_uint(text) {
        Some(mb) if mb >= least => Ok(mb.min(usize::MAX / MIB) * MIB),
        _ if least > MIN_SPLIT_SIZE_MB => Err(invalid(
            name,
            text,
            "a whole number of MiB greater than 20 (torch 2.7)",
        )),
        _ => Err(invalid(name, text, EXPECT_MB)),
    }
}

fn is_division(n: usize) -> bool {
    n == 0 || n.is_power_of_two()
}

/// `log2` of a power-of-two MiB key, clamped to the last interval.
fn interval_of_key_mb(key_mb: usize) -> usize {
    (key_mb.trailing_zeros() as usize).min(ROUNDUP_POWER2_INTERVALS - 1)
}

fn parse_divisions(
    name: &'static str,
    value: Value<'_>,
    torch: TorchVersion,
) -> Result<[usize; 16], ConfigError> {
    let mut divisions = [0; ROUNDUP_POWER2_INTERVALS];
    match value {
        Value::Scalar(tok) => match parse_uint(tok.text) {
            Some(n) if is_division(n) => divisions = [n; ROUNDUP_POWER2_INTERVALS],
            _ => return Err(invalid(name, tok.text, EXPECT_DIVISIONS)),
        },
        Value::List { entries, .. } => {
            let mut last_index = None;
            for (key, value) in entries {
                let n = match parse_uint(value.text) {
                    Some(n) if is_division(n) => n,
                    _ => return Err(invalid(name, value.text, EXPECT_LIST_VALUE)),
                };
                if key.text == ">" {
                    // torch 2.15: from the interval after the last key (after interval 0 when
                    // no key came first); torch 2.7: from the last key's own interval.
                    let last = last_index.unwrap_or(0);
                    let start = if torch.gt_fill_starts_at_last_key() {
                        last
                    } else {
                        last + 1
                    };
                    for d in divisions.iter_mut().skip(start) {
                        *d = n;
                    }
                    continue;
                }
                let index = match parse_uint(key.text) {
                    Some(mb) if mb.is_power_of_two() => interval_of_key_mb(mb),
                    _ => return Err(invalid(name, key.text, EXPECT_LIST_KEY)),
                };
                if last_index.is_none() {
                    for d in &mut divisions[..index] {
                        *d = n;
                    }
                }
                divisions[index] = n;
                last_index = Some(index);
            }
        }
    }
    Ok(divisions)
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

    fn apply(
        &mut self,
        name: &'static str,
        key: Key,
        value: Value<'_>,
        torch: TorchVersion,
    ) -> Result<(), ConfigError> {
        if key == Key::RoundupPower2Divisions {
            self.roundup_power2_divisions = parse_divisions(name, value, torch)?;
            return Ok(());
        }
        let text = match value {
            Value::Scalar(tok) => tok.text,
            Value::List { text, .. } => return Err(invalid(name, text, key.expected())),
        };
        match key {
            Key::Backend => {
                self.backend = match text {
                    "native" => Backend::Native,
                    "cudaMallocAsync" => Backend::CudaMallocAsync,
                    _ => return Err(invalid(name, text, EXPECT_BACKEND)),
                }
            }
            Key::MaxSplitSize => self.max_split_size = Some(parse_split_mb(name, text, torch)?),
            Key::MaxNonSplitRounding => {
                self.max_non_split_rounding = parse_split_mb(name, text, torch)?;
            }
            Key::RoundupPower2Divisions => unreachable!("handled above"),
            Key::GcThreshold => {
                self.garbage_collection_threshold = match text.parse::<f64>() {
                    Ok(x) if x > 0.0 && x < 1.0 => x,
                    _ => return Err(invalid(name, text, EXPECT_GC)),
                }
            }
            Key::PerProcessMemoryFraction => {
                self.per_process_memory_fraction = match text.parse::<f64>() {
                    Ok(x) if x > 0.0 && x <= 1.0 => Some(x),
                    _ => return Err(invalid(name, text, EXPECT_FRACTION)),
                }
            }
            Key::PinnedNumRegisterThreads => {
                self.pinned_num_register_threads = match parse_uint(text) {
                    Some(n) if n.is_power_of_two() && n <= MAX_PINNED_REGISTER_THREADS => n,
                    _ => return Err(invalid(name, text, EXPECT_THREADS)),
                }
            }
            Key::PinnedReserveSegmentSize => {
                self.pinned_reserve_segment_size_mb = match parse_uint(text) {
                    Some(n) if n > 0 => n,
                    _ => return Err(invalid(name, text, EXPECT_RESERVE)),
                }
            }
            Key::ExpandableSegments => self.expandable_segments = parse_bool(name, text)?,
            Key::ReleaseLockOnCudamalloc => {
                self.release_lock_on_cudamalloc = parse_bool(name, text)?;
            }
            Key::PinnedUseCudaHostRegister => {
                self.pinned_use_cuda_host_register = parse_bool(name, text)?;
            }
            Key::PinnedUseBackgroundThreads => {
                self.pinned_use_background_threads = parse_bool(name, text)?;
            }
            Key::GraphCaptureRecordStreamReuse => {
                self.graph_capture_record_stream_reuse = parse_bool(name, text)?;
            }
        }
        Ok(())
    }

    /// Checks that every field is in the range [`parse`](AllocatorConfig::parse) produces
    /// (useful for a config built by hand). Errors name the configuration-string key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let check_mb = |name: &'static str, bytes: usize| {
            if bytes % MIB == 0 && bytes >= MIN_SPLIT_SIZE_MB * MIB {
                Ok(())
            } else {
                Err(invalid(name, &format!("{bytes} bytes"), EXPECT_MB))
            }
        };
        if let Some(bytes) = self.max_split_size {
            check_mb("max_split_size_mb", bytes)?;
        }
        check_mb("max_non_split_rounding_mb", self.max_non_split_rounding)?;
        if let Some(&bad) = self
            .roundup_power2_divisions
            .iter()
            .find(|&&d| !is_division(d))
        {
            return Err(invalid(
                "roundup_power2_divisions",
                &bad.to_string(),
                EXPECT_LIST_VALUE,
            ));
        }
        let gc = self.garbage_collection_threshold;
        if !(gc == 0.0 || (gc > 0.0 && gc < 1.0)) {
            return Err(invalid(
                "garbage_collection_threshold",
                &gc.to_string(),
                EXPECT_GC,
            ));
        }
        if let Some(f) = self.per_process_memory_fraction {
            if !(f > 0.0 && f <= 1.0) {
                return Err(invalid(
                    "per_process_memory_fraction",
                    &f.to_string(),
                    EXPECT_FRACTION,
                ));
            }
        }
        let threads = self.pinned_num_register_threads;
        if !(threads.is_power_of_two() && threads <= MAX_PINNED_REGISTER_THREADS) {
            return Err(invalid(
                "pinned_num_register_threads",
                &threads.to_string(),
                EXPECT_THREADS,
            ));
        }
        Ok(())
    }

    /// The interval index of `size` bytes in [`roundup_power2_divisions`]: `floor(log2(size)) - 20`
    /// clamped to `0..=15` (sizes below 1 MiB, and 0, use index 0; 32 GiB and above index 15).
    ///
    /// [`roundup_power2_divisions`]: AllocatorConfig::roundup_power2_divisions
    #[inline]
    pub fn roundup_power2_index(size: usize) -> usize {
        let log2 = size.checked_ilog2().unwrap_or(0) as usize;
        log2.saturating_sub(MIB.trailing_zeros() as usize)
            .min(ROUNDUP_POWER2_INTERVALS - 1)
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
            let defaults = AllocatorConfig::default();
            let mut options = Vec::new();
            if self.max_split_size.is_some() {
                options.push("max_split_size_mb");
            }
            if self.max_non_split_rounding != defaults.max_non_split_rounding {
                options.push("max_non_split_rounding_mb");
            }
            if self.roundup_power2_divisions != defaults.roundup_power2_divisions {
                options.push("roundup_power2_divisions");
            }
            if self.gc_enabled() {
                options.push("garbage_collection_threshold");
            }
            if self.expandable_segments {
                options.push("expandable_segments");
            }
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
        let int = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        let max_split_size = match self.max_split_size {
            None => -1,
            Some(bytes) => i64::try_from(bytes).unwrap_or(i64::MAX / MIB as i64 * MIB as i64),
        };
        let roundup = self
            .roundup_power2_divisions
            .iter()
            .enumerate()
            .map(|(i, &d)| ((1u64 << i).to_string(), int(d)))
            .collect();
        vec![
            (
                "PYTORCH_CUDA_ALLOC_CONF",
                SettingValue::Str(self.to_string()),
            ),
            ("max_split_size", SettingValue::Int(max_split_size)),
            (
                "garbage_collection_threshold",
                SettingValue::Float(self.garbage_collection_threshold),
            ),
            (
                "expandable_segments",
                SettingValue::Bool(self.expandable_segments),
            ),
            (
                "pinned_num_register_threads",
                SettingValue::Int(int(self.pinned_num_register_threads)),
            ),
            (
                "release_lock_on_cudamalloc",
                SettingValue::Bool(self.release_lock_on_cudamalloc),
            ),
            (
                "pinned_use_cuda_host_register",
                SettingValue::Bool(self.pinned_use_cuda_host_register),
            ),
            ("roundup_power2_divisions", SettingValue::Map(roundup)),
            (
                "graph_capture_record_stream_reuse",
                SettingValue::Bool(self.graph_capture_record_stream_reuse),
            ),
        ]
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
        let bools: [(&'static str, &mut bool); 4] = [
            ("expandable_segments", &mut config.expandable_segments),
            (
                "release_lock_on_cudamalloc",
                &mut config.release_lock_on_cudamalloc,
            ),
            (
                "pinned_use_cuda_host_register",
                &mut config.pinned_use_cuda_host_register,
            ),
            (
                "graph_capture_record_stream_reuse",
                &mut config.graph_capture_record_stream_reuse,
            ),
        ];
        for (key, field) in bools {
            match get(key) {
                Some(SettingValue::Bool(b)) => *field = *b,
                Some(other) => return Err(wrong(key, other, "a bool")),
                None => {}
            }
        }
        match get("max_split_size") {
            Some(SettingValue::Int(-1)) | None => {}
            Some(SettingValue::Int(n)) if *n > 0 => {
                config.max_split_size = Some(usize::try_from(*n).map_err(|_| {
                    wrong(
                        "max_split_size",
                        &SettingValue::Int(*n),
                        "bytes, or -1 for unlimited",
                    )
                })?);
            }
            Some(other) => {
                return Err(wrong(
                    "max_split_size",
                    other,
                    "bytes (at least 20 MiB), or -1 for unlimited",
                ));
            }
        }
        match get("garbage_collection_threshold") {
            Some(SettingValue::Float(x)) => config.garbage_collection_threshold = *x,
            Some(SettingValue::Int(n)) => config.garbage_collection_threshold = *n as f64,
            Some(other) => return Err(wrong("garbage_collection_threshold", other, "a float")),
            None => {}
        }
        match get("pinned_num_register_threads") {
            Some(SettingValue::Int(n)) => {
                config.pinned_num_register_threads = usize::try_from(*n).map_err(|_| {
                    wrong(
                        "pinned_num_register_threads",
                        &SettingValue::Int(*n),
                        EXPECT_THREADS,
                    )
                })?;
            }
            Some(other) => return Err(wrong("pinned_num_register_threads", other, EXPECT_THREADS)),
            None => {}
        }
        match get("roundup_power2_divisions") {
            Some(SettingValue::Map(entries)) => {
                for (k, v) in entries {
                    let index = match parse_uint(k) {
                        Some(mb)
                            if mb.is_power_of_two() && mb < (1 << ROUNDUP_POWER2_INTERVALS) =>
                        {
                            interval_of_key_mb(mb)
                        }
                        _ => {
                            return Err(invalid(
                                "roundup_power2_divisions",
                                k,
                                "interval keys \"1\", \"2\", \"4\", ..., \"32768\"",
                            ));
                        }
                    };
                    config.roundup_power2_divisions[index] = usize::try_from(*v).map_err(|_| {
                        invalid(
                            "roundup_power2_divisions",
                            &v.to_string(),
                            EXPECT_LIST_VALUE,
                        )
                    })?;
                }
            }
            Some(other) => {
                return Err(wrong(
                    "roundup_power2_divisions",
                    other,
                    "a dict of str to int",
                ));
            }
            None => {}
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

/// Writes the canonical list form of `divisions` (not all equal).
fn write_division_list(f: &mut fmt::Formatter<'_>, d: &[usize; 16]) -> fmt::Result {
    let last = ROUNDUP_POWER2_INTERVALS - 1;
    // End of the leading run (the first key fills everything below it).
    let head = d.iter().position(|&x| x != d[0]).map_or(last, |i| i - 1);
    // Start of the trailing run (filled by `>`, which starts right after the last key).
    let tail = d.iter().rposition(|&x| x != d[last]).map_or(0, |i| i + 1);
    write!(f, "[{}:{}", 1usize << head, d[head])?;
    for (i, x) in d.iter().enumerate().take(tail).skip(head + 1) {
        write!(f, ",{}:{}", 1usize << i, x)?;
    }
    if d[last] != 0 {
        write!(f, ",>:{}", d[last])?;
    }
    f.write_str("]")
}

impl fmt::Display for AllocatorConfig {
    /// The canonical configuration string: only the knobs that differ from the defaults, in
    /// the order of [`ALLOWED_KEYS`], comma-separated without spaces; empty for the default.
    /// For a config that passes [`validate`](AllocatorConfig::validate), parsing the output
    /// gives the same config back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let defaults = AllocatorConfig::default();
        let mut sep = "";
        let mut item = |f: &mut fmt::Formatter<'_>, key: &str| -> fmt::Result {
            write!(f, "{sep}{key}:")?;
            sep = ",";
            Ok(())
        };
        let true_str = |b: bool| if b { "True" } else { "False" };
        if self.backend != defaults.backend {
            item(f, "backend")?;
            write!(f, "{}", self.backend)?;
        }
        if let Some(bytes) = self.max_split_size {
            item(f, "max_split_size_mb")?;
            write!(f, "{}", bytes / MIB)?;
        }
        if self.max_non_split_rounding != defaults.max_non_split_rounding {
            item(f, "max_non_split_rounding_mb")?;
            write!(f, "{}", self.max_non_split_rounding / MIB)?;
        }
        let d = &self.roundup_power2_divisions;
        if *d != defaults.roundup_power2_divisions {
            item(f, "roundup_power2_divisions")?;
            if d.iter().all(|&x| x == d[0]) {
                write!(f, "{}", d[0])?;
            } else {
                write_division_list(f, d)?;
            }
        }
        if self.garbage_collection_threshold != defaults.garbage_collection_threshold {
            item(f, "garbage_collection_threshold")?;
            write!(f, "{}", self.garbage_collection_threshold)?;
        }
        if self.expandable_segments != defaults.expandable_segments {
            item(f, "expandable_segments")?;
            f.write_str(true_str(self.expandable_segments))?;
        }
        if let Some(fraction) = self.per_process_memory_fraction {
            item(f, "per_process_memory_fraction")?;
            write!(f, "{fraction}")?;
        }
        if self.release_lock_on_cudamalloc != defaults.release_lock_on_cudamalloc {
            item(f, "release_lock_on_cudamalloc")?;
            f.write_str(true_str(self.release_lock_on_cudamalloc))?;
        }
        if self.pinned_use_cuda_host_register != defaults.pinned_use_cuda_host_register {
            item(f, "pinned_use_cuda_host_register")?;
            f.write_str(true_str(self.pinned_use_cuda_host_register))?;
        }
        if self.pinned_num_register_threads != defaults.pinned_num_register_threads {
            item(f, "pinned_num_register_threads")?;
            write!(f, "{}", self.pinned_num_register_threads)?;
        }
        if self.pinned_reserve_segment_size_mb != defaults.pinned_reserve_segment_size_mb {
            item(f, "pinned_reserve_segment_size_mb")?;
            write!(f, "{}", self.pinned_reserve_segment_size_mb)?;
        }
        if self.pinned_use_background_threads != defaults.pinned_use_background_threads {
            item(f, "pinned_use_background_threads")?;
            f.write_str(true_str(self.pinned_use_background_threads))?;
        }
        if self.graph_capture_record_stream_reuse != defaults.graph_capture_record_stream_reuse {
            item(f, "graph_capture_record_stream_reuse")?;
            f.write_str(true_str(self.graph_capture_record_stream_reuse))?;
        }
        Ok(())
    }
}
