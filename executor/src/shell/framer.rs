//! Where a session command's output starts and ends: the session shell writes a start marker (a byte 0x1E,
//! the session's token, `+`, a newline) on stdout as the command starts, and an end marker (0x1E, the
//! token, on stdout `:STATUS`, then a newline) after each command, on stdout and on stderr. The framer
//! passes everything else on as output and reports the markers; a marker split across reads is put
//! together, and output that merely starts like one is held back only until it cannot be one.

use bytes::{Buf, Bytes, BytesMut};

/// A piece of one stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Piece {
    Output(Bytes),
    /// The start marker: the command runs.
    Start,
    /// The end marker; on stdout with the command's exit status.
    End(Option<i32>),
}

/// Longest status text after a marker (`:-2147483648`).
const MAX_STATUS: usize = 16;

#[derive(Debug)]
pub(crate) struct Framer {
    marker: Vec<u8>,
    buf: BytesMut,
}

impl Framer {
    pub(crate) fn new(token: &str) -> Self {
        let mut marker = vec![0x1e];
        marker.extend_from_slice(token.as_bytes());
        Self {
            marker,
            buf: BytesMut::new(),
        }
    }

    /// Takes `data`; returns what can be told now.
    pub(crate) fn feed(&mut self, data: &[u8]) -> Vec<Piece> {
        self.buf.extend_from_slice(data);
        let mut pieces = Vec::new();
        loop {
            match find(&self.buf, &self.marker) {
                Some(at) => {
                    if at > 0 {
                        pieces.push(Piece::Output(self.buf.split_to(at).freeze()));
                    }
                    let after = &self.buf[self.marker.len()..];
                    let Some(newline) = after.iter().position(|b| *b == b'\n') else {
                        if after.len() > MAX_STATUS {
                            // Not our marker after all (no newline where one must be): pass its first byte on.
                            pieces.push(Piece::Output(self.buf.split_to(1).freeze()));
                            continue;
                        }
                        break;
                    };
                    let piece = if &after[..newline] == b"+" {
                        Piece::Start
                    } else {
                        Piece::End(
                            std::str::from_utf8(&after[..newline])
                                .ok()
                                .and_then(|s| s.strip_prefix(':'))
                                .and_then(|s| s.parse::<i32>().ok()),
                        )
                    };
                    self.buf.advance(self.marker.len() + newline + 1);
                    pieces.push(piece);
                }
                None => {
                    // Everything but a tail that could begin a marker.
                    let keep = partial_tail(&self.buf, &self.marker);
                    let send = self.buf.len() - keep;
                    if send > 0 {
                        pieces.push(Piece::Output(self.buf.split_to(send).freeze()));
                    }
                    break;
                }
            }
        }
        pieces
    }

    /// What is held back, when the stream ends.
    pub(crate) fn rest(&mut self) -> Option<Bytes> {
        (!self.buf.is_empty()).then(|| self.buf.split().freeze())
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The length of the longest end of `buf` that is a proper beginning of `marker`.
fn partial_tail(buf: &[u8], marker: &[u8]) -> usize {
    (1..marker.len().min(buf.len() + 1))
        .rev()
        .find(|&n| buf.ends_with(&marker[..n]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out(s: &str) -> Piece {
        Piece::Output(Bytes::copy_from_slice(s.as_bytes()))
    }

    #[test]
    fn output_and_markers_are_told_apart_however_the_reads_fall() {
        let whole = "\x1etok+\nhello\nno newline\x1etok:3\n\x1etok+\nnext\x1etok:0\n";
        let expected_text = "hello\nno newlinenext";
        // Every way of cutting the stream in two gives the same output and ends.
        for cut in 0..=whole.len() {
            let mut f = Framer::new("tok");
            let mut pieces = f.feed(&whole.as_bytes()[..cut]);
            pieces.extend(f.feed(&whole.as_bytes()[cut..]));
            let text: String = pieces
                .iter()
                .filter_map(|p| match p {
                    Piece::Output(b) => Some(String::from_utf8_lossy(b).into_owned()),
                    Piece::Start | Piece::End(_) => None,
                })
                .collect();
            let starts = pieces.iter().filter(|p| **p == Piece::Start).count();
            assert_eq!(starts, 2, "cut at {cut}");
            let ends: Vec<_> = pieces
                .iter()
                .filter_map(|p| match p {
                    Piece::End(s) => Some(*s),
                    Piece::Start | Piece::Output(_) => None,
                })
                .collect();
            assert_eq!(text, expected_text, "cut at {cut}");
            assert_eq!(ends, [Some(3), Some(0)], "cut at {cut}");
            assert_eq!(f.rest(), None);
        }
    }

    #[test]
    fn stderr_markers_carry_no_status_and_lookalikes_pass() {
        let mut f = Framer::new("tok");
        assert_eq!(f.feed(b"err\x1etok\n"), [out("err"), Piece::End(None)]);
        // The separator byte alone, or followed by something else, is output.
        assert_eq!(f.feed(b"a\x1ex"), [out("a\x1ex")]);
        assert_eq!(f.feed(b"b\x1et"), [out("b")]);
        assert_eq!(f.rest(), Some(Bytes::from_static(b"\x1et")));
        // A marker with no newline where one must be is not a marker.
        let mut f = Framer::new("tok");
        let long = format!("\x1etok{}", "9".repeat(40));
        let pieces = f.feed(long.as_bytes());
        let text: Vec<u8> = pieces
            .iter()
            .flat_map(|p| match p {
                Piece::Output(b) => b.to_vec(),
                Piece::Start | Piece::End(_) => panic!("no marker"),
            })
            .collect();
        assert_eq!(text, long.as_bytes());
    }
}
