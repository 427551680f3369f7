//! The engine's part of a checkpoint: watermarks and operator state, encoded
//! as one self-describing blob (a JSON header, then one Arrow IPC stream per
//! state entry). The runtime stores it beside source positions, atomically.

use std::io::Cursor;

use arrow::array::RecordBatch;
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::StreamWriter;
use serde::{Deserialize, Serialize};

use ubik_state::StoreManifest;

use crate::error::{EngineError, Result};
use crate::operator::OperatorSnapshot;
use crate::progress::Progress;
use crate::state::StateEntry;

const MAGIC: &[u8; 8] = b"UBIKQS01";
/// Bumped whenever the layout of operator state changes. Format 2 added
/// the state store: state kept there is named by the header's `store`
/// (runs in the store's directory) instead of being in the blob. Format 1
/// (everything in the blob) still restores.
pub const STATE_FORMAT_VERSION: u32 = 2;
const OLDEST_READABLE_FORMAT: u32 = 1;

#[derive(Debug, Default)]
pub struct QuerySnapshot {
    pub progress: Progress,
    pub fired: i64,
    pub operator: OperatorSnapshot,
    /// The store's runs holding the rest of the state, if the query has a durable store.
    pub store: Option<StoreManifest>,
}

#[derive(Serialize, Deserialize)]
struct Header {
    format: u32,
    progress: Progress,
    fired: i64,
    meta: serde_json::Value,
    entries: Vec<(String, u64)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    store: Option<StoreManifest>,
}

impl QuerySnapshot {
    pub fn encode(&self) -> Result<Vec<u8>> {
        let mut blobs = Vec::with_capacity(self.operator.batches.len());
        for (entry, batch) in &self.operator.batches {
            let mut buf = Vec::new();
            {
                let mut w = StreamWriter::try_new(&mut buf, &batch.schema())?;
                w.write(batch)?;
                w.finish()?;
            }
            blobs.push((entry.name(), buf));
        }
        let header = Header {
            format: STATE_FORMAT_VERSION,
            progress: self.progress.clone(),
            fired: self.fired,
            meta: self.operator.meta.clone(),
            store: self.store.clone(),
            entries: blobs
                .iter()
                .map(|(n, b)| (n.clone(), b.len() as u64))
                .collect(),
        };
        let json = serde_json::to_vec(&header)
            .map_err(|e| EngineError::Checkpoint(format!("encoding header: {e}")))?;
        let total: usize = blobs.iter().map(|(_, b)| b.len()).sum();
        let mut out = Vec::with_capacity(12 + json.len() + total);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(json.len() as u32).to_le_bytes());
        out.extend_from_slice(&json);
        for (_, b) in blobs {
            out.extend_from_slice(&b);
        }
        Ok(out)
    }

    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let bad = |what: &str| EngineError::Checkpoint(format!("engine state is corrupt: {what}"));
        if bytes.len() < 12 || &bytes[..8] != MAGIC {
            return Err(bad("missing header"));
        }
        let len = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes")) as usize;
        let json = bytes
            .get(12..12 + len)
            .ok_or_else(|| bad("truncated header"))?;
        let header: Header =
            serde_json::from_slice(json).map_err(|e| bad(&format!("header: {e}")))?;
        if !(OLDEST_READABLE_FORMAT..=STATE_FORMAT_VERSION).contains(&header.format) {
            return Err(EngineError::Checkpoint(format!(
                "engine state format {} is not supported by this build (it reads formats {OLDEST_READABLE_FORMAT} to {STATE_FORMAT_VERSION}); resume it with the ubik release that wrote it, or start this pipeline with a new checkpoint directory",
                header.format
            )));
        }
        let mut pos = 12 + len;
        let mut batches = Vec::with_capacity(header.entries.len());
        for (name, blen) in header.entries {
            let blob = bytes
                .get(pos..pos + blen as usize)
                .ok_or_else(|| bad("truncated state"))?;
            pos += blen as usize;
            let mut reader = StreamReader::try_new(Cursor::new(blob), None)?;
            let batch: RecordBatch = reader.next().ok_or_else(|| bad("empty entry"))??;
            batches.push((StateEntry::parse(&name)?, batch));
        }
        Ok(QuerySnapshot {
            progress: header.progress,
            fired: header.fired,
            operator: OperatorSnapshot {
                batches,
                meta: header.meta,
            },
            store: header.store,
        })
    }
}
