//! The knob table: every `PYTORCH_CUDA_ALLOC_CONF` key as one row (its field, default and
//! builder setter, spellings, version gate, parse, check, print and snapshot setting).
//!
//! [`AllocatorConfig`], its `Default` and the setters of [`AllocatorConfigBuilder`] are
//! generated from the rows by `knobs!`, and the parser, [`AllocatorConfig::validate`],
//! `Display`, [`AllocatorConfig::to_settings`] / [`AllocatorConfig::from_settings`] and
//! [`AllocatorConfig::validate_warnings`] walk [`KNOBS`]. A new knob is one row here, the code
//! that reads its field, and its tests.
//!
//! The table order is the canonical (printing) order, the order of [`super::ALLOWED_KEYS`] and
//! the order in which `validate` checks the fields.

use super::parse::{
    Value, interval_of_key_mb, invalid, is_division, parse_bool, parse_divisions, parse_split_mb,
    parse_uint, scalar,
};
// Named by the field docs' links.
#[allow(unused_imports)]
use super::{
    AllocatorConfigBuilder, ConfigWarning, MAX_PINNED_REGISTER_THREADS, MIN_SPLIT_SIZE_MB,
};
use super::{Backend, ConfigError, MIB, ROUNDUP_POWER2_INTERVALS, SettingValue};
use crate::rules::TorchVersion;

pub(super) const EXPECT_MB: &str = "a whole number of MiB, at least 20";
pub(super) const EXPECT_BOOL: &str = "True or False";
pub(super) const EXPECT_DIVISIONS: &str = "a number of divisions that is a power of two (1, 2, \
                                           4, ...) or 0, or a list such as [256:4,512:2,>:1]";
pub(super) const EXPECT_LIST_KEY: &str = "an interval size in MiB that is a power of two \
                                          (1, 2, 4, ..., 32768; larger sizes share the last \
                                          interval) or >";
pub(super) const EXPECT_LIST_VALUE: &str =
    "a number of divisions that is a power of two (1, 2, 4, ...) or 0";
const EXPECT_GC: &str = "a number strictly between 0.0 and 1.0";
const EXPECT_FRACTION: &str = "a fraction greater than 0.0 and at most 1.0";
const EXPECT_BACKEND: &str = "native or cudaMallocAsync";
pub(super) const EXPECT_THREADS: &str = "a power of two from 1 to 128";
const EXPECT_RESERVE: &str = "a whole number of MiB greater than 0";

/// Parses one value of the configuration string into the config. Gets the key as spelled in
/// the string (an alias stays an alias in error messages) and the version whose rules apply.
type ParseFn =
    fn(&mut AllocatorConfig, &'static str, Value<'_>, TorchVersion) -> Result<(), ConfigError>;

/// One configuration-string key.
pub(super) struct Knob {
    /// The canonical spelling (PyTorch's).
    pub name: &'static str,
    /// Other spellings accepted for the same knob (ROCm's).
    pub aliases: &'static [&'static str],
    /// What the key accepts, for error messages.
    pub expected: &'static str,
    /// Whether the value may be a bracketed `[k:v,...]` list.
    pub takes_list: bool,
    /// Ignored by the `cudaMallocAsync` backend ([`ConfigWarning::AsyncBackendIgnoresNativeOptions`]).
    pub native_only: bool,
    /// Whether a torch version's parser knows the key (an unknown key is an error).
    pub accepted_by: fn(TorchVersion) -> bool,
    /// Reads a value of the configuration string.
    pub parse: ParseFn,
    /// Checks the field of a config built by hand (errors name the key).
    pub check: fn(&AllocatorConfig) -> Result<(), ConfigError>,
    /// The value as the canonical string prints it, `None` when the knob has its default
    /// (then it is not printed).
    pub print: fn(&AllocatorConfig) -> Option<String>,
    /// Its entry in a snapshot's `allocator_settings`, if PyTorch writes one.
    pub snapshot: Option<Snapshot>,
}

