//! Drawing timelines with plotters, on any backend (PNG bitmap or SVG): one panel with a
//! legend for `memsnap timeline`, or several panels sharing one y axis for comparisons.

use std::path::Path;
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::palette;
use plotters::coord::types::RangedCoordf64;

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

/// The embedded font's name; SVG files name it too, so a viewer with DejaVu Sans shows the
/// same letters as the PNG.
const FONT: &str = "DejaVu Sans";
const GIB: f64 = (1u64 << 30) as f64;
/// The legend's width in an image `width` pixels wide.
fn legend_width(width: u32) -> u32 {
    (width / 4).clamp(230, 400)
}

/// How large text and marks are drawn in a `width` x `height` image (1 at 1600 x 900).
fn scale_for(width: u32, height: u32) -> f64 {
    (width as f64 / 1600.0)
        .min(height as f64 / 900.0)
        .clamp(0.7, 1.0)
}

/// A plotters error as a chart error.
fn drawing<E: std::error::Error + Send + Sync>(e: DrawingAreaErrorKind<E>) -> ChartError {
    ChartError::Draw(e.to_string())
}

/// Draws an SVG in memory and writes it to `out` as XML 1.0 can hold it: a character of a
/// name that XML cannot hold (a control character, U+FFFE) is written as U+FFFD
/// ([`crate::escape::Stream::xml`]).
fn svg<T>(
    out: &Path,
    size: (u32, u32),
    draw: impl FnOnce(&DrawingArea<SVGBackend, Shift>) -> Result<T, ChartError>,
) -> Result<T, ChartError> {
    use std::io::Write;
    let mut text = String::new();
    let drawn = {
        let root = SVGBackend::with_string(&mut text, size).into_drawing_area();
        let drawn = draw(&root)?;
        root.present().map_err(drawing)?;
        drawn
    };
    let written = std::fs::File::create(out).and_then(|file| {
        let mut w = crate::escape::Stream::xml(std::io::BufWriter::new(file));
        w.write_all(text.as_bytes())?;
        w.into_inner()?.flush()
    });
    written.map_err(|e| ChartError::Draw(crate::error::io_text(&e)))?;
    Ok(drawn)
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

/// How a chart names its grouping: `step (micro-batches together)` where it grouped whole
/// steps.
fn by_text(by: Dimension, whole_steps: bool) -> String {
    if whole_steps {
        format!("{} (micro-batches together)", by.as_str())
    } else {
        by.as_str().to_string()
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
    let columns = (size.0.saturating_sub(legend_width(size.0) + 120)).max(50) as usize;
    let p = panel(a, options, title, columns);
    match format {
        Format::Png => {
            let root = bitmap(out, size)?;
            let info = single(&root, &p, options)?;
            root.present().map_err(drawing)?;
            Ok(info)
        }
        Format::Svg => svg(out, size, |root| single(root, &p, options)),
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
    let many = panels.len() > MAX_PANELS;
    let size = if many {
        (options.width.max(800), options.height.max(450))
    } else {
        let (cols, rows) = grid_shape(panels.len());
        let width = legend_width(options.width) + cols as u32 * MIN_PANEL.0;
        let height = 78 + rows as u32 * MIN_PANEL.1;
        (options.width.max(width), options.height.max(height))
    };
    match format {
        Format::Png => {
            let root = bitmap(out, size)?;
            draw_on(&root, panels, options, title, many)?;
            root.present().map_err(drawing)
        }
        Format::Svg => svg(out, size, |root| {
            draw_on(root, panels, options, title, many)
        }),
    }
}

/// Beyond this many panels, one chart of every panel's peak replaces the small multiples.
const MAX_PANELS: usize = 16;

/// The smallest panel of a grid, in pixels: the image grows so that no panel is smaller.
const MIN_PANEL: (u32, u32) = (420, 260);

/// Columns and rows of a grid of `n` panels: one column up to three, then a square.
fn grid_shape(n: usize) -> (usize, usize) {
    let n = n.max(1);
    let cols = if n <= 3 {
        1
    } else {
        (n as f64).sqrt().ceil() as usize
    };
    (cols, n.div_ceil(cols))
}

fn draw_on<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    panels: &[Panel],
    options: &Options,
    title: &str,
    many: bool,
) -> Result<(), ChartError>
where
    DB::ErrorType: 'static,
{
    if many {
        peaks_per_panel(root, panels, title)
    } else {
        grid(root, panels, options, title)
    }
}

/// One bar per panel (rank): its peak allocated bytes, with its peak reserved as a tick; the
/// highest bar in the peak colour.
fn peaks_per_panel<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    panels: &[Panel],
    title: &str,
) -> Result<(), ChartError>
where
    DB::ErrorType: 'static,
{
    let err = drawing::<DB::ErrorType>;
    root.fill(&WHITE).map_err(err)?;
    let (head, body) = root.split_vertically(78);
    let highest = panels.iter().map(|p| p.peak.0).max().unwrap_or(0);
    let subtitle = format!(
        "peak allocated of each of {} snapshots (bars), peak reserved (ticks) · highest {}",
        panels.len(),
        units::bytes(highest)
    );
    header(&head, title, &subtitle).map_err(err)?;
    let y_max = (top_of(&panels.iter().collect::<Vec<_>>()) as f64 / GIB * 1.1).max(0.01);
    let n = panels.len();
    let mut chart = ChartBuilder::on(&body)
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..n as f64, 0.0..y_max)
        .map_err(err)?;
    let names: Vec<String> = panels.iter().map(|p| p.title.clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n.min(32))
        .x_label_formatter(&|v| {
            let i = v.floor() as usize;
            names
                .get(i)
                .map(|t| t.split(" · ").next().unwrap_or(t).replace("rank ", ""))
                .unwrap_or_default()
        })
        .x_desc("rank")
        .y_desc("GiB")
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 16))
        .draw()
        .map_err(err)?;
    for (i, p) in panels.iter().enumerate() {
        let colour = if p.peak.0 == highest {
            palette::PEAK
        } else {
            RGBColor(0x4c, 0x72, 0xb0)
        };
        let x = i as f64;
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(x + 0.15, 0.0), (x + 0.85, p.peak.0 as f64 / GIB)],
                colour.filled(),
            )))
            .map_err(err)?;
        let r = p.reserved_peak as f64 / GIB;
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(x + 0.1, r), (x + 0.9, r)],
                palette::RESERVED.stroke_width(2),
            )))
            .map_err(err)?;
    }
    Ok(())
}

