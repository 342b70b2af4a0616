//! Drawing timelines with plotters, on any backend (PNG bitmap or SVG): one panel with a
//! legend for `memsnap timeline`, or several panels sharing one y axis for comparisons.

use std::path::Path;
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::palette;
use super::series::{self, Series, XAxis};
use super::{ChartError, Format, Options};
use crate::analysis::{DeviceAnalysis, Dimension};
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

/// Everything needed to draw one device's timeline, without the snapshot.
#[derive(Clone, Debug)]
pub struct Panel {
    /// Panel title.
    pub title: String,
    /// Grouped, downsampled memory.
    pub series: Series,
    /// Peak allocated bytes and its x.
    pub peak: (u64, f64),
    /// Peak reserved bytes.
    pub reserved_peak: u64,
    /// Where the peak was and what made it, for its label.
    pub peak_label: String,
    /// What the peak is made of, by category.
    pub made_of: String,
    /// Step (or phase) bands: short name and x range.
    pub bands: Vec<(String, f64, f64)>,
    /// Out-of-memory events: x and requested bytes.
    pub ooms: Vec<(f64, u64)>,
    /// Events in the trace.
    pub events: usize,
}

const FONT: &str = "sans-serif";
const GIB: f64 = (1u64 << 30) as f64;
const LEGEND_WIDTH: u32 = 400;

/// A plotters error as a chart error.
fn drawing<E: std::error::Error + Send + Sync>(e: DrawingAreaErrorKind<E>) -> ChartError {
    ChartError::Draw(e.to_string())
}

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

/// Prepares one device's panel from its analysis.
pub fn panel(a: &DeviceAnalysis, options: &Options, title: &str, columns: usize) -> Panel {
    let replay = &a.replay;
    let s = series::build(a, options.by, options.x, columns, options.max_groups);
    let peak = replay.peaks.allocated;
    let peak_x = peak.event.map_or(s.x_range.0, |i| s.x_of_event[i]);
    let mut what = vec![format!("peak {}", units::bytes(peak.bytes))];
    what.extend(a.peak_place.summary_parts());
    let made_of = a
        .peak_shares(Dimension::Category)
        .iter()
        .take(2)
        .map(|s| format!("{} {}", s.label, units::percent(s.bytes, peak.bytes)))
        .collect::<Vec<_>>()
        .join(", ");
    let several = a.steps.iter().any(|r| r.train_step > 0);
    let bands = a
        .steps
        .iter()
        .map(|row| {
            let short = match row.step {
                1..=8 if several => format!("{}.S{}", row.train_step, row.step),
                1..=8 => format!("S{}", row.step),
                _ => row.label.rsplit(" · ").next().unwrap_or("").to_string(),
            };
            (
                short,
                s.x_of_event[row.first_event],
                s.x_of_event[row.last_event],
            )
        })
        .collect();
    let ooms = replay
        .ooms
        .iter()
        .map(|o| (s.x_of_event[o.event], o.requested))
        .collect();
    Panel {
        title: title.to_string(),
        peak: (peak.bytes, peak_x),
        reserved_peak: replay.peaks.reserved.bytes,
        peak_label: what.join(" · "),
        made_of,
        bands,
        ooms,
        events: replay.len(),
        series: s,
    }
}

/// Renders one timeline with its legend to a file.
pub(super) fn render(
    out: &Path,
    format: Format,
    a: &DeviceAnalysis,
    options: &Options,
    title: &str,
) -> Result<ChartInfo, ChartError> {
    register_font();
    let size = (options.width.max(400), options.height.max(300));
    let columns = (size.0.saturating_sub(LEGEND_WIDTH + 120)).max(50) as usize;
    let p = panel(a, options, title, columns);
    match format {
        Format::Png => {
            let root = BitMapBackend::new(out, size).into_drawing_area();
            let info = single(&root, &p, options)?;
            root.present().map_err(drawing)?;
            Ok(info)
        }
        Format::Svg => {
            let root = SVGBackend::new(out, size).into_drawing_area();
            let info = single(&root, &p, options)?;
            root.present().map_err(drawing)?;
            Ok(info)
        }
    }
}

