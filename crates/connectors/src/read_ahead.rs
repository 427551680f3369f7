//! Reads a file ahead on its own thread, so copying bytes out of the page
//! cache overlaps decoding and aggregation. Bounded: at most [`DEPTH`]
//! blocks wait. Only for regular files: a read of a file always returns, so
//! dropping a [`ReadAhead`] (which joins its thread) never hangs, as it
//! could on an idle pipe or terminal.

use std::io::{self, Read};
use std::sync::mpsc::{Receiver, sync_channel};
use std::thread::JoinHandle;

/// Blocks read ahead of the consumer.
const DEPTH: usize = 2;

pub struct ReadAhead {
    blocks: Option<Receiver<io::Result<Vec<u8>>>>,
    thread: Option<JoinHandle<()>>,
}

impl ReadAhead {
    /// Starts reading `reader` in blocks of up to `block` bytes.
    pub fn spawn(mut reader: Box<dyn Read + Send>, block: usize) -> io::Result<Self> {
        let (tx, rx) = sync_channel(DEPTH);
        let thread = std::thread::Builder::new()
            .name("ubik-read-ahead".into())
            .spawn(move || {
                loop {
                    let mut buf = vec![0u8; block];
                    let read = reader.read(&mut buf).map(|n| {
                        buf.truncate(n);
                        buf
                    });
                    let last = !matches!(&read, Ok(b) if !b.is_empty());
                    // A send fails once the consumer is gone: stop reading.
                    if tx.send(read).is_err() || last {
                        break;
                    }
                }
            })?;
        Ok(Self {
            blocks: Some(rx),
            thread: Some(thread),
        })
    }

    /// The next block of bytes; empty at the end of the input.
    pub fn next_block(&mut self) -> io::Result<Vec<u8>> {
        match self.blocks.as_ref().map(|rx| rx.recv()) {
            Some(Ok(block)) => block,
            // The thread ended after the last block or an error.
            _ => Ok(Vec::new()),
        }
    }
}

impl Drop for ReadAhead {
    fn drop(&mut self) {
        // Closing the channel fails the thread's next send; then join it.
        self.blocks = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_every_byte_in_order_then_empty() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let mut ra = ReadAhead::spawn(Box::new(io::Cursor::new(data.clone())), 4096).unwrap();
        let mut got = Vec::new();
        loop {
            let b = ra.next_block().unwrap();
            if b.is_empty() {
                break;
            }
            got.extend_from_slice(&b);
        }
        assert_eq!(got, data);
        assert!(ra.next_block().unwrap().is_empty());
    }

    #[test]
    fn dropping_early_stops_the_thread() {
        // On a thread of its own, so a hang fails the test instead of
        // blocking the suite.
        let (done, finished) = std::sync::mpsc::channel();
        let body = std::thread::spawn(move || {
            let data = vec![7u8; 1 << 20];
            let mut ra = ReadAhead::spawn(Box::new(io::Cursor::new(data)), 1024).unwrap();
            assert_eq!(ra.next_block().unwrap().len(), 1024);
            drop(ra); // joins; must not hang with the channel full
            let _ = done.send(());
        });
        match finished.recv_timeout(std::time::Duration::from_secs(5)) {
            Ok(()) => body.join().unwrap(),
            // The body panicked (its sender dropped unsent): report its panic.
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                if let Err(panic) = body.join() {
                    std::panic::resume_unwind(panic);
                }
                unreachable!("the body ended without reporting");
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                panic!("dropping a ReadAhead with its channel full hung for 5 s")
            }
        }
    }
}
