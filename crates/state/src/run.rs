//! A run: an immutable set of keyed rows, sorted by key, in two files.
//!
//! ```text
//! NAME.arrow   an Arrow IPC file: columns __key (binary, unique, ascending),
//!              __deleted (a tombstone), then the table's value columns;
//!              one record batch per block of about BLOCK_BYTES
//! NAME.idx     the first key of every block, the last key, the row count
//!              and a bloom filter of the keys, with a CRC-32
//! ```
//!
//! Any Arrow tool reads the `.arrow` file (`pyarrow.ipc.open_file`). A
//! lookup reads the `.idx` once (when the run is opened), then one block
//! per probed key that the bloom filter does not rule out.
//!
//! A run just written by the store is served from memory
//! ([`Run::in_memory`]: its sorted rows, cut into the same blocks) until a
//! background thread has written its files; the store then swaps in the
//! opened file.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BinaryArray, BooleanArray, RecordBatch, RecordBatchOptions,
};
use arrow::buffer::Buffer;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::ipc::convert::fb_to_schema;
use arrow::ipc::reader::{FileDecoder, read_footer_length};
use arrow::ipc::writer::{FileWriter, IpcWriteOptions};
use arrow::ipc::{MetadataVersion, root_as_footer};

use crate::bloom::{Bloom, hash};
use crate::error::{Result, StateError};
use crate::sorting::Unsorted;

/// The key column of a run file.
pub const KEY: &str = "__key";
/// The tombstone column of a run file.
pub const DELETED: &str = "__deleted";

/// About this many bytes of rows per block: small enough that a point
/// lookup reads little, large enough that a block's IPC framing is noise.
const BLOCK_BYTES: usize = 16 * 1024;
const MIN_BLOCK_ROWS: usize = 16;
const MAX_BLOCK_ROWS: usize = 8192;

const IDX_MAGIC: &[u8; 8] = b"UBIKRUN1";

/// The schema of a run file for a table whose rows are `values`.
pub fn file_schema(values: &Schema) -> SchemaRef {
    let mut fields = vec![
        Arc::new(Field::new(KEY, DataType::Binary, false)),
        Arc::new(Field::new(DELETED, DataType::Boolean, false)),
    ];
    fields.extend(values.fields().iter().cloned());
    Arc::new(Schema::new(fields))
}

/// One decoded block of a run.
#[derive(Debug, Clone)]
pub struct Block {
    pub keys: BinaryArray,
    pub deleted: BooleanArray,
    /// The value columns, row `i` is the value of `keys[i]`.
    pub values: RecordBatch,
    size: usize,
}

impl Block {
    fn from_batch(batch: RecordBatch, value_schema: &SchemaRef) -> Result<Block> {
        let keys = batch.column(0).as_binary::<i32>().clone();
        let deleted = batch.column(1).as_boolean().clone();
        let values = RecordBatch::try_new_with_options(
            Arc::clone(value_schema),
            batch.columns()[2..].to_vec(),
            &RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
        )?;
        let size = batch.get_array_memory_size();
        Ok(Block {
            keys,
            deleted,
            values,
            size,
        })
    }

