//! The on-disk half of a sandbox's observation log: append-only segment files in the sandbox's own folder,
//! each record `[length u32 LE][CRC-32 u32 LE][mentis.journal.v1.Record]` (journals written before used
//! FNV-1a there, still read), the record the journal's own schema (`record`: it holds the observation and
//! its origin, the executor's action and event index for events of an action). The folder says the record's
//! format in a file of its own (`FORMAT_FILE`); a folder without it was written before there was one, when
//! the records were `mentis.v1.Observation` with the origin in its fields 2046 and 2047: format 1, the same
//! bytes, read as they are. A journal of a format this runtime does not know is refused, never misread. An
//! observation is written
//! (to the kernel's page cache) before the log hands it to any reader, so a crash of the runtime process loses
//! nothing a client saw; `sync` (every second, and on close) makes it survive a power loss too. A torn record
//! at the end (a crash in the middle of a write) is cut off when the journal is opened again. Whole segments
//! are dropped when the log trims past them, so the disk holds what the memory bounds say, rounded up to a
//! segment.

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, Read, Write};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use mentis_core::Observation;
use prost::Message;
use prost::encoding::{self, WireType};

use mentis_core::ObservationKind;
use mentis_proto::journal;

#[cfg(test)]
use super::record::record_of;
use super::record::{kind_to_record, observation_from_record, record_head};

/// Where an observation came from: the event of an action, numbered by the executor (1, 2, 3...). A log
/// knows the newest index it holds of every running action, so after a restart the runtime attaches to the
/// executor again right after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub action: mentis_core::ActionId,
    pub index: u64,
}

/// The record format this runtime writes and reads (see `mentis/journal/v1/record.proto`).
const FORMAT: u32 = 1;
/// The file of a journal's folder that says its format.
const FORMAT_FILE: &str = "FORMAT";

/// Room left before an observation's encoded kind for its head (seq, sandbox and action ids, time) and the
/// record's header: far more than they take (about 100 bytes at most).
const HEAD_ROOM: usize = 256;

/// An observation's kind and origin, encoded (and checksummed) before the log's lock is taken. The bulk of
/// an output chunk is not copied at all: its bytes are written from the observation's own buffer, after the
/// rest of the record (protobuf fields may come in any order, and a length-delimited field's bytes may be
/// written as they are).
pub struct Prepared {
    /// `HEAD_ROOM` bytes of room, then the encoded origin and kind (without `bulk`).
    buf: Vec<u8>,
    start: usize,
    /// Bytes that end the record, written from where they are (an output chunk's data).
    bulk: Bytes,
    /// CRC-32 of `buf[start..]` and `bulk`.
    kind_crc: crc32fast::Hasher,
}

impl Prepared {
    pub fn new(kind: &ObservationKind, origin: Option<&Origin>) -> io::Result<Self> {
        // The origin's two fields alone (a record's other fields at their defaults are not encoded).
        let origin = origin.map(|origin| journal::Record {
            origin_action: origin.action.to_string(),
            origin_index: origin.index,
            ..Default::default()
        });
        let mut buf =
            Vec::with_capacity(HEAD_ROOM + origin.as_ref().map_or(0, Message::encoded_len));
        buf.resize(HEAD_ROOM, 0);
        if let Some(origin) = origin {
            origin.encode(&mut buf).map_err(io::Error::other)?;
        }
        let bulk = match kind {
            // `Record.cmd_output` (11) holding `CmdOutput.stream` (1) and then `CmdOutput.data` (2), whose
            // bytes are left out of `buf`.
            ObservationKind::CmdOutput { stream, data } if !data.is_empty() => {
                let empty = ObservationKind::CmdOutput {
                    stream: *stream,
                    data: Bytes::new(),
                };
                let journal::record::Kind::CmdOutput(stream_field) = kind_to_record(&empty) else {
                    return Err(io::Error::other(
                        "an output chunk converted to another kind",
                    ));
                };
                let data_head =
                    encoding::key_len(2) + encoding::encoded_len_varint(data.len() as u64);
                let inner_len = stream_field.encoded_len() + data_head + data.len();
                encoding::encode_key(11, WireType::LengthDelimited, &mut buf);
                encoding::encode_varint(inner_len as u64, &mut buf);
                stream_field.encode(&mut buf).map_err(io::Error::other)?;
                encoding::encode_key(2, WireType::LengthDelimited, &mut buf);
                encoding::encode_varint(data.len() as u64, &mut buf);
                data.clone()
            }
            _ => {
                let tail = journal::Record {
                    kind: Some(kind_to_record(kind)),
                    ..Default::default()
                };
                tail.encode(&mut buf).map_err(io::Error::other)?;
                Bytes::new()
            }
        };
        let mut kind_crc = crc32fast::Hasher::new();
        kind_crc.update(&buf[HEAD_ROOM..]);
        kind_crc.update(&bulk);
        Ok(Self {
            buf,
            start: HEAD_ROOM,
            bulk,
            kind_crc,
        })
    }
}

