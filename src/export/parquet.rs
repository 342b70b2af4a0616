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
    write_parquet_parts(&mut std::iter::once(table.clone()), out)
}

/// Writes the parts of one table ([`super::tables::table_parts`]) as one Parquet file, a row
/// group per part of each part's rows ([`Table::parts`]), each let go once written.
pub fn write_parquet_parts(
    parts: &mut dyn Iterator<Item = Table>,
    out: &mut dyn Write,
) -> PolarsResult<()> {
    let mut frames = frames(parts, plain);
    let Some(first) = frames.next().transpose()? else {
        return Ok(());
    };
    let mut writer = ParquetWriter::new(out)
        .set_parallel(false)
        .batched(&first.schema().clone())?;
    writer.write_batch(&first)?;
    drop(first);
    for frame in frames {
        writer.write_batch(&frame?)?;
    }
    writer.finish()?;
    Ok(())
}

/// Each part of each table as a frame, made as it is read.
fn frames<'a>(
    parts: &'a mut dyn Iterator<Item = Table>,
    cell: fn(&str) -> Cow<'_, str>,
) -> impl Iterator<Item = PolarsResult<DataFrame>> + 'a {
    parts.flat_map(move |table| {
        let ranges = table.parts();
        ranges
            .into_iter()
            .map(move |rows| frame_of(&table, rows, cell))
    })
}

/// Writes `table` as CSV with a header line; a text cell that a spreadsheet would read as a
/// formula starts with `'` ([`crate::escape::csv_cell`]).
pub fn write_csv(table: &Table, out: &mut dyn Write) -> PolarsResult<()> {
    write_csv_parts(&mut std::iter::once(table.clone()), out)
}

/// Writes the parts of one table as one CSV file (see [`write_csv`]).
pub fn write_csv_parts(
    parts: &mut dyn Iterator<Item = Table>,
    out: &mut dyn Write,
) -> PolarsResult<()> {
    let mut frames = frames(parts, crate::escape::csv_cell);
    let Some(first) = frames.next().transpose()? else {
        return Ok(());
    };
    let mut writer = CsvWriter::new(out).batched(&first.schema().clone())?;
    writer.write_batch(&first)?;
    drop(first);
    for frame in frames {
        writer.write_batch(&frame?)?;
    }
    writer.finish()
}
