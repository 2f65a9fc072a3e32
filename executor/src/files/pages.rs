//! ListFiles in pages: a depth-first walk with each directory's names in byte order, which resumes after the
//! last entry of the page before without walking what came before it (it skips whole subtrees by name), so
//! every page costs about the same however deep into a big tree it is. A page stops at a count and before a
//! byte bound, so no answer comes near a default client's 4 MiB message limit.
//!
//! The page token is opaque to clients: hex of `[version][recursive][FNV-1a 64 of the listed path][the last
//! entry's path below the listed directory, names joined by '/']`.

use std::ffi::{OsStr, OsString};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::{OsStrExt as _, OsStringExt as _};

use mentis_proto::executor::{FileInfo, FileType};
use prost::Message as _;

use super::info;
use super::path::{WsPath, open_dir_at};
use super::tree::names;
use crate::error::Error;

/// Entries per page when the request says 0, and the most it may ask for.
pub(crate) const DEFAULT_PAGE: usize = 1000;
pub(crate) const MAX_PAGE: usize = 10_000;
/// A page stops before its entries encode to more than this.
pub(crate) const PAGE_BYTES: usize = 1024 * 1024;
const VERSION: u8 = 1;

/// One page of a listing, and the token of the next one (`None` on the last).
#[derive(Debug)]
pub(crate) struct Page {
    pub(crate) files: Vec<FileInfo>,
    pub(crate) next: Option<String>,
}

/// Which page to list.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PageRequest<'a> {
    pub(crate) recursive: bool,
    pub(crate) size: u32,
    pub(crate) token: &'a str,
}

fn fnv64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn encode(listed: &WsPath, recursive: bool, last: &[u8]) -> String {
    let mut raw = Vec::with_capacity(10 + last.len());
    raw.push(VERSION);
    raw.push(u8::from(recursive));
    raw.extend_from_slice(&fnv64(listed.display().as_bytes()).to_le_bytes());
    raw.extend_from_slice(last);
    raw.iter().map(|b| format!("{b:02x}")).collect()
}

/// The names below the listed directory after which the page starts (empty: from the start).
fn decode(token: &str, listed: &WsPath, recursive: bool) -> Result<Vec<OsString>, Error> {
    if token.is_empty() {
        return Ok(Vec::new());
    }
    let bad = |why: &str| Error::InvalidArgument(format!("page_token is not valid: {why}"));
    if !token.len().is_multiple_of(2) || token.len() > 2 * (10 + 64 * 1024) {
        return Err(bad("it is not a token this executor gave"));
    }
    let raw: Vec<u8> = (0..token.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&token[i..i + 2], 16))
        .collect::<Result<_, _>>()
        .map_err(|_| bad("it is not a token this executor gave"))?;
    if raw.len() < 11 || raw[0] != VERSION {
        return Err(bad("it is not a token this executor gave"));
    }
    let mut hash = [0u8; 8];
    hash.copy_from_slice(&raw[2..10]);
    if raw[1] != u8::from(recursive)
        || u64::from_le_bytes(hash) != fnv64(listed.display().as_bytes())
    {
        return Err(bad(
            "it belongs to another listing (path or recursive differ)",
        ));
    }
    Ok(raw[10..]
        .split(|b| *b == b'/')
        .map(|n| OsString::from_vec(n.to_vec()))
        .collect())
}

/// A directory being walked: its entries in byte order and the next one to take.
struct Frame {
    fd: OwnedFd,
    at: WsPath,
    /// Its path below the listed directory ('/'-joined names; empty for the listed directory itself).
    rel: Vec<u8>,
    names: Vec<OsString>,
    next: usize,
}

impl Frame {
    fn open(fd: OwnedFd, at: WsPath, rel: Vec<u8>) -> Result<Self, Error> {
        let mut names = names(&fd, &at.display())?;
        names.sort_unstable_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        Ok(Self {
            fd,
            at,
            rel,
            names,
            next: 0,
        })
    }

    fn child_rel(&self, name: &OsStr) -> Vec<u8> {
        let mut rel = self.rel.clone();
        if !rel.is_empty() {
            rel.push(b'/');
        }
        rel.extend_from_slice(name.as_bytes());
        rel
    }

    /// The directory `name` below this one, when it is one (a link or anything else is not descended).
    fn descend(&self, name: &OsStr) -> Option<Frame> {
        let child = self.at.join(name);
        let sub = open_dir_at(&self.fd, name).ok()?;
        Frame::open(sub, child, self.child_rel(name)).ok()
    }
}

/// One page of the entries below `dir` (at `listed`).
pub(crate) fn list(dir: OwnedFd, listed: &WsPath, page: PageRequest<'_>) -> Result<Page, Error> {
    let size = match page.size as usize {
        0 => DEFAULT_PAGE,
        n => n.min(MAX_PAGE),
    };
    let cursor = decode(page.token, listed, page.recursive)?;
    // The frames down to where the page before stopped, each positioned after it.
    let mut stack = Vec::new();
    let mut frame = Frame::open(dir, listed.clone(), Vec::new())?;
    let mut rest = cursor.as_slice();
    loop {
        let Some((first, deeper)) = rest.split_first() else {
            stack.push(frame);
            break;
        };
        let at = frame
            .names
            .partition_point(|n| n.as_bytes() < first.as_bytes());
        let found = frame.names.get(at).is_some_and(|n| n == first);
        frame.next = if found { at + 1 } else { at };
        // The entry the page before stopped at (or above) was listed; what is below it comes next.
        let child = (found && page.recursive)
            .then(|| frame.descend(first))
            .flatten();
        stack.push(frame);
        match child {
            Some(c) => {
                frame = c;
                rest = deeper;
            }
            None => break,
        }
    }
    walk(stack, listed, page.recursive, size)
}

/// Takes entries off the frames in order until the page is full or the walk ends.
fn walk(
    mut stack: Vec<Frame>,
    listed: &WsPath,
    recursive: bool,
    size: usize,
) -> Result<Page, Error> {
    let mut files = Vec::new();
    let mut bytes = 0usize;
    let mut last: Option<Vec<u8>> = None;
    while let Some(top) = stack.last_mut() {
        let Some(name) = top.names.get(top.next).cloned() else {
            stack.pop();
            continue;
        };
        top.next += 1;
        let child = top.at.join(&name);
        let entry = match info::stat_at(&top.fd, &name, &child) {
            Ok(entry) => entry,
            // Removed while we list: not an error, just not there.
            Err(Error::PathNotFound(_)) => continue,
            Err(e) => return Err(e),
        };
        let len = entry.encoded_len() + 8;
        if files.len() >= size || bytes + len > PAGE_BYTES {
            let next = last.map(|l| encode(listed, recursive, &l));
            return Ok(Page { files, next });
        }
        bytes += len;
        let is_dir = entry.r#type == FileType::Directory as i32;
        files.push(entry);
        last = Some(top.child_rel(&name));
        if recursive
            && is_dir
            && let Some(sub) = top.descend(&name)
        {
            stack.push(sub);
        }
    }
    Ok(Page { files, next: None })
}