/// Writes every slice whole (`Write::write_all_vectored` is not stable yet).
fn write_all_slices(file: &mut File, mut slices: &mut [io::IoSlice<'_>]) -> io::Result<()> {
    io::IoSlice::advance_slices(&mut slices, 0);
    while !slices.is_empty() {
        match file.write_vectored(slices) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => io::IoSlice::advance_slices(&mut slices, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A segment is closed and a new one started beyond this size.
const SEGMENT_BYTES: u64 = 8 * 1024 * 1024;
/// Largest record accepted when reading back (the log's own entries are far smaller).
const MAX_RECORD: u32 = 64 * 1024 * 1024;

/// One segment file: the seq of its first record, its path and its length.
#[derive(Debug)]
struct Segment {
    first_seq: u64,
    path: PathBuf,
    bytes: u64,
}

/// The segments of one sandbox's log, open for appending.
#[derive(Debug)]
pub struct Journal {
    dir: PathBuf,
    segments: VecDeque<Segment>,
    /// The newest segment, open for appending; `None` until the first append.
    current: Option<File>,
    current_bytes: u64,
    /// Written since the last sync.
    unsynced: bool,
    /// Segments finished since the last sync (by their first seq), to be synced with it unless trimmed first.
    rolled: Vec<(u64, File)>,
}

/// CRC-32 of a record's body: tells a torn or garbled record from a whole one, at memory speed.
fn checksum(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}

/// The checksum journals used before CRC-32 (FNV-1a), still accepted when reading them back.
fn checksum_v1(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

/// The journal in `dir` is of a format this runtime reads: its format file says [`FORMAT`], or there is
/// none (format 1, written before there was one). INVALID_DATA naming the format otherwise.
fn check_format(dir: &Path) -> io::Result<()> {
    let said = match fs::read_to_string(dir.join(FORMAT_FILE)) {
        Ok(said) => said,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    match said.trim().parse::<u32>() {
        Ok(FORMAT) => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "the journal in {} is of format {:?}; this runtime reads format {FORMAT}",
                dir.display(),
                said.trim()
            ),
        )),
    }
}

fn segment_name(first_seq: u64) -> String {
    format!("{first_seq:020}.log")
}

impl Journal {
    /// A new, empty journal in `dir` (whatever was there is removed).
    pub fn create(dir: &Path) -> io::Result<Self> {
        if dir.exists() {
            fs::remove_dir_all(dir)?;
        }
        // Private to the runtime's user, as all of the data folder (`private`): observations are what
        // sandboxes printed.
        crate::private::create_dir(dir)?;
        let mut format = crate::private::file_options()
            .create_new(true)
            .write(true)
            .open(dir.join(FORMAT_FILE))?;
        writeln!(format, "{FORMAT}")?;
        Ok(Self {
            dir: dir.to_owned(),
            segments: VecDeque::new(),
            current: None,
            current_bytes: 0,
            unsynced: false,
            rolled: Vec::new(),
        })
    }

    /// The journal in `dir` and every observation it holds (with its origin), oldest first; `None` when there
    /// is none. For tests: a runtime reads with [`Journal::open_with`], which holds one segment at a time.
    #[cfg(test)]
    #[allow(clippy::type_complexity)]
    pub fn open(dir: &Path) -> io::Result<Option<(Self, Vec<(Observation, Option<Origin>)>)>> {
        let mut observations = Vec::new();
        Ok(
            Self::open_with(dir, |o, origin| observations.push((o, origin)))?
                .map(|j| (j, observations)),
        )
    }

    /// The journal in `dir`, handing every observation it holds (with its origin) to `visit`, oldest first,
    /// one segment in memory at a time; `None` when there is none.
    pub fn open_with(
        dir: &Path,
        mut visit: impl FnMut(Observation, Option<Origin>),
    ) -> io::Result<Option<Self>> {
        if !dir.is_dir() {
            return Ok(None);
        }
        check_format(dir)?;
        let mut names: Vec<(u64, PathBuf)> = fs::read_dir(dir)?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let path = e.path();
                let seq = path
                    .file_name()?
                    .to_str()?
                    .strip_suffix(".log")?
                    .parse()
                    .ok()?;
                Some((seq, path))
            })
            .collect();
        names.sort();
        let mut segments = VecDeque::new();
        let mut last_len = 0;
        let count = names.len();
        for (i, (first_seq, path)) in names.into_iter().enumerate() {
            let (records, good_len) = read_segment(&path, 0, usize::MAX)?;
            if i + 1 == count {
                // A torn record at the end of the newest segment: cut it off.
                let file = OpenOptions::new().write(true).open(&path)?;
                file.set_len(good_len)?;
                last_len = good_len;
            }
            for (o, origin) in records {
                visit(o, origin);
            }
            segments.push_back(Segment {
                first_seq,
                path,
                bytes: good_len,
            });
        }
        let current = match segments.back() {
            Some(s) => Some(OpenOptions::new().append(true).open(&s.path)?),
            None => None,
        };
        Ok(Some(Self {
            dir: dir.to_owned(),
            segments,
            current,
            current_bytes: last_len,
            unsynced: false,
            rolled: Vec::new(),
        }))
    }

    /// Writes one observation (and where it came from) at the end.
    #[cfg(test)]
    pub fn append(&mut self, o: &Observation, origin: Option<&Origin>) -> io::Result<()> {
        self.append_prepared(o, Prepared::new(&o.kind, origin)?)
    }

    /// Writes one observation at the end, its kind (the bulk of it) encoded beforehand by
    /// [`Prepared::new`]: only the seq, ids and time are encoded here, under the log's lock.
    pub fn append_prepared(&mut self, o: &Observation, prepared: Prepared) -> io::Result<()> {
        let Prepared {
            mut buf,
            start: kind_start,
            bulk,
            kind_crc,
        } = prepared;
        let head = record_head(o).encode_to_vec();
        let body_len = head.len() + (buf.len() - kind_start) + bulk.len();
        let len = u32::try_from(body_len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "observation too large"))?;
        // The head goes right before the kind (protobuf fields may come in any order), the record's header
        // before that: the record is one slice of `buf` and the bulk, written with one write.
        let start = kind_start
            .checked_sub(head.len() + 8)
            .ok_or_else(|| io::Error::other("an observation's head outgrew its room"))?;
        let mut crc = crc32fast::Hasher::new();
        crc.update(&head);
        crc.combine(&kind_crc);
        buf[start..start + 4].copy_from_slice(&len.to_le_bytes());
        buf[start + 4..start + 8].copy_from_slice(&crc.finalize().to_le_bytes());
        buf[start + 8..kind_start].copy_from_slice(&head);
        let record = &buf[start..];
        let record_len = (record.len() + bulk.len()) as u64;
        if self.current.is_none() || self.current_bytes >= SEGMENT_BYTES {
            let path = self.dir.join(segment_name(o.seq));
            let file = crate::private::file_options()
                .create(true)
                .append(true)
                .open(&path)?;
            if let Some(old) = self.current.take() {
                // The finished segment is synced with the next sync, off the append path.
                let first = self.segments.back().map_or(0, |s| s.first_seq);
                self.rolled.push((first, old));
            }
            self.current = Some(file);
            self.current_bytes = 0;
            self.segments.push_back(Segment {
                first_seq: o.seq,
                path,
                bytes: 0,
            });
        }
        if let Some(file) = self.current.as_mut() {
            // One write: a crash leaves either the whole record or a torn tail that `open` cuts off.
            write_all_slices(
                file,
                &mut [io::IoSlice::new(record), io::IoSlice::new(&bulk)],
            )?;
        }
        self.current_bytes += record_len;
        if let Some(seg) = self.segments.back_mut() {
            seg.bytes += record_len;
        }
        self.unsynced = true;
        Ok(())
    }

    /// Seq of the oldest record the journal holds (`None` before the first append).
    pub fn first_seq(&self) -> Option<u64> {
        self.segments.front().map(|s| s.first_seq)
    }

    /// Bytes on disk.
    pub fn bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.bytes).sum()
    }

    /// Drops the oldest segment while `over(records held, bytes held)` says the journal is beyond its
    /// bounds (never the newest segment).
    pub fn trim_while(&mut self, next_seq: u64, over: impl Fn(u64, u64) -> bool) {
        while let (Some(first), Some(second)) = (self.segments.front(), self.segments.get(1)) {
            if !over(next_seq - first.first_seq, self.bytes()) {
                break;
            }
            let second = second.first_seq;
            self.trim_before(second);
        }
    }

    /// Where to read records after `after_seq`: the segments that may hold them, oldest first.
    pub fn reader(&self, after_seq: u64) -> Vec<PathBuf> {
        let start = self
            .segments
            .iter()
            .rposition(|s| s.first_seq <= after_seq + 1)
            .unwrap_or(0);
        self.segments
            .iter()
            .skip(start)
            .map(|s| s.path.clone())
            .collect()
    }

    /// Drops every segment whose records all have a seq below `first_kept` (never the newest one).
    pub fn trim_before(&mut self, first_kept: u64) {
        while self.segments.len() > 1 {
            let next_first = self.segments.get(1).map_or(u64::MAX, |s| s.first_seq);
            if next_first > first_kept {
                break;
            }
            if let Some(old) = self.segments.pop_front() {
                // Not synced, not written back: a removed file's dirty pages are dropped, so a burst of
                // output the bounds trim away never costs disk bandwidth.
                self.rolled.retain(|(first, _)| *first != old.first_seq);
                if let Err(e) = fs::remove_file(&old.path) {
                    tracing::warn!(path = %old.path.display(), error = %e, "could not remove a log segment");
                }
            }
        }
    }

    /// Makes what was written durable (fdatasync), if anything was.
    pub fn sync(&mut self) -> io::Result<()> {
        for file in self.take_unsynced()? {
            file.sync_data()?;
        }
        Ok(())
    }

    /// Handles of the segments written since the last sync (which the caller then syncs, without holding
    /// up appends), and marks them synced.
    pub fn take_unsynced(&mut self) -> io::Result<Vec<File>> {
        let mut files: Vec<File> = std::mem::take(&mut self.rolled)
            .into_iter()
            .map(|(_, f)| f)
            .collect();
        if self.unsynced
            && let Some(file) = &self.current
        {
            files.push(file.try_clone()?);
            self.unsynced = false;
        }
        Ok(files)
    }

    /// Removes the journal and its folder.
    pub fn remove(self) -> io::Result<()> {
        drop(self.current);
        fs::remove_dir_all(&self.dir)
    }
}

