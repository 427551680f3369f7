//! The durable Arrow IPC buffer of typed rows.
//!
//! Events arrive already decoded into the pipeline's schema (see
//! [`crate::server`]), so the buffer holds typed rows: each group commit
//! appends one record batch to the active segment file, flushed and
//! fsynced before the requests that carried it are acknowledged. Segment
//! files are named by their first offset (as Kafka names log segments) and
//! each is an Arrow IPC stream whose schema is the pipeline's columns, in
//! order, followed by an `_ubik_event_id` column only when `dedupe` is on
//! (the ids must survive a restart). Any Arrow tool reads a segment, e.g.
//! `pyarrow.ipc.open_stream(open(path, "rb")).read_all()`.
//!
//! A segment rolls when it reaches `segment_bytes`. On restart every segment
//! is read back through a memory map; a batch torn by a crash was never
//! acknowledged and is ignored; a segment whose columns are not the
//! pipeline's is refused (replaying it would feed rows of another shape).
//! Segments wholly before a checkpointed offset are deleted.
//!
//! The writer thread owns the active file; the index (batches in memory and
//! the read position) is shared with the source under a mutex.

use std::collections::{HashMap, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Cursor, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use arrow::array::{ArrayRef, AsArray, RecordBatch, StringArray};
use arrow::compute::concat_batches;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::StreamWriter;
use ubik_format::schema::describe;

use crate::error::Error;

/// The column that keeps dedupe ids in a segment (after the pipeline's).
pub const EVENT_ID_COLUMN: &str = "_ubik_event_id";
/// Schema metadata key marking a segment as this buffer format.
const FORMAT_KEY: &str = "ubik.webhook.buffer";
const FORMAT_VERSION: &str = "2";

/// One request's events, decoded at the door.
#[derive(Debug, Clone)]
pub struct Rows {
    /// In the pipeline's schema.
    pub batch: RecordBatch,
    /// Each event's size as received: the unit of `max_bytes` and
    /// `max_buffer_bytes`.
    pub sizes: Vec<u32>,
    /// Dedupe id of each event, when `dedupe` is on.
    pub event_ids: Option<Vec<Option<String>>>,
    pub received_ms: i64,
}

/// A stored batch and what the index knows of it.
struct Stored {
    /// As written: the pipeline's columns, maybe the id column.
    batch: RecordBatch,
    /// Size as received of each row (estimated after a replay).
    sizes: Vec<u32>,
    /// When its oldest event arrived (the segment's mtime after a replay).
    received_ms: i64,
}

struct Segment {
    base: u64,
    rows: u64,
    batches: Vec<Stored>,
    /// Offset of each batch's first event: finding an offset is a binary
    /// search (the reader looks one up on every append it wakes for).
    starts: Vec<u64>,
}

impl Segment {
    fn new(base: u64) -> Self {
        Self {
            base,
            rows: 0,
            batches: Vec::new(),
            starts: Vec::new(),
        }
    }

    fn push(&mut self, stored: Stored) {
        self.starts.push(self.base + self.rows);
        self.rows += stored.batch.num_rows() as u64;
        self.batches.push(stored);
    }
}

/// Rows taken from the buffer, in the pipeline's schema, and their offsets.
pub struct Taken {
    pub batch: RecordBatch,
    pub offsets: Vec<u64>,
}

/// What the source sees: batches in memory and the read offset.
pub struct Index {
    schema: SchemaRef,
    segments: VecDeque<Segment>,
    /// Next offset to read.
    read: u64,
    /// Next offset to be written.
    end: u64,
    unread_bytes: u64,
    /// Offset below which segment files may be deleted (the writer's active
    /// segment is never deleted).
    active_base: u64,
    pub draining: bool,
    /// The reader's flush thresholds: an append wakes it only when the
    /// buffer was empty (it then times the interval flush itself) or holds
    /// a full flush; waking it per append costs the writers the lock.
    pub wake_rows: u64,
    pub wake_bytes: u64,
}

impl Index {
    pub fn unread_rows(&self) -> u64 {
        self.end - self.read
    }
    pub fn unread_bytes(&self) -> u64 {
        self.unread_bytes
    }
    pub fn read_offset(&self) -> u64 {
        self.read
    }

    /// (segment, batch, row) of `offset`, if it is buffered.
    fn locate(&self, offset: u64) -> Option<(usize, usize, usize)> {
        // Few segments, many batches each.
        let s = self
            .segments
            .iter()
            .position(|seg| offset >= seg.base && offset < seg.base + seg.rows)?;
        let seg = &self.segments[s];
        let b = seg.starts.partition_point(|&start| start <= offset) - 1;
        Some((s, b, (offset - seg.starts[b]) as usize))
    }

    /// Arrival time of the oldest unread event's batch.
    pub fn oldest_unread_ms(&self) -> Option<i64> {
        let (s, b, _) = self.locate(self.read)?;
        Some(self.segments[s].batches[b].received_ms)
    }

    /// Up to `max_rows` rows and `max_bytes` bytes as received (at least
    /// one row), as one batch of the pipeline's schema; advances the read
    /// offset.
    pub fn take(&mut self, max_rows: usize, max_bytes: usize) -> Option<Taken> {
        let (mut s, mut b, mut r) = self.locate(self.read)?;
        let n = self.schema.fields().len();
        // The pipeline's columns of a stored slice (the id column stays behind).
        let part = |b: &RecordBatch, from: usize, len: usize| {
            let b = b.slice(from, len);
            RecordBatch::try_new(Arc::clone(&self.schema), b.columns()[..n].to_vec())
        };
        let mut parts = Vec::new();
        let (mut rows, mut bytes) = (0usize, 0u64);
        'outer: while rows < max_rows {
            let Some(seg) = self.segments.get(s) else {
                break;
            };
            let Some(stored) = seg.batches.get(b) else {
                (s, b, r) = (s + 1, 0, 0);
                continue;
            };
            let first = r;
            while r < stored.sizes.len() && rows < max_rows {
                let size = u64::from(stored.sizes[r]);
                if rows > 0 && bytes + size > max_bytes as u64 {
                    if r > first {
                        parts.push(part(&stored.batch, first, r - first));
                    }
                    break 'outer;
                }
                bytes += size;
                rows += 1;
                r += 1;
            }
            if r > first {
                parts.push(part(&stored.batch, first, r - first));
            }
            if r >= stored.sizes.len() {
                (b, r) = (b + 1, 0);
            }
        }
        if rows == 0 {
            return None;
        }
        let parts = parts.into_iter().collect::<Result<Vec<_>, _>>().ok()?;
        // One slice needs no copy; several are joined into one batch.
        let batch = match parts.as_slice() {
            [one] => one.clone(),
            _ => concat_batches(&self.schema, &parts).ok()?,
        };
        let offsets = (self.read..self.read + rows as u64).collect();
        self.read += rows as u64;
        self.unread_bytes = self.unread_bytes.saturating_sub(bytes);
        Some(Taken { batch, offsets })
    }

    /// Sets the read offset (a resume), recounting unread bytes.
    pub fn seek(&mut self, offset: u64) {
        self.read = offset
            .min(self.end)
            .max(self.segments.front().map_or(self.end, |s| s.base));
        let mut bytes = 0u64;
        for seg in &self.segments {
            for (stored, &start) in seg.batches.iter().zip(&seg.starts) {
                let skip = self.read.saturating_sub(start) as usize;
                bytes += stored
                    .sizes
                    .iter()
                    .skip(skip)
                    .map(|&s| u64::from(s))
                    .sum::<u64>();
            }
        }
        self.unread_bytes = bytes;
    }

    /// Event ids of every event held (to rebuild the dedupe set).
    pub fn event_ids(&self) -> Vec<(String, i64)> {
        let mut out = Vec::new();
        for seg in &self.segments {
            for stored in &seg.batches {
                let Some(ids) = stored.batch.column_by_name(EVENT_ID_COLUMN) else {
                    continue;
                };
                let Some(ids) = ids.as_string_opt::<i32>() else {
                    continue;
                };
                for id in ids.iter().flatten() {
                    out.push((id.to_string(), stored.received_ms));
                }
            }
        }
        out
    }
}