/// The highest line of the panels, in bytes: every panel's y axis reaches above it.
fn top_of(panels: &[&Panel]) -> u64 {
    panels
        .iter()
        .map(|p| p.reserved_peak.max(p.peak.0))
        .max()
        .unwrap_or(0)
}

fn header<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    subtitle: &str,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let (width, _) = area.dim_in_pixel();
    let scale = scale_for(width, 900);
    area.draw(&Text::new(
        shorten(title, (width as f64 / (15.0 * scale)) as usize),
        (24, 14),
        (FONT, (26.0 * scale) as u32)
            .into_font()
            .style(FontStyle::Bold)
            .color(&BLACK),
    ))?;
    area.draw(&Text::new(
        shorten(subtitle, (width as f64 / (9.5 * scale)) as usize),
        (24, 50),
        (FONT, (17.0 * scale) as u32)
            .into_font()
            .color(&RGBColor(0x55, 0x55, 0x55)),
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
    let scale = scale_for(width, height);
    let (plot_area, legend_area) =
        body.split_horizontally(width.saturating_sub(legend_width(width)));
    let subtitle = format!(
        "allocated by {}, reserved as a line · peak {} · {}",
        by_text(options.by, p.series.whole_steps),
        units::bytes(p.peak.0),
        units::counted(p.events as u64, "event")
    );
    header(&head, &p.title, &subtitle).map_err(err)?;
    let colours = palette::assign(&p.series.groups);
    let (info, at_peak) =
        draw_panel(&plot_area, p, &colours, top_of(&[p]), true, scale).map_err(err)?;
    // what is live at the peak, then what was large at other times; the band of smaller
    // groups last, named with how many it holds and how large it gets
    let other = p.series.groups.len() - 1;
    let other_name = p.series.other_name();
    let rows = |live: bool| {
        let mut rows: Vec<_> = (0..other)
            .rev()
            .filter(|&g| (at_peak[g] > 0) == live)
            .map(|g| {
                let bytes = live.then_some(at_peak[g]);
                (p.series.groups[g].as_str(), colours[g], bytes)
            })
            .collect();
        // the band of smaller groups, when it ever holds a byte
        if p.series.folded > 0 && p.series.other_max() > 0 && (at_peak[other] > 0) == live {
            rows.push((
                other_name.as_str(),
                colours[other],
                live.then_some(at_peak[other]),
            ));
        }
        rows
    };
    let sections = [
        LegendSection {
            heading: format!(
                "live at the peak, by {}",
                by_text(options.by, p.series.whole_steps)
            ),
            rows: rows(true),
        },
        LegendSection {
            heading: "large at other times".to_string(),
            rows: rows(false),
        },
    ];
    draw_legend(&legend_area, &sections, options, Some(p.reserved_peak)).map_err(err)?;
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
    let (plots, legend_area) = body.split_horizontally(width.saturating_sub(legend_width(width)));
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
    let top = top_of(&refs);
    let n = panels.len().max(1);
    let (cols, rows) = grid_shape(n);
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
        draw_panel(&plot, p, &panel_colours, top, n <= 2, scale).map_err(err)?;
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
    let sections = [LegendSection {
        heading: format!("by {} (highest of the panels)", options.by.as_str()),
        rows: (0..groups.len())
            .rev()
            .filter(|&g| highest_at[g] > 0)
            .map(|g| {
                let name = if groups[g] == series::OTHER {
                    "smaller groups"
                } else {
                    groups[g].as_str()
                };
                (name, colours[g], Some(highest_at[g]))
            })
            .collect(),
    }];
    draw_legend(&legend_area, &sections, options, None).map_err(err)?;
    Ok(())
}

/// The plotting coordinates of a panel: seconds (or events) across, GiB up.
type Plot<'a, DB> = ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// Draws one panel's axes, bands, areas, reserved line, OOMs and peak; returns where things
/// went and the groups' bytes at the peak.
fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    p: &Panel,
    colours: &[RGBColor],
    top: u64,
    peak_labels: bool,
    scale: f64,
) -> Result<(ChartInfo, Vec<u64>), DrawingAreaErrorKind<DB::ErrorType>> {
    let s = &p.series;
    let (x0, x1) = s.x_range;
    // Room above the highest line for the lines of text: step names, names of narrow steps,
    // the peak's label and (with `peak_labels`) what it was made of.
    let text_lines = if peak_labels { 4.0 } else { 3.0 };
    let plot_height = area.dim_in_pixel().1 as f64 - 24.0 - 56.0 * scale;
    let text_room = (8.0 + text_lines * LINE * scale) / plot_height.max(1.0);
    let y_max = (top as f64 / GIB / (1.0 - text_room.min(0.6)) * 1.03).max(0.01);
    let x_desc = match (s.axis, s.idle) {
        (XAxis::Events, Some((idle, span))) => format!(
            "event (no event for {idle:.1} s of the trace's {span:.1} s; --x time draws seconds)"
        ),
        (XAxis::Events, None) => "event".to_string(),
        _ => "seconds from the first recorded event".to_string(),
    };
    let mut chart = ChartBuilder::on(area)
        .margin_left(16)
        .margin_right(24)
        .margin_top(12)
        .margin_bottom(12)
        .x_label_area_size((56.0 * scale) as u32)
        .y_label_area_size((78.0 * scale) as u32)
        .build_cartesian_2d(x0..x1.max(x0 + 1e-9), 0.0..y_max)?;
    let (pixels, _) = chart.plotting_area().dim_in_pixel();
    let x_labels = ((pixels as f64 / (110.0 * scale)) as usize).clamp(2, 12);
    chart
        .configure_mesh()
        .light_line_style(RGBColor(0xee, 0xee, 0xee))
        .bold_line_style(RGBColor(0xdd, 0xdd, 0xdd))
        .x_labels(x_labels)
        .x_desc(x_desc)
        .y_desc("GiB")
        .axis_desc_style(font(18.0, scale))
        .label_style(font(16.0, scale))
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
    let lines = TextLines {
        y_max,
        step: y_max * LINE * scale / plot_height.max(1.0),
        top: y_max * (1.0 - 6.0 / plot_height.max(1.0)),
    };
    draw_bands(&mut chart, p, &lines, scale)?;
    // Reserved memory, drawn under the areas: it is never below allocated memory, so only its
    // vertical jumps meet the areas, and there the allocated spike must stay visible.
    chart.draw_series(LineSeries::new(
        s.columns.iter().map(|c| (c.x, c.reserved as f64 / GIB)),
        palette::RESERVED.stroke_width(2),
    ))?;
    draw_areas(&mut chart, s, colours)?;
    let peak_text = draw_peak(&mut chart, p, &lines, peak_labels, scale)?;
    draw_ooms(&mut chart, p, &lines, peak_text, scale)?;
    let (peak_bytes, peak_x) = p.peak;
    let (xr, yr) = chart.plotting_area().get_pixel_range();
    let (peak_px, peak_py) = chart.backend_coord(&(peak_x, peak_bytes as f64 / GIB));
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

/// The height of one line of text above the plot's lines, in pixels at scale 1.
const LINE: f64 = 21.0;

/// Where the lines of text above the plot's lines go, in GiB.
struct TextLines {
    y_max: f64,
    /// The height of one line.
    step: f64,
    /// The top of the first line.
    top: f64,
}

impl TextLines {
    /// The top of line `k` (0 is the first).
    fn at(&self, k: f64) -> f64 {
        self.top - k * self.step
    }
}

/// A font of `size` points at the panel's scale, never below 9.
fn font(size: f64, scale: f64) -> (&'static str, u32) {
    (FONT, (size * scale).round().max(9.0) as u32)
}

/// Steps (or phases) as alternating bands with their names at the top. Bands too narrow
/// for their own name are named together (`S5–S8`), below the other names, right-aligned to
/// where the last of them ends.
fn draw_bands<DB: DrawingBackend>(
    chart: &mut Plot<DB>,
    p: &Panel,
    lines: &TextLines,
    scale: f64,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let y_max = lines.y_max;
    let (x0, x1) = p.series.x_range;
    let (xr, _) = chart.plotting_area().get_pixel_range();
    let x_span = (x1 - x0).max(1e-12);
    let px = |x: f64| xr.start as f64 + (x - x0) / x_span * (xr.end - xr.start - 1) as f64;
    let grey = RGBColor(0x66, 0x66, 0x66);
    let size = font(15.0, scale);
    let fits = |text: &str, xa: f64, xb: f64| {
        px(xb) - px(xa) >= (text.chars().count() as f64 * 9.0 + 6.0) * scale
    };
    let mut narrow: Vec<usize> = Vec::new();
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (k, (short, xa, xb)) in p.bands.iter().enumerate() {
        if k % 2 == 0 {
            chart.draw_series(std::iter::once(Rectangle::new(
                [(*xa, 0.0), (*xb, y_max)],
                RGBColor(0xf3, 0xf4, 0xf7).filled(),
            )))?;
        }
        if fits(short, *xa, *xb) {
            chart.draw_series(std::iter::once(Text::new(
                short.clone(),
                ((xa + xb) / 2.0, lines.at(0.0)),
                size.into_font()
                    .color(&grey)
                    .pos(Pos::new(HPos::Center, VPos::Top)),
            )))?;
            if !narrow.is_empty() {
                groups.push(std::mem::take(&mut narrow));
            }
        } else {
            narrow.push(k);
        }
    }
    if !narrow.is_empty() {
        groups.push(narrow);
    }
    for group in groups {
        let (first, last) = (&p.bands[group[0]], &p.bands[group[group.len() - 1]]);
        let text = if group.len() == 1 {
            first.0.clone()
        } else {
            format!("{}–{}", first.0, last.0)
        };
        let (anchor, x) = if fits(&text, first.1, last.2) {
            (HPos::Center, (first.1 + last.2) / 2.0)
        } else {
            (HPos::Right, last.2)
        };
        chart.draw_series(std::iter::once(Text::new(
            text,
            (x, lines.at(1.0)),
            size.into_font()
                .color(&grey)
                .pos(Pos::new(anchor, VPos::Top)),
        )))?;
    }
    Ok(())
}

/// The stacked areas, bottom band first.
fn draw_areas<DB: DrawingBackend>(
    chart: &mut Plot<DB>,
    s: &Series,
    colours: &[RGBColor],
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
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
        let xs = s.columns.iter().map(|c| c.x);
        let mut points: Vec<(f64, f64)> = xs.clone().zip(upper.iter().copied()).collect();
        points.extend(xs.zip(lower.iter().copied()).rev());
        chart.draw_series(std::iter::once(Polygon::new(points, colour.filled())))?;
        lower = upper;
    }
    Ok(())
}