/// Up to `max` observations with seq > `after_seq` from `segments` (from [`Journal::reader`]), oldest first,
/// stopping before `before_seq`. Reads files only: call it off the runtime's threads, without the log's lock.
pub fn read_after(
    segments: &[PathBuf],
    after_seq: u64,
    before_seq: u64,
    max: usize,
) -> io::Result<Vec<Observation>> {
    let mut out = Vec::new();
    for path in segments {
        let (records, _) = read_segment(path, after_seq, max - out.len())?;
        out.extend(
            records
                .into_iter()
                .map(|(o, _)| o)
                .take_while(|o| o.seq < before_seq),
        );
        if out.len() >= max || out.last().is_some_and(|o| o.seq + 1 >= before_seq) {
            break;
        }
    }
    Ok(out)
}

/// The seq at the start of an encoded `Record` (field 1, a varint), when it is there.
fn leading_seq(bytes: &[u8]) -> Option<u64> {
    let (&tag, rest) = bytes.split_first()?;
    if tag != 0x08 {
        return None;
    }
    let mut value = 0u64;
    for (i, b) in rest.iter().enumerate().take(10) {
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

/// The whole records of one segment file with seq > `after_seq` (at most `max`), and the length the whole
/// records span.
#[allow(clippy::type_complexity)]
fn read_segment(
    path: &Path,
    after_seq: u64,
    max: usize,
) -> io::Result<(Vec<(Observation, Option<Origin>)>, u64)> {
    let mut reader = BufReader::new(File::open(path)?);
    let mut records = Vec::new();
    let mut good = 0u64;
    loop {
        let mut head = [0u8; 8];
        match reader.read_exact(&mut head) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(e),
        }
        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
        let sum = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
        if len > MAX_RECORD {
            break;
        }
        // A reader after a seq skips older records by their seq (field 1, encoded first), unread.
        if after_seq > 0 {
            let mut peek = [0u8; 11];
            let n = (len as usize).min(peek.len());
            match reader.read_exact(&mut peek[..n]) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break,
                Err(e) => return Err(e),
            }
            // At most the 11 bytes of `peek`.
            let peeked = i64::try_from(n).map_err(io::Error::other)?;
            if leading_seq(&peek[..n]).is_some_and(|seq| seq <= after_seq) {
                reader.seek_relative(i64::from(len) - peeked)?;
                continue;
            }
            reader.seek_relative(-peeked)?;
        }
        let mut body = vec![0u8; len as usize];
        match reader.read_exact(&mut body) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(e),
        }
        if checksum(&body) != sum && checksum_v1(&body) != sum {
            break;
        }
        good += 8 + u64::from(len);
        if records.len() >= max {
            break;
        }
        let Ok(record) = journal::Record::decode(body.as_slice()) else {
            good -= 8 + u64::from(len);
            break;
        };
        if record.seq <= after_seq {
            continue;
        }
        let origin = match mentis_core::ActionId::parse(&record.origin_action) {
            Ok(action) if record.origin_index > 0 => Some(Origin {
                action,
                index: record.origin_index,
            }),
            _ => None,
        };
        let Ok(o) = observation_from_record(record) else {
            good -= 8 + u64::from(len);
            break;
        };
        records.push((o, origin));
    }
    Ok((records, good))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use mentis_core::{ObservationKind, OutputStream, SandboxId};

    fn obs(sandbox: SandboxId, seq: u64, n: usize) -> Observation {
        Observation {
            seq,
            sandbox_id: sandbox,
            action_id: None,
            time: std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(seq),
            kind: ObservationKind::CmdOutput {
                stream: OutputStream::Stdout,
                data: Bytes::from(vec![b'x'; n]),
            },
        }
    }

    #[test]
    fn what_is_appended_is_read_back_and_a_torn_tail_is_cut() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("sandbox");
        let id = SandboxId::new();
        let mut j = Journal::create(&path)?;
        for seq in 1..=3 {
            j.append(&obs(id, seq, 10), None)?;
        }
        j.sync()?;
        drop(j);
        // A crash in the middle of the fourth record.
        let seg = path.join(segment_name(1));
        let mut f = OpenOptions::new().append(true).open(&seg)?;
        f.write_all(&[50, 0, 0, 0, 1, 2])?;
        drop(f);
        let (mut j, read) = Journal::open(&path)?.expect("a journal");
        assert_eq!(
            read,
            (1..=3).map(|s| (obs(id, s, 10), None)).collect::<Vec<_>>()
        );
        // Appending after the cut continues cleanly.
        j.append(&obs(id, 4, 10), None)?;
        drop(j);
        let (_, read) = Journal::open(&path)?.expect("a journal");
        assert_eq!(
            read.iter().map(|(o, _)| o.seq).collect::<Vec<_>>(),
            [1, 2, 3, 4]
        );
        Ok(())
    }

    #[test]
    fn segments_roll_and_trimming_drops_whole_old_ones() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("sandbox");
        let id = SandboxId::new();
        let mut j = Journal::create(&path)?;
        // 1 MiB records: a segment holds 8 of them.
        for seq in 1..=20 {
            j.append(&obs(id, seq, 1024 * 1024), None)?;
        }
        assert_eq!(j.segments.len(), 3);
        j.trim_before(16);
        assert_eq!(
            j.segments.len(),
            2,
            "the segment of 1-8 goes, 9-16 holds 16"
        );
        drop(j);
        let (mut j, read) = Journal::open(&path)?.expect("a journal");
        assert_eq!(read.first().map(|(o, _)| o.seq), Some(9));
        assert_eq!(read.len(), 12);
        j.trim_before(100);
        assert_eq!(j.segments.len(), 1, "the newest segment always stays");
        Ok(())
    }

    #[test]
    fn the_origin_is_kept_beside_the_observation_and_skipped_by_its_readers() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("sandbox");
        let id = SandboxId::new();
        let action = mentis_core::ActionId::generate();
        let origin = Origin {
            action: action.clone(),
            index: 42,
        };
        let mut j = Journal::create(&path)?;
        j.append(&obs(id, 1, 10), Some(&origin))?;
        j.append(&obs(id, 2, 10), None)?;
        drop(j);
        let (_, read) = Journal::open(&path)?.expect("a journal");
        assert_eq!(
            read,
            [(obs(id, 1, 10), Some(origin)), (obs(id, 2, 10), None)]
        );
        Ok(())
    }

    /// An output chunk's bytes are written from its own buffer, after the rest of the record: every shape
    /// of record still reads back as it was, and its body is the record a reader decodes.
    #[test]
    fn output_chunks_written_in_place_read_back_whole() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("sandbox");
        let id = SandboxId::new();
        let origin = Origin {
            action: mentis_core::ActionId::generate(),
            index: 7,
        };
        let with = |seq: u64, kind: ObservationKind| Observation {
            kind,
            ..obs(id, seq, 0)
        };
        let chunk = |stream, n: usize| ObservationKind::CmdOutput {
            stream,
            data: Bytes::from((0..n).map(|i| (i % 251) as u8).collect::<Vec<u8>>()),
        };
        let written = [
            (
                with(1, chunk(OutputStream::Stdout, 300)),
                Some(origin.clone()),
            ),
            (with(2, chunk(OutputStream::Stderr, 5)), None),
            (
                with(3, chunk(OutputStream::Stdout, 0)),
                Some(origin.clone()),
            ),
            (
                with(4, chunk(OutputStream::Stderr, 3 << 20)),
                Some(origin.clone()),
            ),
            (
                with(
                    5,
                    ObservationKind::lost(
                        mentis_core::observation::ActionKind::Shell,
                        "test",
                        std::time::Duration::from_millis(3),
                    ),
                ),
                Some(origin),
            ),
        ];
        let mut j = Journal::create(&path)?;
        for (o, origin) in &written {
            j.append(o, origin.as_ref())?;
        }
        drop(j);
        let (_, read) = Journal::open(&path)?.expect("a journal");
        assert_eq!(read, written);
        // Each body decodes to the record of the observation and its origin.
        let bytes = fs::read(path.join(segment_name(1)))?;
        let mut at = 0;
        for (o, origin) in &written {
            let len = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as usize;
            let body = &bytes[at + 8..at + 8 + len];
            let record = journal::Record {
                origin_action: origin
                    .as_ref()
                    .map(|o| o.action.to_string())
                    .unwrap_or_default(),
                origin_index: origin.as_ref().map_or(0, |o| o.index),
                ..record_of(o)
            };
            assert_eq!(
                journal::Record::decode(body).map_err(io::Error::other)?,
                record
            );
            at += 8 + len;
        }
        assert_eq!(at, bytes.len());
        Ok(())
    }

    #[test]
    fn a_reader_after_a_seq_skips_older_records_by_their_leading_seq() -> io::Result<()> {
        let id = SandboxId::new();
        for seq in [1, 127, 128, 300, 1 << 40] {
            let body = record_of(&obs(id, seq, 3)).encode_to_vec();
            assert_eq!(leading_seq(&body[..body.len().min(11)]), Some(seq));
        }
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("sandbox");
        let mut j = Journal::create(&path)?;
        for seq in 1..=300 {
            j.append(&obs(id, seq, 100), None)?;
        }
        let read = read_after(&j.reader(250), 250, u64::MAX, 10)?;
        assert_eq!(
            read.iter().map(|o| o.seq).collect::<Vec<_>>(),
            (251..=260).collect::<Vec<_>>()
        );
        assert_eq!(read[0], obs(id, 251, 100));
        Ok(())
    }

    #[test]
    fn records_checked_with_the_old_checksum_are_still_read() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("sandbox");
        fs::create_dir_all(&path)?;
        let id = SandboxId::new();
        let body = record_of(&obs(id, 1, 10)).encode_to_vec();
        let mut record = (body.len() as u32).to_le_bytes().to_vec();
        record.extend_from_slice(&checksum_v1(&body).to_le_bytes());
        record.extend_from_slice(&body);
        fs::write(path.join(segment_name(1)), &record)?;
        let (_, read) = Journal::open(&path)?.expect("a journal");
        assert_eq!(read, [(obs(id, 1, 10), None)]);
        Ok(())
    }

    /// A journal as runtimes wrote them before the record had a schema of its own: no format file, each
    /// record the public `mentis.v1.Observation` with the origin in its fields 2046 and 2047, checked with
    /// CRC-32. It reads back whole as format 1, and appending to it goes on.
    #[test]
    fn a_journal_written_as_public_observations_reads_back_as_format_1() -> io::Result<()> {
        use mentis_proto::api;

        /// The origin as those runtimes encoded it, after the observation's own fields.
        #[derive(Clone, PartialEq, prost::Message)]
        struct OldOrigin {
            #[prost(string, tag = "2046")]
            action: String,
            #[prost(uint64, tag = "2047")]
            index: u64,
        }

        let dir = tempfile::tempdir()?;
        let path = dir.path().join("sandbox");
        fs::create_dir_all(&path)?;
        let id = SandboxId::new();
        let action = mentis_core::ActionId::generate();
        let ts = |secs: u64| {
            Some(prost_types::Timestamp::from(
                std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(secs),
            ))
        };
        let old = [
            (
                api::Observation {
                    seq: 1,
                    sandbox_id: id.to_string(),
                    action_id: action.to_string(),
                    time: ts(1),
                    kind: Some(api::observation::Kind::CmdOutput(api::CmdOutput {
                        stream: api::OutputStream::Stderr as i32,
                        data: Bytes::from_static(b"err\n"),
                    })),
                },
                Some(OldOrigin {
                    action: action.to_string(),
                    index: 3,
                }),
            ),
            (
                api::Observation {
                    seq: 2,
                    sandbox_id: id.to_string(),
                    action_id: action.to_string(),
                    time: ts(2),
                    kind: Some(api::observation::Kind::CmdEnd(api::CmdEnd {
                        exit_code: 0,
                        reason: api::EndReason::OomKilled as i32,
                        duration: Some(prost_types::Duration {
                            seconds: 2,
                            nanos: 0,
                        }),
                        signal: 9,
                        message: "killed".into(),
                    })),
                },
                Some(OldOrigin {
                    action: action.to_string(),
                    index: 4,
                }),
            ),
            (
                api::Observation {
                    seq: 3,
                    sandbox_id: id.to_string(),
                    action_id: String::new(),
                    time: ts(3),
                    kind: Some(api::observation::Kind::AgentState(api::AgentState {
                        message: "room made".into(),
                        details: [("killed".to_owned(), "2".to_owned())].into(),
                    })),
                },
                None,
            ),
        ];
        let mut segment = Vec::new();
        for (o, origin) in &old {
            let mut body = o.encode_to_vec();
            if let Some(origin) = origin {
                origin.encode(&mut body).map_err(io::Error::other)?;
            }
            segment.extend_from_slice(&(body.len() as u32).to_le_bytes());
            segment.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
            segment.extend_from_slice(&body);
        }
        fs::write(path.join(segment_name(1)), &segment)?;

        let (mut j, read) = Journal::open(&path)?.expect("a journal");
        let at = |secs| std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(secs);
        let origin = |index| {
            Some(Origin {
                action: action.clone(),
                index,
            })
        };
        assert_eq!(
            read,
            [
                (
                    Observation {
                        seq: 1,
                        sandbox_id: id,
                        action_id: Some(action.clone()),
                        time: at(1),
                        kind: ObservationKind::CmdOutput {
                            stream: OutputStream::Stderr,
                            data: Bytes::from_static(b"err\n"),
                        },
                    },
                    origin(3),
                ),
                (
                    Observation {
                        seq: 2,
                        sandbox_id: id,
                        action_id: Some(action.clone()),
                        time: at(2),
                        kind: ObservationKind::CmdEnd(mentis_core::CmdEnd {
                            exit_code: 0,
                            reason: mentis_core::EndReason::OomKilled,
                            duration: std::time::Duration::from_secs(2),
                            signal: 9,
                            message: "killed".into(),
                        }),
                    },
                    origin(4),
                ),
                (
                    Observation {
                        seq: 3,
                        sandbox_id: id,
                        action_id: None,
                        time: at(3),
                        kind: ObservationKind::AgentState {
                            message: "room made".into(),
                            details: [("killed".to_owned(), "2".to_owned())].into(),
                        },
                    },
                    None,
                ),
            ]
        );
        j.append(&obs(id, 4, 5), None)?;
        drop(j);
        let (_, read) = Journal::open(&path)?.expect("a journal");
        assert_eq!(
            read.iter().map(|(o, _)| o.seq).collect::<Vec<_>>(),
            [1, 2, 3, 4]
        );
        Ok(())
    }

    #[test]
    fn a_journal_of_a_format_this_runtime_does_not_know_is_refused() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("sandbox");
        let id = SandboxId::new();
        let mut j = Journal::create(&path)?;
        j.append(&obs(id, 1, 10), None)?;
        drop(j);
        assert_eq!(fs::read_to_string(path.join(FORMAT_FILE))?, "1\n");
        assert!(Journal::open(&path)?.is_some());
        fs::write(path.join(FORMAT_FILE), "2\n")?;
        let e = Journal::open(&path).expect_err("format 2 is refused");
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("format \"2\""), "{e}");
        Ok(())
    }

    #[test]
    fn no_folder_is_no_journal_and_remove_takes_the_folder() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("sandbox");
        assert!(Journal::open(&path)?.is_none());
        let j = Journal::create(&path)?;
        j.remove()?;
        assert!(!path.exists());
        Ok(())
    }
}