/// The buffer shared by the writer, the server and the source.
pub struct Shared {
    pub index: Mutex<Index>,
    /// Signalled when events are appended or draining starts.
    pub changed: Condvar,
    dir: Option<PathBuf>,
}

impl Shared {
    /// Deletes segments that lie wholly before `offset` (a checkpoint covers them).
    pub fn truncate(&self, offset: u64) -> Result<(), Error> {
        let mut gone = Vec::new();
        {
            let mut idx = self
                .index
                .lock()
                .map_err(|_| Error::Buffer("lock poisoned".into()))?;
            while let Some(seg) = idx.segments.front() {
                let wholly_before = seg.base + seg.rows <= offset;
                let next_base = idx.segments.get(1).map(|s| s.base);
                // The active segment stays until the writer rolls past it.
                if wholly_before && next_base.is_some_and(|n| n <= idx.active_base) {
                    gone.push(seg.base);
                    idx.segments.pop_front();
                } else {
                    break;
                }
            }
        }
        if let Some(dir) = &self.dir {
            for base in gone {
                let p = segment_path(dir, base);
                if let Err(e) = fs::remove_file(&p)
                    && e.kind() != std::io::ErrorKind::NotFound
                {
                    return Err(Error::Buffer(format!("cannot delete {}: {e}", p.display())));
                }
            }
        }
        Ok(())
    }
}

