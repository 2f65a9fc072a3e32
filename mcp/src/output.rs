//! What a tool gives the model: output kept within a limit (its head and its tail, with a note saying how
//! much was left out between them), and terminal colour codes taken out of tracebacks.

use std::collections::VecDeque;

/// Bytes of one output the tools give back at most, by default (`mentis mcp --max-output`).
pub const DEFAULT_MAX_OUTPUT: usize = 20_000;

/// A stream of bytes kept within `limit`: the first half of the limit and the last half, and the count of
/// everything. Memory stays bounded however much a command prints.
#[derive(Debug)]
pub struct Capped {
    head: Vec<u8>,
    tail: VecDeque<u8>,
    half: usize,
    total: u64,
}

impl Capped {
    pub fn new(limit: usize) -> Self {
        Self {
            head: Vec::new(),
            tail: VecDeque::new(),
            half: (limit / 2).max(1),
            total: 0,
        }
    }

    pub fn push(&mut self, mut data: &[u8]) {
        self.total += data.len() as u64;
        if self.head.len() < self.half {
            let n = (self.half - self.head.len()).min(data.len());
            self.head.extend_from_slice(&data[..n]);
            data = &data[n..];
        }
        if data.len() >= self.half {
            self.tail.clear();
            self.tail.extend(&data[data.len() - self.half..]);
            return;
        }
        let over = (self.tail.len() + data.len()).saturating_sub(self.half);
        self.tail.drain(..over);
        self.tail.extend(data);
    }

    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Everything pushed, as text (invalid UTF-8 replaced); beyond the limit, the head, a note and the tail.
    pub fn text(&self) -> String {
        let kept = (self.head.len() + self.tail.len()) as u64;
        let head = String::from_utf8_lossy(&self.head);
        let (a, b) = self.tail.as_slices();
        let tail = String::from_utf8_lossy(&[a, b].concat()).into_owned();
        if kept == self.total {
            return format!("{head}{tail}");
        }
        let cut = self.total - kept;
        format!(
            "{head}\n[... {cut} bytes left out of {} here: the output is over this server's limit of {} bytes. \
             Write it to a file and read parts of it, or print less ...]\n{tail}",
            self.total,
            2 * self.half
        )
    }
}

/// `text` within `limit` bytes, cut the way [`Capped`] cuts.
pub fn capped(text: &str, limit: usize) -> String {
    let mut c = Capped::new(limit);
    c.push(text.as_bytes());
    c.text()
}

/// `text` without ANSI escape sequences (IPython colours its tracebacks).
pub fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\u{1b}' {
            out.push(c);
            continue;
        }
        match chars.peek() {
            // CSI: parameters and intermediates, then one final byte in @..~.
            Some('[') => {
                chars.next();
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
            // OSC: up to BEL or ESC \.
            Some(']') => {
                chars.next();
                while let Some(c) = chars.next() {
                    if c == '\u{7}' {
                        break;
                    }
                    if c == '\u{1b}' && chars.peek() == Some(&'\\') {
                        chars.next();
                        break;
                    }
                }
            }
            // Two-character sequences.
            Some(_) => {
                chars.next();
            }
            None => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_within_the_limit_is_whole() {
        let mut c = Capped::new(10);
        c.push(b"abc");
        c.push(b"de");
        assert_eq!(c.text(), "abcde");
        let mut c = Capped::new(10);
        c.push(b"0123456789");
        assert_eq!(c.text(), "0123456789");
    }

    #[test]
    fn output_over_the_limit_keeps_head_and_tail_and_says_how_much_is_cut() {
        let mut c = Capped::new(10);
        for chunk in [&b"01234"[..], b"5678", b"9abcdefgh", b"ij"] {
            c.push(chunk);
        }
        let text = c.text();
        assert!(
            text.starts_with("01234\n[... 10 bytes left out of 20 here"),
            "{text}"
        );
        assert!(text.ends_with("]\nfghij"), "{text}");
        // One push larger than the limit.
        let big = "x".repeat(5) + &"-".repeat(1000) + "yyyyy";
        let text = capped(&big, 10);
        assert!(
            text.starts_with("xxxxx\n[... 1000 bytes left out of 1010"),
            "{text}"
        );
        assert!(text.ends_with("yyyyy"), "{text}");
    }

    #[test]
    fn a_cut_inside_a_character_is_replaced_not_a_panic() {
        let text = capped(&"é".repeat(100), 11);
        assert!(text.contains("bytes left out"));
    }

    #[test]
    fn colour_codes_are_stripped() {
        let tb = "\u{1b}[0;31mZeroDivisionError\u{1b}[0m: division by zero\u{1b}]0;title\u{7}!";
        assert_eq!(strip_ansi(tb), "ZeroDivisionError: division by zero!");
        assert_eq!(strip_ansi("plain"), "plain");
    }
}
