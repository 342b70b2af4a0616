//! `memsnap compare summaries/*.jsonl`: many ranks compared from the JSON that
//! `memsnap report --json` wrote where the snapshots live, without reading a pickle.

use std::io::{self, BufRead, Write};
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use memsnap::report::compare::{rank_from_name, Profile, Ranks};
use memsnap::report::{json, text, FileReport};

use super::{Failure, Tally};

/// How the comparison of summaries is shown (from `compare`'s options).
pub struct Shown<'a> {
    /// One JSON object instead of text.
    pub json: bool,
    /// Tables as Markdown.
    pub markdown: bool,
    /// Rows per breakdown table.
    pub top: usize,
    /// The chart of the peaks, if asked for.
    pub png: Option<&'a Path>,
}

/// Reads every summary (in parallel), then prints the rank table, the spread of the peaks and
/// why the highest peaks above the lowest.
pub fn run(files: &[PathBuf], args: &Shown) -> Result<(), Failure> {
    let mut tally = Tally::default();
    let read: Vec<Result<Vec<FileReport>, memsnap::Error>> =
        files.par_iter().map(|f| read_summary(f)).collect();
    let mut profiles = Vec::new();
    let mut failures = Vec::new();
    for (file, result) in files.iter().zip(read) {
        match result {
            Ok(reports) => {
                for r in reports {
                    let rank = rank_from_name(&r.file);
                    for d in r.devices.into_iter().filter(|d| d.events > 0) {
                        let position = profiles.len();
                        profiles.push((position, Profile::new(&r.file, rank, d)));
                    }
                }
            }
            Err(e) => {
                tally.complain(&e);
                failures.push((
                    profiles.len(),
                    file.display().to_string(),
                    e.kind.to_string(),
                ));
            }
        }
    }
    let ranks = Ranks::new(profiles, failures);
    let mut out = super::stdout(args.json);
    if args.json {
        json::write_ranks(&mut out, &ranks)?;
    } else {
        text::compare::write_many(
            &mut text::Out::new(&mut out, args.markdown),
            &ranks,
            args.top,
        )?;
    }
    out.flush()?;
    if let Some(png) = args.png {
        let peaks = ranks.peaks();
        if peaks.is_empty() {
            // nothing to draw: a chart without one bar would look like a result
            note!(
                "memsnap: {}: not drawn, since no summary could be read",
                super::shown(png)
            );
        } else {
            let title = format!("peak allocated of {} ranks", peaks.len());
            super::timeline::draw_to(png, memsnap::output::Naming::Named, |at| {
                memsnap::chart::histogram(at, &peaks, &title)
            })?;
            note!("memsnap: wrote {}", super::shown(png));
        }
    }
    tally.finish()
}

/// The reports of one summary file, one JSON object per line.
pub(super) fn read_summary(path: &std::path::Path) -> Result<Vec<FileReport>, memsnap::Error> {
    let fail = |kind| memsnap::Error::new(path, kind);
    memsnap::output::note_input(path);
    let file = std::fs::File::open(path).map_err(|e| fail(memsnap::ErrorKind::Io(e)))?;
    let mut out = Vec::new();
    for (n, line) in io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|e| fail(memsnap::ErrorKind::Io(e)))?;
        if line.trim().is_empty() {
            continue;
        }
        let report: FileReport = serde_json::from_str(&line).map_err(|e| {
            fail(memsnap::ErrorKind::NotASnapshot(format!(
                "line {}: not a memsnap report summary ({e})",
                n + 1
            )))
        })?;
        out.push(report);
    }
    if out.is_empty() {
        return Err(fail(memsnap::ErrorKind::NotASnapshot(
            "holds no report summary (it is empty: `memsnap report --json` writes one line per snapshot)"
                .into(),
        )));
    }
    Ok(out)
}
