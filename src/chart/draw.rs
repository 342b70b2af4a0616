//! Drawing one timeline with plotters, on any backend (PNG bitmap or SVG).

use std::path::Path;
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::palette;
use super::series::{self, Series, XAxis};
use super::{Format, Options};
use crate::attribute::Attribution;
use crate::replay::Replay;
use crate::report::breakdown;
use crate::snapshot::Snapshot;
use crate::units;

/// Where things ended up in the image (for tests and callers that annotate it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChartInfo {
    /// Image size.
    pub width: u32,
    /// Image size.
    pub height: u32,
    /// Plot area: left, top, right, bottom pixels.
    pub plot: (i32, i32, i32, i32),
    /// Pixel column of the peak marker.
    pub peak_x: i32,
    /// Pixel row of the top of the stack at the peak.
    pub peak_y: i32,
    /// Groups drawn, bottom band first.
    pub groups: Vec<String>,
}

const FONT: &str = "sans-serif";
const GIB: f64 = (1u64 << 30) as f64;
const LEGEND_WIDTH: u32 = 400;

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular());
        let _ = plotters::style::register_font(FONT, FontStyle::Bold, dejavu::sans::bold());
    });
}

fn shorten(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(max.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

/// Renders to a file.
pub(super) fn render(
    out: &Path,
    format: Format,
    snap: &Snapshot,
    replay: &Replay,
    a: &Attribution,
    options: &Options,
    title: &str,
) -> Result<ChartInfo, String> {
    register_font();
    let size = (options.width.max(400), options.height.max(300));
    match format {
        Format::Png => {
            let root = BitMapBackend::new(out, size).into_drawing_area();
            let info = draw(&root, snap, replay, a, options, title)?;
            root.present().map_err(|e| e.to_string())?;
            Ok(info)
        }
        Format::Svg => {
            let root = SVGBackend::new(out, size).into_drawing_area();
            let info = draw(&root, snap, replay, a, options, title)?;
            root.present().map_err(|e| e.to_string())?;
            Ok(info)
        }
    }
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    snap: &Snapshot,
    replay: &Replay,
    a: &Attribution,
    options: &Options,
    title: &str,
) -> Result<ChartInfo, String>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let (width, height) = root.dim_in_pixel();
    root.fill(&WHITE).map_err(err)?;
    let (header, body) = root.split_vertically(78);
    let (plot_area, legend_area) = body.split_horizontally(width.saturating_sub(LEGEND_WIDTH));
    let columns = (width.saturating_sub(LEGEND_WIDTH + 120)).max(50) as usize;
    let s = series::build(
        snap,
        replay,
        a,
        options.by,
        options.x,
        columns,
        options.max_groups,
    );
    let colours = palette::assign(&s.groups);
    let peak = replay.peaks.allocated;
    // headroom above the highest line for the step and peak labels
    let y_max = (replay.peaks.reserved.bytes.max(peak.bytes) as f64 / GIB * 1.24).max(0.01);
    let (x0, x1) = s.x_range;
    let x_desc = match s.axis {
        XAxis::Time => "seconds from the first recorded event",
        XAxis::Events => "event",
    };
    let subtitle = format!(
        "allocated by {}, reserved as a line · peak {} · {} events",
        options.by.as_str(),
        units::bytes(peak.bytes),
        units::count(replay.len() as u64)
    );
    header
        .draw(&Text::new(
            shorten(title, 110),
            (24, 14),
            (FONT, 26).into_font().style(FontStyle::Bold).color(&BLACK),
        ))
        .map_err(err)?;
    header
        .draw(&Text::new(
            subtitle,
            (24, 50),
            (FONT, 17).into_font().color(&RGBColor(0x55, 0x55, 0x55)),
        ))
        .map_err(err)?;
    let mut chart = ChartBuilder::on(&plot_area)
        .margin_left(16)
        .margin_right(24)
        .margin_top(12)
        .margin_bottom(12)
        .x_label_area_size(56)
        .y_label_area_size(78)
        .build_cartesian_2d(x0..x1.max(x0 + 1e-9), 0.0..y_max)
        .map_err(err)?;
    chart
        .configure_mesh()
        .light_line_style(RGBColor(0xee, 0xee, 0xee))
        .bold_line_style(RGBColor(0xdd, 0xdd, 0xdd))
        .x_desc(x_desc)
        .y_desc("GiB")
        .axis_desc_style((FONT, 18))
        .label_style((FONT, 16))
        .x_label_formatter(&|v| {
            if s.axis == XAxis::Events {
                units::count(v.max(0.0) as u64)
            } else if x1 < 0.1 {
                format!("{:.3}", v)
            } else {
                format!("{:.2}", v)
            }
        })
        .y_label_formatter(&|v| format!("{v:.1}"))
        .draw()
        .map_err(err)?;

    // pipeline steps (or phases) as bands
    let rows = breakdown::step_table(snap, replay, a);
    let band_label_y = y_max * 0.985;
    let (xr, yr) = chart.plotting_area().get_pixel_range();
    let x_span = (x1 - x0).max(1e-12);
    let px = move |x: f64, y: f64| -> (i32, i32) {
        let fx = (x - x0) / x_span;
        let fy = y / y_max;
        (
            xr.start + (fx * (xr.end - xr.start - 1) as f64).round() as i32,
            yr.end - 1 - (fy * (yr.end - yr.start - 1) as f64).round() as i32,
        )
    };
    for (k, row) in rows.iter().enumerate() {
        let xa = s.x_of_event[row.first_event];
        let xb = s.x_of_event[row.last_event];
        if k % 2 == 0 {
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(xa, 0.0), (xb, y_max)],
                    RGBColor(0xf3, 0xf4, 0xf7).filled(),
                )))
                .map_err(err)?;
        }
        let wide = px(xb, 0.0).0 - px(xa, 0.0).0;
        let short = match row.step {
            1..=8 => format!("S{}", row.step),
            _ => row.label.rsplit(" · ").next().unwrap_or("").to_string(),
        };
        let short = if rows.iter().any(|r| r.train_step > 0) && (1..=8).contains(&row.step) {
            format!("{}.{short}", row.train_step)
        } else {
            short
        };
        if wide as usize >= short.len() * 9 + 6 {
            chart
                .draw_series(std::iter::once(Text::new(
                    short,
                    ((xa + xb) / 2.0, band_label_y),
                    (FONT, 15)
                        .into_font()
                        .color(&RGBColor(0x66, 0x66, 0x66))
                        .pos(Pos::new(HPos::Center, VPos::Top)),
                )))
                .map_err(err)?;
        }
    }

    // Reserved memory, drawn under the areas: it is never below allocated memory, so only its
    // vertical jumps meet the areas, and there the allocated spike must stay visible.
    chart
        .draw_series(LineSeries::new(
            s.columns.iter().map(|c| (c.x, c.reserved as f64 / GIB)),
            palette::RESERVED.stroke_width(2),
        ))
        .map_err(err)?;

    // stacked areas, bottom band first
    let mut lower: Vec<f64> = vec![0.0; s.columns.len()];
    for (g, colour) in colours.iter().enumerate() {
        let upper: Vec<f64> = s
            .columns
            .iter()
            .zip(&lower)
            .map(|(c, lo)| lo + c.groups[g] as f64 / GIB)
            .collect();
        if upper.iter().zip(&lower).all(|(u, l)| (u - l).abs() < 1e-12) {
            lower = upper;
            continue;
        }
        let mut points: Vec<(f64, f64)> = s
            .columns
            .iter()
            .map(|c| c.x)
            .zip(upper.iter().copied())
            .collect();
        points.extend(
            s.columns
                .iter()
                .map(|c| c.x)
                .zip(lower.iter().copied())
                .rev(),
        );
        chart
            .draw_series(std::iter::once(Polygon::new(points, colour.filled())))
            .map_err(err)?;
        lower = upper;
    }

    // out-of-memory events
    for oom in &replay.ooms {
        let x = s.x_of_event[oom.event];
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(x, 0.0), (x, y_max * 0.93)],
                palette::OOM.stroke_width(3),
            )))
            .map_err(err)?;
        chart
            .draw_series(std::iter::once(Text::new(
                format!("OOM: {} requested", units::bytes(oom.requested)),
                (x, y_max * 0.93),
                (FONT, 17)
                    .into_font()
                    .color(&palette::OOM)
                    .pos(Pos::new(HPos::Right, VPos::Bottom)),
            )))
            .map_err(err)?;
    }

    // the peak
    let (peak_x, peak_top) = match peak.event {
        Some(i) => (s.x_of_event[i], peak.bytes as f64 / GIB),
        None => (x0, peak.bytes as f64 / GIB),
    };
    // dashed from just above the peak up to its label, so the peak itself stays visible
    let dash = y_max / 80.0;
    let mut y = peak_top + dash * 1.5;
    let mut dashes = Vec::new();
    while y < y_max * 0.86 {
        dashes.push(PathElement::new(
            vec![(peak_x, y), (peak_x, (y + dash).min(y_max * 0.86))],
            palette::PEAK.stroke_width(2),
        ));
        y += dash * 2.0;
    }
    chart.draw_series(dashes).map_err(err)?;
    chart
        .draw_series(std::iter::once(Circle::new(
            (peak_x, peak_top),
            6,
            palette::PEAK.filled(),
        )))
        .map_err(err)?;
    let place = crate::report::DeviceReport::peak_place(snap, replay, a);
    let mut what = vec![
        format!("peak {}", units::bytes(peak.bytes)),
        place.step.clone(),
    ];
    if !place.op.is_empty() && !place.step.ends_with(&place.op) {
        what.push(place.op.clone());
    }
    if place.stage.starts_with("backward (") {
        if !place.detail.is_empty() {
            what.push(place.detail.clone());
        }
    } else if !place.stage.is_empty() {
        what.push(place.stage.clone());
    }
    // what the peak is made of, by category
    let live = breakdown::live_at(snap, replay, a, peak.event);
    let mut keyer = breakdown::Keyer::new(snap, a);
    let made_of = breakdown::group(&mut keyer, breakdown::Dimension::Category, &live)
        .iter()
        .take(2)
        .map(|s| format!("{} {}", s.label, units::percent(s.bytes, peak.bytes)))
        .collect::<Vec<_>>()
        .join(", ");
    let label = shorten(&what.join(" · "), 80);
    let right_half = px(peak_x, 0.0).0 > px((x0 + x1) / 2.0, 0.0).0;
    let anchor = Pos::new(
        if right_half { HPos::Right } else { HPos::Left },
        VPos::Bottom,
    );
    chart
        .draw_series(std::iter::once(Text::new(
            label,
            (peak_x, y_max * 0.925),
            (FONT, 18)
                .into_font()
                .style(FontStyle::Bold)
                .color(&palette::PEAK)
                .pos(anchor),
        )))
        .map_err(err)?;
    if !made_of.is_empty() {
        chart
            .draw_series(std::iter::once(Text::new(
                format!("made of {made_of}"),
                (peak_x, y_max * 0.885),
                (FONT, 17).into_font().color(&palette::PEAK).pos(anchor),
            )))
            .map_err(err)?;
    }

    let (xr, yr) = chart.plotting_area().get_pixel_range();
    let (peak_px, peak_py) = chart.backend_coord(&(peak_x, peak_top));
    draw_legend(&legend_area, &s, &colours, options, replay).map_err(err)?;
    Ok(ChartInfo {
        width,
        height,
        plot: (xr.start, yr.start, xr.end, yr.end),
        peak_x: peak_px,
        peak_y: peak_py,
        groups: s.groups.clone(),
    })
}

fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    s: &Series,
    colours: &[RGBColor],
    options: &Options,
    replay: &Replay,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let ink = RGBColor(0x33, 0x33, 0x33);
    let mut y = 70;
    area.draw(&Text::new(
        format!("live at the peak, by {}", options.by.as_str()),
        (8, y),
        (FONT, 18).into_font().style(FontStyle::Bold).color(&ink),
    ))?;
    y += 34;
    let at_peak: Vec<u64> = {
        let i = replay.peaks.allocated.event;
        let col = s.columns.iter().find(|c| Some(c.event) == i).or_else(|| {
            s.columns
                .iter()
                .max_by_key(|c| c.groups.iter().sum::<u64>())
        });
        col.map_or(vec![0; s.groups.len()], |c| c.groups.clone())
    };
    // top band first, as stacked
    for g in (0..s.groups.len()).rev() {
        if at_peak[g] == 0 && s.columns.iter().all(|c| c.groups[g] == 0) {
            continue;
        }
        area.draw(&Rectangle::new(
            [(8, y - 2), (26, y + 14)],
            colours[g].filled(),
        ))?;
        area.draw(&Text::new(
            shorten(&s.groups[g], 34),
            (34, y - 2),
            (FONT, 15).into_font().color(&ink),
        ))?;
        area.draw(&Text::new(
            if at_peak[g] == 0 {
                "—".to_string()
            } else {
                units::bytes(at_peak[g])
            },
            (LEGEND_WIDTH as i32 - 12, y - 2),
            (FONT, 15)
                .into_font()
                .color(&ink)
                .pos(Pos::new(HPos::Right, VPos::Top)),
        ))?;
        y += 24;
    }
    y += 14;
    area.draw(&PathElement::new(
        vec![(8, y + 7), (26, y + 7)],
        palette::RESERVED.stroke_width(2),
    ))?;
    area.draw(&Text::new(
        format!(
            "reserved (peak {})",
            units::bytes(replay.peaks.reserved.bytes)
        ),
        (34, y - 2),
        (FONT, 15).into_font().color(&ink),
    ))?;
    y += 24;
    area.draw(&PathElement::new(
        vec![(17, y - 2), (17, y + 16)],
        palette::PEAK.stroke_width(2),
    ))?;
    area.draw(&Text::new(
        "peak",
        (34, y - 2),
        (FONT, 15).into_font().color(&ink),
    ))?;
    Ok(())
}
