//! Which PyTorch release's allocator rules to follow ([`TorchVersion`]), and which of
//! PyTorch's bugs to fix on purpose ([`Fixes`]); together a [`Rules`] value, chosen when a
//! [`crate::DeviceCachingAllocator`] is built and never consulted per call.
//!
//! Every difference between the versions was found (and is re-checked) by differential testing
//! against PyTorch's real `libc10_cuda.so` on a fake CUDA runtime (`crates/oracle-diff`); the
//! list, with where each lives in the code, is in ARCHITECTURE.md.

use std::fmt;
use std::str::FromStr;

/// A PyTorch release whose caching-allocator behaviour the allocator reproduces.
///
/// The default is the newest ([`TorchVersion::NEWEST`]). Differences between the two (each
/// checked against the real allocators, torch 2.7.1 and 2.15.0):
/// - ties between equal-size free blocks: 2.7 orders a pool's free blocks by
///   `(stream, size, address)`, 2.15 by `(stream, size, segment registration counter,
///   address)`, so the block in the oldest segment wins;
/// - `memory_stats()` keys: 2.15 adds `num_oom_rejections`;
/// - the out-of-memory message: 2.15 ends it with a note on virtual address space when
///   expandable segments are on, 2.7 with the `expandable_segments:True` hint and the link;
/// - `PYTORCH_CUDA_ALLOC_CONF`: 2.7 rejects the `per_process_memory_fraction` key and
///   `max_split_size_mb`/`max_non_split_rounding_mb` of 20, and starts the `>` fill of
///   `roundup_power2_divisions` at the last key's interval (see
///   [`crate::config::AllocatorConfig::parse_for`]);
/// - a memory fraction of 1.0: 2.15 removes the limit, 2.7 keeps it at the device's total;
/// - expandable segments: 2.15 releases a new segment too small for the request at once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TorchVersion {
    /// torch 2.7 (checked against 2.7.1).
    V2_7,
    /// torch 2.15 (checked against 2.15.0), the default.
    #[default]
    V2_15,
}

impl TorchVersion {
    /// Every supported version, oldest first.
    pub const ALL: [TorchVersion; 2] = [TorchVersion::V2_7, TorchVersion::V2_15];

    /// The newest supported version (the default).
    pub const NEWEST: TorchVersion = TorchVersion::V2_15;

