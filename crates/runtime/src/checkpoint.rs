//! Checkpoint directories.
//!
//! ```text
//! DIR/CURRENT              name of the latest complete checkpoint
//! DIR/ckpt-00000042/       one checkpoint (kept: the last few)
//!     manifest.json        format, pipeline fingerprint, epoch, source position, counters,
//!                          the state runs it refers to
//!     engine.state         watermarks + operator state (Arrow IPC, see ubik_engine::checkpoint)
//!     pending.arrow        output handed to the host after this point, if any (Python leg)
//! DIR/idle.log             idle-close decisions since the last checkpoint
//! DIR/state/               the state store's runs (or --state-dir): immutable files that
//!                          several checkpoints share; a file no kept checkpoint refers to is deleted
//! ```
//!
//! A checkpoint is written into `ckpt-N.tmp/`, every file fsynced, renamed
//! to `ckpt-N/`, and only then named in `CURRENT` (temp file + fsync +
//! rename + directory fsync). A crash at any point leaves the previous
//! checkpoint intact and current.
//!
//! A store may have a [`CheckpointReplica`] (a task of a consumer group:
//! Kafka): each checkpoint and idle decision is then also saved there, with
//! the state runs it refers to as shared files (the replica uploads a run
//! once), and opening the store first installs the replica's checkpoint and
//! runs when it is newer than the local one, so any process can take the
//! task over.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tracing::info;
use ubik_connector::{CheckpointReplica, SharedFile};

use crate::error::{Result, RuntimeError};

/// Bumped when the layout of a checkpoint directory changes.
pub const CHECKPOINT_FORMAT: u32 = 1;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    /// Identity of the pipeline (query, schema, semantics options): a
    /// checkpoint only resumes the pipeline that wrote it.
    pub fingerprint: String,
    /// What the fingerprint was computed from, for error messages.
    pub identity: serde_json::Value,
    pub epoch: u64,
    pub source: serde_json::Value,
    /// Records consumed per partition (positions of idle-close decisions).
    pub consumed: std::collections::BTreeMap<u32, u64>,
    /// A second stage: the next source offset expected per source
    /// partition and join leaf (rows before it were taken in: a replay's
    /// copies go). Keys of leaf 0 are the partition ids, as before joins.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub shuffle_next: std::collections::BTreeMap<u64, u64>,
    /// Changelog records emitted before this checkpoint.
    pub emitted: u64,
    pub created_ms: i64,
    /// Engine state bytes (for reporting).
    pub state_bytes: u64,
    pub state_keys: u64,
    /// The pipeline watermark (µs) at the checkpoint (for reporting).
    #[serde(default = "no_watermark")]
    pub watermark: i64,
    /// The state store's runs this checkpoint refers to (they must not be
    /// deleted while it is kept).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub state_runs: Vec<String>,
    /// Bytes this checkpoint wrote: its own files and the state runs
    /// written since the previous one (for reporting).
    #[serde(default)]
    pub bytes_written: u64,
}

fn no_watermark() -> i64 {
    i64::MIN
}

pub struct CheckpointStore {
    dir: PathBuf,
    /// The state store's directory (its runs are the checkpoints' shared files).
    state_dir: PathBuf,
    keep: usize,
    replica: Option<Box<dyn CheckpointReplica>>,
}

/// A checkpoint read back.
pub struct Loaded {
    pub manifest: Manifest,
    pub engine_state: Vec<u8>,
    pub pending: Option<Vec<u8>>,
}

/// Refuses a file name from a checkpoint (or its replica) that is not a
/// plain name in its directory: one that could reach outside it.
fn plain_file_name(name: &str, what: &str) -> Result<()> {
    if name.is_empty() || name.contains('/') || name.contains('\\') || name.starts_with('.') {
        return Err(RuntimeError::Checkpoint(format!(
            "refusing {what} file name {name:?}"
        )));
    }
    Ok(())
}

fn ckpt_err(what: &str, path: &Path, e: std::io::Error) -> RuntimeError {
    RuntimeError::Checkpoint(format!("{what} {}: {e}", path.display()))
}

