//! `memory_summary()`: the text table of PyTorch's `torch.cuda.memory_summary`, and size formatting.
//!
//! Two size formatters live here because PyTorch has two:
//! - [`format_size`] is the C++ `format_size` of `c10/cuda/CUDACachingAllocator.cpp` (now in
//!   `c10/core/CachingDeviceAllocator.h`), used by the out-of-memory message ("20.00 MiB").
//! - [`format_size_summary`] and [`format_count`] are the `_format_size` / `_format_count`
//!   helpers nested in `torch/cuda/memory.py::memory_summary`: fixed-width columns whose unit is
//!   chosen by a *reference* value (the aggregate row of the same column), so the "from large
//!   pool" / "from small pool" rows print in the unit of their "all" row.
//!
//! [`memory_summary`] reproduces `torch.cuda.memory_summary(device, abbreviated)` byte for byte
//! for the same statistics, and [`stats_table`] prints the flat `memory_stats()` map.

use std::fmt::Write as _;

use crate::stats::{DeviceStats, Stat, StatArray, StatType};

/// Width of every line of [`memory_summary`] between the `|` borders (PyTorch's 75).
const WIDTH: usize = 75;

/// Formats a byte count the way the allocator's out-of-memory message does (C++ `format_size`).
///
/// `bytes <= 1024` prints as `"N bytes"`; `<= 1 MiB` as KiB, `<= 1 GiB` as MiB, anything larger
/// as GiB, each with two decimals (`std::fixed`, precision 2): `1024` -> `"1024 bytes"`,
/// `1025` -> `"1.00 KiB"`, `1048576` -> `"1024.00 KiB"`, `1048577` -> `"1.00 MiB"`.
pub fn format_size(bytes: u64) -> String {
    const KIB: u64 = 1 << 10;
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    // The C++ divides a `uint64_t` by a double literal; `as f64` is the same conversion.
    if bytes <= KIB {
        format!("{bytes} bytes")
    } else if bytes <= MIB {
        format!("{:.2} KiB", bytes as f64 / 1024.0)
    } else if bytes <= GIB {
        format!("{:.2} MiB", bytes as f64 / 1_048_576.0)
    } else {
        format!("{:.2} GiB", bytes as f64 / 1_073_741_824.0)
    }
}

/// Formats a byte count as one `memory_summary` cell (Python `_format_size(n, n)`).
///
/// Returns the 10-character cell exactly as PyTorch does, padding included: the value right-aligned
/// in 6 columns, a space, then a 3-column unit (`"B  "`, `"KiB"`, `"MiB"`, `"GiB"`, `"TiB"`,
/// `"PiB"`). The unit goes up by 1024 while the value is at least 768 of the *next* unit (768 KiB
/// = 786432 bytes and up prints in KiB), and the value is floor-divided: `786431` ->
/// `"786431 B  "`, `786432` -> `"   768 KiB"`. Negative values always print in bytes.
pub fn format_size_summary(bytes: i64) -> String {
    format_size_pref(bytes, bytes)
}

/// Formats a count as one `memory_summary` cell (Python `_format_count(n, n)`).
///
/// Returns the 10-character cell exactly as PyTorch does: the value right-aligned in 7 columns, a
/// space, a 1-column suffix (`" "`, `"K"`, `"M"`) and a trailing space. The suffix goes up by 1000
/// while the value is at least 750 of the next one, floor-dividing: `749999` ->
/// `" 749999   "`, `750000` -> `"    750 K "`.
pub fn format_count(count: i64) -> String {
    format_count_pref(count, count)
}

/// Python's `_format_size(sz, pref_sz)`: the unit is chosen from `pref`, applied to `bytes`.
fn format_size_pref(bytes: i64, pref: i64) -> String {
    const PREFIXES: [&str; 6] = ["B  ", "KiB", "MiB", "GiB", "TiB", "PiB"];
    scaled_cell(bytes, pref, &PREFIXES, 1024, 768 * 1024, |value, unit| {
        format!("{value:6} {unit}")
    })
}

/// Python's `_format_count(cnt, pref_cnt)`: the suffix is chosen from `pref`, applied to `count`.
fn format_count_pref(count: i64, pref: i64) -> String {
    const PREFIXES: [&str; 3] = [" ", "K", "M"];
    scaled_cell(count, pref, &PREFIXES, 1000, 750 * 1000, |value, unit| {
        format!("{value:7} {unit} ")
    })
}

/// The loop shared by `_format_size` and `_format_count`.
///
/// Python keeps `value` an int (`//=`, floor division) and turns `pref` into a float at the first
/// division (`/=`); the threshold test is `pref < threshold`. This does the same: `div_euclid`
/// is floor division for a positive divisor, and the reference value is an `f64` after the first
/// step (dividing by 1024 is exact in binary floating point, so the unit choice is Python's).
fn scaled_cell(
    mut value: i64,
    pref: i64,
    prefixes: &[&str],
    step: i64,
    threshold: i64,
    cell: impl Fn(i64, &str) -> String,
) -> String {
    let mut unit = prefixes[0];
    // The first comparison is int against int in Python; keep it exact.
    if pref >= threshold {
        let mut pref_f = pref as f64;
        for &next in &prefixes[1..] {
            if pref_f < threshold as f64 {
                break;
            }
            unit = next;
            value = value.div_euclid(step);
            pref_f /= step as f64;
        }
    }
    cell(value, unit)
}