fn segment_path(dir: &Path, base: u64) -> PathBuf {
    dir.join(format!("{base:020}.arrow"))
}

/// The schema segments are written with: the pipeline's columns, then the
/// id column when `dedupe` is on.
fn stored_schema(schema: &SchemaRef, with_ids: bool) -> SchemaRef {
    let mut fields: Vec<Arc<Field>> = schema.fields().iter().cloned().collect();
    if with_ids {
        fields.push(Arc::new(Field::new(EVENT_ID_COLUMN, DataType::Utf8, true)));
    }
    let metadata = HashMap::from([(FORMAT_KEY.to_string(), FORMAT_VERSION.to_string())]);
    Arc::new(Schema::new_with_metadata(fields, metadata))
}

/// Refuses a segment whose columns are not the pipeline's.
fn check_schema(path: &Path, found: &Schema, schema: &SchemaRef) -> Result<(), Error> {
    let n = schema.fields().len();
    let ours = found.fields().len() >= n
        && found.fields()[..n] == schema.fields()[..]
        && found.fields()[n..]
            .iter()
            .all(|f| f.name() == EVENT_ID_COLUMN && f.data_type() == &DataType::Utf8);
    if ours {
        return Ok(());
    }
    let found_cols = Arc::new(Schema::new(
        found
            .fields()
            .iter()
            .filter(|f| f.name() != EVENT_ID_COLUMN)
            .cloned()
            .collect::<Vec<_>>(),
    ));
    Err(Error::Config(format!(
        "the webhook buffer segment {} holds rows of schema ({}), but this pipeline's schema is ({}): replaying it would feed rows of another shape. Run the pipeline that wrote it until its buffer drains, or delete that directory if its events are no longer needed",
        path.display(),
        describe(&found_cols),
        describe(schema)
    )))
}

/// Reads every batch of a segment file through a memory map, stopping at a
/// torn tail. `None` when not even the schema was written.
fn read_segment(path: &Path) -> Result<Option<(SchemaRef, Vec<RecordBatch>)>, Error> {
    let file = File::open(path)?;
    if file.metadata()?.len() == 0 {
        return Ok(None);
    }
    // SAFETY: segment files are only appended by this process's writer,
    // which has not started yet; nothing truncates them while mapped.
    let map = unsafe { memmap2::Mmap::map(&file)? };
    let Ok(reader) = StreamReader::try_new(Cursor::new(&map[..]), None) else {
        return Ok(None);
    };
    let schema = reader.schema();
    let mut out = Vec::new();
    for batch in reader {
        match batch {
            Ok(b) => out.push(b),
            Err(_) => break,
        }
    }
    Ok(Some((schema, out)))
}

fn mtime_ms(path: &Path) -> i64 {
    fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_millis() as i64)
}

/// The writer half: the active segment file.
pub struct Writer {
    dir: Option<PathBuf>,
    segment_bytes: u64,
    active: Option<(u64, StreamWriter<BufWriter<File>>, u64)>,
    shared: Arc<Shared>,
    /// What segments are written with.
    stored: SchemaRef,
    with_ids: bool,
}

