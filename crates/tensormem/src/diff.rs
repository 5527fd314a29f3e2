//! `tensormem diff A B`: two snapshots side by side: the dump's segments and bytes, the peaks
//! of a parity replay of each history (the whole job: its start state, then the history), the
//! fragmentation, and the call sites that grew or shrank between them. A state-only snapshot
//! has no peaks: those figures are `null` in JSON and `unknown` in text, never 0.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use c10_cuda::summary::format_size;
use serde::Serialize;

use crate::error::Error;
use crate::model::Snapshot;
use crate::report;
use crate::session::{self, ReplayReport, ReplayRequest};
use crate::top_sites::Site;
use crate::window::{EventWindow, Window};

/// One side of a comparison.
#[derive(Clone, Debug, Serialize)]
pub struct Side {
    /// The snapshot's name.
    pub file: String,
    /// Where its call sites were taken: `reserved peak` (a history's parity replay) or `dump`.
    pub moment: &'static str,
    /// History events replayed (0 for a state-only snapshot).
    pub events: usize,
    /// Segments in the dump.
    pub segments: usize,
    /// Reserved bytes at the dump.
    pub reserved_bytes_at_dump: u64,
    /// Allocated bytes at the dump.
    pub allocated_bytes_at_dump: u64,
    /// Peak reserved bytes of the parity replay (`null` without a history).
    pub peak_reserved_bytes: Option<u64>,
    /// Peak allocated bytes of the parity replay (`null` without a history).
    pub peak_allocated_bytes: Option<u64>,
    /// Peak of live bytes of the whole job (`null` without a history).
    pub lower_bound_bytes: Option<u64>,
    /// Peak reserved / lower bound (`null` without a history).
    pub fragmentation: Option<f64>,
    /// Blocks live when recording began (`null` without a history).
    pub start_blocks: Option<usize>,
    /// With `--since`/`--until` on a history: the window its peaks and call sites were
    /// measured in (absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<EventWindow>,
    /// Events in the side's trace (for describing the window).
    #[serde(skip)]
    pub trace_events: usize,
    /// Every call site at the moment, largest first.
    #[serde(skip)]
    pub sites: Vec<Site>,
}

/// One call site in both snapshots.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SiteChange {
    /// `filename:line:name` of the top user frame, as in `--top`.
    pub site: String,
    /// Requested bytes of its live allocations in A (0 when absent there).
    pub a_bytes: u64,
    /// Its live allocations in A.
    pub a_count: usize,
    /// Requested bytes in B.
    pub b_bytes: u64,
    /// Its live allocations in B.
    pub b_count: usize,
    /// `b_bytes - a_bytes`.
    pub change_bytes: i64,
}

/// What [`diff`] found.
#[derive(Clone, Debug, Serialize)]
pub struct Diff {
    /// The first snapshot.
    pub a: Side,
    /// The second snapshot.
    pub b: Side,
    /// The call sites whose bytes differ, the largest change first (at most `top`).
    pub sites: Vec<SiteChange>,
    /// Call sites whose bytes differ, in all.
    pub sites_changed: usize,
}

fn side(snap: &Snapshot, file: &str, window: &Window) -> Result<Side, Error> {
    // A window applies to a history; a state-only side is one moment, its dump.
    let has_history = session::history_device(None, snap)?.is_some();
    let req = ReplayRequest {
        top: Some(usize::MAX),
        window: if has_history {
            *window
        } else {
            Window::default()
        },
        ..ReplayRequest::default()
    };
    let report = session::run(snap, file, &req, &mut |_, _, _| {})?;
    let mut s = Side {
        file: file.to_string(),
        moment: "dump",
        events: 0,
        segments: snap.segments.len(),
        reserved_bytes_at_dump: snap.reserved_bytes(),
        allocated_bytes_at_dump: snap.allocated_bytes(),
        peak_reserved_bytes: None,
        peak_allocated_bytes: None,
        lower_bound_bytes: None,
        fragmentation: None,
        start_blocks: None,
        window: None,
        trace_events: 0,
        sites: Vec::new(),
    };
    match report {
        ReplayReport::StateOnly(st) => s.sites = st.top.unwrap_or_default(),
        ReplayReport::Replayed(r) => {
            let o = &r.main;
            s.moment = "reserved peak";
            s.events = o.events;
            s.peak_reserved_bytes = Some(o.peak_reserved);
            s.peak_allocated_bytes = Some(o.peak_allocated);
            s.lower_bound_bytes = Some(o.lower_bound);
            s.fragmentation = (o.lower_bound > 0).then(|| report::fragmentation(o));
            s.start_blocks = Some(o.start_blocks);
            s.window = r.window;
            s.trace_events = snap.traces[r.device].len();
            s.sites = r.top.map(|t| t.at_peak).unwrap_or_default();
        }
    }
    Ok(s)
}

