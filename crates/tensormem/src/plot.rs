//! `--plot`: allocated and reserved bytes over the replay, one pair of curves per configuration,
//! drawn as SVG with plotters (to a file, or to a string for the HTML report).

use std::path::Path;

use plotters::prelude::*;

use crate::replay::Outcome;
use crate::report::config_label;

/// The y axis unit for a largest value of `max_bytes`: GiB from 1 GiB, else MiB from 1 MiB,
/// else KiB (the same thresholds as PyTorch's `format_size`).
pub fn axis_unit(max_bytes: u64) -> (&'static str, f64) {
    if max_bytes > 1 << 30 {
        ("GiB", (1u64 << 30) as f64)
    } else if max_bytes > 1 << 20 {
        ("MiB", (1u64 << 20) as f64)
    } else {
        ("KiB", 1024.0)
    }
}

/// The colour of the `k`-th curve: Tableau's ten colours (all dark enough to read on white,
/// unlike the yellow of plotters' palette), repeating after ten.
fn curve_color(k: usize) -> RGBAColor {
    const TABLEAU: [(u8, u8, u8); 10] = [
        (31, 119, 180),
        (214, 39, 40),
        (44, 160, 44),
        (255, 127, 14),
        (148, 103, 189),
        (140, 86, 75),
        (227, 119, 194),
        (127, 127, 127),
        (188, 189, 34),
        (23, 190, 207),
    ];
    let (r, g, b) = TABLEAU[k % TABLEAU.len()];
    RGBColor(r, g, b).to_rgba()
}

/// The curves to draw: the main replay, then each sweep configuration not already drawn (a
/// from-empty main replay under a swept configuration is that sweep row), each labelled once.
pub fn curves<'a>(main: &'a Outcome, sweep: &'a [Outcome]) -> Vec<(String, &'a Outcome)> {
    let mut out: Vec<(String, &Outcome)> = Vec::new();
    let main_label = if main.parity.is_some() {
        format!("{} (parity)", config_label(&main.config))
    } else {
        config_label(&main.config).to_string()
    };
    if !(main.parity.is_none() && sweep.iter().any(|o| o.config == main.config)) {
        out.push((main_label, main));
    }
    for o in sweep {
        out.push((config_label(&o.config).to_string(), o));
    }
    out
}

/// Draws the series of `curves` (each replayed with `series` on) into `path` (`.svg`).
/// The x axis is the recorded time in seconds since the first point when every point has one,
/// else the event index.
///
/// # Errors
/// A message when the extension is not `.svg`, a series is missing, or drawing fails.
pub fn plot(path: &Path, title: &str, curves: &[(String, &Outcome)]) -> Result<(), String> {
    match path.extension().and_then(|e| e.to_str()) {
        Some(ext) if ext.eq_ignore_ascii_case("svg") => {}
        Some(ext) => {
            return Err(format!(
                "cannot write '.{ext}' plots: only .svg is supported (convert with e.g. rsvg-convert)"
            ));
        }
        None => return Err("the plot file needs a .svg extension".into()),
    }
    let svg = svg_string(title, curves, (1100, 560))?;
    std::fs::write(path, svg).map_err(|e| e.to_string())
}

/// The SVG text of the plot of `curves`, `size` pixels (see [`plot`]).
///
/// # Errors
/// A message when a series is missing or drawing fails.
pub fn svg_string(
    title: &str,
    curves: &[(String, &Outcome)],
    size: (u32, u32),
) -> Result<String, String> {
    let outcomes: Vec<&Outcome> = curves.iter().map(|c| c.1).collect();
    if outcomes.iter().any(|o| o.series.is_empty()) {
        return Err("no memory series was recorded for this replay".into());
    }
    let use_time = outcomes
        .iter()
        .all(|o| o.series.iter().all(|p| p.time_us.is_some()));
    let t0 = outcomes
        .iter()
        .flat_map(|o| o.series.iter().filter_map(|p| p.time_us))
        .min()
        .unwrap_or(0);
    let x_of = |p: &crate::replay::SeriesPoint| -> f64 {
        if use_time {
            p.time_us.unwrap_or(0).saturating_sub(t0) as f64 / 1e6
        } else {
            p.index as f64
        }
    };
    let max_reserved = outcomes
        .iter()
        .flat_map(|o| o.series.iter().map(|p| p.reserved))
        .max()
        .unwrap_or(0);
    let (unit, scale) = axis_unit(max_reserved);
    let (mut x0, mut x1, mut y1) = (f64::MAX, f64::MIN, 0f64);
    for o in outcomes {
        for p in &o.series {
            x0 = x0.min(x_of(p));
            x1 = x1.max(x_of(p));
            y1 = y1.max(p.reserved as f64 / scale);
        }
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    // Headroom for the legend (two rows per curve, about 18 px each, in the upper left), so
    // that it never covers a curve.
    let legend_px = (curves.len() * 2 * 18 + 24) as f64;
    let plot_px = f64::from(size.1.saturating_sub(110).max(100));
    let headroom = (plot_px / (plot_px - legend_px).max(plot_px / 3.0)).max(1.08);
    let y1 = (y1 * headroom).max(0.001);
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(format!("tensormem replay: {title}"), ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(64)
            .build_cartesian_2d(x0..x1, 0f64..y1)
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc(if use_time { "time (s)" } else { "event index" })
            .y_desc(unit)
            .label_style(("sans-serif", 15))
            .axis_desc_style(("sans-serif", 15))
            .draw()
            .map_err(|e| err(&e))?;
        // Reserved curves of different settings often coincide (the default and
        // max_split_size_mb:128 differ by 0.3% on the 2.7B train step): each is drawn thinner
        // than the one before it, so every earlier curve shows as a rim around the later ones
        // and none is hidden. The allocated curves go on top, dashed, in the same colours.
        let n = curves.len() as u32;
        let reserved_width = |k: usize| 2 + 2 * (n - 1 - k as u32).min(4);
        for (k, (label, o)) in curves.iter().enumerate() {
            let color = curve_color(k);
            let width = reserved_width(k);
            chart
                .draw_series(LineSeries::new(
                    o.series
                        .iter()
                        .map(|p| (x_of(p), p.reserved as f64 / scale)),
                    color.stroke_width(width),
                ))
                .map_err(|e| err(&e))?
                .label(format!("{label}: reserved"))
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(width))
                });
        }
        for (k, (label, o)) in curves.iter().enumerate() {
            let color = curve_color(k);
            chart
                .draw_series(DashedLineSeries::new(
                    o.series
                        .iter()
                        .map(|p| (x_of(p), p.allocated as f64 / scale)),
                    6,
                    4,
                    color.mix(0.9).stroke_width(1),
                ))
                .map_err(|e| err(&e))?
                .label(format!("{label}: allocated"))
                .legend(move |(x, y)| {
                    EmptyElement::at((x, y))
                        + PathElement::new(vec![(0, 0), (7, 0)], color.mix(0.9))
                        + PathElement::new(vec![(11, 0), (18, 0)], color.mix(0.9))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            // plotters draws text at 0.8 of the size asked for: 16 gives 12.9 px.
            .label_font(("sans-serif", 16))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))?;
    }
    Ok(svg)
}
