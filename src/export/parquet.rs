//! Parquet and CSV files of the export tables, written by polars (the `export` feature), a part
//! of the rows at a time ([`Table::parts`]), so that polars holds one part's texts, not the
//! whole table's.

use std::borrow::Cow;
use std::io::Write;
use std::ops::Range;

use polars::prelude::*;

use super::tables::{Table, Values};

/// The table as a polars frame, column types as documented: integers as `UInt64`/`Int64`
/// (nullable where a value may be missing), text as `String`.
pub fn frame(table: &Table) -> PolarsResult<DataFrame> {
    frame_of(table, 0..table.rows(), plain)
}

/// A text cell as it is.
fn plain(s: &str) -> Cow<'_, str> {
    Cow::Borrowed(s)
}

/// Rows `rows` of the table as a frame, every text cell through `cell`.
fn frame_of(
    table: &Table,
    rows: Range<usize>,
    cell: impl Fn(&str) -> Cow<'_, str>,
) -> PolarsResult<DataFrame> {
    let columns: Vec<Column> = table
        .columns
        .iter()
        .map(|(name, values)| {
            let name = PlSmallStr::from_static(name);
            match values {
                Values::U64(v) => Column::new(name, &v[rows.clone()]),
                Values::OptU64(v) => Column::new(name, &v[rows.clone()]),
                Values::I64(v) => Column::new(name, &v[rows.clone()]),
                Values::Str(v) => {
                    let cells: Vec<Cow<str>> = rows.clone().map(|i| cell(v.get(i))).collect();
                    let cells: Vec<&str> = cells.iter().map(|c| c.as_ref()).collect();
                    Column::new(name, cells)
                }
            }
        })
        .collect();
    DataFrame::new(rows.len(), columns)
}

/// Writes `table` as Parquet (zstd-compressed), a row group per part of its rows.
pub fn write_parquet(table: &Table, out: &mut dyn Write) -> PolarsResult<()> {
    let parts = table.parts();
    let first = frame_of(table, parts[0].clone(), plain)?;
    let mut writer = ParquetWriter::new(out)
        .set_parallel(false)
        .batched(&first.schema().clone())?;
    writer.write_batch(&first)?;
    drop(first);
    for rows in &parts[1..] {
        writer.write_batch(&frame_of(table, rows.clone(), plain)?)?;
    }
    writer.finish()?;
    Ok(())
}

/// Writes `table` as CSV with a header line; a text cell that a spreadsheet would read as a
/// formula starts with `'` ([`crate::escape::csv_cell`]).
pub fn write_csv(table: &Table, out: &mut dyn Write) -> PolarsResult<()> {
    let parts = table.parts();
    let first = frame_of(table, parts[0].clone(), crate::escape::csv_cell)?;
    let mut writer = CsvWriter::new(out).batched(&first.schema().clone())?;
    writer.write_batch(&first)?;
    drop(first);
    for rows in &parts[1..] {
        writer.write_batch(&frame_of(table, rows.clone(), crate::escape::csv_cell)?)?;
    }
    writer.finish()
}