/// Compares snapshot `a` (named `a_file`) with `b`; `top` call-site changes are kept.
///
/// # Errors
/// A replay failure of either history.
pub fn diff(
    a: &Snapshot,
    a_file: &str,
    b: &Snapshot,
    b_file: &str,
    top: usize,
) -> Result<Diff, Error> {
    diff_in(a, a_file, b, b_file, top, &Window::default())
}

/// [`diff`] with each history's peaks and call sites measured inside `window`
/// (`--since`/`--until`, resolved against each side's own trace; a state-only side is its dump).
///
/// # Errors
/// A replay failure of either history; a window that does not fit a side's trace.
pub fn diff_in(
    a: &Snapshot,
    a_file: &str,
    b: &Snapshot,
    b_file: &str,
    top: usize,
    window: &Window,
) -> Result<Diff, Error> {
    let a = side(a, a_file, window)?;
    let b = side(b, b_file, window)?;
    let mut by_site: BTreeMap<&str, SiteChange> = BTreeMap::new();
    let empty = |site: &str| SiteChange {
        site: site.to_string(),
        a_bytes: 0,
        a_count: 0,
        b_bytes: 0,
        b_count: 0,
        change_bytes: 0,
    };
    for s in &a.sites {
        let c = by_site.entry(&s.site).or_insert_with(|| empty(&s.site));
        c.a_bytes += s.bytes;
        c.a_count += s.count;
    }
    for s in &b.sites {
        let c = by_site.entry(&s.site).or_insert_with(|| empty(&s.site));
        c.b_bytes += s.bytes;
        c.b_count += s.count;
    }
    let mut sites: Vec<SiteChange> = by_site
        .into_values()
        .map(|mut c| {
            c.change_bytes = c.b_bytes as i64 - c.a_bytes as i64;
            c
        })
        .filter(|c| c.change_bytes != 0 || c.a_count != c.b_count)
        .collect();
    sites.sort_by(|x, y| {
        y.change_bytes
            .unsigned_abs()
            .cmp(&x.change_bytes.unsigned_abs())
            .then_with(|| x.site.cmp(&y.site))
    });
    let sites_changed = sites.len();
    sites.truncate(top);
    Ok(Diff {
        a,
        b,
        sites,
        sites_changed,
    })
}

/// `+1.00 GiB`, `-20.00 MiB`, `0 bytes`.
pub fn signed(change: i64) -> String {
    match change {
        0 => "0 bytes".to_string(),
        c if c > 0 => format!("+{}", format_size(c as u64)),
        c => format!("-{}", format_size(c.unsigned_abs())),
    }
}