/// Out-of-memory events: a purple line with the request.
fn draw_ooms<DB: DrawingBackend>(
    chart: &mut Plot<DB>,
    p: &Panel,
    lines: &TextLines,
    peak_text: PeakText,
    scale: f64,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    for &(x, requested) in &p.ooms {
        // the line stops below the peak's label where it would cross it (an OOM often comes
        // right after the peak)
        let (from, to) = peak_text.x;
        let top = if (from..=to).contains(&x) {
            peak_text.bottom
        } else {
            lines.at(1.0)
        };
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(x, 0.0), (x, top)],
            palette::OOM.stroke_width(3),
        )))?;
        chart.draw_series(std::iter::once(Text::new(
            format!("OOM: {} requested ", units::bytes(requested)),
            (x, lines.at(1.0)),
            font(16.0, scale)
                .into_font()
                .color(&palette::OOM)
                .pos(Pos::new(HPos::Right, VPos::Top)),
        )))?;
    }
    Ok(())
}

/// Where the peak's label went: the x range its text covers and the bottom of its lines.
#[derive(Clone, Copy, Debug)]
struct PeakText {
    x: (f64, f64),
    bottom: f64,
}

/// The peak: a dot, dashed from just above it up to its label, so the peak itself stays
/// visible; the label says where it was and what it was made of.
fn draw_peak<DB: DrawingBackend>(
    chart: &mut Plot<DB>,
    p: &Panel,
    lines: &TextLines,
    peak_labels: bool,
    scale: f64,
) -> Result<PeakText, DrawingAreaErrorKind<DB::ErrorType>> {
    let (peak_bytes, peak_x) = p.peak;
    let (x0, x1) = p.series.x_range;
    let peak_top = peak_bytes as f64 / GIB;
    let dash = lines.y_max / 80.0;
    let label_line = 2.0;
    let below_text = lines.at(label_line + if peak_labels { 2.0 } else { 1.0 });
    let mut y = peak_top + dash * 1.5;
    let mut dashes = Vec::new();
    while y < below_text {
        dashes.push(PathElement::new(
            vec![(peak_x, y), (peak_x, (y + dash).min(below_text))],
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
    let right_half = peak_x > (x0 + x1) / 2.0;
    let anchor = Pos::new(if right_half { HPos::Right } else { HPos::Left }, VPos::Top);
    // as many characters as fit in the wider side of the plot
    let (xr, _) = chart.plotting_area().get_pixel_range();
    let room = (xr.end - xr.start) as f64
        * if right_half {
            (peak_x - x0) / (x1 - x0).max(1e-12)
        } else {
            (x1 - peak_x) / (x1 - x0).max(1e-12)
        };
    let fits = ((room / (10.5 * scale)) as usize).clamp(16, 90);
    let label = if peak_labels {
        shorten(&p.peak_label, fits)
    } else {
        shorten(&format!("peak {}", units::bytes(peak_bytes)), fits)
    };
    // the text's extent, from the widest line's length (characters are about 10.5 pixels)
    let mut widest = label.chars().count();
    let made_of = shorten(&format!("made of {}", p.made_of), fits);
    let two_lines = peak_labels && !p.made_of.is_empty();
    if two_lines {
        widest = widest.max(made_of.chars().count());
    }
    let plot_px = f64::from((xr.end - xr.start).max(1));
    let width = widest as f64 * 10.5 * scale / plot_px * (x1 - x0);
    let x = if right_half {
        (peak_x - width, peak_x)
    } else {
        (peak_x, peak_x + width)
    };
    chart.draw_series(std::iter::once(Text::new(
        label,
        (peak_x, lines.at(label_line)),
        font(18.0, scale)
            .into_font()
            .style(FontStyle::Bold)
            .color(&palette::PEAK)
            .pos(anchor),
    )))?;
    if two_lines {
        chart.draw_series(std::iter::once(Text::new(
            made_of,
            (peak_x, lines.at(label_line + 1.0)),
            font(17.0, scale)
                .into_font()
                .color(&palette::PEAK)
                .pos(anchor),
        )))?;
    }
    let bottom = lines.at(label_line + if two_lines { 2.0 } else { 1.0 });
    Ok(PeakText { x, bottom })
}

/// The legend's entries: a heading, then one row per group (top band first).
struct LegendSection<'a> {
    heading: String,
    rows: Vec<(&'a str, RGBColor, Option<u64>)>,
}

fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    sections: &[LegendSection],
    options: &Options,
    reserved_peak: Option<u64>,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let ink = RGBColor(0x33, 0x33, 0x33);
    let (width, height) = area.dim_in_pixel();
    let chars = ((width as f64 - 120.0) / 8.5).max(12.0) as usize;
    let mut y = 24;
    for section in sections.iter().filter(|s| !s.rows.is_empty()) {
        area.draw(&Text::new(
            section.heading.clone(),
            (8, y),
            (FONT, 17).into_font().style(FontStyle::Bold).color(&ink),
        ))?;
        y += 30;
        for (label, colour, bytes) in &section.rows {
            if y + 40 > height as i32 {
                break;
            }
            area.draw(&Rectangle::new([(8, y - 2), (26, y + 14)], colour.filled()))?;
            // sites keep their innermost frames
            let text = if options.by == Dimension::Site {
                shorten_left(label, chars)
            } else {
                shorten(label, chars)
            };
            area.draw(&Text::new(
                text,
                (34, y - 2),
                (FONT, 15).into_font().color(&ink),
            ))?;
            if let Some(b) = bytes {
                area.draw(&Text::new(
                    units::bytes(*b),
                    (width as i32 - 12, y - 2),
                    (FONT, 15)
                        .into_font()
                        .color(&ink)
                        .pos(Pos::new(HPos::Right, VPos::Top)),
                ))?;
            }
            y += 24;
        }
        y += 14;
    }
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

/// Keeps the end of a long label (the innermost frames of a site).
fn shorten_left(s: &str, max: usize) -> String {
    let n = s.chars().count();
    if n <= max {
        s.to_string()
    } else {
        let tail: String = s.chars().skip(n - max.saturating_sub(1)).collect();
        format!("…{tail}")
    }
}

/// A histogram of per-rank peaks: ranks per range of peak allocated bytes.
pub(super) fn histogram(
    out: &Path,
    format: Format,
    peaks: &[u64],
    title: &str,
) -> Result<(), ChartError> {
    register_font();
    let size = (1200, 600);
    match format {
        Format::Png => {
            let root = bitmap(out, size)?;
            histogram_on(&root, peaks, title)?;
            root.present().map_err(drawing)
        }
        Format::Svg => svg(out, size, |root| histogram_on(root, peaks, title)),
    }
}

fn histogram_on<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    peaks: &[u64],
    title: &str,
) -> Result<(), ChartError>
where
    DB::ErrorType: 'static,
{
    let err = drawing::<DB::ErrorType>;
    root.fill(&WHITE).map_err(err)?;
    let (head, body) = root.split_vertically(78);
    let bins = crate::analysis::histogram(peaks, 20);
    let most = bins.iter().map(|b| b.2).max().unwrap_or(1).max(1);
    let (lo, hi) = (
        bins.first().map_or(0.0, |b| b.0 as f64 / GIB),
        bins.last().map_or(1.0, |b| b.1 as f64 / GIB),
    );
    let subtitle = format!(
        "ranks per range of peak allocated memory · lowest {:.2} GiB, highest {:.2} GiB",
        lo, hi
    );
    header(&head, title, &subtitle).map_err(err)?;
    let span = (hi - lo).max(0.01);
    let mut chart = ChartBuilder::on(&body)
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(60)
        .build_cartesian_2d(lo..(lo + span), 0usize..(most + most / 10 + 1))
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("peak allocated, GiB")
        .y_desc("ranks")
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 16))
        .x_label_formatter(&|v| format!("{v:.2}"))
        .y_labels((most + 1).min(10))
        .draw()
        .map_err(err)?;
    chart
        .draw_series(bins.iter().map(|&(from, to, n)| {
            Rectangle::new(
                [(from as f64 / GIB, 0), (to as f64 / GIB, n)],
                RGBColor(0x4c, 0x72, 0xb0).filled(),
            )
        }))
        .map_err(err)?;
    Ok(())
}

/// A PNG's drawing area, once the process has room for its buffer (three bytes a pixel) within
/// `--max-memory`: the buffer is the largest thing a chart makes, so it asks before it is made.
fn bitmap(
    out: &Path,
    (width, height): (u32, u32),
) -> Result<DrawingArea<BitMapBackend<'_>, Shift>, ChartError> {
    let needed = u64::from(width) * u64::from(height) * 3;
    crate::memory::check(needed).map_err(|max| ChartError::Memory {
        width,
        height,
        needed,
        max,
    })?;
    Ok(BitMapBackend::new(out, (width, height)).into_drawing_area())
}
