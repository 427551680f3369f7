//! The durable Arrow IPC buffer.
//!
//! Events are rows `(offset, received_ms, payload, event_id)`, appended in
//! batches to segment files named by their first offset (as Kafka names log
//! segments), each file an Arrow IPC stream: batches are appended, flushed
//! and fsynced before the requests that carried them are acknowledged. A
//! segment rolls when it reaches `segment_bytes`. On restart every segment
//! is read back through a memory map; a batch torn by a crash was never
//! acknowledged and is ignored. Segments wholly before a checkpointed offset
//! are deleted.
//!
//! The writer thread owns the active file; the index (batches in memory and
//! the read position) is shared with the source under a mutex.

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Cursor, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use arrow::array::{Array, ArrayRef, AsArray, BinaryArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef};
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::StreamWriter;

use crate::error::Error;

/// One event to append.
#[derive(Debug, Clone)]
pub struct Event {
    pub received_ms: i64,
    pub payload: Vec<u8>,
    pub event_id: Option<String>,
}

pub fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("received_ms", DataType::Int64, false),
        Field::new("payload", DataType::Binary, false),
        Field::new("event_id", DataType::Utf8, true),
    ]))
}

struct Segment {
    base: u64,
    rows: u64,
    batches: Vec<RecordBatch>,
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

    fn push(&mut self, batch: RecordBatch) {
        self.starts.push(self.base + self.rows);
        self.rows += batch.num_rows() as u64;
        self.batches.push(batch);
    }
}

/// Events taken from the buffer: payloads concatenated, their spans, and offsets.
pub struct Taken {
    pub data: Vec<u8>,
    pub spans: Vec<std::ops::Range<usize>>,
    pub offsets: Vec<u64>,
}

/// What the source sees: batches in memory and the read offset.
pub struct Index {
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

    /// `received_ms` of the oldest unread event.
    pub fn oldest_unread_ms(&self) -> Option<i64> {
        let (s, b, r) = self.locate(self.read)?;
        Some(
            self.segments[s].batches[b]
                .column(0)
                .as_primitive::<Int64Type>()
                .value(r),
        )
    }

    /// Up to `max_rows` events and `max_bytes` payload bytes (at least one
    /// event), concatenated; advances the read offset.
    pub fn take(&mut self, max_rows: usize, max_bytes: usize) -> Option<Taken> {
        let (mut s, mut b, mut r) = self.locate(self.read)?;
        let mut data = Vec::new();
        let mut spans = Vec::new();
        let mut offsets = Vec::new();
        while spans.len() < max_rows {
            let Some(seg) = self.segments.get(s) else {
                break;
            };
            let Some(batch) = seg.batches.get(b) else {
                s += 1;
                b = 0;
                r = 0;
                continue;
            };
            if r >= batch.num_rows() {
                b += 1;
                r = 0;
                continue;
            }
            let payload = batch.column(1).as_binary::<i32>().value(r);
            if !spans.is_empty() && data.len() + payload.len() > max_bytes {
                break;
            }
            let start = data.len();
            data.extend_from_slice(payload);
            spans.push(start..data.len());
            offsets.push(self.read + offsets.len() as u64);
            r += 1;
        }
        if spans.is_empty() {
            return None;
        }
        self.read += spans.len() as u64;
        self.unread_bytes = self.unread_bytes.saturating_sub(data.len() as u64);
        Some(Taken {
            data,
            spans,
            offsets,
        })
    }

    /// Sets the read offset (a resume), recounting unread bytes.
    pub fn seek(&mut self, offset: u64) {
        self.read = offset
            .min(self.end)
            .max(self.segments.front().map_or(self.end, |s| s.base));
        let mut bytes = 0u64;
        for seg in &self.segments {
            let mut o = seg.base;
            for batch in &seg.batches {
                let p = batch.column(1).as_binary::<i32>();
                for i in 0..batch.num_rows() {
                    if o + i as u64 >= self.read {
                        bytes += p.value_length(i) as u64;
                    }
                }
                o += batch.num_rows() as u64;
            }
        }
        self.unread_bytes = bytes;
    }

