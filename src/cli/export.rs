//! `memsnap export FILE -o DIR`: the events, blocks, steps and peak tables as files.

use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use memsnap::export::tables::{self, Table};
use memsnap::output::{Naming, Pending};
use memsnap::units;

use memsnap::error::UsageError;

use super::{load, Failure, InputArgs};

/// File format of the tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Apache Parquet (zstd), typed columns.
    Parquet,
    /// Comma-separated values with a header line.
    Csv,
    /// One JSON object per row.
    Jsonl,
    /// A Chrome trace (JSON) for Perfetto or chrome://tracing: one process per file (rank),
    /// memory counters, steps as slices, OOMs as instants; `-o` names the file.
    ChromeTrace,
}

impl Format {
    fn extension(self) -> &'static str {
        match self {
            Format::Parquet => "parquet",
            Format::Csv => "csv",
            Format::Jsonl => "jsonl",
            Format::ChromeTrace => "json",
        }
    }
}

/// Arguments of `memsnap export`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  memsnap export rank0.pickle.xz -o tables/\n  \
                        memsnap export rank*.pickle.xz --format chrome-trace -o memory.trace.json\n  \
                        python -c 'import polars; print(polars.read_parquet(\"tables/events.parquet\"))'\n  \
                        memsnap export rank0.pickle.xz -o tables/ --format csv"
)]
pub struct ExportArgs {
    /// Snapshot file (`-` reads standard input); several (ranks) for `--format chrome-trace`.
    #[arg(required = true, num_args = 1..)]
    pub files: Vec<PathBuf>,
    /// Output folder (created if its parent exists); the trace file for `chrome-trace`.
    #[arg(short, long, value_name = "DIR|FILE")]
    pub output: PathBuf,
    /// File format.
    #[arg(long, value_enum, default_value_t = Format::Parquet)]
    pub format: Format,
    /// Only this device (default: every device with events).
    #[arg(long, value_parser = super::parse_device)]
    pub device: Option<u32>,
    /// Print the files written as one JSON line instead of text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub input: InputArgs,
}

pub fn run(args: ExportArgs) -> Result<(), Failure> {
    if args.format == Format::ChromeTrace {
        return chrome_trace(&args);
    }
    if args.files.len() != 1 {
        return Err(memsnap::Error::new(
            &args.files[1],
            UsageError::BadValue {
                option: "FILE",
                value: args.files[1].display().to_string(),
                reason: "tables are written for one file at a time (several only with --format chrome-trace)".into(),
            }
            .into(),
        )
        .into());
    }
    let file = &args.files[0];
    if args.format != Format::Jsonl && !cfg!(feature = "export") {
        return Err(Failure::Usage(UsageError::NotBuilt {
            feature: "export",
            instead:
                "use --format jsonl, or build with default features (polars) for Parquet and CSV",
        }));
    }
    prepare_folder(&args.output)?;
    let options = args.input.analysis()?;
    let snap = load(file)?;
    let devices = match args.device {
        Some(_) => super::choose_devices(memsnap::analysis::devices(&snap), args.device, file)?,
        // devices with events, else with segments; none at all is an error, as everywhere
        None => super::choose_devices(memsnap::analysis::devices(&snap), None, file)?,
    };
    let analyses: Vec<_> = devices
        .iter()
        .map(|&d| memsnap::analysis::analyse_device(&snap, d, &options))
        .collect();
    super::within_memory(file)?;
    let mut written = Vec::new();
    let path_of = |name: &str| {
        args.output
            .join(format!("{name}.{}", args.format.extension()))
    };
    // Every name is checked before the first table is written.
    for name in tables::NAMES {
        super::check_output(&path_of(name), Naming::Chosen)?;
    }
    let mut stdout = super::stdout(args.json);
    // one table at a time: built, written, let go (none for a file without devices)
    let names = if analyses.is_empty() {
        &[][..]
    } else {
        &tables::NAMES[..]
    };
    for &name in names {
        let path = path_of(name);
        let pending = super::create_output(&path, Naming::Chosen)?;
        let (mut rows, mut columns) = (0usize, Vec::new());
        let mut parts = tables::table_parts(name, &analyses).inspect(|t| {
            rows += t.rows();
            if columns.is_empty() {
                columns = t.columns.iter().map(|c| c.0).collect();
            }
        });
        let done = write(&mut parts, pending, args.format);
        drop(parts);
        done.map_err(|m| {
            memsnap::Error::new(
                &path,
                memsnap::output::OutputError::Io(io::Error::other(m)).into(),
            )
        })?;
        super::within_memory(file)?;
        if !args.json {
            writeln!(
                stdout,
                "wrote {} ({}, {})",
                super::shown(&path),
                units::counted(rows as u64, "row"),
                units::counted(columns.len() as u64, "column")
            )?;
        }
        written.push(serde_json::json!({
            "table": name,
            "path": path.display().to_string(),
            "rows": rows,
            "columns": columns,
        }));
    }
    if args.json {
        writeln!(
            stdout,
            "{}",
            serde_json::json!({ "format": args.format.extension(), "tables": written })
        )?;
    }
    stdout.flush()?;
    Ok(())
}