    /// The row holding `key`, if any.
    pub fn find(&self, key: &[u8]) -> Option<usize> {
        let n = self.keys.len();
        let i = partition_point(n, |i| self.keys.value(i) < key);
        (i < n && self.keys.value(i) == key).then_some(i)
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn size(&self) -> usize {
        self.size
    }
}

/// The first index in `0..n` for which `before` is false (`before` is true
/// for a prefix).
fn partition_point(n: usize, before: impl Fn(usize) -> bool) -> usize {
    let (mut lo, mut hi) = (0, n);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if before(mid) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// Rows per block for rows like these: about [`BLOCK_BYTES`] each.
fn block_rows(keys: &BinaryArray, values: &RecordBatch) -> usize {
    let n = keys.len().max(1);
    let bytes = keys.get_array_memory_size() + values.get_array_memory_size();
    let per_row = (bytes / n).max(1);
    (BLOCK_BYTES / per_row).clamp(MIN_BLOCK_ROWS, MAX_BLOCK_ROWS)
}

/// Writes one run from rows handed over in ascending key order.
pub struct RunWriter {
    name: String,
    data_path: PathBuf,
    idx_path: PathBuf,
    writer: FileWriter<BufWriter<File>>,
    schema: SchemaRef,
    /// First key of each block, concatenated, and where each ends.
    fences: Vec<u8>,
    fence_ends: Vec<u32>,
    last_key: Vec<u8>,
    bloom: Bloom,
    rows: u64,
}

impl RunWriter {
    /// Starts run `name` in `dir` for a table of `values` rows; `expected`
    /// bounds the rows it will hold (it sizes the bloom filter).
    pub fn create(dir: &Path, name: &str, values: &Schema, expected: usize) -> Result<Self> {
        let data_path = dir.join(format!("{name}.arrow"));
        let idx_path = dir.join(format!("{name}.idx"));
        let file = File::create(&data_path).map_err(StateError::io("create", &data_path))?;
        let schema = file_schema(values);
        let options = IpcWriteOptions::try_new(8, false, MetadataVersion::V5)?;
        let writer = FileWriter::try_new_with_options(
            BufWriter::with_capacity(256 * 1024, file),
            &schema,
            options,
        )
        .map_err(|e| io_or_arrow(e, "write", &data_path))?;
        Ok(Self {
            name: name.to_string(),
            data_path,
            idx_path,
            writer,
            schema,
            fences: Vec::new(),
            fence_ends: Vec::new(),
            last_key: Vec::new(),
            bloom: Bloom::with_capacity(expected),
            rows: 0,
        })
    }

    /// Appends rows; their keys are unique, ascending, and after every key
    /// written before. Cut into blocks of about [`BLOCK_BYTES`].
    pub fn push(
        &mut self,
        keys: &BinaryArray,
        deleted: &BooleanArray,
        values: &RecordBatch,
    ) -> Result<()> {
        let n = keys.len();
        if n == 0 {
            return Ok(());
        }
        let block_rows = block_rows(keys, values);
        let mut start = 0;
        while start < n {
            let len = block_rows.min(n - start);
            let mut columns: Vec<ArrayRef> = Vec::with_capacity(2 + values.num_columns());
            columns.push(Arc::new(keys.slice(start, len)));
            columns.push(Arc::new(deleted.slice(start, len)));
            columns.extend(values.columns().iter().map(|c| c.slice(start, len)));
            let batch = RecordBatch::try_new(Arc::clone(&self.schema), columns)?;
            self.writer
                .write(&batch)
                .map_err(|e| io_or_arrow(e, "write", &self.data_path))?;
            self.fences.extend_from_slice(keys.value(start));
            self.fence_ends.push(self.fences.len() as u32);
            start += len;
        }
        for i in 0..n {
            self.bloom.insert(hash(keys.value(i)));
        }
        self.last_key = keys.value(n - 1).to_vec();
        self.rows += n as u64;
        Ok(())
    }

    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Finishes both files (not yet synced: [`RunFile::sync`]); `None` and
    /// no files when no row was written.
    pub fn finish(mut self) -> Result<Option<RunFile>> {
        if self.rows == 0 {
            drop(self.writer);
            let _ = std::fs::remove_file(&self.data_path);
            return Ok(None);
        }
        self.writer
            .finish()
            .map_err(|e| io_or_arrow(e, "write", &self.data_path))?;
        let file = self
            .writer
            .into_inner()
            .map_err(|e| io_or_arrow(e, "write", &self.data_path))?
            .into_inner()
            .map_err(|e| StateError::Io {
                action: "write",
                path: self.data_path.clone(),
                source: e.into_error(),
            })?;
        let bytes = file
            .metadata()
            .map_err(StateError::io("read", &self.data_path))?
            .len();
        let mut idx = Vec::with_capacity(64 + self.fences.len() + self.bloom.size());
        idx.extend_from_slice(IDX_MAGIC);
        idx.extend_from_slice(&self.rows.to_le_bytes());
        idx.extend_from_slice(&(self.fence_ends.len() as u32).to_le_bytes());
        for end in &self.fence_ends {
            idx.extend_from_slice(&end.to_le_bytes());
        }
        idx.extend_from_slice(&(self.fences.len() as u32).to_le_bytes());
        idx.extend_from_slice(&self.fences);
        idx.extend_from_slice(&(self.last_key.len() as u32).to_le_bytes());
        idx.extend_from_slice(&self.last_key);
        self.bloom.to_bytes(&mut idx);
        let crc = crc32fast::hash(&idx);
        idx.extend_from_slice(&crc.to_le_bytes());
        let mut f =
            File::create(&self.idx_path).map_err(StateError::io("create", &self.idx_path))?;
        f.write_all(&idx)
            .map_err(StateError::io("write", &self.idx_path))?;
        Ok(Some(RunFile {
            name: self.name,
            data: file,
            idx: f,
            bytes: bytes + idx.len() as u64,
            rows: self.rows,
        }))
    }
}

/// A written run whose files may not be durable yet.
pub struct RunFile {
    pub name: String,
    data: File,
    idx: File,
    /// Bytes of both files.
    pub bytes: u64,
    pub rows: u64,
}

impl RunFile {
    /// Makes both files durable (the directory entry is synced by the caller).
    pub fn sync(&self, dir: &Path) -> Result<()> {
        self.data.sync_all().map_err(StateError::io(
            "sync",
            &dir.join(format!("{}.arrow", self.name)),
        ))?;
        self.idx.sync_all().map_err(StateError::io(
            "sync",
            &dir.join(format!("{}.idx", self.name)),
        ))
    }
}

fn io_or_arrow(e: arrow::error::ArrowError, action: &'static str, path: &Path) -> StateError {
    match e {
        arrow::error::ArrowError::IoError(_, source) => StateError::Io {
            action,
            path: path.to_path_buf(),
            source,
        },
        other => StateError::Arrow(other),
    }
}

/// Where a block lies in its run file.
#[derive(Debug, Clone, Copy)]
struct BlockAt {
    offset: u64,
    meta_len: u32,
    body_len: u64,
}

/// Where a run's blocks are.
enum Body {
    /// In its files, read on demand.
    File {
        path: PathBuf,
        file: File,
        decoder: FileDecoder,
        blocks: Vec<BlockAt>,
    },
    /// In memory, while its files are being written.
    Memory { blocks: Vec<Block>, bytes: usize },
    /// In memory as written, not sorted yet: the store sorts it before
    /// reading it (see [`Unsorted`]).
    Unsorted(Arc<Unsorted>),
}

/// An opened run: its index in memory, its blocks read on demand.
pub struct Run {
    /// Unique in this process (the block cache's key).
    pub id: u64,
    pub name: String,
    value_schema: SchemaRef,
    body: Body,
    fences: Vec<u8>,
    fence_ends: Vec<u32>,
    last_key: Vec<u8>,
    /// `None` in memory: a miss costs a binary search there, not a read.
    bloom: Option<Bloom>,
    pub rows: u64,
    /// Bytes of both files (in memory: of its rows).
    pub bytes: u64,
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Run")
            .field("name", &self.name)
            .field("rows", &self.rows)
            .field("blocks", &self.blocks())
            .field("written", &self.is_written())
            .finish()
    }
}

/// A run's `.idx` file, parsed.
struct Index {
    fence_ends: Vec<u32>,
    fences: Vec<u8>,
    last_key: Vec<u8>,
    bloom: Bloom,
}

fn take_u32(bytes: &[u8], at: &mut usize) -> Option<u32> {
    let v = u32::from_le_bytes(bytes.get(*at..*at + 4)?.try_into().ok()?);
    *at += 4;
    Some(v)
}

impl Run {
    /// Opens run `name` in `dir`, whose value columns must be `values`.
    pub fn open(dir: &Path, name: &str, id: u64, values: &SchemaRef) -> Result<Run> {
        let idx_path = dir.join(format!("{name}.idx"));
        let path = dir.join(format!("{name}.arrow"));
        let idx = std::fs::read(&idx_path).map_err(StateError::io("read", &idx_path))?;
        let bad = |why: &str| StateError::corrupt(&idx_path, why);
        if idx.len() < IDX_MAGIC.len() + 16 || &idx[..8] != IDX_MAGIC {
            return Err(bad("not a run index"));
        }
        let (body, crc) = idx.split_at(idx.len() - 4);
        if crc32fast::hash(body) != u32::from_le_bytes(crc.try_into().expect("4 bytes")) {
            return Err(bad("checksum mismatch"));
        }
        let mut at = 8;
        let rows = u64::from_le_bytes(body[at..at + 8].try_into().expect("8 bytes"));
        at += 8;
        let parse = || -> Option<Index> {
            let mut at = at;
            let n = take_u32(body, &mut at)? as usize;
            let mut fence_ends = Vec::with_capacity(n);
            for _ in 0..n {
                fence_ends.push(take_u32(body, &mut at)?);
            }
            let len = take_u32(body, &mut at)? as usize;
            let fences = body.get(at..at + len)?.to_vec();
            at += len;
            let len = take_u32(body, &mut at)? as usize;
            let last_key = body.get(at..at + len)?.to_vec();
            at += len;
            let (bloom, read) = Bloom::from_bytes(&body[at..])?;
            (at + read == body.len() && fence_ends.last().copied() == Some(fences.len() as u32))
                .then_some(Index {
                    fence_ends,
                    fences,
                    last_key,
                    bloom,
                })
        };
        let Index {
            fence_ends,
            fences,
            last_key,
            bloom,
        } = parse().ok_or_else(|| bad("truncated"))?;

        let file = File::open(&path).map_err(StateError::io("open", &path))?;
        let len = file
            .metadata()
            .map_err(StateError::io("read", &path))?
            .len();
        let bad = |why: &str| StateError::corrupt(&path, why);
        if len < 10 {
            return Err(bad("too short"));
        }
        let mut tail = [0u8; 10];
        file.read_exact_at(&mut tail, len - 10)
            .map_err(StateError::io("read", &path))?;
        let footer_len = read_footer_length(tail).map_err(|e| bad(&e.to_string()))?;
        if footer_len as u64 + 10 > len {
            return Err(bad("footer longer than the file"));
        }
        let mut footer = vec![0u8; footer_len];
        file.read_exact_at(&mut footer, len - 10 - footer_len as u64)
            .map_err(StateError::io("read", &path))?;
        let footer = root_as_footer(&footer).map_err(|e| bad(&format!("footer: {e}")))?;
        let schema = Arc::new(fb_to_schema(
            footer.schema().ok_or_else(|| bad("no schema"))?,
        ));
        let expected = file_schema(values);
        let same = schema.fields().len() == expected.fields().len()
            && schema
                .fields()
                .iter()
                .zip(expected.fields())
                .all(|(a, b)| a.data_type() == b.data_type());
        if !same {
            return Err(bad(&format!(
                "its columns are {:?}, this table's are {:?}",
                schema
                    .fields()
                    .iter()
                    .map(|f| format!("{} {}", f.name(), f.data_type()))
                    .collect::<Vec<_>>(),
                expected
                    .fields()
                    .iter()
                    .map(|f| format!("{} {}", f.name(), f.data_type()))
                    .collect::<Vec<_>>()
            )));
        }
        let blocks: Vec<BlockAt> = footer
            .recordBatches()
            .map(|b| {
                b.iter()
                    .map(|b| BlockAt {
                        offset: b.offset() as u64,
                        meta_len: b.metaDataLength() as u32,
                        body_len: b.bodyLength() as u64,
                    })
                    .collect()
            })
            .unwrap_or_default();
        if blocks.len() != fence_ends.len() {
            return Err(bad("its index names another number of blocks"));
        }
        let decoder = FileDecoder::new(Arc::clone(&expected), footer.version());
        Ok(Run {
            id,
            name: name.to_string(),
            value_schema: Arc::clone(values),
            body: Body::File {
                path,
                file,
                decoder,
                blocks,
            },
            fences,
            fence_ends,
            last_key,
            bloom: Some(bloom),
            rows,
            bytes: len + idx.len() as u64,
        })
    }

