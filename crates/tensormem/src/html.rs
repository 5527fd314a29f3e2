//! `--html`: one self-contained HTML page (inline CSS and SVG, no script, nothing fetched): the
//! memory timeline per configuration (allocated and reserved), the sweep or advise table, the
//! top call sites, and the segment map at the reserved peak; for `diff`, the two snapshots side
//! by side and the call sites that changed.

use std::fmt::Write as _;

use c10_cuda::snapshot::{BlockState, DeviceSnapshot};
use c10_cuda::summary::format_size;

use crate::advise::Advice;
use crate::diff::Diff;
use crate::error::Error;
use crate::model::Snapshot;
use crate::replay::{Mode, Outcome, ReplayOptions, replay};
use crate::report::config_label;
use crate::session::{Replayed, StateOnly};
use crate::top_sites::{self, Grouping, Site};

/// A table: a title, column names and rows of cells (already formatted).
#[derive(Clone, Debug, Default)]
pub struct Table {
    /// Shown above the table.
    pub title: String,
    /// Column names.
    pub columns: Vec<String>,
    /// Rows of cells.
    pub rows: Vec<Vec<String>>,
    /// A note under the table.
    pub note: String,
}

/// What the page shows.
#[derive(Default)]
pub struct Page<'a> {
    /// The page title (the snapshot's name).
    pub title: String,
    /// Lines under the title.
    pub summary: Vec<String>,
    /// The timeline's curves (label, outcome replayed with `series`).
    pub curves: Vec<(String, &'a Outcome)>,
    /// Tables (the sweep or advise results).
    pub tables: Vec<Table>,
    /// Call-site tables: (title, sites).
    pub sites: Vec<(String, Vec<Site>)>,
    /// The segment map: (title, our snapshot at that moment).
    pub segment_map: Option<(String, DeviceSnapshot)>,
}

