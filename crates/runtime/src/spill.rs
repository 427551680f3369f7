//! A coalesced host batch that outgrew memory while it accumulated: its
//! pieces sit in an Arrow IPC file and are handed out one by one, never
//! concatenated. Together the pieces are the flush, row for row, as the
//! in-memory path would have given it in one batch.
//!
//! `compact` (the last row per key) reads the file twice: once for the key
//! columns, to find each key's last row, and once to hand the pieces out
//! filtered to those rows. Only the keys are held in memory.

use std::collections::HashMap;
use std::fs::File;
use std::io::BufReader;
use std::path::PathBuf;
use std::sync::Arc;

use arrow::array::{ArrayRef, BooleanArray, RecordBatch};
use arrow::buffer::BooleanBuffer;
use arrow::compute::filter_record_batch;
use arrow::ipc::reader::StreamReader;
use arrow_row::{RowConverter, Rows, SortField};

use crate::error::Result;

/// The key columns of `batch` as comparable byte rows, with one converter
/// for every batch of a flush.
fn key_rows(
    converter: &mut Option<RowConverter>,
    batch: &RecordBatch,
    key_columns: &[usize],
) -> Result<Rows> {
    let cols: Vec<ArrayRef> = key_columns
        .iter()
        .map(|&i| Arc::clone(batch.column(i)))
        .collect();
    let converter = match converter {
        Some(c) => c,
        None => converter.insert(RowConverter::new(
            cols.iter()
                .map(|c| SortField::new(c.data_type().clone()))
                .collect(),
        )?),
    };
    Ok(converter.convert_columns(&cols)?)
}

/// `total` rows, the ones at `kept` set.
fn mask(total: usize, kept: impl Iterator<Item = usize>) -> BooleanBuffer {
    let mut keep = vec![false; total];
    kept.for_each(|at| keep[at] = true);
    BooleanBuffer::from(keep)
}

/// Marks, over `batches` taken as one sequence of rows, the last row of
/// each key. Kept rows stay where they are: compacting is a filter. The
/// keys outlive each batch, so they are copied (once per distinct key).
fn last_rows(
    batches: impl Iterator<Item = Result<RecordBatch>>,
    key_columns: &[usize],
) -> Result<BooleanBuffer> {
    let mut last: HashMap<Box<[u8]>, usize> = HashMap::new();
    let mut converter = None;
    let mut total = 0;
    for batch in batches {
        let batch = batch?;
        let rows = key_rows(&mut converter, &batch, key_columns)?;
        for i in 0..batch.num_rows() {
            let key = rows.row(i).data();
            match last.get_mut(key) {
                Some(at) => *at = total + i,
                None => {
                    last.insert(key.into(), total + i);
                }
            }
        }
        total += batch.num_rows();
    }
    Ok(mask(total, last.into_values()))
}

/// `batch` keeping only the last row of each key, where it stands (the
/// in-memory form of [`last_rows`]: keys borrowed from one batch's rows).
pub(crate) fn last_per_key(batch: &RecordBatch, key_columns: &[usize]) -> Result<RecordBatch> {
    if batch.num_rows() == 0 {
        return Ok(batch.clone());
    }
    let rows = key_rows(&mut None, batch, key_columns)?;
    let mut last: HashMap<&[u8], usize> = HashMap::with_capacity(batch.num_rows());
    for i in 0..batch.num_rows() {
        last.insert(rows.row(i).data(), i);
    }
    let keep = mask(batch.num_rows(), last.into_values());
    Ok(filter_record_batch(batch, &BooleanArray::new(keep, None))?)
}

fn read(path: &PathBuf) -> Result<StreamReader<BufReader<File>>> {
    Ok(StreamReader::try_new(
        BufReader::new(File::open(path)?),
        None,
    )?)
}

/// A finished spill file being handed out; the file is removed when the
/// last piece is out (or the flush is dropped).
pub(crate) struct SpilledFlush {
    path: PathBuf,
    reader: StreamReader<BufReader<File>>,
    /// With `compact`: which rows of the flush to hand out.
    keep: Option<BooleanBuffer>,
    /// Rows of the file read so far.
    offset: usize,
}

impl SpilledFlush {
    /// Opens a finished spill file; `compact_keys`: keep the last row per key.
    pub(crate) fn open(path: PathBuf, compact_keys: Option<&[usize]>) -> Result<Self> {
        let keep = match compact_keys {
            Some(keys) => Some(last_rows(read(&path)?.map(|b| Ok(b?)), keys)?),
            None => None,
        };
        Ok(Self {
            reader: read(&path)?,
            path,
            keep,
            offset: 0,
        })
    }

    /// The next non-empty piece, or `None` when all were handed out.
    pub(crate) fn next_piece(&mut self) -> Result<Option<RecordBatch>> {
        for piece in self.reader.by_ref() {
            let piece = piece?;
            let rows = piece.num_rows();
            let piece = match &self.keep {
                Some(keep) => filter_record_batch(
                    &piece,
                    &BooleanArray::new(keep.slice(self.offset, rows), None),
                )?,
                None => piece,
            };
            self.offset += rows;
            if piece.num_rows() > 0 {
                return Ok(Some(piece));
            }
        }
        Ok(None)
    }
}

impl Drop for SpilledFlush {
    fn drop(&mut self) {
        // Best effort: a file left behind holds no state anyone reads.
        let _ = std::fs::remove_file(&self.path);
    }
}