    /// Run `name` served from memory: `keys` unique and ascending, row `i`
    /// of `deleted` and `values` theirs (`values` of the table's columns).
    pub fn in_memory(
        name: &str,
        id: u64,
        keys: &BinaryArray,
        deleted: &BooleanArray,
        values: &RecordBatch,
    ) -> Run {
        let n = keys.len();
        let step = block_rows(keys, values);
        let (mut blocks, mut fences, mut fence_ends) = (Vec::new(), Vec::new(), Vec::new());
        let mut start = 0;
        while start < n {
            let len = step.min(n - start);
            blocks.push(Block {
                keys: keys.slice(start, len),
                deleted: deleted.slice(start, len),
                values: values.slice(start, len),
                size: 0,
            });
            fences.extend_from_slice(keys.value(start));
            fence_ends.push(fences.len() as u32);
            start += len;
        }
        let bytes = keys.get_array_memory_size()
            + deleted.get_array_memory_size()
            + values.get_array_memory_size();
        Run {
            id,
            name: name.to_string(),
            value_schema: values.schema(),
            body: Body::Memory { blocks, bytes },
            fences,
            fence_ends,
            last_key: if n == 0 {
                Vec::new()
            } else {
                keys.value(n - 1).to_vec()
            },
            bloom: None,
            rows: n as u64,
            bytes: bytes as u64,
        }
    }