/// Escapes text for HTML.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = "body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px;\
color:#1d232a}div svg{width:100%;height:auto}h1{font-size:22px;margin-bottom:4px}h2{font-size:17px;margin-top:28px;\
border-bottom:1px solid #d0d7de;padding-bottom:4px}p.sum{margin:2px 0;color:#444}\
table{border-collapse:collapse;font-size:13px;margin:8px 0}th,td{border:1px solid #d0d7de;\
padding:3px 8px;text-align:right;white-space:nowrap}th{background:#f3f5f7}td.l,th.l{text-align:left;white-space:normal;overflow-wrap:normal;word-break:normal}\
tr:nth-child(even) td{background:#fafbfc}.note{font-size:12px;color:#555}\
.legend span{display:inline-block;width:12px;height:12px;margin:0 4px 0 14px;vertical-align:middle}\
code{background:#f3f5f7;padding:1px 4px}";

/// Renders `page` as one HTML document.
///
/// # Errors
/// A message when the timeline cannot be drawn (a curve without its series).
pub fn render(page: &Page) -> Result<String, String> {
    let mut h = String::new();
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>tensormem: {}</title><style>{STYLE}</style></head><body>\n",
        escape(&page.title)
    );
    let _ = writeln!(h, "<h1>tensormem: {}</h1>", escape(&page.title));
    for line in &page.summary {
        let _ = writeln!(h, "<p class=\"sum\">{}</p>", escape(line));
    }
    if !page.curves.is_empty() {
        let _ = writeln!(h, "<h2>Memory over time, per configuration</h2>");
        let svg = crate::plot::svg_string(&page.title, &page.curves, (1200, 520))?;
        // The SVG's XML declaration is not needed inline.
        let svg = svg
            .strip_prefix("<?xml version=\"1.0\" encoding=\"UTF-8\"?>")
            .unwrap_or(&svg);
        let _ = writeln!(h, "<div>{}</div>", svg.trim());
        let _ = writeln!(
            h,
            "<p class=\"note\">Solid lines: reserved bytes (segments held from the device; each \
             setting is drawn thinner than the one before, so curves that coincide show as rims \
             around each other); dashed lines: allocated bytes (blocks handed out).</p>"
        );
    }
    for t in &page.tables {
        table(&mut h, t);
    }
    for (title, sites) in &page.sites {
        let mut t = Table {
            title: title.clone(),
            columns: vec!["bytes".into(), "allocations".into(), "call site".into()],
            ..Table::default()
        };
        for s in sites {
            let mut site = s.site.clone();
            if let Some(stack) = &s.stack {
                site = stack.join("\n");
            }
            t.rows
                .push(vec![format_size(s.bytes), s.count.to_string(), site]);
        }
        if sites.is_empty() {
            t.note = "no live allocations".into();
        }
        table(&mut h, &t);
    }
    if let Some((title, snap)) = &page.segment_map {
        segment_map(&mut h, title, snap);
    }
    let _ = writeln!(
        h,
        "<p class=\"note\">Written by tensormem {}; self-contained: no scripts, nothing loaded \
         from the network.</p></body></html>",
        env!("CARGO_PKG_VERSION")
    );
    Ok(h)
}

fn table(h: &mut String, t: &Table) {
    // Numbers align right, text left (judged by the first row, so a column aligns as one).
    let left: Vec<bool> = (0..t.columns.len())
        .map(|i| {
            t.rows.first().and_then(|r| r.get(i)).is_none_or(|c| {
                // A figure: a digit first, or a sign and then a digit (`+1.00 GiB`).
                let digits = c.trim_start_matches(['+', '-']);
                !digits.starts_with(|ch: char| ch.is_ascii_digit())
            })
        })
        .collect();
    let class = |i: usize| {
        if left.get(i).copied().unwrap_or(true) {
            " class=\"l\""
        } else {
            ""
        }
    };
    let _ = writeln!(h, "<h2>{}</h2><table><tr>", escape(&t.title));
    for (i, c) in t.columns.iter().enumerate() {
        let _ = write!(h, "<th{}>{}</th>", class(i), escape(c));
    }
    let _ = writeln!(h, "</tr>");
    for r in &t.rows {
        let _ = write!(h, "<tr>");
        for (i, c) in r.iter().enumerate() {
            let cell = breakable(&escape(c)).replace('\n', "<br>");
            let _ = write!(h, "<td{}>{cell}</td>", class(i));
        }
        let _ = writeln!(h, "</tr>");
    }
    let _ = writeln!(h, "</table>");
    if !t.note.is_empty() {
        let _ = writeln!(h, "<p class=\"note\">{}</p>", escape(&t.note));
    }
}

/// Escaped text with a break opportunity (`<wbr>`) after each `/`, `,` and `:`, so long paths
/// and settings wrap between their parts, never inside a word.
fn breakable(escaped: &str) -> String {
    let mut out = String::with_capacity(escaped.len() + escaped.len() / 8);
    for ch in escaped.chars() {
        out.push(ch);
        if matches!(ch, '/' | ',' | ':') {
            out.push_str("<wbr>");
        }
    }
    out
}

/// Colors of block states in the segment map.
fn color(state: BlockState) -> &'static str {
    match state {
        BlockState::ActiveAllocated => "#3b73b9",
        BlockState::ActivePendingFree => "#e69f00",
        BlockState::Inactive => "#d9dee4",
    }
}

/// The segments in address order as rows of equal byte width, each block a rectangle colored
/// by its state (a block crossing a row's end continues on the next row), with a tooltip.
fn segment_map(h: &mut String, title: &str, snap: &DeviceSnapshot) {
    const WIDTH: f64 = 1200.0;
    const ROW: f64 = 18.0;
    const GAP: f64 = 4.0;
    let total: u64 = snap.segments.iter().map(|s| s.total_size).sum();
    let _ = writeln!(h, "<h2>{}</h2>", escape(title));
    if total == 0 {
        let _ = writeln!(h, "<p class=\"note\">no segments</p>");
        return;
    }
    let rows = 40u64;
    let per_row = total.div_ceil(rows).max(1);
    let height = rows as f64 * (ROW + GAP);
    let _ = writeln!(
        h,
        "<p class=\"legend\">{} segments, {} reserved; each row is {}.\
         <span style=\"background:{}\"></span>allocated<span style=\"background:{}\"></span>\
         freed, waiting on streams<span style=\"background:{}\"></span>free (cached)\
         <span style=\"background:#fff;border:2px solid #1d232a;box-sizing:border-box\"></span>\
         segment boundary</p>",
        snap.segments.len(),
        format_size(total),
        format_size(per_row),
        color(BlockState::ActiveAllocated),
        color(BlockState::ActivePendingFree),
        color(BlockState::Inactive)
    );
    let _ = writeln!(
        h,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" \
         viewBox=\"0 0 {WIDTH} {height}\" style=\"width:100%;height:auto\">"
    );
    let scale = WIDTH / per_row as f64;
    let mut offset = 0u64;
    let rect = |h: &mut String, start: u64, len: u64, fill: &str, tip: &str| {
        let mut s = start;
        let end = start + len;
        while s < end {
            let row = s / per_row;
            let row_end = (row + 1) * per_row;
            let e = end.min(row_end);
            let x = (s - row * per_row) as f64 * scale;
            let w = ((e - s) as f64 * scale).max(0.5);
            let y = row as f64 * (ROW + GAP);
            let _ = writeln!(
                h,
                "<rect x=\"{x:.2}\" y=\"{y:.1}\" width=\"{w:.2}\" height=\"{ROW}\" fill=\"{fill}\"><title>{tip}</title></rect>"
            );
            s = e;
        }
    };
    for seg in &snap.segments {
        for b in &seg.blocks {
            let tip = escape(&format!(
                "segment {:#x} ({}, {} pool, stream {}): block {:#x}, {}, {}",
                seg.address,
                format_size(seg.total_size),
                seg.segment_type(),
                seg.stream.0,
                b.address,
                format_size(b.size),
                b.state.as_str()
            ));
            rect(
                h,
                offset + (b.address - seg.address),
                b.size,
                color(b.state),
                &tip,
            );
        }
        // The boundary at the segment's start.
        let row = offset / per_row;
        let x = (offset - row * per_row) as f64 * scale;
        let y = row as f64 * (ROW + GAP);
        let _ = writeln!(
            h,
            "<line x1=\"{x:.2}\" y1=\"{y:.1}\" x2=\"{x:.2}\" y2=\"{:.1}\" stroke=\"#1d232a\" stroke-width=\"1.2\"/>",
            y + ROW
        );
        offset += seg.total_size;
    }
    let _ = writeln!(h, "</svg>");
}

/// Our allocator's state just after event `index` of a replay like `o` (same configuration,
/// mode and device memory).
///
/// # Errors
/// A replay failure.
pub fn state_after(
    snap: &Snapshot,
    device: usize,
    o: &Outcome,
    capacity: usize,
    index: usize,
) -> Result<DeviceSnapshot, Error> {
    let config: c10_cuda::config::AllocatorConfig = o
        .config
        .parse()
        .map_err(|e| Error::option("--alloc-conf", e))?;
    let opts = ReplayOptions {
        until_event: Some(index + 1),
        rules: o.rules,
        history_only: o.mode == Mode::HistoryOnly,
        start: o.start.clone(),
        ..ReplayOptions::new(config, capacity, o.mode != Mode::Parity)
    };
    Ok(replay(snap, device, &opts, &mut |_, _| {})?.snapshot)
}

/// The page of `tensormem replay --html`: the timeline of the main replay and the sweep, the
/// sweep table, the top `top` call sites at the peak and at the end, the segment map at the
/// reserved peak.
///
/// # Errors
/// A replay failure (rebuilding the state at the peak), or a missing series.
pub fn replay_page(snap: &Snapshot, r: &Replayed, top: usize) -> Result<String, Error> {
    let main = &r.main;
    let mut page = Page {
        title: r.file.clone(),
        ..Page::default()
    };
    page.summary.push(format!(
        "{} history events on device {}; {} segments, {} reserved at the dump; simulated device memory {}",
        snap.traces[r.device].len(),
        r.device,
        snap.segments.len(),
        format_size(snap.reserved_bytes()),
        format_size(r.capacity as u64)
    ));
    if let Some(w) = &r.window {
        page.summary.push(format!(
            "{}: peaks, call sites and curves measured inside it (the time axis counts from its start)",
            w.describe(snap.traces[r.device].len())
        ));
    }
    if let Some(p) = &main.parity {
        page.summary.push(format!(
            "parity with PyTorch ({}): {} of {} allocations at PyTorch's address, {} of {} segment decisions identical",
            config_label(&main.config),
            p.alloc_address_match,
            p.alloc_total,
            p.segment_decision_match,
            p.segment_decision_total
        ));
    }
    if let Some(o) = std::iter::once(main)
        .chain(&r.sweep)
        .find(|o| o.parity.is_none())
    {
        page.summary.push(format!(
            "what-if replays: {}",
            crate::report::counted_line(o.mode, o.start_blocks, o.start_bytes)
        ));
    }
    page.curves = crate::plot::curves(main, &r.sweep);
    let mut rows: Vec<&Outcome> = vec![main];
    rows.extend(r.sweep.iter());
    let mut t = Table {
        title: "Peaks per configuration".into(),
        columns: [
            "config",
            "mode",
            "peak reserved",
            "peak allocated",
            "lower bound",
            "frag",
            "device mallocs",
            "retries",
            "OOMs",
        ]
        .map(String::from)
        .to_vec(),
        note: "frag = peak reserved / lower bound; lower bound = peak of live bytes, each request rounded up to 512".into(),
        ..Table::default()
    };
    for (k, o) in rows.iter().enumerate() {
        t.rows.push(vec![
            config_label(&o.config).to_string(),
            if k == 0 || o.parity.is_some() {
                o.mode.label().to_string()
            } else {
                format!("sweep ({})", o.mode.label())
            },
            format_size(o.peak_reserved),
            format_size(o.peak_allocated),
            format_size(o.lower_bound),
            format!("{:.3}", crate::report::fragmentation(o)),
            o.device_mallocs.to_string(),
            o.retries.to_string(),
            o.ooms.to_string(),
        ]);
    }
    page.tables.push(t);
    let sites = match &r.top {
        Some(t) => (t.at_peak.clone(), t.at_end.clone()),
        None => {
            let start = main.start.as_deref();
            let at = |i| {
                top_sites::top_sites(
                    &top_sites::live_at(snap, r.device, i, start),
                    top,
                    Grouping::TopFrame,
                )
            };
            (at(main.peak_event_index), at(main.last_event_index))
        }
    };
    page.sites.push((
        format!(
            "Top call sites at the reserved peak ({} after event {})",
            format_size(main.peak_reserved),
            main.peak_event_index
        ),
        sites.0,
    ));
    page.sites.push((
        format!(
            "Top call sites at the end (after event {})",
            main.last_event_index
        ),
        sites.1,
    ));
    let at_peak = state_after(snap, r.device, main, r.capacity, main.peak_event_index)?;
    page.segment_map = Some((
        format!(
            "Segments at the reserved peak ({}, after event {})",
            config_label(&main.config),
            main.peak_event_index
        ),
        at_peak,
    ));
    render(&page).map_err(|e| Error::Output {
        option: "--html",
        path: String::new(),
        message: e,
    })
}

/// The page of `tensormem replay --html` for a state-only snapshot (one taken at an OOM, or
/// without a history): what the dump holds, what it cannot tell, the call sites of its
/// allocated blocks and its segment map.
///
/// # Errors
/// A failure importing the dump's segments.
pub fn state_page(snap: &Snapshot, s: &StateOnly, top: usize) -> Result<String, Error> {
    let mut page = Page {
        title: s.file.clone(),
        ..Page::default()
    };
    page.summary.push(format!(
        "state only (no history to replay): {} segments, {} reserved, {} allocated at the dump on device {}",
        snap.segments.len(),
        format_size(snap.reserved_bytes()),
        format_size(snap.allocated_bytes()),
        s.device
    ));
    let (reserved, allocated) = (snap.reserved_bytes(), snap.allocated_bytes());
    if reserved > 0 {
        // What a dump taken at an OOM can tell: how much of the reserved memory was handed out
        // (the rest is all fragmentation could have wasted).
        page.summary.push(format!(
            "{:.2}% of the reserved bytes allocated; {} reserved but not allocated (the most fragmentation can waste)",
            allocated as f64 * 100.0 / reserved as f64,
            format_size(reserved.saturating_sub(allocated))
        ));
    }
    for u in crate::state::UNKNOWN_IN_STATE {
        page.summary.push(format!("unknown: {u}"));
    }
    let sites = match &s.top {
        Some(t) => t.clone(),
        None => top_sites::top_sites(
            &top_sites::live_in_dump(snap, s.device),
            top,
            Grouping::TopFrame,
        ),
    };
    page.sites.push((
        "Top call sites holding the dump's allocated blocks".into(),
        sites,
    ));
    let dump = crate::state::state_snapshot(snap, s.device)
        .map_err(|e| Error::Replay(crate::replay::ReplayError::Allocator(e)))?;
    page.segment_map = Some(("Segments at the dump".into(), dump));
    render(&page).map_err(|e| Error::Output {
        option: "--html",
        path: String::new(),
        message: e,
    })
}

/// The page of `tensormem advise --html`: the candidates table, the timeline of the best
/// candidate and of PyTorch's default, the top call sites and the segment map at the best
/// candidate's peak.
///
/// # Errors
/// A replay failure.
pub fn advise_page(snap: &Snapshot, a: &Advice, top: usize) -> Result<String, Error> {
    let mut page = Page {
        title: a.file.clone(),
        ..Page::default()
    };
    page.summary.push(format!(
        "{} history events on device {}; lower bound (peak of live bytes) {}; {}",
        a.events,
        a.device,
        format_size(a.lower_bound_bytes),
        a.device_memory_bytes
            .map_or("device memory unconstrained".to_string(), |b| format!(
                "device memory {}",
                format_size(b)
            ))
    ));
    page.summary.push(a.counted());
    let mut t = Table {
        title: format!("Allocator settings, best first ({} replays)", a.replays),
        columns: [
            "rank",
            "config",
            "peak reserved",
            "frag",
            "device mallocs",
            "retries",
            "OOMs",
            "min device memory",
            "apply",
        ]
        .map(String::from)
        .to_vec(),
        note: "min device memory: the smallest device memory (to 2 MiB) on which the replay completes without OOM, PyTorch's free-cache-and-retry path included".into(),
        ..Table::default()
    };
    for (i, c) in a.candidates.iter().enumerate() {
        t.rows.push(vec![
            (i + 1).to_string(),
            c.config.clone(),
            format_size(c.peak_reserved_bytes),
            format!("{:.3}", c.fragmentation),
            c.device_mallocs.to_string(),
            c.num_alloc_retries.to_string(),
            c.failed_allocs.to_string(),
            c.min_device_memory_bytes
                .map_or("does not fit".into(), format_size),
            c.apply.join("\n"),
        ]);
    }
    page.tables.push(t);
    let capacity = a
        .device_memory_bytes
        .map_or(crate::session::DEFAULT_DEVICE_MEMORY, |b| b as usize);
    let mut outcomes = Vec::new();
    let mut labels = Vec::new();
    for c in a.candidates.iter().take(1).chain(a.default_row()) {
        if labels.contains(&c.config) {
            continue;
        }
        let mut conf = c.alloc_conf.clone();
        if let Some(f) = c.memory_fraction {
            if !conf.is_empty() {
                conf.push(',');
            }
            conf.push_str(&format!("per_process_memory_fraction:{f:?}"));
        }
        let config = conf.parse().map_err(|e| Error::option("--alloc-conf", e))?;
        let opts = ReplayOptions {
            series: true,
            history_only: a.left_out.is_some(),
            ..ReplayOptions::new(config, capacity, true)
        };
        outcomes.push(replay(snap, a.device, &opts, &mut |_, _| {})?);
        labels.push(c.config.clone());
    }
    page.curves = labels.iter().cloned().zip(outcomes.iter()).collect();
    if let Some(best) = outcomes.first() {
        let live = top_sites::live_at(snap, a.device, best.peak_event_index, best.start.as_deref());
        page.sites.push((
            format!(
                "Top call sites at the best setting's peak ({} after event {})",
                format_size(best.peak_reserved),
                best.peak_event_index
            ),
            top_sites::top_sites(&live, top, Grouping::TopFrame),
        ));
        let at_peak = state_after(snap, a.device, best, capacity, best.peak_event_index)?;
        page.segment_map = Some((format!("Segments at the peak of {}", labels[0]), at_peak));
    }
    render(&page).map_err(|e| Error::Output {
        option: "--html",
        path: String::new(),
        message: e,
    })
}

/// The page of `tensormem diff --html`: the two snapshots side by side (the rows of the text
/// report, `unknown` where a state-only side cannot give a figure) and the call sites that
/// grew or shrank, the largest change first. No timeline: the two histories have different
/// events.
pub fn diff_page(d: &Diff) -> String {
    let mut page = Page {
        title: format!("diff {} {}", d.a.file, d.b.file),
        ..Page::default()
    };
    page.summary.push(format!("A: {}", d.a.file));
    page.summary.push(format!("B: {}", d.b.file));
    page.summary.extend(d.notes());
    page.tables.push(Table {
        title: "Side by side".into(),
        columns: vec![String::new(), "A".into(), "B".into(), "change".into()],
        rows: d.rows().into_iter().map(Vec::from).collect(),
        note: String::new(),
    });
    page.tables.push(Table {
        title: d.sites_title(),
        columns: vec![
            "A bytes".into(),
            "B bytes".into(),
            "change".into(),
            "call site".into(),
        ],
        rows: d
            .sites
            .iter()
            .map(|c| {
                vec![
                    format_size(c.a_bytes),
                    format_size(c.b_bytes),
                    crate::diff::signed(c.change_bytes),
                    c.site.clone(),
                ]
            })
            .collect(),
        note: if d.sites.is_empty() {
            "none: every call site holds the same bytes".into()
        } else {
            String::new()
        },
    });
    // Nothing to draw: render cannot fail without curves.
    render(&page).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup() {
        assert_eq!(
            escape("<a href='x'>&\"</a>"),
            "&lt;a href=&#39;x&#39;&gt;&amp;&quot;&lt;/a&gt;"
        );
    }
}