/// How a knob appears in a snapshot's `allocator_settings` dict.
pub(super) struct Snapshot {
    /// The dict key.
    pub key: &'static str,
    /// Its place in PyTorch's key order (`PYTORCH_CUDA_ALLOC_CONF`, always first, is 0).
    pub order: u8,
    /// The value PyTorch writes.
    pub write: fn(&AllocatorConfig) -> SettingValue,
    /// Reads the value back into the config.
    pub read: fn(&mut AllocatorConfig, &SettingValue) -> Result<(), ConfigError>,
}

/// The defaults of a row: a scalar knob every version accepts, always valid, not native-only,
/// not in snapshots. Rows override what differs.
const BASE: Knob = Knob {
    name: "",
    aliases: &[],
    expected: "",
    takes_list: false,
    native_only: false,
    accepted_by: |_| true,
    parse: |_, _, _, _| Ok(()),
    check: |_| Ok(()),
    print: |_| None,
    snapshot: None,
};

/// An error for a snapshot setting of the wrong type or range.
fn wrong(key: &'static str, value: &SettingValue, expected: &str) -> ConfigError {
    invalid(key, &value.to_string(), expected)
}

/// Python's spelling of a bool.
fn py_bool(b: bool) -> String {
    if b { "True" } else { "False" }.to_owned()
}

/// A bool knob (`True`/`False`, default `False`) whose field is `$field`; `snapshot N` puts it
/// in a snapshot's settings under its own name at place `N`.
macro_rules! flag {
    ($field:ident, $name:literal $(, alias $alias:literal)? $(, snapshot $order:literal)?) => {
        Knob {
            name: $name,
            aliases: &[$($alias)?],
            expected: EXPECT_BOOL,
            parse: |c, name, v, _| {
                c.$field = parse_bool(name, scalar(name, v, EXPECT_BOOL)?)?;
                Ok(())
            },
            print: |c| c.$field.then(|| py_bool(true)),
            snapshot: {
                #[allow(unused_variables)]
                let snapshot: Option<Snapshot> = None;
                $(
                    let snapshot = Some(Snapshot {
                        key: $name,
                        order: $order,
                        write: |c| SettingValue::Bool(c.$field),
                        read: |c, v| match v {
                            SettingValue::Bool(b) => {
                                c.$field = *b;
                                Ok(())
                            }
                            other => Err(wrong($name, other, "a bool")),
                        },
                    });
                )?
                snapshot
            },
            ..BASE
        }
    };
}

