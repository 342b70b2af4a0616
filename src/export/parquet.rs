//! Parquet and CSV files of the export tables, written by polars (the `export` feature).

use std::io::Write;

use polars::prelude::*;

use super::tables::{Table, Values};

/// The table as a polars frame, column types as documented: integers as `UInt64`/`Int64`
/// (nullable where a value may be missing), text as `String`.
pub fn frame(table: &Table) -> PolarsResult<DataFrame> {
    frame_of(table, |s| s.into())
}

/// The frame with every text cell through `cell`.
fn frame_of(
    table: &Table,
    cell: impl Fn(&str) -> std::borrow::Cow<'_, str>,
) -> PolarsResult<DataFrame> {
    let columns: Vec<Column> = table
        .columns
        .iter()
        .map(|(name, values)| {
            let name = PlSmallStr::from_static(name);
            match values {
                Values::U64(v) => Column::new(name, v),
                Values::OptU64(v) => Column::new(name, v),
                Values::I64(v) => Column::new(name, v),
                Values::Str(v) => {
                    let cells: Vec<std::borrow::Cow<str>> = v.iter().map(|s| cell(s)).collect();
                    let cells: Vec<&str> = cells.iter().map(|c| c.as_ref()).collect();
                    Column::new(name, cells)
                }
            }
        })
        .collect();
    DataFrame::new(table.rows(), columns)
}

/// Writes `table` as Parquet (zstd-compressed).
pub fn write_parquet(table: &Table, out: &mut dyn Write) -> PolarsResult<()> {
    let mut df = frame(table)?;
    ParquetWriter::new(out).finish(&mut df)?;
    Ok(())
}

/// Writes `table` as CSV with a header line; a text cell that a spreadsheet would read as a
/// formula starts with `'` ([`crate::escape::csv_cell`]).
pub fn write_csv(table: &Table, out: &mut dyn Write) -> PolarsResult<()> {
    let mut df = frame_of(table, crate::escape::csv_cell)?;
    CsvWriter::new(out).finish(&mut df)
}
