//! A WebSocket client just big enough for the tests that watch a socket through the HTTP listener (the
//! preview proxy's tunnels, the web terminal's socket): a handshake written by hand, masked frames out,
//! unfragmented frames in, and how long the server takes to close it. No crate for it: RFC 6455's framing is
//! a few lines.

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// Opcodes of the frames the tests look at.
pub const TEXT: u8 = 1;
pub const BINARY: u8 = 2;
pub const CLOSE: u8 = 8;

/// An open WebSocket.
pub struct Ws {
    stream: TcpStream,
    /// Bytes read past the last frame taken.
    buffered: Vec<u8>,
}

/// A frame from the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub opcode: u8,
    pub payload: Vec<u8>,
}

impl Frame {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.payload).into_owned()
    }
}

/// Opens a WebSocket at `path` of `127.0.0.1:port` with `headers` (`Name: value` lines, each ending in
/// `\r\n`) added to the handshake; fails with the answer when it is not `101`.
pub async fn connect(port: u16, path: &str, headers: &str) -> Result<Ws> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n{headers}\r\n"
    );
    stream.write_all(request.as_bytes()).await?;
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    let end = loop {
        if let Some(end) = answer.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        let n = tokio::time::timeout(Duration::from_secs(30), stream.read(&mut buf))
            .await
            .context("no answer to the handshake")??;
        ensure!(
            n > 0,
            "closed during the handshake: {}",
            String::from_utf8_lossy(&answer)
        );
        answer.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&answer[..end]).into_owned();
    ensure!(
        head.starts_with("HTTP/1.1 101"),
        "not upgraded: {}",
        String::from_utf8_lossy(&answer)
    );
    Ok(Ws {
        stream,
        buffered: answer[end..].to_vec(),
    })
}

impl Ws {
    /// Sends one masked frame.
    pub async fn send(&mut self, opcode: u8, payload: &[u8]) -> Result<()> {
        // Any mask does: servers unmask, nothing more (RFC 6455 wants it unpredictable for browsers' sake).
        let mask = [0x37, 0xfa, 0x21, 0x3d];
        let mut frame = vec![0x80 | opcode];
        let n = payload.len();
        if n < 126 {
            frame.push(0x80 | u8::try_from(n)?);
        } else if n < 65536 {
            frame.push(0x80 | 126);
            frame.extend_from_slice(&u16::try_from(n)?.to_be_bytes());
        } else {
            frame.push(0x80 | 127);
            frame.extend_from_slice(&u64::try_from(n)?.to_be_bytes());
        }
        frame.extend_from_slice(&mask);
        frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        self.stream.write_all(&frame).await?;
        Ok(())
    }

    pub async fn send_text(&mut self, text: &str) -> Result<()> {
        self.send(TEXT, text.as_bytes()).await
    }

    /// The next frame, `None` once the server closed the connection; fails after `wait`.
    pub async fn next(&mut self, wait: Duration) -> Result<Option<Frame>> {
        tokio::time::timeout(wait, self.read_frame())
            .await
            .with_context(|| format!("no frame and no close within {wait:?}"))?
    }

    /// The next text or binary frame (pings are skipped), failing on a close.
    pub async fn next_message(&mut self, wait: Duration) -> Result<Frame> {
        let deadline = Instant::now() + wait;
        loop {
            match self
                .next(deadline.saturating_duration_since(Instant::now()))
                .await?
            {
                Some(f) if f.opcode == TEXT || f.opcode == BINARY => return Ok(f),
                Some(f) if f.opcode == CLOSE => bail!("closed by the server: {f:?}"),
                None => bail!("the connection ended"),
                Some(_) => {}
            }
        }
    }

    /// Waits at most `wait` for the server to close the socket (a close frame or the connection's end) and
    /// returns how long it took and the frames that came before.
    pub async fn closed_within(&mut self, wait: Duration) -> Result<(Duration, Vec<Frame>)> {
        let start = Instant::now();
        let mut before = Vec::new();
        loop {
            let left = wait.saturating_sub(start.elapsed());
            let next = tokio::time::timeout(left, self.read_frame())
                .await
                .with_context(|| {
                    format!("still open {wait:?} later, after {} frames", before.len())
                })?;
            match next {
                // A reset is a close too.
                Ok(None) | Err(_) => return Ok((start.elapsed(), before)),
                Ok(Some(f)) if f.opcode == CLOSE => return Ok((start.elapsed(), before)),
                Ok(Some(f)) => before.push(f),
            }
        }
    }

    async fn fill(&mut self, want: usize) -> Result<bool> {
        let mut buf = [0u8; 8192];
        while self.buffered.len() < want {
            let n = self.stream.read(&mut buf).await?;
            if n == 0 {
                return Ok(false);
            }
            self.buffered.extend_from_slice(&buf[..n]);
        }
        Ok(true)
    }

    async fn read_frame(&mut self) -> Result<Option<Frame>> {
        if !self.fill(2).await? {
            return Ok(None);
        }
        let (b0, b1) = (self.buffered[0], self.buffered[1]);
        let (mut head, len) = match b1 & 0x7f {
            126 => {
                if !self.fill(4).await? {
                    return Ok(None);
                }
                (
                    4,
                    usize::from(u16::from_be_bytes([self.buffered[2], self.buffered[3]])),
                )
            }
            127 => {
                if !self.fill(10).await? {
                    return Ok(None);
                }
                let mut n = [0u8; 8];
                n.copy_from_slice(&self.buffered[2..10]);
                (10, usize::try_from(u64::from_be_bytes(n))?)
            }
            n => (2, usize::from(n)),
        };
        let masked = b1 & 0x80 != 0;
        if masked {
            head += 4;
        }
        if !self.fill(head + len).await? {
            return Ok(None);
        }
        let mut payload: Vec<u8> = self.buffered[head..head + len].to_vec();
        if masked {
            let mask = &self.buffered[head - 4..head];
            for (i, b) in payload.iter_mut().enumerate() {
                *b ^= mask[i % 4];
            }
        }
        self.buffered.drain(..head + len);
        Ok(Some(Frame {
            opcode: b0 & 0x0f,
            payload,
        }))
    }
}
