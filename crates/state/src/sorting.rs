//! Rows written in any key order, sorted once, by whoever needs them first.
//!
//! A checkpoint hands the store the groups changed since the previous one
//! in the operators' order, not in key order. Sorting them (and copying
//! them into that order) cost most of the pipeline's pause at a
//! checkpoint, so [`Unsorted`] defers it: the writer thread sorts the rows
//! before it encodes their run, and a lookup or scan that reaches the run
//! first sorts them on its own thread instead. Either way they are sorted
//! once; the other waits for that sort.

use std::sync::{Arc, Mutex, OnceLock};

use arrow::array::{Array, ArrayRef, BinaryArray, BooleanArray, RecordBatch, RecordBatchOptions};
use arrow::compute::take;
use arrow::datatypes::SchemaRef;

use crate::error::{Result, StateError};

/// Bytes per row a sort takes besides the rows and their keys: the order
/// (a 16-byte key prefix and a row number, 32 bytes aligned) and the rows
/// kept.
const SORT_BYTES_PER_ROW: usize = 40;

/// Rows sorted by key, each key once: a run's contents.
#[derive(Clone)]
pub(crate) struct Sorted {
    pub keys: BinaryArray,
    pub deleted: BooleanArray,
    pub values: RecordBatch,
}

/// Turns key columns into the store's keys (byte-comparable rows, as a
/// lookup's probes are), on whichever thread sorts a write's rows.
pub trait KeyEncoder: Send + Sync {
    /// The keys of `rows` rows whose key columns are `columns`.
    fn encode(&self, columns: &[ArrayRef], rows: usize) -> Result<BinaryArray>;
}

/// A write's keys: encoded, or to encode when sorted.
pub(crate) enum Keys {
    Encoded(BinaryArray),
    Columns(Vec<ArrayRef>, Arc<dyn KeyEncoder>),
}

impl Keys {
    fn bytes(&self) -> usize {
        match self {
            Keys::Encoded(k) => k.get_array_memory_size(),
            Keys::Columns(c, _) => c.iter().map(|c| c.get_array_memory_size()).sum(),
        }
    }
}

/// The rows as written, until sorted.
struct Input {
    keys: Keys,
    deleted: Option<Vec<bool>>,
    values: RecordBatch,
}

/// Rows of one write, sorted on first use.
pub(crate) struct Unsorted {
    input: Mutex<Option<Input>>,
    sorted: OnceLock<std::result::Result<Sorted, String>>,
    schema: SchemaRef,
    rows: usize,
    bytes: usize,
    peak: usize,
}

impl Unsorted {
    /// `keys[i]` gets `values` row `i` (of the table's columns `schema`), or
    /// is deleted where `deleted[i]`; where a key repeats, its last row counts.
    pub fn new(
        keys: Keys,
        deleted: Option<Vec<bool>>,
        values: RecordBatch,
        schema: SchemaRef,
    ) -> Self {
        let encoding = match &keys {
            Keys::Encoded(_) => 0,
            Keys::Columns(..) => keys.bytes(),
        };
        let rows = values.num_rows();
        let bytes = keys.bytes() + values.get_array_memory_size();
        let peak = bytes + encoding + rows * SORT_BYTES_PER_ROW;
        Unsorted {
            rows,
            input: Mutex::new(Some(Input {
                keys,
                deleted,
                values,
            })),
            sorted: OnceLock::new(),
            schema,
            bytes,
            peak,
        }
    }

    /// Rows written (a repeated key counts each time).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The table's value columns.
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// Memory the rows hold as written.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Memory the rows hold until written: as written, plus what sorting
    /// them takes (their encoded keys and the order), so that a memory
    /// budget counts the writer thread's peak too.
    pub fn peak(&self) -> usize {
        self.peak
    }

    /// The rows sorted by key, sorting them now unless done (or under way
    /// on another thread: then waits for it).
    pub fn sorted(&self) -> Result<&Sorted> {
        let sorted = self.sorted.get_or_init(|| {
            let input = self
                .input
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take()
                .expect("sorted once");
            sort(input, &self.schema).map_err(|e| e.to_string())
        });
        sorted
            .as_ref()
            .map_err(|e| StateError::Background(format!("sorting rows for the state store: {e}")))
    }
}