    /// The version as `major.minor` (`"2.7"`, `"2.15"`).
    pub fn as_str(self) -> &'static str {
        match self {
            TorchVersion::V2_7 => "2.7",
            TorchVersion::V2_15 => "2.15",
        }
    }

    /// The exact release the rules were checked against (`"2.7.1"`, `"2.15.0"`).
    pub fn checked_release(self) -> &'static str {
        match self {
            TorchVersion::V2_7 => "2.7.1",
            TorchVersion::V2_15 => "2.15.0",
        }
    }

    /// Whether equal-size free blocks are ordered by their segment's registration counter
    /// before their address (the oldest segment wins; 2.15).
    pub fn ties_by_segment_age(self) -> bool {
        self >= TorchVersion::V2_15
    }

    /// Whether `memory_stats()` has `num_oom_rejections` (2.15).
    pub fn has_oom_rejections_stat(self) -> bool {
        self >= TorchVersion::V2_15
    }

    /// Whether the memory fraction's limit (`allowed_memory_maximum`) is `fraction * total`
    /// rounded to the nearest byte (2.15) rather than truncated (2.7); seen in the
    /// `device_total` an OOM observer gets (fraction 0.89 of 16 GiB: 15290083574 vs
    /// 15290083573).
    pub fn fraction_limit_rounds(self) -> bool {
        self >= TorchVersion::V2_15
    }

    /// Whether a begun private pool counts as a CUDA graph capture underway (2.7:
    /// `beginAllocateToPool` adds to `captures_underway`, so malloc skips event processing
    /// and the release-everything retry, frees with stream uses defer their events, and a
    /// global `emptyCache` asserts; 2.15 keeps begun pools apart from captures).
    pub fn begun_pool_is_capture(self) -> bool {
        self < TorchVersion::V2_15
    }

    /// Whether, of two begun pools accepting a stream, the one begun last gets the
    /// allocation (2.15; 2.7: the one begun first).
    pub fn last_begun_pool_wins(self) -> bool {
        self >= TorchVersion::V2_15
    }

    /// Whether `MemPool` has `use_on_oom` and `no_split` (2.15).
    pub fn has_mem_pool_options(self) -> bool {
        self >= TorchVersion::V2_15
    }

    /// Whether `~MemPool` asserts a use count of 1 (2.7).
    pub fn mem_pool_destructor_needs_sole_use(self) -> bool {
        self < TorchVersion::V2_15
    }

    /// Whether `PYTORCH_CUDA_ALLOC_CONF` accepts `per_process_memory_fraction` (2.15; 2.7
    /// rejects the key as unrecognized).
    pub fn accepts_memory_fraction_key(self) -> bool {
        self >= TorchVersion::V2_15
    }

    /// Whether `max_split_size_mb` and `max_non_split_rounding_mb` must be more than 20
    /// (2.7; 2.15 accepts 20).
    pub fn split_mb_must_exceed_20(self) -> bool {
        self < TorchVersion::V2_15
    }

    /// Whether the `>` entry of a `roundup_power2_divisions` list fills from the last key's
    /// own interval, overwriting it (2.7), instead of from the next one (2.15).
    pub fn gt_fill_starts_at_last_key(self) -> bool {
        self < TorchVersion::V2_15
    }

    /// Whether a memory fraction of 1.0 removes the limit (2.15; under 2.7 it still refuses
    /// any segment that would take reserved memory past the device's total, without asking the
    /// device).
    pub fn fraction_one_is_unlimited(self) -> bool {
        self >= TorchVersion::V2_15
    }

    /// Whether a new expandable segment whose address space (9/8 of the device) cannot hold
    /// the request is released at once and the request fails (2.15). 2.7 maps pages until the
    /// device refuses, and keeps the segment.
    pub fn releases_too_small_new_segment(self) -> bool {
        self >= TorchVersion::V2_15
    }
}

impl fmt::Display for TorchVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A version string that names no supported release.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "unsupported torch version \"{given}\": expected one of 2.7, 2.15 (a patch release such as 2.7.1 is accepted)"
)]
pub struct UnknownTorchVersion {
    /// The string as given.
    pub given: String,
}

impl FromStr for TorchVersion {
    type Err = UnknownTorchVersion;

    /// Parses `2.7`, `2.15`, or a release of them (`2.7.1`, `2.15.0`, `2.15.0+cu132`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        let t = t.split('+').next().unwrap_or(t);
        let mut parts = t.split('.');
        let (major, minor) = (parts.next(), parts.next());
        let patch_ok = parts
            .next()
            .is_none_or(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()));
        let rest_ok = parts.next().is_none();
        match (major, minor, patch_ok && rest_ok) {
            (Some("2"), Some("7"), true) => Ok(TorchVersion::V2_7),
            (Some("2"), Some("15"), true) => Ok(TorchVersion::V2_15),
            _ => Err(UnknownTorchVersion {
                given: s.to_owned(),
            }),
        }
    }
}

/// PyTorch bugs this allocator fixes on purpose. [`Fixes::ALL`] is the default; [`Fixes::NONE`]
/// reproduces PyTorch exactly, bugs included (for parity with a recording that hit one, and for
/// the differential tests, which count each fix's differences apart).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fixes {
    /// pytorch#189504: after the final release step synchronized the outstanding events (which
    /// can free a pending `record_stream` block inside a split segment), search the pool again
    /// before giving up. PyTorch only retries the device allocation and raises a spurious OOM.
    pub search_after_release: bool,
    /// With expandable segments and a memory fraction, refuse a request whose pages would take
    /// reserved memory past the limit. PyTorch checks the limit against the request rounded to
    /// 2 MiB but maps whole 20 MiB pages, so it can reserve up to a page more than allowed.
    pub expandable_fraction_limit: bool,
    /// `empty_cache` also releases expandable segments that were reserved but never mapped (a
    /// request whose pages could not be mapped). PyTorch keeps their address space until a later
    /// request on the same stream uses it.
    pub release_unmapped_segments: bool,
}

