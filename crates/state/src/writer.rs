//! The store's background writer: it writes the files of runs the store
//! already serves from memory, one after another, and syncs them when the
//! store is durable. Sorting rows written out of key order (unless a
//! lookup needed them first), encoding, writing and `fsync` happen here,
//! so a spill or a checkpoint does not wait on them.
//!
//! A checkpoint takes a [`Durability`]: the runs written up to then. Its
//! [`Durability::wait`] blocks until they are on disk and the directory is
//! synced, and can run on another thread than the store's user (the
//! checkpoint's own completion), so the hot path never waits on `fsync`.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use arrow::array::Array;

use crate::error::{Result, StateError};
use crate::run::{RunFile, RunWriter};
use crate::sorting::{Sorted, Unsorted};

/// One run to write.
pub(crate) struct WriteJob {
    pub name: String,
    pub rows: JobRows,
    /// Bytes it holds in memory until written.
    pub held: usize,
}

/// A run's rows, as the store serves them until its files are written.
pub(crate) enum JobRows {
    Sorted(Box<Sorted>),
    Unsorted(Arc<Unsorted>),
}

/// A run whose files are written (and synced, in a durable store).
pub(crate) struct Written {
    pub name: String,
    pub file: RunFile,
}

#[derive(Default)]
struct Progress {
    /// Jobs done (in submission order), failed ones included.
    done: u64,
    /// The first failure: every later call of the store reports it.
    failed: Option<String>,
    finished: Vec<Written>,
    /// Bytes the jobs not done yet hold in memory.
    held: usize,
    /// File bytes written, cumulative, after job `first + i`
    /// (durable stores only: a checkpoint asks what its own jobs wrote).
    written: VecDeque<u64>,
    first: u64,
    total_bytes: u64,
}

impl Progress {
    /// File bytes written by jobs `from..=through` (1-based), if known.
    fn bytes_between(&self, from: u64, through: u64) -> u64 {
        let at = |job: u64| -> u64 {
            if job < self.first {
                return 0;
            }
            self.written
                .get((job - self.first) as usize)
                .copied()
                .unwrap_or(self.total_bytes)
        };
        let before = if from <= 1 { 0 } else { at(from - 1) };
        at(through).saturating_sub(before)
    }
}

struct Shared {
    progress: Mutex<Progress>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits while `busy` holds and no write failed, then reports a failure.
    fn wait_while(&self, busy: impl Fn(&Progress) -> bool) -> Result<MutexGuard<'_, Progress>> {
        let mut p = self.lock();
        while busy(&p) && p.failed.is_none() {
            p = self.changed.wait(p).unwrap_or_else(|e| e.into_inner());
        }
        failed(&p)?;
        Ok(p)
    }
}

/// The writer thread of one store.
pub(crate) struct Writer {
    jobs: Option<Sender<WriteJob>>,
    shared: Arc<Shared>,
    handle: Option<JoinHandle<()>>,
    submitted: u64,
    durable: bool,
}

/// Bytes of unwritten runs a store may hold before a write waits for the
/// disk: the writer falls behind only when spills outrun the disk.
const MAX_HELD: usize = 256 << 20;

impl Writer {
    /// Starts the writer of the store in `dir`; `durable`: sync each run.
    pub fn start(dir: &Path, durable: bool) -> Result<Writer> {
        let (tx, rx) = channel();
        let shared = Arc::new(Shared {
            progress: Mutex::new(Progress {
                first: 1,
                ..Progress::default()
            }),
            changed: Condvar::new(),
        });
        let worker = Arc::clone(&shared);
        let dir = dir.to_path_buf();
        let handle = std::thread::Builder::new()
            .name("ubik-state-write".into())
            .spawn(move || work(&dir, durable, &rx, &worker))
            .map_err(|e| StateError::Io {
                action: "start the writer thread of",
                path: PathBuf::new(),
                source: e,
            })?;
        Ok(Writer {
            jobs: Some(tx),
            shared,
            handle: Some(handle),
            submitted: 0,
            durable,
        })
    }