fn fsync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| ckpt_err("cannot sync directory", dir, e))
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = File::create(path).map_err(|e| ckpt_err("cannot create", path, e))?;
    f.write_all(bytes)
        .map_err(|e| ckpt_err("cannot write", path, e))?;
    f.sync_all().map_err(|e| ckpt_err("cannot sync", path, e))
}

impl CheckpointStore {
    pub fn open(dir: impl Into<PathBuf>, keep: usize) -> Result<Self> {
        let dir = dir.into();
        fs::create_dir_all(&dir)
            .map_err(|e| ckpt_err("cannot create checkpoint directory", &dir, e))?;
        Ok(Self {
            state_dir: dir.join("state"),
            dir,
            keep: keep.max(1),
            replica: None,
        })
    }

    /// Keeps the state store in `dir` instead of the checkpoint directory's
    /// `state/`; before [`Self::with_replica`], which installs runs there.
    pub fn with_state_dir(mut self, dir: Option<PathBuf>) -> Self {
        if let Some(d) = dir {
            self.state_dir = d;
        }
        self
    }

    /// Where the state store's runs are.
    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// Adds a replica, first installing its checkpoint (and idle log) when
    /// it is newer than the local one.
    pub fn with_replica(mut self, mut replica: Box<dyn CheckpointReplica>) -> Result<Self> {
        let started = std::time::Instant::now();
        let held = replica.load()?;
        let local = self.latest_epoch()?;
        if let Some((epoch, files)) = held.checkpoint
            && local.is_none_or(|l| epoch > l)
        {
            let files: Vec<(&str, &[u8])> = files
                .iter()
                .map(|(n, b)| (n.as_str(), b.as_slice()))
                .collect();
            let runs = held.shared.len() / 2;
            let bytes: usize = files.iter().map(|(_, b)| b.len()).sum::<usize>()
                + held.shared.iter().map(|(_, b)| b.len()).sum::<usize>();
            self.install_shared(&held.shared)?;
            self.install(epoch, &files)?;
            let idle = self.idle_log_path();
            write_synced(&idle, held.idle.as_deref().unwrap_or_default())?;
            info!(
                epoch,
                bytes,
                runs,
                ms = started.elapsed().as_millis() as u64,
                replica = replica.describe(),
                "restored the checkpoint from its replica"
            );
        } else if local.is_none()
            && let Some(idle) = held.idle
        {
            write_synced(&self.idle_log_path(), &idle)?;
        }
        self.replica = Some(replica);
        Ok(self)
    }

    /// Writes the state runs of a replica's checkpoint into the state
    /// directory (each to a temporary name, synced, renamed): a run's name
    /// is unique to its contents, so one already there is kept.
    fn install_shared(&self, files: &[(String, Vec<u8>)]) -> Result<()> {
        if files.is_empty() {
            return Ok(());
        }
        let dir = &self.state_dir;
        fs::create_dir_all(dir).map_err(|e| ckpt_err("cannot create", dir, e))?;
        for (name, bytes) in files {
            plain_file_name(name, "state")?;
            let path = dir.join(name);
            if fs::metadata(&path).is_ok_and(|m| m.len() == bytes.len() as u64) {
                continue;
            }
            let tmp = dir.join(format!("{name}.tmp"));
            write_synced(&tmp, bytes)?;
            fs::rename(&tmp, &path).map_err(|e| ckpt_err("cannot rename", &tmp, e))?;
        }
        fsync_dir(dir)
    }

