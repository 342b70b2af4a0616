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
}

impl Format {
    fn extension(self) -> &'static str {
        match self {
            Format::Parquet => "parquet",
            Format::Csv => "csv",
            Format::Jsonl => "jsonl",
        }
    }
}

/// Arguments of `memsnap export`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  memsnap export rank0.pickle.xz -o tables/\n  \
                        python -c 'import polars; print(polars.read_parquet(\"tables/events.parquet\"))'\n  \
                        memsnap export rank0.pickle.xz -o tables/ --format csv"
)]
pub struct ExportArgs {
    /// Snapshot file (`-` reads standard input).
    pub file: PathBuf,
    /// Output folder (created if its parent exists).
    #[arg(short, long, value_name = "DIR")]
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
    if args.format != Format::Jsonl && !cfg!(feature = "export") {
        return Err(Failure::Usage(UsageError::NotBuilt {
            feature: "export",
            instead:
                "use --format jsonl, or build with default features (polars) for Parquet and CSV",
        }));
    }
    prepare_folder(&args.output)?;
    let options = args.input.analysis()?;
    let snap = load(&args.file)?;
    let devices = match args.device {
        Some(_) => {
            super::choose_devices(memsnap::analysis::devices(&snap), args.device, &args.file)?
        }
        // devices with events, else with segments; none at all is an error, as everywhere
        None => super::choose_devices(memsnap::analysis::devices(&snap), None, &args.file)?,
    };
    let analyses: Vec<_> = devices
        .iter()
        .map(|&d| memsnap::analysis::analyse_device(&snap, d, &options))
        .collect();
    super::within_memory(&args.file)?;
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
        super::within_memory(&args.file)?;
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
    }
    out.commit().map_err(|e| e.to_string())
}