/// `--format chrome-trace`: every file (each device with events) one process of one trace.
fn chrome_trace(args: &ExportArgs) -> Result<(), Failure> {
    use memsnap::export::chrome;
    use memsnap::report::compare::rank_from_name;
    let options = args.input.analysis()?;
    super::check_output(&args.output, Naming::Named)?;
    let snaps = args
        .files
        .iter()
        .map(|f| load(f))
        .collect::<Result<Vec<_>, _>>()?;
    let mut analyses = Vec::new();
    for (f, snap) in args.files.iter().zip(&snaps) {
        for d in super::devices(snap, args.device, f)? {
            analyses.push((f, memsnap::analysis::analyse_device(snap, d, &options)));
            super::within_memory(f)?;
        }
    }
    let several_devices = analyses.len() > args.files.len();
    let runs: Vec<chrome::Run> = analyses
        .iter()
        .enumerate()
        .map(|(k, (f, a))| {
            let rank = rank_from_name(&f.display().to_string());
            let who = match rank {
                Some(r) => format!("rank {r}"),
                None => super::stem(f),
            };
            let device = memsnap::snapshot::device_name(a.device());
            chrome::Run {
                name: format!("{who} · {device}"),
                pid: match rank {
                    Some(r) if !several_devices => r,
                    _ => k as u32,
                },
                analysis: a,
            }
        })
        .collect();
    let mut pending = super::create_output(&args.output, Naming::Named)?;
    let written = {
        let mut w = BufWriter::new(pending.file());
        chrome::write(&mut w, &runs, chrome::MAX_SAMPLES).and_then(|()| w.flush())
    };
    written.map_err(|e| super::write_failed(&args.output, e))?;
    super::commit_output(pending, &args.output)?;
    let mut stdout = super::stdout(args.json);
    if args.json {
        writeln!(
            stdout,
            "{}",
            serde_json::json!({"format": "chrome-trace", "path": args.output.display().to_string(), "processes": runs.len()})
        )?;
    } else {
        writeln!(
            stdout,
            "wrote {} ({} {}; open it in https://ui.perfetto.dev or chrome://tracing)",
            super::shown(&args.output),
            runs.len(),
            if runs.len() == 1 {
                "process"
            } else {
                "processes"
            }
        )?;
    }
    stdout.flush()?;
    Ok(())
}

/// Creates the output folder when its parent exists; refuses a file or a missing parent.
fn prepare_folder(dir: &Path) -> Result<(), Failure> {
    if dir.is_dir() {
        return Ok(());
    }
    if dir.exists() {
        return Err(
            memsnap::Error::new(dir, UsageError::NotAFolder { option: "-o" }.into()).into(),
        );
    }
    let parent = dir.parent().filter(|p| !p.as_os_str().is_empty());
    if parent.is_some_and(|p| !p.is_dir()) {
        return Err(memsnap::Error::new(dir, UsageError::NoParentFolder.into()).into());
    }
    std::fs::create_dir(dir)
        .map_err(|e| memsnap::Error::new(dir, UsageError::CreateFolder(e).into()).into())
}

/// Writes one table, part after part, through its pending output and puts it in place.
fn write(
    parts: &mut dyn Iterator<Item = Table>,
    mut out: Pending,
    format: Format,
) -> Result<(), String> {
    match format {
        Format::Jsonl => {
            let mut buffered = BufWriter::new(out.file());
            let mut written = Ok(());
            for t in parts {
                written = tables::write_jsonl(&mut buffered, &t);
                if written.is_err() {
                    break;
                }
            }
            written
                .and_then(|()| buffered.flush())
                .map_err(|e| e.to_string())?;
        }
        #[cfg(feature = "export")]
        Format::Parquet => memsnap::export::parquet::write_parquet_parts(parts, out.file())
            .map_err(|e| e.to_string())?,
        #[cfg(feature = "export")]
        Format::Csv => memsnap::export::parquet::write_csv_parts(parts, out.file())
            .map_err(|e| e.to_string())?,
        #[cfg(not(feature = "export"))]
        Format::Parquet | Format::Csv => unreachable!("refused in run"),
        Format::ChromeTrace => unreachable!("written by chrome_trace"),
    }
    out.commit().map_err(|e| e.to_string())
}
