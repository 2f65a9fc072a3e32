//! Bridges between async gRPC streams and the blocking `Read` / `Write` the tar crate works with, over
//! bounded channels (a slow side makes the other wait; memory stays at a few chunks).

use std::io::{Read, Write};

use bytes::{Buf as _, Bytes, BytesMut};
use tokio::sync::mpsc;

use super::CHUNK;
use crate::error::Error;

/// What the async side feeds a [`ChannelReader`].
#[derive(Debug)]
pub(crate) enum Feed {
    Data(Bytes),
    /// The stream was committed and ended cleanly. A channel closed without it means the stream failed,
    /// was cut or ended without its commit, and the reader reports an error instead of a (possibly
    /// truncated) end of file.
    End,
}

/// A blocking reader over chunks sent by an async task.
pub(crate) struct ChannelReader {
    rx: mpsc::Receiver<Feed>,
    current: Bytes,
    ended: bool,
}

impl ChannelReader {
    pub(crate) fn new(rx: mpsc::Receiver<Feed>) -> Self {
        Self {
            rx,
            current: Bytes::new(),
            ended: false,
        }
    }
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            if self.ended {
                return Ok(0);
            }
            match self.rx.blocking_recv() {
                Some(Feed::Data(b)) => self.current = b,
                Some(Feed::End) => self.ended = true,
                None => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "the upload stream ended before its end",
                    ));
                }
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        self.current.advance(n);
        Ok(n)
    }
}

/// A blocking writer that sends what is written to an async receiver in chunks of [`CHUNK`] bytes.
pub(crate) struct ChannelWriter {
    tx: mpsc::Sender<Result<Bytes, Error>>,
    buf: BytesMut,
}

impl ChannelWriter {
    pub(crate) fn new(tx: mpsc::Sender<Result<Bytes, Error>>) -> Self {
        Self {
            tx,
            buf: BytesMut::with_capacity(CHUNK),
        }
    }

    fn send(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = self.buf.split().freeze();
        self.tx.blocking_send(Ok(chunk)).map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the download was abandoned")
        })
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let n = data.len().min(CHUNK - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() >= CHUNK {
            self.send()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send()
    }
}
