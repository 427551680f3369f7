//! The checkpoint replica contract: a durable copy of a task's checkpoints
//! outside its machine, so that any process can take the task over.

use crate::ConnectorError;

use std::path::PathBuf;

/// A checkpoint as files: `(name, bytes)`.
pub type CheckpointFiles = Vec<(String, Vec<u8>)>;

/// An immutable file a checkpoint rests on (a state store run), shared by
/// consecutive checkpoints: its name is unique to its contents, and it is
/// read from `path` only the first time a checkpoint names it.
#[derive(Debug, Clone)]
pub struct SharedFile {
    pub name: String,
    pub path: PathBuf,
}

/// What a replica holds for its task.
#[derive(Debug, Default)]
pub struct Replicated {
    /// The latest saved checkpoint: its epoch and files.
    pub checkpoint: Option<(u64, CheckpointFiles)>,
    /// The shared files that checkpoint rests on.
    pub shared: CheckpointFiles,
    /// The idle-close log saved with [`CheckpointReplica::save_idle`].
    pub idle: Option<Vec<u8>>,
}

/// A durable copy of one task's checkpoints (Kafka: a compacted topic).
///
/// Fault-tolerance contract:
/// - the runtime saves a checkpoint only after it is complete locally, and
///   that is only after the output it covers was committed; so a replica
///   may lag the local copy, but it never holds a checkpoint ahead of the
///   committed output, and restoring any checkpoint it returns replays
///   byte-identical records;
/// - [`CheckpointReplica::save`] and [`CheckpointReplica::save_idle`] return
///   only once durable; a checkpoint is returned by `load` whole or not at
///   all, never mixed with another writer's files (a fenced former owner
///   may still be saving);
/// - the idle log is saved before the idle decision it records takes
///   effect, so a takeover replays it at the same input positions;
/// - a shared file is uploaded once, by the first save that names it, and
///   kept while the latest saved checkpoint names it: a save costs the new
///   shared files plus the checkpoint's own files, not the whole state, and
///   `load` returns every shared file of the checkpoint it returns.
pub trait CheckpointReplica: Send {
    /// Saves checkpoint `epoch`: its own `files`, and the `shared` files it
    /// rests on; `summary` (positions, watermark, counters) is kept readable
    /// without the files, for status reports.
    fn save(
        &mut self,
        epoch: u64,
        files: &[(&str, &[u8])],
        shared: &[SharedFile],
        summary: &serde_json::Value,
    ) -> Result<(), ConnectorError>;
    /// Replaces the saved idle-close log.
    fn save_idle(&mut self, log: &[u8]) -> Result<(), ConnectorError>;
    fn load(&mut self) -> Result<Replicated, ConnectorError>;
    /// For logs ("kafka://.../pipeline-checkpoints task 3").
    fn describe(&self) -> String;
}