/// Renders several panels sharing one y axis: stacked for two, a grid for more.
pub fn render_panels(
    out: &Path,
    panels: &[Panel],
    options: &Options,
    title: &str,
) -> Result<(), ChartError> {
    register_font();
    let format = super::check_output(out)?;
    let size = (options.width.max(400), options.height.max(300));
    match format {
        Format::Png => {
            let root = BitMapBackend::new(out, size).into_drawing_area();
            grid(&root, panels, options, title)?;
            root.present().map_err(drawing)
        }
        Format::Svg => {
            let root = SVGBackend::new(out, size).into_drawing_area();
            grid(&root, panels, options, title)?;
            root.present().map_err(drawing)
        }
    }
}

fn y_max_for(panels: &[&Panel]) -> f64 {
    let top = panels
        .iter()
        .map(|p| p.reserved_peak.max(p.peak.0))
        .max()
        .unwrap_or(0);
    // headroom above the highest line for the step and peak labels
    (top as f64 / GIB * 1.24).max(0.01)
}

fn header<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    subtitle: &str,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    area.draw(&Text::new(
        shorten(title, 110),
        (24, 14),
        (FONT, 26).into_font().style(FontStyle::Bold).color(&BLACK),
    ))?;
    area.draw(&Text::new(
        subtitle.to_string(),
        (24, 50),
        (FONT, 17).into_font().color(&RGBColor(0x55, 0x55, 0x55)),
    ))
}

fn single<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    p: &Panel,
    options: &Options,
) -> Result<ChartInfo, ChartError>
where
    DB::ErrorType: 'static,
{
    let err = drawing::<DB::ErrorType>;
    let (width, height) = root.dim_in_pixel();
    root.fill(&WHITE).map_err(err)?;
    let (head, body) = root.split_vertically(78);
    let (plot_area, legend_area) = body.split_horizontally(width.saturating_sub(LEGEND_WIDTH));
    let subtitle = format!(
        "allocated by {}, reserved as a line · peak {} · {} events",
        options.by.as_str(),
        units::bytes(p.peak.0),
        units::count(p.events as u64)
    );
    header(&head, &p.title, &subtitle).map_err(err)?;
    let colours = palette::assign(&p.series.groups);
    let (info, at_peak) =
        draw_panel(&plot_area, p, &colours, y_max_for(&[p]), true, 1.0).map_err(err)?;
    draw_legend(
        &legend_area,
        &p.series.groups,
        &colours,
        &at_peak,
        options,
        Some(p.reserved_peak),
    )
    .map_err(err)?;
    Ok(ChartInfo {
        width,
        height,
        ..info
    })
}

fn grid<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    panels: &[Panel],
    options: &Options,
    title: &str,
) -> Result<(), ChartError>
where
    DB::ErrorType: 'static,
{
    let err = drawing::<DB::ErrorType>;
    let (width, _) = root.dim_in_pixel();
    root.fill(&WHITE).map_err(err)?;
    let (head, body) = root.split_vertically(78);
    let highest = panels.iter().map(|p| p.peak.0).max().unwrap_or(0);
    let subtitle = format!(
        "allocated by {}, one panel each, same y axis · highest peak {}",
        options.by.as_str(),
        units::bytes(highest)
    );
    header(&head, title, &subtitle).map_err(err)?;
    let (plots, legend_area) = body.split_horizontally(width.saturating_sub(LEGEND_WIDTH));
    // one colour per label across every panel
    let mut groups: Vec<String> = Vec::new();
    for p in panels {
        for g in &p.series.groups {
            if !groups.contains(g) {
                groups.push(g.clone());
            }
        }
    }
    let colours = palette::assign(&groups);
    let refs: Vec<&Panel> = panels.iter().collect();
    let y_max = y_max_for(&refs);
    let n = panels.len().max(1);
    let cols = if n <= 3 {
        1
    } else {
        (n as f64).sqrt().ceil() as usize
    };
    let rows = n.div_ceil(cols);
    let cells = plots.split_evenly((rows, cols));
    let scale = if n <= 2 { 0.9 } else { 0.75 };
    for (p, cell) in panels.iter().zip(cells.iter()) {
        let panel_colours: Vec<RGBColor> = p
            .series
            .groups
            .iter()
            .map(|g| colours[groups.iter().position(|x| x == g).unwrap_or(0)])
            .collect();
        let (title_area, plot) = cell.split_vertically(30);
        title_area
            .draw(&Text::new(
                shorten(&p.title, 70),
                (16, 6),
                (FONT, (18.0 * scale) as u32 + 4)
                    .into_font()
                    .style(FontStyle::Bold),
            ))
            .map_err(err)?;
        draw_panel(&plot, p, &panel_colours, y_max, n <= 2, scale).map_err(err)?;
    }
    let highest_at: Vec<u64> = groups
        .iter()
        .map(|g| {
            panels
                .iter()
                .map(|p| {
                    let i = p.series.groups.iter().position(|x| x == g);
                    let col = p
                        .series
                        .columns
                        .iter()
                        .max_by_key(|c| c.groups.iter().sum::<u64>());
                    match (i, col) {
                        (Some(i), Some(c)) => c.groups[i],
                        _ => 0,
                    }
                })
                .max()
                .unwrap_or(0)
        })
        .collect();
    draw_legend(&legend_area, &groups, &colours, &highest_at, options, None).map_err(err)?;
    Ok(())
}