    /// The epoch `CURRENT` names, if any.
    fn latest_epoch(&self) -> Result<Option<u64>> {
        let current = self.dir.join("CURRENT");
        match fs::read_to_string(&current) {
            Ok(s) => Ok(s
                .trim()
                .strip_prefix("ckpt-")
                .and_then(|n| n.parse::<u64>().ok())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(ckpt_err("cannot read", &current, e)),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The state runs the kept checkpoints refer to.
    pub fn pinned_runs(&self) -> Result<std::collections::BTreeSet<String>> {
        let mut runs = std::collections::BTreeSet::new();
        let entries = fs::read_dir(&self.dir).map_err(|e| ckpt_err("cannot list", &self.dir, e))?;
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if !name.starts_with("ckpt-") || name.ends_with(".tmp") {
                continue;
            }
            let path = e.path().join("manifest.json");
            let Ok(text) = fs::read(&path) else { continue };
            let manifest: Manifest = serde_json::from_slice(&text).map_err(|err| {
                RuntimeError::Checkpoint(format!(
                    "{} is not a valid manifest: {err}",
                    path.display()
                ))
            })?;
            runs.extend(manifest.state_runs);
        }
        Ok(runs)
    }

    fn name(epoch: u64) -> String {
        format!("ckpt-{epoch:08}")
    }

    /// The latest complete checkpoint, if any.
    pub fn load_latest(&self) -> Result<Option<Loaded>> {
        let current = self.dir.join("CURRENT");
        let name = match fs::read_to_string(&current) {
            Ok(s) => s.trim().to_string(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(ckpt_err("cannot read", &current, e)),
        };
        self.load_named(&name).map(Some)
    }

    /// The checkpoint of `epoch`, if still kept.
    pub fn load_epoch(&self, epoch: u64) -> Result<Loaded> {
        self.load_named(&Self::name(epoch))
    }

    fn load_named(&self, name: &str) -> Result<Loaded> {
        let dir = self.dir.join(name);
        let manifest_path = dir.join("manifest.json");
        let text =
            fs::read(&manifest_path).map_err(|e| ckpt_err("cannot read", &manifest_path, e))?;
        let manifest: Manifest = serde_json::from_slice(&text).map_err(|e| {
            RuntimeError::Checkpoint(format!(
                "{} is not a valid manifest: {e}",
                manifest_path.display()
            ))
        })?;
        if manifest.format != CHECKPOINT_FORMAT {
            return Err(RuntimeError::Checkpoint(format!(
                "{} has format {}, this ubik reads format {CHECKPOINT_FORMAT}",
                dir.display(),
                manifest.format
            )));
        }
        let state_path = dir.join("engine.state");
        let engine_state =
            fs::read(&state_path).map_err(|e| ckpt_err("cannot read", &state_path, e))?;
        let pending_path = dir.join("pending.arrow");
        let pending = match fs::read(&pending_path) {
            Ok(b) => Some(b),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(ckpt_err("cannot read", &pending_path, e)),
        };
        Ok(Loaded {
            manifest,
            engine_state,
            pending,
        })
    }

    /// Writes a checkpoint atomically and makes it current (and saves it
    /// to the replica, if any).
    pub fn write(
        &mut self,
        manifest: &Manifest,
        engine_state: &[u8],
        pending: Option<&[u8]>,
    ) -> Result<()> {
        let json = serde_json::to_vec_pretty(manifest)
            .map_err(|e| RuntimeError::Checkpoint(format!("cannot encode manifest: {e}")))?;
        let mut files: Vec<(&str, &[u8])> = vec![("engine.state", engine_state)];
        if let Some(p) = pending {
            files.push(("pending.arrow", p));
        }
        // Last: a directory with a manifest is complete.
        files.push(("manifest.json", &json));
        self.install(manifest.epoch, &files)?;
        if let Some(replica) = &mut self.replica {
            let summary = serde_json::json!({
                "epoch": manifest.epoch,
                "source": manifest.source,
                "emitted": manifest.emitted,
                "created_ms": manifest.created_ms,
                "state_bytes": manifest.state_bytes,
                "state_keys": manifest.state_keys,
                "watermark": manifest.watermark,
            });
            let shared: Vec<SharedFile> = manifest
                .state_runs
                .iter()
                .flat_map(|run| ubik_engine::ubik_state::run::file_names(run))
                .map(|name| SharedFile {
                    path: self.state_dir.join(&name),
                    name,
                })
                .collect();
            replica.save(manifest.epoch, &files, &shared, &summary)?;
        }
        Ok(())
    }

    /// Writes checkpoint `epoch`'s files atomically and makes it current.
    fn install(&self, epoch: u64, files: &[(&str, &[u8])]) -> Result<()> {
        let name = Self::name(epoch);
        let tmp = self.dir.join(format!("{name}.tmp"));
        let fin = self.dir.join(&name);
        if tmp.exists() {
            fs::remove_dir_all(&tmp).map_err(|e| ckpt_err("cannot clear", &tmp, e))?;
        }
        fs::create_dir_all(&tmp).map_err(|e| ckpt_err("cannot create", &tmp, e))?;
        for (file, bytes) in files {
            plain_file_name(file, "checkpoint")?;
            write_synced(&tmp.join(file), bytes)?;
        }
        fsync_dir(&tmp)?;
        if fin.exists() {
            fs::remove_dir_all(&fin).map_err(|e| ckpt_err("cannot replace", &fin, e))?;
        }
        fs::rename(&tmp, &fin).map_err(|e| ckpt_err("cannot rename", &tmp, e))?;
        fsync_dir(&self.dir)?;
        let current_tmp = self.dir.join("CURRENT.tmp");
        write_synced(&current_tmp, name.as_bytes())?;
        fs::rename(&current_tmp, self.dir.join("CURRENT"))
            .map_err(|e| ckpt_err("cannot rename", &current_tmp, e))?;
        fsync_dir(&self.dir)?;
        self.prune(epoch);
        Ok(())
    }

    /// Keeps the newest `keep` checkpoints; failures only cost disk space.
    fn prune(&self, latest: u64) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            let Some(epoch) = name
                .strip_prefix("ckpt-")
                .and_then(|n| n.parse::<u64>().ok())
            else {
                continue;
            };
            if epoch + (self.keep as u64) <= latest {
                let _ = fs::remove_dir_all(e.path());
            }
        }
    }

    fn idle_log_path(&self) -> PathBuf {
        self.dir.join("idle.log")
    }

    /// Saves the idle log to the replica, if any.
    fn replicate_idle(&mut self) -> Result<()> {
        let Some(replica) = &mut self.replica else {
            return Ok(());
        };
        let path = self.dir.join("idle.log");
        let log = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(ckpt_err("cannot read", &path, e)),
        };
        Ok(replica.save_idle(&log)?)
    }