    /// Run `name` of rows written in any key order, served from memory
    /// once sorted ([`Self::unsorted`] says so until then).
    pub(crate) fn unsorted_in_memory(name: &str, id: u64, rows: Arc<Unsorted>) -> Run {
        Run {
            id,
            name: name.to_string(),
            value_schema: rows.schema(),
            rows: rows.rows() as u64,
            bytes: rows.bytes() as u64,
            body: Body::Unsorted(rows),
            fences: Vec::new(),
            fence_ends: Vec::new(),
            last_key: Vec::new(),
            bloom: None,
        }
    }

    /// Its rows while they wait to be sorted: no lookup may read it then.
    pub(crate) fn unsorted(&self) -> Option<&Arc<Unsorted>> {
        match &self.body {
            Body::Unsorted(rows) => Some(rows),
            _ => None,
        }
    }

    /// The table's value columns.
    pub fn values(&self) -> &SchemaRef {
        &self.value_schema
    }

    /// Whether its files are written (else it is served from memory).
    pub fn is_written(&self) -> bool {
        matches!(self.body, Body::File { .. })
    }

    fn fence(&self, i: usize) -> &[u8] {
        let start = if i == 0 {
            0
        } else {
            self.fence_ends[i - 1] as usize
        };
        &self.fences[start..self.fence_ends[i] as usize]
    }