/// One line of the table body: name column, then four cells separated by `" | "`.
fn row(name: &str, cells: [String; 4]) -> String {
    let [cur, peak, alloc, freed] = cells;
    format!(" {name:<21} | {cur} | {peak} | {alloc} | {freed} ")
}

/// Formats the four fields of `stat` with the units chosen by `pref` (the "all" row).
fn cells(stat: &Stat, pref: &Stat, f: fn(i64, i64) -> String) -> [String; 4] {
    [
        f(stat.current, pref.current),
        f(stat.peak, pref.peak),
        f(stat.allocated, pref.allocated),
        f(stat.freed, pref.freed),
    ]
}

/// The text of `torch.cuda.memory_summary(device, abbreviated)` for these statistics.
///
/// Byte for byte what `torch/cuda/memory.py` prints for the same `memory_stats()` map: 75-column
/// lines between `|` borders, each ending in `\n`; a title with the device ID; the
/// `num_ooms` / `num_alloc_retries` counters; then, under the header
/// `Metric | Cur Usage | Peak Usage | Tot Alloc | Tot Freed`, the rows Allocated memory
/// (`allocated_bytes`), Active memory (`active_bytes`), Requested memory (`requested_bytes`),
/// GPU reserved memory (`reserved_bytes`), Non-releasable memory (`inactive_split_bytes`),
/// Allocations (`allocation`), Active allocs (`active`), GPU reserved segments (`segment`),
/// Non-releasable allocs (`inactive_split`), each followed by its "from large pool" and
/// "from small pool" rows unless `abbreviated`, and last Oversize allocations and Oversize GPU
/// segments. Sizes use [`format_size_summary`]'s rules and counts [`format_count`]'s; a pool
/// row takes its unit from the "all" row of the same column, as in PyTorch.
pub fn memory_summary(device: u8, stats: &DeviceStats, abbreviated: bool) -> String {
    type Formatter = fn(i64, i64) -> String;
    let metrics: [(&StatArray, &str, Formatter); 9] = [
        (&stats.allocated_bytes, "Allocated memory", format_size_pref),
        (&stats.active_bytes, "Active memory", format_size_pref),
        (&stats.requested_bytes, "Requested memory", format_size_pref),
        (
            &stats.reserved_bytes,
            "GPU reserved memory",
            format_size_pref,
        ),
        (
            &stats.inactive_split_bytes,
            "Non-releasable memory",
            format_size_pref,
        ),
        (&stats.allocation, "Allocations", format_count_pref),
        (&stats.active, "Active allocs", format_count_pref),
        (&stats.segment, "GPU reserved segments", format_count_pref),
        (
            &stats.inactive_split,
            "Non-releasable allocs",
            format_count_pref,
        ),
    ];
    let thick = "=".repeat(WIDTH);
    let thin = "-".repeat(WIDTH);

    let mut lines = vec![
        thick.clone(),
        format!(
            " {:16} PyTorch CUDA memory summary, device ID {device:<17} ",
            ""
        ),
        thin.clone(),
        format!(
            "  {:9} CUDA OOMs: {:<12} | {:6} cudaMalloc retries: {:<8}  ",
            "", stats.num_ooms, "", stats.num_alloc_retries
        ),
        thick.clone(),
        "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ".to_owned(),
    ];

    for (array, name, f) in metrics {
        lines.push(thin.clone());
        let all = &array[StatType::Aggregate as usize];
        lines.push(row(name, cells(all, all, f)));
        if !abbreviated {
            for (pool, label) in [
                (StatType::LargePool, "      from large pool"),
                (StatType::SmallPool, "      from small pool"),
            ] {
                lines.push(row(label, cells(&array[pool as usize], all, f)));
            }
        }
    }

    for (stat, name) in [
        (&stats.oversize_allocations, "Oversize allocations"),
        (&stats.oversize_segments, "Oversize GPU segments"),
    ] {
        lines.push(thin.clone());
        lines.push(row(name, cells(stat, stat, format_count_pref)));
    }
    lines.push(thick);

    let mut out = String::with_capacity(lines.len() * (WIDTH + 3));
    for line in &lines {
        out.push('|');
        out.push_str(line);
        out.push_str("|\n");
    }
    out
}

/// The flat `torch.cuda.memory_stats()` map as `key = value` lines, sorted by key.
///
/// One line per key of [`DeviceStats::memory_stats`] (the keys of the PyTorch version the stats
/// follow: 122 for torch 2.7, 123 for 2.15), each ending in `\n`;
/// byte values are plain integers (no units). `max_split_size` reads `-1` when unlimited, as in
/// PyTorch. Meant for snapshots and the command-line tools.
pub fn stats_table(stats: &DeviceStats) -> String {
    let mut out = String::new();
    for (key, value) in stats.memory_stats() {
        // Writing to a String cannot fail.
        let _ = writeln!(out, "{key} = {value}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_rows_take_the_unit_of_the_all_row() {
        // all = 1 MiB (prints in KiB), large = 1000 B: PyTorch prints the pool cell in KiB too.
        assert_eq!(format_size_pref(1000, 1 << 20), "     0 KiB");
        assert_eq!(format_count_pref(999, 800_000), "      0 K ");
    }

    #[test]
    fn every_summary_line_is_75_columns() {
        let text = memory_summary(3, &DeviceStats::default(), false);
        for line in text.lines() {
            assert_eq!(line.chars().count(), WIDTH + 2, "{line:?}");
        }
    }
}