    /// Appends one idle-close decision, durably, before it takes effect.
    pub fn append_idle(&mut self, event: &IdleEvent) -> Result<()> {
        let path = self.idle_log_path();
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| ckpt_err("cannot open", &path, e))?;
        let mut line = serde_json::to_vec(event).expect("idle event encodes");
        line.push(b'\n');
        f.write_all(&line)
            .map_err(|e| ckpt_err("cannot write", &path, e))?;
        f.sync_data()
            .map_err(|e| ckpt_err("cannot sync", &path, e))?;
        self.replicate_idle()
    }

    /// Idle-close decisions logged since the last checkpoint.
    pub fn read_idle(&self, after_epoch: u64) -> Result<Vec<IdleEvent>> {
        let path = self.idle_log_path();
        let text = match fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(ckpt_err("cannot read", &path, e)),
        };
        // A torn last line (crash while appending) was never acted on.
        Ok(text
            .lines()
            .filter_map(|l| serde_json::from_str::<IdleEvent>(l).ok())
            .filter(|e| e.epoch >= after_epoch)
            .collect())
    }

    /// Drops idle decisions a checkpoint now covers.
    pub fn truncate_idle(&mut self, epoch: u64) -> Result<()> {
        let kept = self.read_idle(epoch)?;
        let mut text = Vec::new();
        for e in kept {
            text.extend(serde_json::to_vec(&e).expect("idle event encodes"));
            text.push(b'\n');
        }
        let tmp = self.dir.join("idle.log.tmp");
        write_synced(&tmp, &text)?;
        fs::rename(&tmp, self.idle_log_path()).map_err(|e| ckpt_err("cannot rename", &tmp, e))?;
        self.replicate_idle()
    }
}

/// An idle-close decision: at `position` records into `partition` (counted
/// from the start of the stream), its watermark was pushed to `watermark`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdleEvent {
    /// The epoch the decision was made in (the one after the last checkpoint).
    pub epoch: u64,
    pub partition: u32,
    pub position: u64,
    pub watermark: i64,
}

/// FNV-1a, 64 bits: a stable fingerprint (std's hasher may change between releases).
pub fn fingerprint(text: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}