/// Opens (and replays) the buffer in `dir`, or a memory-only one, for rows
/// of `schema`; `with_ids` keeps dedupe ids in the segments.
pub fn open(
    dir: Option<PathBuf>,
    segment_bytes: u64,
    schema: SchemaRef,
    with_ids: bool,
) -> Result<(Arc<Shared>, Writer), Error> {
    let mut segments = VecDeque::new();
    let mut end = 0u64;
    if let Some(d) = &dir {
        fs::create_dir_all(d)
            .map_err(|e| Error::Buffer(format!("cannot create {}: {e}", d.display())))?;
        let mut bases: Vec<u64> = fs::read_dir(d)?
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.strip_suffix(".arrow")?.parse().ok())
            .collect();
        bases.sort_unstable();
        for base in bases {
            let path = segment_path(d, base);
            let mut seg = Segment::new(base);
            if let Some((found, batches)) = read_segment(&path)? {
                check_schema(&path, &found, &schema)?;
                let received_ms = mtime_ms(&path);
                for batch in batches {
                    // Sizes as received are not stored: estimate them from the rows.
                    let rows = batch.num_rows().max(1);
                    let each = (batch.get_array_memory_size() / rows).min(u32::MAX as usize);
                    seg.push(Stored {
                        sizes: vec![each as u32; batch.num_rows()],
                        batch,
                        received_ms,
                    });
                }
            }
            end = end.max(base + seg.rows);
            segments.push_back(seg);
        }
    }
    let read = segments.front().map_or(end, |s| s.base);
    let mut index = Index {
        schema: Arc::clone(&schema),
        segments,
        read,
        end,
        unread_bytes: 0,
        active_base: end,
        draining: false,
        wake_rows: 1,
        wake_bytes: 1,
    };
    index.seek(read);
    let shared = Arc::new(Shared {
        index: Mutex::new(index),
        changed: Condvar::new(),
        dir: dir.clone(),
    });
    let writer = Writer {
        dir,
        segment_bytes,
        active: None,
        shared: Arc::clone(&shared),
        stored: stored_schema(&schema, with_ids),
        with_ids,
    };
    Ok((shared, writer))
}

impl Writer {
    fn roll(&mut self, base: u64) -> Result<(), Error> {
        if let Some((_, mut w, _)) = self.active.take() {
            w.finish()?;
            w.get_mut().flush()?;
            w.get_ref().get_ref().sync_data()?;
        }
        let Some(dir) = &self.dir else { return Ok(()) };
        let path = segment_path(dir, base);
        let file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(&path)?;
        let w = StreamWriter::try_new(BufWriter::with_capacity(1 << 20, file), &self.stored)?;
        self.active = Some((base, w, 0));
        File::open(dir)?.sync_all()?;
        Ok(())
    }

    /// The batch to store for `groups`: their rows joined, plus the ids.
    fn stored_batch(&self, groups: &[Rows]) -> Result<RecordBatch, Error> {
        let schema = self.shared_schema();
        let rows = match groups {
            [one] => one.batch.clone(),
            _ => concat_batches(&schema, groups.iter().map(|g| &g.batch))?,
        };
        let mut columns: Vec<ArrayRef> = rows.columns().to_vec();
        if self.with_ids {
            let ids: StringArray = groups
                .iter()
                .flat_map(|g| match &g.event_ids {
                    Some(ids) => ids.iter().map(|i| i.as_deref()).collect::<Vec<_>>(),
                    None => vec![None; g.batch.num_rows()],
                })
                .collect();
            columns.push(Arc::new(ids));
        }
        Ok(RecordBatch::try_new(Arc::clone(&self.stored), columns)?)
    }

    fn shared_schema(&self) -> SchemaRef {
        let n = self.stored.fields().len() - usize::from(self.with_ids);
        Arc::new(Schema::new(self.stored.fields()[..n].to_vec()))
    }

    /// Appends `groups` durably (fsync) as one batch and makes them
    /// readable. Returns the offset of the first row and how long the fsync
    /// took.
    pub fn append(&mut self, groups: &[Rows]) -> Result<(u64, Duration), Error> {
        let first = self
            .shared
            .index
            .lock()
            .map_err(|_| Error::Buffer("lock poisoned".into()))?
            .end;
        let batch = self.stored_batch(groups)?;
        let n = batch.num_rows();
        if n == 0 {
            return Ok((first, Duration::ZERO));
        }
        let sizes: Vec<u32> = groups
            .iter()
            .flat_map(|g| g.sizes.iter().copied())
            .collect();
        let bytes: u64 = sizes.iter().map(|&s| u64::from(s)).sum();
        let received_ms = groups.iter().map(|g| g.received_ms).min().unwrap_or(0);
        let mut fsync = Duration::ZERO;
        let mut new_segment = false;
        if self.dir.is_some() {
            let full = self
                .active
                .as_ref()
                .is_none_or(|(_, _, size)| *size >= self.segment_bytes);
            if full {
                self.roll(first)?;
                new_segment = true;
            }
            let (_, w, size) = self.active.as_mut().expect("rolled");
            w.write(&batch)?;
            w.get_mut().flush()?;
            let t = std::time::Instant::now();
            w.get_ref().get_ref().sync_data()?;
            fsync = t.elapsed();
            *size += batch.get_array_memory_size() as u64;
        }
        let mut idx = self
            .shared
            .index
            .lock()
            .map_err(|_| Error::Buffer("lock poisoned".into()))?;
        let was_empty = idx.unread_rows() == 0;
        let start_new = new_segment
            || idx.segments.is_empty()
            || (self.dir.is_none() && idx.segments.back().is_some_and(|s| s.rows >= 1 << 16));
        if start_new {
            idx.segments.push_back(Segment::new(first));
            idx.active_base = first;
        }
        idx.segments.back_mut().expect("a segment").push(Stored {
            batch,
            sizes,
            received_ms,
        });
        idx.end += n as u64;
        idx.unread_bytes += bytes;
        let wake = was_empty
            || idx.draining
            || idx.unread_rows() >= idx.wake_rows
            || idx.unread_bytes >= idx.wake_bytes;
        drop(idx);
        if wake {
            self.shared.changed.notify_all();
        }
        Ok((first, fsync))
    }