    /// Queues `job`; waits first while the runs not yet written hold more
    /// than [`MAX_HELD`] bytes.
    pub fn submit(&mut self, job: WriteJob) -> Result<()> {
        self.shared.wait_while(|p| p.held > MAX_HELD)?.held += job.held;
        self.submitted += 1;
        self.jobs
            .as_ref()
            .expect("open until dropped")
            .send(job)
            .map_err(|_| StateError::Background("the state writer thread stopped".into()))
    }

    /// Jobs submitted so far.
    pub fn submitted(&self) -> u64 {
        self.submitted
    }

    /// The runs written since the last call (waiting for every job
    /// submitted when `all`).
    pub fn finished(&mut self, all: bool) -> Result<Vec<Written>> {
        let submitted = self.submitted;
        let mut p = self.shared.wait_while(|p| all && p.done < submitted)?;
        Ok(std::mem::take(&mut p.finished))
    }

    /// What a checkpoint waits on: the jobs submitted so far, the ones
    /// after `since` (a count of jobs submitted before) being its own.
    pub fn durability(&self, dir: &Path, since: u64) -> Durability {
        Durability {
            dir: self.durable.then(|| dir.to_path_buf()),
            shared: self.durable.then(|| Arc::clone(&self.shared)),
            from: since + 1,
            through: self.submitted,
        }
    }
}

impl Drop for Writer {
    /// Finishes the jobs queued and waits for the thread: a writer never
    /// outlives its store.
    fn drop(&mut self) {
        self.jobs.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn failed(p: &Progress) -> Result<()> {
    match &p.failed {
        Some(m) => Err(StateError::Background(m.clone())),
        None => Ok(()),
    }
}

fn work(dir: &Path, durable: bool, jobs: &Receiver<WriteJob>, shared: &Shared) {
    while let Ok(job) = jobs.recv() {
        let held = job.held;
        let name = job.name.clone();
        let skip = shared.lock().failed.is_some();
        let result = if skip {
            Ok(None)
        } else {
            write(dir, durable, job)
        };
        // A sorted write freed its rows as written.
        crate::memory::release_after(held);
        let mut p = shared.lock();
        p.done += 1;
        p.held -= held;
        match result {
            Ok(Some(file)) => {
                p.total_bytes += file.bytes;
                p.finished.push(Written { name, file });
            }
            Ok(None) => {}
            Err(e) => {
                p.failed.get_or_insert_with(|| e.to_string());
            }
        }
        if durable {
            let total = p.total_bytes;
            p.written.push_back(total);
        }
        shared.changed.notify_all();
    }
}

fn write(dir: &Path, durable: bool, job: WriteJob) -> Result<Option<RunFile>> {
    let rows = match &job.rows {
        JobRows::Sorted(rows) => rows,
        JobRows::Unsorted(rows) => rows.sorted()?,
    };
    let mut writer = RunWriter::create(dir, &job.name, &rows.values.schema(), rows.keys.len())?;
    writer.push(&rows.keys, &rows.deleted, &rows.values)?;
    let file = writer.finish()?;
    if durable && let Some(f) = &file {
        f.sync(dir)?;
    }
    Ok(file)
}

/// The runs a checkpoint names, on their way to disk.
pub struct Durability {
    /// The directory to sync (`None`: a store that does not sync).
    dir: Option<PathBuf>,
    /// `None`: no run to wait for.
    shared: Option<Arc<Shared>>,
    from: u64,
    through: u64,
}

impl Durability {
    /// No run to wait for; `dir`, if any, is synced (runs a compaction installed).
    pub fn runs_done(dir: Option<&Path>) -> Durability {
        Durability {
            dir: dir.map(Path::to_path_buf),
            shared: None,
            from: 1,
            through: 0,
        }
    }

    /// Waits until the runs are written and synced, then syncs the
    /// directory; returns the bytes of the checkpoint's own runs.
    pub fn wait(self) -> Result<u64> {
        let bytes = match self.shared {
            None => 0,
            Some(shared) => {
                let mut p = shared.wait_while(|p| p.done < self.through)?;
                let bytes = p.bytes_between(self.from, self.through);
                // Later checkpoints start after `through`: forget what came before it.
                while p.first < self.through && !p.written.is_empty() {
                    p.written.pop_front();
                    p.first += 1;
                }
                bytes
            }
        };
        if let Some(dir) = &self.dir {
            sync_dir(dir)?;
        }
        Ok(bytes)
    }
}

pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(StateError::io("sync", dir))
}