/// Generates [`AllocatorConfig`], its `Default`, the builder's setters and [`KNOBS`] from the
/// rows: `doc, field: type = default, set(setter argument type) => row;`.
macro_rules! knobs {
    ($(
        $(#[doc = $doc:literal])*
        $field:ident: $ty:ty = $default:expr, set($arg:ty) => $row:expr;
    )*) => {
        /// The caching allocator's configuration (PyTorch's `CUDAAllocatorConfig`).
        ///
        /// Make one with [`parse`](AllocatorConfig::parse) (the `PYTORCH_CUDA_ALLOC_CONF`
        /// string), [`AllocatorConfig::builder`] or [`Default`]; all three give a config that
        /// passes [`AllocatorConfig::validate`]. The struct is `#[non_exhaustive]` (new knobs
        /// are added as PyTorch adds them), so other crates cannot write it as a struct
        /// literal; its fields stay public for reading and for changing in place, and a config
        /// changed by hand should pass `validate` again. Printing (`Display`) a valid config
        /// and parsing the result gives the same config back.
        #[derive(Clone, Debug, PartialEq)]
        #[non_exhaustive]
        pub struct AllocatorConfig {
            $( $(#[doc = $doc])* pub $field: $ty, )*
        }

        impl Default for AllocatorConfig {
            /// PyTorch's defaults: everything off, unlimited split size, 20 MiB non-split
            /// rounding, one pinned register thread, native backend.
            fn default() -> Self {
                AllocatorConfig { $( $field: $default, )* }
            }
        }

        impl AllocatorConfigBuilder {
            $(
                #[doc = concat!(
                    "Sets [`AllocatorConfig::", stringify!($field),
                    "`], in the field's units (see its documentation)."
                )]
                pub fn $field(mut self, value: $arg) -> Self {
                    self.config.$field = value.into();
                    self
                }
            )*
        }

        /// Every knob, in canonical order.
        pub(super) const KNOBS: &[Knob] = &[ $( $row, )* ];
    };
}

knobs! {
    /// Which allocator backs device memory (`backend:native|cudaMallocAsync`, default native).
    /// Stored; this crate implements the native allocator.
    backend: Backend = Backend::Native, set(Backend) => Knob {
        name: "backend",
        expected: EXPECT_BACKEND,
        parse: |c, name, v, _| {
            c.backend = match scalar(name, v, EXPECT_BACKEND)? {
                "native" => Backend::Native,
                "cudaMallocAsync" => Backend::CudaMallocAsync,
                text => return Err(invalid(name, text, EXPECT_BACKEND)),
            };
            Ok(())
        },
        print: |c| (c.backend != Backend::Native).then(|| c.backend.to_string()),
        ..BASE
    };

    /// Blocks of at least this many bytes are never split, and a request below it is never
    /// served from such a block (`max_split_size_mb:N`, stored as `N` MiB). `None` (the
    /// default) means unlimited. At least [`MIN_SPLIT_SIZE_MB`] MiB; larger values than
    /// `usize::MAX / MIB` MiB are clamped, as in PyTorch.
    max_split_size: Option<usize> = None, set(impl Into<Option<usize>>) => Knob {
        name: "max_split_size_mb",
        expected: EXPECT_MB,
        native_only: true,
        parse: |c, name, v, torch| {
            c.max_split_size = Some(parse_split_mb(name, scalar(name, v, EXPECT_MB)?, torch)?);
            Ok(())
        },
        check: |c| c.max_split_size.map_or(Ok(()), |bytes| check_mb("max_split_size_mb", bytes)),
        print: |c| c.max_split_size.map(|bytes| (bytes / MIB).to_string()),
        snapshot: Some(Snapshot {
            key: "max_split_size",
            order: 1,
            // Bytes, -1 when unlimited; saturating (PyTorch's `int64_t` cast wraps).
            write: |c| {
                SettingValue::Int(match c.max_split_size {
                    None => -1,
                    Some(bytes) => {
                        i64::try_from(bytes).unwrap_or(i64::MAX / MIB as i64 * MIB as i64)
                    }
                })
            },
            read: |c, v| {
                c.max_split_size = match v {
                    SettingValue::Int(-1) => None,
                    SettingValue::Int(n) if *n > 0 => Some(usize::try_from(*n).map_err(|_| {
                        wrong("max_split_size", v, "bytes, or -1 for unlimited")
                    })?),
                    other => {
                        return Err(wrong(
                            "max_split_size",
                            other,
                            "bytes (at least 20 MiB), or -1 for unlimited",
                        ));
                    }
                };
                Ok(())
            },
        }),
        ..BASE
    };

    /// Bytes: how much larger than the request an unsplittable cached block may be and still
    /// be handed out whole (`max_non_split_rounding_mb:N`, stored as `N` MiB). Default 20 MiB;
    /// at least [`MIN_SPLIT_SIZE_MB`] MiB (PyTorch requires `>= 20`).
    max_non_split_rounding: usize = MIN_SPLIT_SIZE_MB * MIB, set(usize) => Knob {
        name: "max_non_split_rounding_mb",
        expected: EXPECT_MB,
        native_only: true,
        parse: |c, name, v, torch| {
            c.max_non_split_rounding = parse_split_mb(name, scalar(name, v, EXPECT_MB)?, torch)?;
            Ok(())
        },
        check: |c| check_mb("max_non_split_rounding_mb", c.max_non_split_rounding),
        print: |c| {
            (c.max_non_split_rounding != MIN_SPLIT_SIZE_MB * MIB)
                .then(|| (c.max_non_split_rounding / MIB).to_string())
        },
        ..BASE
    };

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
    roundup_power2_divisions: [usize; ROUNDUP_POWER2_INTERVALS] = [0; ROUNDUP_POWER2_INTERVALS],
        set([usize; ROUNDUP_POWER2_INTERVALS]) => Knob {
        name: "roundup_power2_divisions",
        expected: EXPECT_DIVISIONS,
        takes_list: true,
        native_only: true,
        parse: |c, name, v, torch| {
            c.roundup_power2_divisions = parse_divisions(name, v, torch)?;
            Ok(())
        },
        check: |c| match c.roundup_power2_divisions.iter().find(|&&d| !is_division(d)) {
            Some(bad) => Err(invalid("roundup_power2_divisions", &bad.to_string(), EXPECT_LIST_VALUE)),
            None => Ok(()),
        },
        print: |c| {
            let d = &c.roundup_power2_divisions;
            if d.iter().all(|&x| x == 0) {
                None
            } else if d.iter().all(|&x| x == d[0]) {
                Some(d[0].to_string())
            } else {
                Some(division_list(d))
            }
        },
        snapshot: Some(Snapshot {
            key: "roundup_power2_divisions",
            order: 7,
            // MiB key "1", "2", ..., "32768" to divisions, saturating.
            write: |c| {
                SettingValue::Map(
                    c.roundup_power2_divisions
                        .iter()
                        .enumerate()
                        .map(|(i, &d)| ((1u64 << i).to_string(), i64::try_from(d).unwrap_or(i64::MAX)))
                        .collect(),
                )
            },
            read: |c, v| {
                let SettingValue::Map(entries) = v else {
                    return Err(wrong("roundup_power2_divisions", v, "a dict of str to int"));
                };
                for (k, v) in entries {
                    let index = match parse_uint(k) {
                        Some(mb) if mb.is_power_of_two() && mb < (1 << ROUNDUP_POWER2_INTERVALS) => {
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
                    c.roundup_power2_divisions[index] = usize::try_from(*v).map_err(|_| {
                        invalid("roundup_power2_divisions", &v.to_string(), EXPECT_LIST_VALUE)
                    })?;
                }
                Ok(())
            },
        }),
        ..BASE
    };

    /// Fraction of the allowed memory above which the allocator frees cached blocks that have
    /// not been reused for the longest (`garbage_collection_threshold:f`, `0 < f < 1`).
    /// 0 (the default) means off. Only effective together with a per-process memory fraction;
    /// see [`ConfigWarning::GcThresholdWithoutMemoryFraction`].
    garbage_collection_threshold: f64 = 0.0, set(f64) => Knob {
        name: "garbage_collection_threshold",
        expected: EXPECT_GC,
        native_only: true,
        parse: |c, name, v, _| {
            let text = scalar(name, v, EXPECT_GC)?;
            c.garbage_collection_threshold = match text.parse::<f64>() {
                Ok(x) if x > 0.0 && x < 1.0 => x,
                _ => return Err(invalid(name, text, EXPECT_GC)),
            };
            Ok(())
        },
        check: |c| {
            let gc = c.garbage_collection_threshold;
            if gc == 0.0 || (gc > 0.0 && gc < 1.0) {
                Ok(())
            } else {
                Err(invalid("garbage_collection_threshold", &gc.to_string(), EXPECT_GC))
            }
        },
        print: |c| {
            (c.garbage_collection_threshold != 0.0)
                .then(|| c.garbage_collection_threshold.to_string())
        },
        snapshot: Some(Snapshot {
            key: "garbage_collection_threshold",
            order: 2,
            write: |c| SettingValue::Float(c.garbage_collection_threshold),
            read: |c, v| {
                c.garbage_collection_threshold = match v {
                    SettingValue::Float(x) => *x,
                    SettingValue::Int(n) => *n as f64,
                    other => return Err(wrong("garbage_collection_threshold", other, "a float")),
                };
                Ok(())
            },
        }),
        ..BASE
    };

    /// Grow segments by mapping more pages instead of allocating new segments
    /// (`expandable_segments:True|False`, default `False`).
    expandable_segments: bool = false, set(bool) => Knob {
        native_only: true,
        ..flag!(expandable_segments, "expandable_segments", snapshot 3)
    };

    /// Cap on this process's device memory as a fraction of the device's total,
    /// `0 < f <= 1` (`per_process_memory_fraction:f`). torch 2.15 accepts the key in the
    /// configuration string; torch 2.7 sets the cap only with
    /// `torch.cuda.set_per_process_memory_fraction(f)` and rejects the key. `None` (the
    /// default) means no cap.
    per_process_memory_fraction: Option<f64> = None, set(impl Into<Option<f64>>) => Knob {
        name: "per_process_memory_fraction",
        expected: EXPECT_FRACTION,
        accepted_by: TorchVersion::accepts_memory_fraction_key,
        parse: |c, name, v, _| {
            let text = scalar(name, v, EXPECT_FRACTION)?;
            c.per_process_memory_fraction = match text.parse::<f64>() {
                Ok(x) if x > 0.0 && x <= 1.0 => Some(x),
                _ => return Err(invalid(name, text, EXPECT_FRACTION)),
            };
            Ok(())
        },
        check: |c| match c.per_process_memory_fraction {
            Some(f) if !(f > 0.0 && f <= 1.0) => {
                Err(invalid("per_process_memory_fraction", &f.to_string(), EXPECT_FRACTION))
            }
            _ => Ok(()),
        },
        print: |c| c.per_process_memory_fraction.map(|f| f.to_string()),
        ..BASE
    };

    /// Release the allocator lock around `cudaMalloc` (`release_lock_on_cudamalloc:True|False`,
    /// alias `release_lock_on_hipmalloc`). Accepted for compatibility; no effect here.
    release_lock_on_cudamalloc: bool = false, set(bool) =>
        flag!(release_lock_on_cudamalloc, "release_lock_on_cudamalloc",
              alias "release_lock_on_hipmalloc", snapshot 5);

    /// Pinned host memory through `cudaHostRegister` instead of `cudaHostAlloc`
    /// (`pinned_use_cuda_host_register:True|False`, alias `pinned_use_hip_host_register`); read
    /// by the pinned host allocator (`HostAllocatorConfig`).
    pinned_use_cuda_host_register: bool = false, set(bool) =>
        flag!(pinned_use_cuda_host_register, "pinned_use_cuda_host_register",
              alias "pinned_use_hip_host_register", snapshot 6);

    /// Threads used to register pinned memory (`pinned_num_register_threads:N`, a power of two
    /// from 1 to [`MAX_PINNED_REGISTER_THREADS`], default 1); read by the pinned host allocator.
    pinned_num_register_threads: usize = 1, set(usize) => Knob {
        name: "pinned_num_register_threads",
        expected: EXPECT_THREADS,
        parse: |c, name, v, _| {
            let text = scalar(name, v, EXPECT_THREADS)?;
            c.pinned_num_register_threads = match parse_uint(text) {
                Some(n) if is_thread_count(n) => n,
                _ => return Err(invalid(name, text, EXPECT_THREADS)),
            };
            Ok(())
        },
        check: |c| {
            let threads = c.pinned_num_register_threads;
            if is_thread_count(threads) {
                Ok(())
            } else {
                Err(invalid("pinned_num_register_threads", &threads.to_string(), EXPECT_THREADS))
            }
        },
        print: |c| {
            (c.pinned_num_register_threads != 1).then(|| c.pinned_num_register_threads.to_string())
        },
        snapshot: Some(Snapshot {
            key: "pinned_num_register_threads",
            order: 4,
            write: |c| {
                SettingValue::Int(i64::try_from(c.pinned_num_register_threads).unwrap_or(i64::MAX))
            },
            read: |c, v| {
                c.pinned_num_register_threads = match v {
                    SettingValue::Int(n) => usize::try_from(*n)
                        .map_err(|_| wrong("pinned_num_register_threads", v, EXPECT_THREADS))?,
                    other => return Err(wrong("pinned_num_register_threads", other, EXPECT_THREADS)),
                };
                Ok(())
            },
        }),
        ..BASE
    };

    /// MiB reserved up front by the pinned host allocator (`pinned_reserve_segment_size_mb:N`,
    /// `N > 0`; 0, the default, means not set). Accepted for compatibility; no effect here.
    pinned_reserve_segment_size_mb: usize = 0, set(usize) => Knob {
        name: "pinned_reserve_segment_size_mb",
        expected: EXPECT_RESERVE,
        parse: |c, name, v, _| {
            let text = scalar(name, v, EXPECT_RESERVE)?;
            c.pinned_reserve_segment_size_mb = match parse_uint(text) {
                Some(n) if n > 0 => n,
                _ => return Err(invalid(name, text, EXPECT_RESERVE)),
            };
            Ok(())
        },
        print: |c| {
            (c.pinned_reserve_segment_size_mb != 0)
                .then(|| c.pinned_reserve_segment_size_mb.to_string())
        },
        ..BASE
    };

    /// Process pinned-memory events on a background thread
    /// (`pinned_use_background_threads:True|False`); read by the pinned host allocator.
    pinned_use_background_threads: bool = false, set(bool) =>
        flag!(pinned_use_background_threads, "pinned_use_background_threads");

    /// Reuse blocks freed during CUDA graph capture once their recorded streams are done
    /// (`graph_capture_record_stream_reuse:True|False`). Accepted for compatibility; no effect
    /// here.
    graph_capture_record_stream_reuse: bool = false, set(bool) =>
        flag!(graph_capture_record_stream_reuse, "graph_capture_record_stream_reuse", snapshot 8);

    /// A pinned host allocator switch of torch 2.15 (`pinned_free_catch_all:True|False`,
    /// PyTorch's `CUDAAllocatorConfig::pinned_free_catch_all()`; torch 2.7 rejects the key, as
    /// torch-oracle shows). Accepted for compatibility and stored; nothing here reads it.
    pinned_free_catch_all: bool = false, set(bool) => Knob {
        accepted_by: |torch| torch >= TorchVersion::V2_15,
        ..flag!(pinned_free_catch_all, "pinned_free_catch_all")
    };
}

/// The canonical spellings of [`KNOBS`], in order ([`super::ALLOWED_KEYS`]).
pub(super) const NAMES: [&str; KNOBS.len()] = {
    let mut names = [""; KNOBS.len()];
    let mut i = 0;
    while i < KNOBS.len() {
        names[i] = KNOBS[i].name;
        i += 1;
    }
    names
};

/// The knob a spelling names (its canonical name or an alias), with the spelling as a
/// `'static` string for error messages.
pub(super) fn lookup(spelling: &str) -> Option<(&'static str, &'static Knob)> {
    KNOBS.iter().find_map(|knob| {
        std::iter::once(&knob.name)
            .chain(knob.aliases)
            .find(|name| **name == spelling)
            .map(|name| (*name, knob))
    })
}

/// A `*_mb` field: a whole number of MiB, at least [`MIN_SPLIT_SIZE_MB`].
fn check_mb(name: &'static str, bytes: usize) -> Result<(), ConfigError> {
    if bytes % MIB == 0 && bytes >= MIN_SPLIT_SIZE_MB * MIB {
        Ok(())
    } else {
        Err(invalid(name, &format!("{bytes} bytes"), EXPECT_MB))
    }
}

/// A valid `pinned_num_register_threads`.
fn is_thread_count(n: usize) -> bool {
    n.is_power_of_two() && n <= MAX_PINNED_REGISTER_THREADS
}

/// The canonical list form of `divisions` (not all equal).
fn division_list(d: &[usize; ROUNDUP_POWER2_INTERVALS]) -> String {
    use std::fmt::Write;
    let last = ROUNDUP_POWER2_INTERVALS - 1;
    // End of the leading run (the first key fills everything below it).
    let head = d.iter().position(|&x| x != d[0]).map_or(last, |i| i - 1);
    // Start of the trailing run (filled by `>`, which starts right after the last key).
    let tail = d.iter().rposition(|&x| x != d[last]).map_or(0, |i| i + 1);
    let mut out = format!("[{}:{}", 1usize << head, d[head]);
    for (i, x) in d.iter().enumerate().take(tail).skip(head + 1) {
        // Writing to a String cannot fail.
        let _ = write!(out, ",{}:{}", 1usize << i, x);
    }
    if d[last] != 0 {
        let _ = write!(out, ",>:{}", d[last]);
    }
    out.push(']');
    out
}