    /// Seals the active segment (a clean shutdown).
    pub fn close(&mut self) -> Result<(), Error> {
        if let Some((_, mut w, _)) = self.active.take() {
            w.finish()?;
            w.get_mut().flush()?;
            w.get_ref().get_ref().sync_data()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::Int64Array;
    use arrow::datatypes::Int64Type;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![Field::new("i", DataType::Int64, true)]))
    }

    fn rows(from: i64, n: i64) -> Rows {
        let batch = RecordBatch::try_new(
            schema(),
            vec![Arc::new(Int64Array::from_iter_values(from..from + n))],
        )
        .unwrap();
        Rows {
            batch,
            sizes: vec![7; n as usize],
            event_ids: Some((from..from + n).map(|i| Some(format!("e{i}"))).collect()),
            received_ms: from,
        }
    }

    fn values(t: &Taken) -> Vec<i64> {
        t.batch
            .column(0)
            .as_primitive::<Int64Type>()
            .values()
            .to_vec()
    }

    #[test]
    fn append_read_replay_truncate() {
        let dir = std::env::temp_dir().join(format!("ubik-buffer-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        {
            let (shared, mut w) = open(Some(dir.clone()), 200, schema(), true).unwrap();
            for i in 0..10 {
                w.append(&[rows(2 * i, 1), rows(2 * i + 1, 1)]).unwrap();
            }
            let t = shared.index.lock().unwrap().take(5, usize::MAX).unwrap();
            assert_eq!(t.offsets, vec![0, 1, 2, 3, 4]);
            assert_eq!(values(&t), vec![0, 1, 2, 3, 4]);
            assert_eq!(
                t.batch.schema(),
                schema(),
                "the id column stays in the buffer"
            );
            // No close: a crash. Everything appended was fsynced.
        }
        let (shared, mut w) = open(Some(dir.clone()), 200, schema(), true).unwrap();
        {
            let mut idx = shared.index.lock().unwrap();
            assert_eq!(idx.unread_rows(), 20);
            assert_eq!(idx.event_ids().len(), 20);
            idx.seek(5);
            assert_eq!(idx.unread_rows(), 15);
            let t = idx.take(3, usize::MAX).unwrap();
            assert_eq!(values(&t), vec![5, 6, 7]);
        }
        w.append(&[rows(20, 1)]).unwrap();
        shared.truncate(9).unwrap();
        let files = fs::read_dir(&dir).unwrap().count();
        let t = shared.index.lock().unwrap().take(100, usize::MAX).unwrap();
        assert_eq!(t.offsets.first(), Some(&8));
        assert_eq!(t.offsets.last(), Some(&20));
        assert_eq!(values(&t).last(), Some(&20));
        assert!(files < 11, "old segments deleted ({files} left)");
        drop(w);

        // Another schema is refused, naming both.
        let other = Arc::new(Schema::new(vec![Field::new("i", DataType::Utf8, true)]));
        let e = open(Some(dir.clone()), 200, other, true)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("(i Int64)") && e.contains("(i Utf8)"), "{e}");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn max_bytes_counts_sizes_as_received() {
        let (shared, mut w) = open(None, 1 << 20, schema(), false).unwrap();
        w.append(&[rows(0, 10)]).unwrap();
        let mut idx = shared.index.lock().unwrap();
        assert_eq!(idx.unread_bytes(), 70);
        let t = idx.take(100, 30).unwrap();
        assert_eq!(values(&t), vec![0, 1, 2, 3]);
        assert_eq!(idx.unread_bytes(), 42);
        assert_eq!(values(&idx.take(100, usize::MAX).unwrap()).len(), 6);
    }
}