impl Diff {
    /// The side-by-side rows: (figure, A, B, change), as the text and the HTML print them
    /// (`unknown` for what a state-only side cannot give).
    pub fn rows(&self) -> Vec<[String; 4]> {
        let show = |v: Option<u64>| v.map_or("unknown".to_string(), format_size);
        let bytes_row = |name: &str, a: Option<u64>, b: Option<u64>| {
            let change = match (a, b) {
                (Some(a), Some(b)) => signed(b as i64 - a as i64),
                _ => "unknown".to_string(),
            };
            [name.to_string(), show(a), show(b), change]
        };
        let count_row = |name: &str, a: Option<usize>, b: Option<usize>| {
            let show = |v: Option<usize>| v.map_or("unknown".to_string(), |n| n.to_string());
            let change = match (a, b) {
                (Some(a), Some(b)) => format!("{:+}", b as i64 - a as i64),
                _ => "unknown".to_string(),
            };
            [name.to_string(), show(a), show(b), change]
        };
        let (a, b) = (&self.a, &self.b);
        let frag = |v: Option<f64>| v.map_or("unknown".to_string(), |f| format!("{f:.3}"));
        let frag_change = match (a.fragmentation, b.fragmentation) {
            (Some(x), Some(y)) => format!("{:+.3}", y - x),
            _ => "unknown".to_string(),
        };
        vec![
            count_row("history events", Some(a.events), Some(b.events)),
            count_row("segments at the dump", Some(a.segments), Some(b.segments)),
            bytes_row(
                "reserved at the dump",
                Some(a.reserved_bytes_at_dump),
                Some(b.reserved_bytes_at_dump),
            ),
            bytes_row(
                "allocated at the dump",
                Some(a.allocated_bytes_at_dump),
                Some(b.allocated_bytes_at_dump),
            ),
            bytes_row(
                "peak reserved",
                a.peak_reserved_bytes,
                b.peak_reserved_bytes,
            ),
            bytes_row(
                "peak allocated",
                a.peak_allocated_bytes,
                b.peak_allocated_bytes,
            ),
            bytes_row(
                "lower bound (live peak)",
                a.lower_bound_bytes,
                b.lower_bound_bytes,
            ),
            count_row("blocks live before rec.", a.start_blocks, b.start_blocks),
            [
                "fragmentation".to_string(),
                frag(a.fragmentation),
                frag(b.fragmentation),
                frag_change,
            ],
        ]
    }

    /// The heading of the call-site changes: `Call sites that grew or shrank (A at its
    /// reserved peak, B at its dump): 5 of 27 shown`.
    pub fn sites_title(&self) -> String {
        format!(
            "Call sites that grew or shrank (A at its {}, B at its {}): {} of {} shown",
            self.a.moment,
            self.b.moment,
            self.sites.len(),
            self.sites_changed
        )
    }

    /// The lines saying what the peaks cover (and each side's window, when one was given).
    pub fn notes(&self) -> Vec<String> {
        let mut out = vec![
            "(peaks: a parity replay of each history, the whole job; unknown for a state-only snapshot)"
                .to_string(),
        ];
        for (name, side) in [("A", &self.a), ("B", &self.b)] {
            if let Some(w) = &side.window {
                out.push(format!(
                    "{name} {}: peaks and call sites measured inside it",
                    w.describe(side.trace_events)
                ));
            }
        }
        out
    }

    /// The text report.
    pub fn text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "tensormem diff {} {}", self.a.file, self.b.file);
        let _ = writeln!(s, "  A: {}", self.a.file);
        let _ = writeln!(s, "  B: {}", self.b.file);
        for note in self.notes() {
            let _ = writeln!(s, "  {note}");
        }
        let _ = writeln!(s);
        let _ = writeln!(s, "  {:<26} {:>14} {:>14} {:>14}", "", "A", "B", "change");
        for [name, a, b, change] in self.rows() {
            let _ = writeln!(s, "  {name:<26} {a:>14} {b:>14} {change:>14}");
        }
        let _ = writeln!(s, "\n{}", self.sites_title());
        if self.sites.is_empty() {
            let _ = writeln!(s, "  (none: every call site holds the same bytes)");
            return s;
        }
        let _ = writeln!(
            s,
            "  {:>12} {:>12} {:>13}  site",
            "A bytes", "B bytes", "change"
        );
        for c in &self.sites {
            let _ = writeln!(
                s,
                "  {:>12} {:>12} {:>13}  {}",
                format_size(c.a_bytes),
                format_size(c.b_bytes),
                signed(c.change_bytes),
                c.site
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::signed;

    #[test]
    fn changes_carry_their_sign() {
        assert_eq!(signed(0), "0 bytes");
        assert_eq!(signed(2 << 20), "+2.00 MiB");
        assert_eq!(signed(-(3 << 30)), "-3.00 GiB");
    }
}
