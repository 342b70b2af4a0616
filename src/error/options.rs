//! What a command asked for that cannot be done: a rules file that cannot be used, a chart
//! that cannot be drawn, an option value that does not fit the file or the command. Each is
//! exit code 2 ([`super::Error::is_usage`]); the stages that find them ([`crate::attribute::rules`],
//! [`crate::chart`], the command line) re-export or build them, so this ground module depends on
//! none of them.

use std::io;
use std::path::PathBuf;

/// The most rules a rules file may hold.
pub const MAX_RULES: usize = 1_000;
/// The widest or tallest chart drawn, in pixels.
pub const MAX_CHART_SIDE: u32 = 16_384;
/// The most pixels one chart may have.
pub const MAX_CHART_PIXELS: u64 = 50_000_000;

/// Why a rules file was refused; rules are numbered from 1 in file order.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RulesError {
    /// Not valid TOML, or not the rules schema.
    #[error("line {line}, column {column}: {message}")]
    Toml {
        /// 1-based line of the error.
        line: usize,
        /// 1-based column (in characters) of the error.
        column: usize,
        /// What the TOML reader said, on one line.
        message: String,
    },
    /// More rules than are read.
    #[error("{0} rules: at most {MAX_RULES} are read")]
    TooMany(usize),
    /// A `file` or `function` pattern that is not a regular expression.
    #[error("rule {rule}: {field}: not a regular expression: {message}")]
    Pattern {
        /// The rule's number.
        rule: usize,
        /// `file` or `function`.
        field: &'static str,
        /// What the regex parser said, on one line.
        message: String,
    },
    /// A category or phase name that does not exist.
    #[error("rule {rule}: unknown {field} {value:?}")]
    UnknownName {
        /// The rule's number.
        rule: usize,
        /// `category` or `phase`.
        field: &'static str,
        /// The name given.
        value: String,
    },
    /// The file cannot be read as a rules file (missing, not regular, too large, not UTF-8).
    #[error("cannot read the rules: {0}")]
    Read(String),
    /// A rule that matches but sets nothing.
    #[error("rule {0} sets no label")]
    NoLabel(usize),
}

/// Why a chart was not drawn.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChartError {
    /// The output name does not say PNG or SVG.
    #[error("the chart file must end in .png or .svg")]
    Format,
    /// The output's folder does not exist.
    #[error("cannot write the chart: the folder {0} does not exist")]
    NoFolder(PathBuf),
    /// The output names a folder.
    #[error("cannot write the chart: it is a folder; give a file name ending in .png or .svg")]
    IsFolder,
    /// The image is too small for its axes, labels and legend.
    #[error(
        "a {width}x{height} chart is too small to read; use at least {min_width}x{min_height}"
    )]
    TooSmall {
        /// Width asked for.
        width: u32,
        /// Height asked for.
        height: u32,
        /// Smallest width drawn.
        min_width: u32,
        /// Smallest height drawn.
        min_height: u32,
    },
    /// The image would take more memory than a chart is worth.
    #[error(
        "a {width}x{height} chart is too large; use at most {max_side} pixels a side and {} megapixels",
        MAX_CHART_PIXELS / 1_000_000
    )]
    TooLarge {
        /// Width asked for.
        width: u32,
        /// Height asked for.
        height: u32,
        /// Largest width or height drawn.
        max_side: u32,
    },
    /// The image's buffer would take the process past `--max-memory`.
    #[error(
        "memory use would pass the limit of {} after decoding: a {width}x{height} PNG needs {} to draw (raise it with --max-memory)",
        crate::units::bytes(*max),
        crate::units::bytes(*needed)
    )]
    Memory {
        /// Width asked for.
        width: u32,
        /// Height asked for.
        height: u32,
        /// Bytes the image's buffer takes.
        needed: u64,
        /// The allowance.
        max: u64,
    },
    /// Drawing or writing the image failed.
    #[error("cannot draw the chart: {0}")]
    Draw(String),
}

/// An option, or the files given, that the command cannot use; shown after the file's name
/// when there is one.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UsageError {
    /// `--device N` names a device without trace events.
    #[error("device {device} has no events ({})", devices_text(.available))]
    DeviceNotFound {
        /// The device asked for.
        device: u32,
        /// The devices that have events.
        available: Vec<u32>,
    },
    /// An option's value that cannot be used.
    #[error("{option} {value:?}: {reason}")]
    BadValue {
        /// The option, as typed (`--cap`).
        option: &'static str,
        /// The value given.
        value: String,
        /// Why it cannot be used, and what would be.
        reason: String,
    },
    /// An option given more times than one run handles.
    #[error("{option}: {given} given; at most {most} in one run")]
    TooMany {
        /// The option.
        option: &'static str,
        /// How many were given.
        given: usize,
        /// How many are taken.
        most: usize,
    },
    /// A moment (`--at`, `--from`, `--to`, `--around-peak`) this trace does not have.
    #[error("{0}")]
    Moment(String),
    /// The output file's name does not say the kind of file the command writes.
    #[error("the output is {wants}")]
    OutputKind {
        /// What to give instead (`an SVG: give a file ending in .svg, or --folded`).
        wants: &'static str,
    },
    /// A file where the command writes a folder.
    #[error("is a file: {option} takes a folder")]
    NotAFolder {
        /// The option that takes the folder.
        option: &'static str,
    },
    /// A folder to write into that does not exist and cannot be made.
    #[error("cannot create the folder: {}", super::io_text(.0))]
    CreateFolder(io::Error),
    /// A folder to write into whose parent does not exist.
    #[error("its parent folder does not exist")]
    NoParentFolder,
    /// What this build of memsnap leaves out.
    #[error("this memsnap was built without the `{feature}` feature: {instead}")]
    NotBuilt {
        /// The Cargo feature.
        feature: &'static str,
        /// What works without it.
        instead: &'static str,
    },
    /// A folder (or list) with nothing to read.
    #[error("no snapshot files (.pickle, .pickle.xz, ...) found{hint}")]
    NoInputs {
        /// What was found instead, if anything (`; 3 summaries ... are there`).
        hint: String,
    },
    /// `compare` given a single snapshot.
    #[error("give two files, or a folder, to compare")]
    OneInput,
    /// `compare` given snapshots and report summaries together.
    #[error("is a report summary (.jsonl): give snapshots or summaries, not both")]
    MixedInputs,
}

/// `devices with events: 0, 1` or `no device has events`.
fn devices_text(devices: &[u32]) -> String {
    if devices.is_empty() {
        return "no device has events".into();
    }
    let list: Vec<String> = devices
        .iter()
        .map(|&d| {
            if d == crate::units::HOST_DEVICE {
                "host".to_string()
            } else {
                d.to_string()
            }
        })
        .collect();
    format!("devices with events: {}", list.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_errors_read_as_one_sentence() {
        let e = UsageError::DeviceNotFound {
            device: 3,
            available: vec![0, 1],
        };
        assert_eq!(
            e.to_string(),
            "device 3 has no events (devices with events: 0, 1)"
        );
        let e = UsageError::DeviceNotFound {
            device: 0,
            available: vec![],
        };
        assert_eq!(
            e.to_string(),
            "device 0 has no events (no device has events)"
        );
        let e = UsageError::TooMany {
            option: "--try",
            given: 70,
            most: 64,
        };
        assert_eq!(e.to_string(), "--try: 70 given; at most 64 in one run");
        let e = UsageError::BadValue {
            option: "--cap",
            value: "lots".into(),
            reason: "not a size".into(),
        };
        assert_eq!(e.to_string(), "--cap \"lots\": not a size");
    }
}