    pub fn blocks(&self) -> usize {
        self.fence_ends.len()
    }

    /// The block that would hold `key` (hashed to `h`), or `None` when the
    /// run cannot hold it (outside its key range, or ruled out by the bloom filter).
    pub fn block_for(&self, key: &[u8], h: u64) -> Option<usize> {
        if self.fence_ends.is_empty()
            || key < self.fence(0)
            || self.bloom.as_ref().is_some_and(|b| !b.may_contain(h))
        {
            return None;
        }
        self.first_block_from(key)
    }

    /// The first block that may hold a key at or after `key`, or `None`
    /// when every key of the run is before it.
    pub fn first_block_from(&self, key: &[u8]) -> Option<usize> {
        if self.fence_ends.is_empty() || key > self.last_key.as_slice() {
            return None;
        }
        Some(partition_point(self.blocks(), |i| self.fence(i) <= key).saturating_sub(1))
    }

    /// Reads and decodes block `i` (in memory: shares it).
    pub fn read_block(&self, i: usize) -> Result<Block> {
        let (path, file, decoder, blocks) = match &self.body {
            Body::Memory { blocks, .. } => return Ok(blocks[i].clone()),
            Body::Unsorted(_) => {
                return Err(StateError::Background(format!(
                    "run {} was read before its rows were sorted",
                    self.name
                )));
            }
            Body::File {
                path,
                file,
                decoder,
                blocks,
            } => (path, file, decoder, blocks),
        };
        let at = blocks[i];
        let len = at.meta_len as usize + at.body_len as usize;
        let mut buf = vec![0u8; len];
        file.read_exact_at(&mut buf, at.offset)
            .map_err(StateError::io("read", path))?;
        let block =
            arrow::ipc::Block::new(at.offset as i64, at.meta_len as i32, at.body_len as i64);
        let batch = decoder
            .read_record_batch(&block, &Buffer::from_vec(buf))
            .map_err(|e| StateError::corrupt(path, format!("block {i}: {e}")))?
            .ok_or_else(|| StateError::corrupt(path, format!("block {i} is empty")))?;
        Block::from_batch(batch, &self.value_schema)
    }

    /// Memory the opened run holds (index and filter; in memory, its rows too).
    pub fn size(&self) -> usize {
        let body = match &self.body {
            Body::File { blocks, .. } => blocks.capacity() * std::mem::size_of::<BlockAt>(),
            Body::Memory { bytes, .. } => *bytes,
            Body::Unsorted(rows) => rows.peak(),
        };
        self.fences.capacity()
            + self.fence_ends.capacity() * 4
            + body
            + self.bloom.as_ref().map_or(0, Bloom::size)
    }
}

/// The two file names of run `name`.
pub fn file_names(name: &str) -> [String; 2] {
    [format!("{name}.arrow"), format!("{name}.idx")]
}
