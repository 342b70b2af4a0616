//! Chart: memory timelines as PNG or SVG, drawn with plotters.
//!
//! [`timeline`] draws allocated memory over time as a stacked area grouped by any label
//! dimension, reserved memory as a line above it, pipeline steps as labelled bands, the peak
//! with what made it, out-of-memory events, and the memory that was there before recording as
//! the bottom band. Long traces are downsampled one column per pixel keeping each column's
//! maximum ([`series`]), so the peak survives. Text uses DejaVu Sans embedded in the binary,
//! so a machine without fonts draws the same chart. Colours come from [`palette`]: a label has
//! the same colour in every chart.

mod draw;
pub mod palette;
pub mod series;

use std::path::Path;

pub use draw::{panel, render_panels, ChartInfo, Panel};
pub use series::XAxis;

use crate::attribute::Attribution;
use crate::replay::Replay;
use crate::report::breakdown::Dimension;
use crate::snapshot::Snapshot;
use crate::{Error, ErrorKind};

/// What to draw.
#[derive(Clone, Debug)]
pub struct Options {
    /// Grouping of the stacked area.
    pub by: Dimension,
    /// Horizontal axis.
    pub x: XAxis,
    /// Image width in pixels.
    pub width: u32,
    /// Image height in pixels.
    pub height: u32,
    /// Title; by default the file name, device and pipeline rank.
    pub title: Option<String>,
    /// Groups with their own band; the rest are `other`.
    pub max_groups: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            by: Dimension::Category,
            x: XAxis::Time,
            width: 1600,
            height: 900,
            title: None,
            max_groups: 9,
        }
    }
}

/// Image format, from the output file's extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `.png`
    Png,
    /// `.svg`
    Svg,
}

impl Format {
    /// The format of `path`, by extension.
    pub fn of(path: &Path) -> Option<Format> {
        match path.extension()?.to_str()?.to_ascii_lowercase().as_str() {
            "png" => Some(Format::Png),
            "svg" => Some(Format::Svg),
            _ => None,
        }
    }
}

/// The default title: file name, device and, for a pipeline, the rank.
pub fn default_title(file: &str, a: &Attribution) -> String {
    let name = Path::new(file)
        .file_name()
        .map_or(file.to_string(), |n| n.to_string_lossy().into_owned());
    let rank = a
        .pipeline
        .as_ref()
        .and_then(|p| p.shape)
        .map_or(String::new(), |s| {
            format!(" · pipeline rank {} of {}", s.rank, s.ranks)
        });
    format!("{name} · device {}{rank}", a.device)
}

/// Draws a timeline of one device to `out` (PNG or SVG by extension).
pub fn timeline(
    out: &Path,
    file: &str,
    snap: &Snapshot,
    replay: &Replay,
    a: &Attribution,
    options: &Options,
) -> Result<ChartInfo, Error> {
    let format = Format::of(out).ok_or_else(|| {
        Error::new(
            out,
            ErrorKind::Usage("the chart file must end in .png or .svg".to_string()),
        )
    })?;
    let title = options
        .title
        .clone()
        .unwrap_or_else(|| default_title(file, a));
    draw::render(out, format, snap, replay, a, options, &title)
        .map_err(|e| Error::new(out, ErrorKind::Usage(format!("cannot draw the chart: {e}"))))
}
