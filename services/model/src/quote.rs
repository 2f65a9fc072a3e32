//! Quoting client input in error messages: at most a short prefix, so a message never carries a whole
//! oversized field back (a 3 MB image name echoed whole broke clients on the gRPC metadata limit).

use std::fmt;

/// How many characters of the input a message quotes at most.
pub const QUOTE_CHARS: usize = 64;

/// Longest message (in characters) passed on from another service (the executor's statuses), which may
/// quote its input whole.
pub const MAX_MESSAGE_CHARS: usize = 512;

/// `message` cut to its first [`MAX_MESSAGE_CHARS`] characters, with "…" when it was longer.
pub fn bounded(message: &str) -> String {
    match message.char_indices().nth(MAX_MESSAGE_CHARS) {
        Some((i, _)) => format!("{}…", &message[..i]),
        None => message.to_owned(),
    }
}

/// `s` as a message quotes it: Rust-quoted (control characters escaped), cut to its first
/// [`QUOTE_CHARS`] characters with "…" after the quote when it is longer.
pub fn quoted(s: &str) -> Quoted<'_> {
    Quoted(s)
}

/// See [`quoted`]; formats without allocating the whole input.
#[derive(Clone, Copy)]
pub struct Quoted<'a>(&'a str);

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (head, cut) = match self.0.char_indices().nth(QUOTE_CHARS) {
            Some((i, _)) => (&self.0[..i], true),
            None => (self.0, false),
        };
        write!(f, "{head:?}")?;
        if cut {
            write!(f, "… ({} bytes)", self.0.len())?;
        }
        Ok(())
    }
}

impl fmt::Debug for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_input_is_quoted_whole() {
        assert_eq!(quoted("abc").to_string(), "\"abc\"");
        assert_eq!(quoted("").to_string(), "\"\"");
        assert_eq!(quoted("a\0b\n").to_string(), "\"a\\0b\\n\"");
        let exact = "x".repeat(QUOTE_CHARS);
        assert_eq!(quoted(&exact).to_string(), format!("{exact:?}"));
    }

    #[test]
    fn long_input_is_cut_to_a_prefix_with_its_size() {
        let huge = "y".repeat(3 << 20);
        let q = quoted(&huge).to_string();
        assert!(q.len() < 120, "{q}");
        assert!(
            q.starts_with(&format!("\"{}\"…", "y".repeat(QUOTE_CHARS))),
            "{q}"
        );
        assert!(q.ends_with(&format!("({} bytes)", 3 << 20)), "{q}");
    }

    #[test]
    fn messages_from_elsewhere_are_bounded() {
        assert_eq!(bounded("short"), "short");
        let long = "z".repeat(10_000);
        assert_eq!(
            bounded(&long),
            format!("{}…", "z".repeat(MAX_MESSAGE_CHARS))
        );
    }

    #[test]
    fn a_cut_never_splits_a_character() {
        let wide = "é".repeat(QUOTE_CHARS + 5);
        let q = quoted(&wide).to_string();
        assert!(
            q.starts_with(&format!("\"{}\"…", "é".repeat(QUOTE_CHARS))),
            "{q}"
        );
    }
}