/// Draws one panel's axes, bands, areas, reserved line, OOMs and peak; returns where things
/// went and the groups' bytes at the peak.
fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    p: &Panel,
    colours: &[RGBColor],
    y_max: f64,
    peak_labels: bool,
    scale: f64,
) -> Result<(ChartInfo, Vec<u64>), DrawingAreaErrorKind<DB::ErrorType>> {
    let s = &p.series;
    let font = |size: f64| (FONT, (size * scale).round().max(9.0) as u32);
    let (x0, x1) = s.x_range;
    let x_desc = match s.axis {
        XAxis::Time => "seconds from the first recorded event",
        XAxis::Events => "event",
    };
    let mut chart = ChartBuilder::on(area)
        .margin_left(16)
        .margin_right(24)
        .margin_top(12)
        .margin_bottom(12)
        .x_label_area_size((56.0 * scale) as u32)
        .y_label_area_size((78.0 * scale) as u32)
        .build_cartesian_2d(x0..x1.max(x0 + 1e-9), 0.0..y_max)?;
    chart
        .configure_mesh()
        .light_line_style(RGBColor(0xee, 0xee, 0xee))
        .bold_line_style(RGBColor(0xdd, 0xdd, 0xdd))
        .x_desc(x_desc)
        .y_desc("GiB")
        .axis_desc_style(font(18.0))
        .label_style(font(16.0))
        .x_label_formatter(&|v| {
            if s.axis == XAxis::Events {
                units::count(v.max(0.0) as u64)
            } else if x1 < 0.1 {
                format!("{v:.3}")
            } else {
                format!("{v:.2}")
            }
        })
        .y_label_formatter(&|v| format!("{v:.1}"))
        .draw()?;
    let (xr, _) = chart.plotting_area().get_pixel_range();
    let x_span = (x1 - x0).max(1e-12);
    let px = move |x: f64| -> i32 {
        xr.start + ((x - x0) / x_span * (xr.end - xr.start - 1) as f64).round() as i32
    };

    // steps (or phases) as bands
    for (k, (short, xa, xb)) in p.bands.iter().enumerate() {
        if k % 2 == 0 {
            chart.draw_series(std::iter::once(Rectangle::new(
                [(*xa, 0.0), (*xb, y_max)],
                RGBColor(0xf3, 0xf4, 0xf7).filled(),
            )))?;
        }
        let wide = px(*xb) - px(*xa);
        if wide as f64 >= (short.len() as f64 * 9.0 + 6.0) * scale {
            chart.draw_series(std::iter::once(Text::new(
                short.clone(),
                ((xa + xb) / 2.0, y_max * 0.985),
                font(15.0)
                    .into_font()
                    .color(&RGBColor(0x66, 0x66, 0x66))
                    .pos(Pos::new(HPos::Center, VPos::Top)),
            )))?;
        }
    }

    // Reserved memory, drawn under the areas: it is never below allocated memory, so only its
    // vertical jumps meet the areas, and there the allocated spike must stay visible.
    chart.draw_series(LineSeries::new(
        s.columns.iter().map(|c| (c.x, c.reserved as f64 / GIB)),
        palette::RESERVED.stroke_width(2),
    ))?;

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
        chart.draw_series(std::iter::once(Polygon::new(points, colour.filled())))?;
        lower = upper;
    }

    // out-of-memory events
    for &(x, requested) in &p.ooms {
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(x, 0.0), (x, y_max * 0.93)],
            palette::OOM.stroke_width(3),
        )))?;
        chart.draw_series(std::iter::once(Text::new(
            format!("OOM: {} requested", units::bytes(requested)),
            (x, y_max * 0.93),
            font(17.0)
                .into_font()
                .color(&palette::OOM)
                .pos(Pos::new(HPos::Right, VPos::Bottom)),
        )))?;
    }

    // the peak: dashed from just above it up to its label, so the peak itself stays visible
    let (peak_bytes, peak_x) = p.peak;
    let peak_top = peak_bytes as f64 / GIB;
    let dash = y_max / 80.0;
    let mut y = peak_top + dash * 1.5;
    let mut dashes = Vec::new();
    while y < y_max * 0.84 {
        dashes.push(PathElement::new(
            vec![(peak_x, y), (peak_x, (y + dash).min(y_max * 0.84))],
            palette::PEAK.stroke_width(2),
        ));
        y += dash * 2.0;
    }
    chart.draw_series(dashes)?;
    chart.draw_series(std::iter::once(Circle::new(
        (peak_x, peak_top),
        (6.0 * scale).max(3.0) as u32,
        palette::PEAK.filled(),
    )))?;
    let right_half = px(peak_x) > px((x0 + x1) / 2.0);
    let anchor = Pos::new(
        if right_half { HPos::Right } else { HPos::Left },
        VPos::Bottom,
    );
    let label = if peak_labels {
        shorten(&p.peak_label, 80)
    } else {
        format!("peak {}", units::bytes(peak_bytes))
    };
    chart.draw_series(std::iter::once(Text::new(
        label,
        (peak_x, y_max * 0.905),
        font(18.0)
            .into_font()
            .style(FontStyle::Bold)
            .color(&palette::PEAK)
            .pos(anchor),
    )))?;
    if peak_labels && !p.made_of.is_empty() {
        chart.draw_series(std::iter::once(Text::new(
            format!("made of {}", p.made_of),
            (peak_x, y_max * 0.865),
            font(17.0).into_font().color(&palette::PEAK).pos(anchor),
        )))?;
    }
    let (xr, yr) = chart.plotting_area().get_pixel_range();
    let (peak_px, peak_py) = chart.backend_coord(&(peak_x, peak_top));
    let at_peak = s
        .columns
        .iter()
        .min_by(|a, b| (a.x - peak_x).abs().total_cmp(&(b.x - peak_x).abs()))
        .filter(|c| c.groups.iter().sum::<u64>() == peak_bytes)
        .or_else(|| {
            s.columns
                .iter()
                .max_by_key(|c| c.groups.iter().sum::<u64>())
        })
        .map_or(vec![0; s.groups.len()], |c| c.groups.clone());
    Ok((
        ChartInfo {
            width: 0,
            height: 0,
            plot: (xr.start, yr.start, xr.end, yr.end),
            peak_x: peak_px,
            peak_y: peak_py,
            groups: s.groups.clone(),
        },
        at_peak,
    ))
}

fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    groups: &[String],
    colours: &[RGBColor],
    bytes: &[u64],
    options: &Options,
    reserved_peak: Option<u64>,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let ink = RGBColor(0x33, 0x33, 0x33);
    let mut y = 70;
    let heading = match reserved_peak {
        Some(_) => format!("live at the peak, by {}", options.by.as_str()),
        None => format!("by {} (highest of the panels)", options.by.as_str()),
    };
    area.draw(&Text::new(
        heading,
        (8, y),
        (FONT, 18).into_font().style(FontStyle::Bold).color(&ink),
    ))?;
    y += 34;
    // top band first, as stacked
    for g in (0..groups.len()).rev() {
        if bytes.get(g).copied().unwrap_or(0) == 0 && groups[g] == "other" {
            continue;
        }
        area.draw(&Rectangle::new(
            [(8, y - 2), (26, y + 14)],
            colours[g].filled(),
        ))?;
        area.draw(&Text::new(
            shorten(&groups[g], 34),
            (34, y - 2),
            (FONT, 15).into_font().color(&ink),
        ))?;
        let b = bytes.get(g).copied().unwrap_or(0);
        area.draw(&Text::new(
            if b == 0 {
                "—".to_string()
            } else {
                units::bytes(b)
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
    let reserved = match reserved_peak {
        Some(r) => format!("reserved (peak {})", units::bytes(r)),
        None => "reserved".to_string(),
    };
    area.draw(&Text::new(
        reserved,
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