/// Sorts by each key's first 16 bytes held inline, comparing whole keys
/// only on a tie (chasing every key's bytes costs most), and keeps the
/// last row of each key. Each input part is dropped once its sorted copy
/// exists, so the peak is the rows plus one part, not the rows twice.
fn sort(input: Input, schema: &SchemaRef) -> Result<Sorted> {
    let Input {
        keys,
        deleted,
        values,
    } = input;
    let n = values.num_rows();
    let keys = match keys {
        Keys::Encoded(k) => k,
        Keys::Columns(columns, encoder) => encoder.encode(&columns, n)?,
    };
    if keys.len() != n {
        return Err(StateError::Background(format!(
            "{} keys for {n} rows",
            keys.len()
        )));
    }
    let kept = last_row_per_key_in_order(&keys);
    let idx = arrow::array::UInt32Array::from(kept);
    let sorted_keys = take(&keys, &idx, None)?
        .as_any()
        .downcast_ref::<BinaryArray>()
        .expect("binary")
        .clone();
    drop(keys);
    let (_, columns, _) = values.into_parts();
    let columns = columns
        .into_iter()
        .map(|c| take(c.as_ref(), &idx, None))
        .collect::<std::result::Result<Vec<ArrayRef>, _>>()?;
    let values = RecordBatch::try_new_with_options(
        schema.clone(),
        columns,
        &RecordBatchOptions::new().with_row_count(Some(idx.len())),
    )?;
    let deleted = BooleanArray::from_iter(
        idx.values()
            .iter()
            .map(|&r| Some(deleted.as_ref().is_some_and(|d| d[r as usize]))),
    );
    Ok(Sorted {
        keys: sorted_keys,
        deleted,
        values,
    })
}

/// The rows to keep, in key order: the last row of each key.
fn last_row_per_key_in_order(keys: &BinaryArray) -> Vec<u32> {
    let n = keys.len();
    let mut order: Vec<(u128, u32)> = (0..n).map(|i| (prefix(keys.value(i)), i as u32)).collect();
    order.sort_unstable_by(|a, b| {
        a.0.cmp(&b.0)
            .then_with(|| keys.value(a.1 as usize).cmp(keys.value(b.1 as usize)))
            .then(a.1.cmp(&b.1))
    });
    let mut kept: Vec<u32> = Vec::with_capacity(n);
    for (i, &(_, row)) in order.iter().enumerate() {
        let last = order
            .get(i + 1)
            .is_none_or(|&(_, next)| keys.value(next as usize) != keys.value(row as usize));
        if last {
            kept.push(row);
        }
    }
    kept
}

/// A key's first 16 bytes, zero-padded, big-endian: where two keys'
/// prefixes differ, they order as the keys do.
fn prefix(key: &[u8]) -> u128 {
    let mut bytes = [0u8; 16];
    let n = key.len().min(16);
    bytes[..n].copy_from_slice(&key[..n]);
    u128::from_be_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use arrow::array::Int64Array;
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    #[test]
    fn sorted_once_by_whichever_thread_comes_first_last_row_of_a_key_wins() {
        let schema: SchemaRef = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, true)]));
        // Keys sharing 16-byte prefixes too, so ties compare whole keys.
        let key = |i: u64| format!("{:020}", (i * 7919) % 1000).into_bytes();
        let n = 5000u64;
        let keys = BinaryArray::from_iter_values((0..n).map(key));
        let deleted: Vec<bool> = (0..n).map(|i| i % 11 == 0).collect();
        let values = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![Arc::new(Int64Array::from_iter_values(0..n as i64))],
        )
        .unwrap();
        let mut expected = BTreeMap::new();
        for i in 0..n {
            expected.insert(key(i), (i as i64, deleted[i as usize]));
        }
        let rows = Arc::new(Unsorted::new(
            Keys::Encoded(keys),
            Some(deleted),
            values,
            schema,
        ));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let rows = Arc::clone(&rows);
                std::thread::spawn(move || {
                    let s = rows.sorted().unwrap();
                    let v = s
                        .values
                        .column(0)
                        .as_any()
                        .downcast_ref::<Int64Array>()
                        .unwrap();
                    (0..s.keys.len())
                        .map(|i| (s.keys.value(i).to_vec(), (v.value(i), s.deleted.value(i))))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let want: Vec<_> = expected.into_iter().collect();
        for t in threads {
            assert_eq!(t.join().unwrap(), want);
        }
        assert_eq!(rows.rows(), n as usize);
    }
}
