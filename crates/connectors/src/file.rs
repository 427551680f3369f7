//! `file://path.jsonl` and `-` (stdin): newline-delimited JSON, bounded.
//! The table name is the file's stem (`orders.jsonl` is table `orders`),
//! `stdin` for standard input.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::time::Duration;

use crate::read_ahead::ReadAhead;

use serde_json::json;
use ubik_connector::{Chunk, ConnectorError, Payload, Source, SourceEvent, SourcePosition};

/// Bytes read per poll: large enough to amortise decoding, small enough to
/// keep latency and memory low.
const READ_SIZE: usize = 4 << 20;

/// Where the bytes come from: a file is read ahead on a thread; stdin is
/// read in place (a read-ahead thread could block forever on an idle pipe).
enum Input {
    Direct(Box<dyn Read + Send>),
    Ahead(ReadAhead),
}

pub struct FileSource {
    name: String,
    table: String,
    input: Input,
    seekable: Option<File>,
    /// Bytes before `pending` (a record never straddles this offset).
    offset: u64,
    /// Line number of the first line in `pending`.
    line: u64,
    /// Read but not yet returned (a partial last line).
    pending: Vec<u8>,
    eof: bool,
    ended: bool,
}

impl FileSource {
    pub fn open(path: &str) -> Result<Self, ConnectorError> {
        let file = File::open(path)
            .map_err(|e| ConnectorError::Config(format!("cannot open input file {path}: {e}")))?;
        let table = std::path::Path::new(path)
            .file_stem()
            .and_then(|s| s.to_str())
            .map(|s| s.split('.').next().unwrap_or(s).to_string())
            .unwrap_or_else(|| "input".into());
        let input = Input::Ahead(ReadAhead::spawn(Box::new(file.try_clone()?), READ_SIZE)?);
        Ok(Self {
            name: format!("file://{path}"),
            table,
            input,
            seekable: Some(file),
            offset: 0,
            line: 0,
            pending: Vec::new(),
            eof: false,
            ended: false,
        })
    }

    pub fn stdin() -> Self {
        Self {
            name: "stdin".into(),
            table: "stdin".into(),
            input: Input::Direct(Box::new(std::io::stdin())),
            seekable: None,
            offset: 0,
            line: 0,
            pending: Vec::new(),
            eof: false,
            ended: false,
        }
    }

    /// Reads until `pending` holds at least one full line or the input ended.
    fn fill(&mut self) -> Result<(), ConnectorError> {
        while !self.eof {
            let len = self.pending.len();
            match &mut self.input {
                Input::Ahead(ahead) => {
                    let block = ahead.next_block()?;
                    if self.pending.is_empty() {
                        self.pending = block;
                    } else {
                        self.pending.extend_from_slice(&block);
                    }
                }
                Input::Direct(reader) => {
                    self.pending.resize(len + READ_SIZE, 0);
                    let read = reader.read(&mut self.pending[len..]);
                    let n = *read.as_ref().unwrap_or(&0);
                    self.pending.truncate(len + n);
                    read?;
                }
            }
            if self.pending.len() == len {
                self.eof = true;
                break;
            }
            if memchr::memchr(b'\n', &self.pending[len..]).is_some()
                && self.pending.len() >= READ_SIZE / 2
            {
                break;
            }
        }
        Ok(())
    }
}

impl Source for FileSource {
    fn table(&self) -> &str {
        &self.table
    }

    fn partitions(&self) -> Vec<u32> {
        vec![0]
    }

    fn poll(
        &mut self,
        max_records: usize,
        _timeout: Duration,
    ) -> Result<SourceEvent, ConnectorError> {
        loop {
            if self.ended {
                return Ok(SourceEvent::End);
            }
            if !self.eof && self.pending.len() < READ_SIZE / 2 {
                self.fill()?;
            }
            // Complete lines only, unless the input ended (the last line may lack '\n').
            let cut = if self.eof {
                self.pending.len()
            } else {
                memchr::memrchr(b'\n', &self.pending).map_or(0, |i| i + 1)
            };
            if cut == 0 {
                if self.eof {
                    self.ended = true;
                    return Ok(SourceEvent::PartitionEnd(0));
                }
                continue;
            }
            let mut spans = Vec::new();
            let mut positions = Vec::new();
            let mut start = 0;
            let mut line = self.line;
            while start < cut && spans.len() < max_records {
                let nl =
                    memchr::memchr(b'\n', &self.pending[start..cut]).map_or(cut, |i| start + i);
                let mut rec = start..nl;
                if rec.end > rec.start && self.pending[rec.end - 1] == b'\r' {
                    rec.end -= 1;
                }
                if self.pending[rec.clone()]
                    .iter()
                    .any(|c| !c.is_ascii_whitespace())
                {
                    spans.push(rec);
                    positions.push(line + 1);
                }
                line += 1;
                start = (nl + 1).min(cut);
            }
            // The chunk takes the buffer; the partial last line starts the next one.
            let rest = self.pending.split_off(start);
            let data = std::mem::replace(&mut self.pending, rest);
            self.offset += data.len() as u64;
            self.line = line;
            if spans.is_empty() {
                continue;
            }
            return Ok(SourceEvent::Chunk(Chunk {
                partition: 0,
                payload: Payload::Bytes { data, spans },
                positions,
                position_name: "line",
                meta: Default::default(),
            }));
        }
    }

    fn position(&self) -> SourcePosition {
        json!({ "offset": self.offset, "line": self.line, "ended": self.ended })
    }

    fn seek(&mut self, position: &SourcePosition) -> Result<(), ConnectorError> {
        let offset = position["offset"].as_u64().unwrap_or(0);
        let line = position["line"].as_u64().unwrap_or(0);
        match self.seekable.as_mut() {
            Some(f) => {
                // Stop the old read-ahead before moving the shared file offset.
                self.input = Input::Direct(Box::new(std::io::empty()));
                f.seek(SeekFrom::Start(offset))?;
                self.input = Input::Ahead(ReadAhead::spawn(Box::new(f.try_clone()?), READ_SIZE)?);
            }
            None if offset == 0 => {}
            None => {
                return Err(ConnectorError::Config(
                    "stdin cannot be replayed from a checkpoint; use a file or a Kafka topic, or start without the checkpoint".into(),
                ));
            }
        }
        self.offset = offset;
        self.line = line;
        self.pending.clear();
        self.eof = false;
        self.ended = position["ended"].as_bool().unwrap_or(false);
        Ok(())
    }

    fn replayable(&self) -> bool {
        self.seekable.is_some()
    }

    fn sample(&mut self, n: usize) -> Result<Vec<Vec<u8>>, ConnectorError> {
        if self.pending.is_empty() {
            self.fill()?;
        }
        let complete = if self.eof {
            self.pending.len()
        } else {
            memchr::memrchr(b'\n', &self.pending).map_or(0, |i| i + 1)
        };
        Ok(self.pending[..complete]
            .split(|&c| c == b'\n')
            .filter(|l| l.iter().any(|c| !c.is_ascii_whitespace()))
            .take(n)
            .map(|l| l.to_vec())
            .collect())
    }

    fn describe(&self) -> String {
        self.name.clone()
    }
}