    /// Event ids of every event held (to rebuild the dedupe set).
    pub fn event_ids(&self) -> Vec<(String, i64)> {
        let mut out = Vec::new();
        for seg in &self.segments {
            for batch in &seg.batches {
                let ts = batch.column(0).as_primitive::<Int64Type>();
                let ids = batch.column(2).as_string::<i32>();
                for i in 0..batch.num_rows() {
                    if ids.is_valid(i) {
                        out.push((ids.value(i).to_string(), ts.value(i)));
                    }
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

/// Reads every batch of a segment file through a memory map, stopping at a
/// torn tail.
fn read_segment(path: &Path) -> Result<Vec<RecordBatch>, Error> {
    let file = File::open(path)?;
    if file.metadata()?.len() == 0 {
        return Ok(Vec::new());
    }
    // SAFETY: segment files are only appended by this process's writer,
    // which has not started yet; nothing truncates them while mapped.
    let map = unsafe { memmap2::Mmap::map(&file)? };
    let mut out = Vec::new();
    let Ok(reader) = StreamReader::try_new(Cursor::new(&map[..]), None) else {
        return Ok(out);
    };
    for batch in reader {
        match batch {
            Ok(b) => out.push(b),
            Err(_) => break,
        }
    }
    Ok(out)
}

/// The writer half: the active segment file.
pub struct Writer {
    dir: Option<PathBuf>,
    segment_bytes: u64,
    active: Option<(u64, StreamWriter<BufWriter<File>>, u64)>,
    shared: Arc<Shared>,
    schema: SchemaRef,
}

/// Opens (and replays) the buffer in `dir`, or a memory-only one.
pub fn open(dir: Option<PathBuf>, segment_bytes: u64) -> Result<(Arc<Shared>, Writer), Error> {
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
            let mut seg = Segment::new(base);
            for batch in read_segment(&segment_path(d, base))? {
                seg.push(batch);
            }
            end = end.max(base + seg.rows);
            segments.push_back(seg);
        }
    }
    let read = segments.front().map_or(end, |s| s.base);
    let shared = Arc::new(Shared {
        index: Mutex::new(Index {
            segments,
            read,
            end,
            unread_bytes: 0,
            active_base: end,
            draining: false,
            wake_rows: 1,
            wake_bytes: 1,
        }),
        changed: Condvar::new(),
        dir: dir.clone(),
    });
    shared.index.lock().expect("new lock").seek(read);
    let writer = Writer {
        dir,
        segment_bytes,
        active: None,
        shared: Arc::clone(&shared),
        schema: schema(),
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
        let w = StreamWriter::try_new(BufWriter::with_capacity(1 << 20, file), &self.schema)?;
        self.active = Some((base, w, 0));
        File::open(dir)?.sync_all()?;
        Ok(())
    }

    /// Appends `events` durably (fsync) and makes them readable. Returns the
    /// offset of the first one and how long the fsync took.
    pub fn append(&mut self, events: &[Event]) -> Result<(u64, Duration), Error> {
        let first = self
            .shared
            .index
            .lock()
            .map_err(|_| Error::Buffer("lock poisoned".into()))?
            .end;
        let received: ArrayRef = Arc::new(Int64Array::from_iter_values(
            events.iter().map(|e| e.received_ms),
        ));
        let payload: ArrayRef = Arc::new(BinaryArray::from_iter_values(
            events.iter().map(|e| e.payload.as_slice()),
        ));
        let ids: ArrayRef = Arc::new(StringArray::from_iter(
            events.iter().map(|e| e.event_id.as_deref()),
        ));
        let batch = RecordBatch::try_new(Arc::clone(&self.schema), vec![received, payload, ids])?;
        let bytes: u64 = events.iter().map(|e| e.payload.len() as u64).sum();
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
        idx.segments.back_mut().expect("a segment").push(batch);
        idx.end += events.len() as u64;
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

    fn ev(i: usize) -> Event {
        Event {
            received_ms: i as i64,
            payload: format!("{{\"i\":{i}}}").into_bytes(),
            event_id: Some(format!("e{i}")),
        }
    }

    #[test]
    fn append_read_replay_truncate() {
        let dir = std::env::temp_dir().join(format!("ubik-buffer-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        {
            let (shared, mut w) = open(Some(dir.clone()), 200).unwrap();
            for i in 0..10 {
                w.append(&[ev(2 * i), ev(2 * i + 1)]).unwrap();
            }
            let Taken {
                data,
                spans,
                offsets,
            } = shared.index.lock().unwrap().take(5, usize::MAX).unwrap();
            assert_eq!(offsets, vec![0, 1, 2, 3, 4]);
            assert_eq!(&data[spans[4].clone()], b"{\"i\":4}");
            // No close: a crash. Everything appended was fsynced.
        }
        let (shared, mut w) = open(Some(dir.clone()), 200).unwrap();
        {
            let mut idx = shared.index.lock().unwrap();
            assert_eq!(idx.unread_rows(), 20);
            idx.seek(5);
            assert_eq!(idx.unread_rows(), 15);
            let offsets = idx.take(100, 30).unwrap().offsets;
            assert_eq!(offsets.len(), 4, "max_bytes bounds a take");
        }
        w.append(&[ev(20)]).unwrap();
        shared.truncate(9).unwrap();
        let files = fs::read_dir(&dir).unwrap().count();
        let offsets = shared
            .index
            .lock()
            .unwrap()
            .take(100, usize::MAX)
            .unwrap()
            .offsets;
        assert_eq!(offsets.first(), Some(&9));
        assert_eq!(offsets.last(), Some(&20));
        assert!(files < 11, "old segments deleted ({files} left)");
        let _ = fs::remove_dir_all(&dir);
    }
}
