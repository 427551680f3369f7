//! The default sink: one `{"key":…,"value":…}` line per record on stdout.

use std::io::{BufWriter, Stdout, Write};

use ubik_connector::{ConnectorError, Sink, SinkRecord};

pub struct StdoutSink {
    out: BufWriter<Stdout>,
    line: Vec<u8>,
}

impl Default for StdoutSink {
    fn default() -> Self {
        Self {
            out: BufWriter::with_capacity(1 << 16, std::io::stdout()),
            line: Vec::with_capacity(512),
        }
    }
}

/// Writes `{"key":K,"value":V}` (without newline).
pub fn write_line(out: &mut Vec<u8>, record: &SinkRecord<'_>) {
    out.extend_from_slice(b"{\"key\":");
    out.extend_from_slice(record.key.unwrap_or(b"null"));
    out.extend_from_slice(b",\"value\":");
    out.extend_from_slice(record.value.unwrap_or(b"null"));
    out.push(b'}');
}

fn broken_pipe(e: std::io::Error) -> ConnectorError {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        ConnectorError::Fatal("stdout was closed".into())
    } else {
        ConnectorError::Io(e)
    }
}

impl Sink for StdoutSink {
    fn write(&mut self, record: SinkRecord<'_>) -> Result<(), ConnectorError> {
        self.line.clear();
        write_line(&mut self.line, &record);
        self.line.push(b'\n');
        self.out.write_all(&self.line).map_err(broken_pipe)
    }

    fn commit(&mut self) -> Result<(), ConnectorError> {
        self.out.flush().map_err(broken_pipe)
    }

    fn describe(&self) -> String {
        "stdout".into()
    }
}