impl Fixes {
    /// Every fix on (the default).
    pub const ALL: Fixes = Fixes {
        search_after_release: true,
        expandable_fraction_limit: true,
        release_unmapped_segments: true,
    };

    /// No fix: PyTorch's behaviour, bugs included.
    pub const NONE: Fixes = Fixes {
        search_after_release: false,
        expandable_fraction_limit: false,
        release_unmapped_segments: false,
    };

    /// Each fix with its name (as the differential tests report it) and a short description.
    pub const LIST: [(&'static str, &'static str); 3] = [
        (
            "pytorch#189504",
            "search the pool again after the final release synchronized pending frees",
        ),
        (
            "expandable-fraction-limit",
            "a memory fraction bounds the pages expandable segments map, not the 2 MiB-rounded request",
        ),
        (
            "release-unmapped-segments",
            "empty_cache releases expandable segments that were never mapped",
        ),
    ];

    /// Whether fix `i` (an index into [`Fixes::LIST`]) is on.
    pub fn get(&self, i: usize) -> bool {
        match i {
            0 => self.search_after_release,
            1 => self.expandable_fraction_limit,
            2 => self.release_unmapped_segments,
            _ => false,
        }
    }

    /// `self` with fix `i` (an index into [`Fixes::LIST`]) set to `on`.
    pub fn with(mut self, i: usize, on: bool) -> Fixes {
        match i {
            0 => self.search_after_release = on,
            1 => self.expandable_fraction_limit = on,
            2 => self.release_unmapped_segments = on,
            _ => {}
        }
        self
    }
}

impl Default for Fixes {
    fn default() -> Self {
        Fixes::ALL
    }
}

/// What a [`crate::DeviceCachingAllocator`] follows: a PyTorch version's rules and a set of
/// deliberate fixes. The default is the newest version with every fix.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Rules {
    /// The PyTorch release whose decisions to reproduce.
    pub version: TorchVersion,
    /// The PyTorch bugs to fix.
    pub fixes: Fixes,
}

impl Rules {
    /// `version`'s rules with every fix.
    pub fn new(version: TorchVersion) -> Rules {
        Rules {
            version,
            fixes: Fixes::ALL,
        }
    }

    /// `version`'s rules exactly as PyTorch has them, bugs included ([`Fixes::NONE`]).
    pub fn pytorch_exact(version: TorchVersion) -> Rules {
        Rules {
            version,
            fixes: Fixes::NONE,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_with_or_without_a_patch_release() {
        for (s, v) in [
            ("2.7", TorchVersion::V2_7),
            ("2.7.1", TorchVersion::V2_7),
            ("2.15", TorchVersion::V2_15),
            ("2.15.0+cu132", TorchVersion::V2_15),
        ] {
            assert_eq!(s.parse::<TorchVersion>(), Ok(v), "{s}");
        }
        for bad in ["", "2", "2.8", "3.7", "2.7.x", "2.7.1.2", "2.15."] {
            let e = bad.parse::<TorchVersion>().unwrap_err();
            assert!(e.to_string().contains("expected one of 2.7, 2.15"), "{e}");
        }
        assert_eq!(TorchVersion::default(), TorchVersion::NEWEST);
    }

    #[test]
    fn fixes_index_round_trips() {
        for i in 0..Fixes::LIST.len() {
            assert!(Fixes::ALL.get(i));
            assert!(!Fixes::NONE.get(i));
            assert!(Fixes::NONE.with(i, true).get(i));
            assert_eq!(Fixes::ALL.with(i, false).with(i, true), Fixes::ALL);
        }
    }
}
