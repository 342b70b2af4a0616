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
pub mod flamegraph;
pub mod palette;
pub mod series;

use std::path::Path;

pub use draw::{panel, render_panels, ChartInfo, Panel};
pub use series::XAxis;

use crate::analysis::{DeviceAnalysis, Dimension};
use crate::attribute::Attribution;

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
            x: XAxis::Auto,
            width: 1600,
            height: 900,
            title: None,
            max_groups: 9,
        }
    }
}

pub use crate::error::ChartError;

/// Checks that a chart can be written to `out`, and gives its format.
pub fn check_output(out: &Path) -> Result<Format, ChartError> {
    if out.is_dir() {
        return Err(ChartError::IsFolder);
    }
    let format = Format::of(out).ok_or(ChartError::Format)?;
    match out.parent() {
        Some(dir) if !dir.as_os_str().is_empty() && !dir.is_dir() => {
            Err(ChartError::NoFolder(dir.to_path_buf()))
        }
        _ => Ok(format),
    }
}

impl Options {
    /// The smallest image a timeline is drawn on: axes, step labels, the peak's label and the
    /// legend need this much room.
    pub const MIN_SIZE: (u32, u32) = (600, 400);

    /// The largest width or height drawn.
    pub const MAX_SIDE: u32 = crate::error::options::MAX_CHART_SIDE;
    /// The most pixels drawn (a PNG's buffer holds three bytes each: 150 MB at most).
    pub const MAX_PIXELS: u64 = crate::error::options::MAX_CHART_PIXELS;

    /// Refuses sizes too small to read, and sizes whose image buffer would be huge.
    pub fn check_size(&self) -> Result<(), ChartError> {
        if self.width > Self::MAX_SIDE
            || self.height > Self::MAX_SIDE
            || u64::from(self.width) * u64::from(self.height) > Self::MAX_PIXELS
        {
            return Err(ChartError::TooLarge {
                width: self.width,
                height: self.height,
                max_side: Self::MAX_SIDE,
            });
        }
        let (min_width, min_height) = Self::MIN_SIZE;
        if self.width < min_width || self.height < min_height {
            return Err(ChartError::TooSmall {
                width: self.width,
                height: self.height,
                min_width,
                min_height,
            });
        }
        Ok(())
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
    format!("{name} · {}{rank}", crate::snapshot::device_name(a.device))
}

/// Draws a timeline of one device to `out` (PNG or SVG by extension).
pub fn timeline(
    out: &Path,
    file: &str,
    a: &DeviceAnalysis,
    options: &Options,
) -> Result<ChartInfo, ChartError> {
    let format = check_output(out)?;
    options.check_size()?;
    let title = options
        .title
        .clone()
        .unwrap_or_else(|| default_title(file, &a.attribution));
    draw::render(out, format, a, options, &title)
}

/// Draws a histogram of per-rank peaks (bytes) to `out` (PNG or SVG by extension).
pub fn histogram(out: &Path, peaks: &[u64], title: &str) -> Result<(), ChartError> {
    let format = check_output(out)?;
    draw::histogram(out, format, peaks, title)
}
