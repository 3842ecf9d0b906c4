//! A small libpcap file reader and writer (feature `std`), Ethernet link type.
//!
//! The classic pcap format (not pcapng): a 24-byte file header (magic
//! 0xA1B2C3D4 for microsecond or 0xA1B23C4D for nanosecond timestamps, in the
//! writer's byte order), then records of a 16-byte header (seconds, sub-second
//! fraction, captured length, original length) followed by the captured bytes.
//! QEMU `filter-dump` and tcpdump write it; the tests read the captures in
//! `tests/vectors/`, and the lossy-link relay writes what it forwards.
//!
//! The reader works on a byte slice (read the file first) and never panics on
//! malformed input: it reports [`PcapError`] and stops.

use std::fmt;
use std::io::{self, Write};
use std::time::Duration;

/// Link type of Ethernet captures (`LINKTYPE_ETHERNET`).
pub const LINKTYPE_ETHERNET: u32 = 1;

/// The snapshot length the writer declares.
pub const DEFAULT_SNAPLEN: u32 = 65_535;

const MAGIC_MICROS: u32 = 0xa1b2_c3d4;
const MAGIC_NANOS: u32 = 0xa1b2_3c4d;
const FILE_HEADER_LEN: usize = 24;
const RECORD_HEADER_LEN: usize = 16;

/// Why a capture could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PcapError {
    /// Not a classic pcap file (unknown magic number).
    BadMagic,
    /// The file ends inside a header or a record.
    Truncated,
    /// A record claims more captured bytes than its original length or the
    /// snapshot length allows.
    BadRecordLength,
}

impl fmt::Display for PcapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PcapError::BadMagic => "not a pcap file",
            PcapError::Truncated => "pcap file truncated",
            PcapError::BadRecordLength => "pcap record length out of range",
        })
    }
}

impl std::error::Error for PcapError {}

/// One captured frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    /// Capture time since the Unix epoch.
    pub timestamp: Duration,
    /// Length of the frame on the wire (≥ `data.len()`).
    pub orig_len: u32,
    /// The captured bytes.
    pub data: &'a [u8],
}

/// Iterates over the records of a pcap file held in memory.
///
/// ```
/// use roce::pcap::{Reader, Writer};
/// use std::time::Duration;
///
/// let mut file = Vec::new();
/// let mut writer = Writer::new(&mut file).unwrap();
/// writer.write_frame(Duration::from_micros(1_500_000), &[1, 2, 3]).unwrap();
/// let reader = Reader::new(&file).unwrap();
/// let records: Vec<_> = reader.map(Result::unwrap).collect();
/// assert_eq!(records[0].data, &[1, 2, 3]);
/// assert_eq!(records[0].timestamp, Duration::from_micros(1_500_000));
/// ```
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    rest: &'a [u8],
    swapped: bool,
    nanos: bool,
    snaplen: u32,
    link_type: u32,
    failed: bool,
}

impl<'a> Reader<'a> {
    /// Reads the file header.
    ///
    /// # Errors
    /// [`PcapError::Truncated`] if shorter than 24 bytes, [`PcapError::BadMagic`]
    /// if not a classic pcap file.
    pub fn new(file: &'a [u8]) -> Result<Reader<'a>, PcapError> {
        let header = file.get(..FILE_HEADER_LEN).ok_or(PcapError::Truncated)?;
        let magic = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
        let (swapped, nanos) = match (magic, magic.swap_bytes()) {
            (MAGIC_MICROS, _) => (false, false),
            (MAGIC_NANOS, _) => (false, true),
            (_, MAGIC_MICROS) => (true, false),
            (_, MAGIC_NANOS) => (true, true),
            _ => return Err(PcapError::BadMagic),
        };
        let mut reader = Reader {
            rest: &file[FILE_HEADER_LEN..],
            swapped,
            nanos,
            snaplen: 0,
            link_type: 0,
            failed: false,
        };
        reader.snaplen = reader.u32_at(header, 16);
        reader.link_type = reader.u32_at(header, 20);
        Ok(reader)
    }

    /// The link type (1 = Ethernet).
    pub fn link_type(&self) -> u32 {
        self.link_type
    }

    /// The snapshot length.
    pub fn snaplen(&self) -> u32 {
        self.snaplen
    }

    fn u32_at(&self, bytes: &[u8], offset: usize) -> u32 {
        let raw = [
            bytes[offset],
            bytes[offset + 1],
            bytes[offset + 2],
            bytes[offset + 3],
        ];
        if self.swapped {
            u32::from_be_bytes(raw)
        } else {
            u32::from_le_bytes(raw)
        }
    }

    fn next_record(&mut self) -> Result<Record<'a>, PcapError> {
        let header = self
            .rest
            .get(..RECORD_HEADER_LEN)
            .ok_or(PcapError::Truncated)?;
        let seconds = self.u32_at(header, 0);
        let fraction = self.u32_at(header, 4);
        let incl_len = self.u32_at(header, 8);
        let orig_len = self.u32_at(header, 12);
        // Some writers record orig_len < incl_len for padded frames; only the
        // captured length must be sane.
        if incl_len > self.snaplen.max(DEFAULT_SNAPLEN) {
            return Err(PcapError::BadRecordLength);
        }
        let len = usize::try_from(incl_len).map_err(|_| PcapError::BadRecordLength)?;
        let data = self
            .rest
            .get(RECORD_HEADER_LEN..RECORD_HEADER_LEN + len)
            .ok_or(PcapError::Truncated)?;
        self.rest = &self.rest[RECORD_HEADER_LEN + len..];
        let sub_second = if self.nanos {
            Duration::from_nanos(u64::from(fraction))
        } else {
            Duration::from_micros(u64::from(fraction))
        };
        Ok(Record {
            timestamp: Duration::from_secs(u64::from(seconds)) + sub_second,
            orig_len: orig_len.max(incl_len),
            data,
        })
    }
}

impl<'a> Iterator for Reader<'a> {
    type Item = Result<Record<'a>, PcapError>;

    /// The next record; after an error the iterator ends.
    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.rest.is_empty() {
            return None;
        }
        let record = self.next_record();
        self.failed = record.is_err();
        Some(record)
    }
}

/// Writes a pcap file (little-endian, microsecond timestamps, Ethernet).
#[derive(Debug)]
pub struct Writer<W: Write> {
    inner: W,
}

impl<W: Write> Writer<W> {
    /// Writes the file header.
    ///
    /// # Errors
    /// Any I/O error of `inner`.
    pub fn new(mut inner: W) -> io::Result<Writer<W>> {
        let mut header = [0u8; FILE_HEADER_LEN];
        header[0..4].copy_from_slice(&MAGIC_MICROS.to_le_bytes());
        header[4..6].copy_from_slice(&2u16.to_le_bytes());
        header[6..8].copy_from_slice(&4u16.to_le_bytes());
        // 8..16: time zone offset and accuracy, both 0.
        header[16..20].copy_from_slice(&DEFAULT_SNAPLEN.to_le_bytes());
        header[20..24].copy_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
        inner.write_all(&header)?;
        Ok(Writer { inner })
    }

    /// Appends one frame captured at `timestamp` (since the Unix epoch or any
    /// other origin; seconds wrap at 2^32). Frames longer than the snapshot
    /// length are truncated in the file, as a capture would be.
    ///
    /// # Errors
    /// Any I/O error of the underlying writer.
    pub fn write_frame(&mut self, timestamp: Duration, frame: &[u8]) -> io::Result<()> {
        let orig_len = u32::try_from(frame.len()).unwrap_or(u32::MAX);
        let captured = &frame[..frame.len().min(DEFAULT_SNAPLEN as usize)];
        let mut header = [0u8; RECORD_HEADER_LEN];
        // Truncating the seconds is the format's own limit.
        header[0..4].copy_from_slice(&(timestamp.as_secs() as u32).to_le_bytes());
        header[4..8].copy_from_slice(&timestamp.subsec_micros().to_le_bytes());
        header[8..12].copy_from_slice(&(captured.len() as u32).to_le_bytes());
        header[12..16].copy_from_slice(&orig_len.to_le_bytes());
        self.inner.write_all(&header)?;
        self.inner.write_all(captured)
    }

    /// Flushes the underlying writer.
    ///
    /// # Errors
    /// Any I/O error of the underlying writer.
    pub fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }

    /// Returns the underlying writer.
    pub fn into_inner(self) -> W {
        self.inner
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn test_round_trip() {
        let mut writer = Writer::new(Vec::new()).unwrap();
        writer
            .write_frame(Duration::new(5, 250_000_000), &[0xaa; 60])
            .unwrap();
        writer.write_frame(Duration::new(6, 0), &[]).unwrap();
        let file = writer.into_inner();
        let mut reader = Reader::new(&file).unwrap();
        assert_eq!(reader.link_type(), LINKTYPE_ETHERNET);
        let first = reader.next().unwrap().unwrap();
        assert_eq!(first.timestamp, Duration::new(5, 250_000_000));
        assert_eq!(first.data, &[0xaa; 60]);
        assert_eq!(first.orig_len, 60);
        assert_eq!(reader.next().unwrap().unwrap().data, &[]);
        assert!(reader.next().is_none());
    }

    #[test]
    fn test_big_endian_nanos() {
        let mut file = vec![0xa1, 0xb2, 0x3c, 0x4d, 0, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0];
        file.extend_from_slice(&[0, 0, 0xff, 0xff, 0, 0, 0, 1]);
        file.extend_from_slice(&[0, 0, 0, 7, 0, 0, 0, 9, 0, 0, 0, 2, 0, 0, 0, 2, 0xde, 0xad]);
        let records: Vec<_> = Reader::new(&file).unwrap().collect();
        assert_eq!(
            records,
            [Ok(Record {
                timestamp: Duration::new(7, 9),
                orig_len: 2,
                data: &[0xde, 0xad],
            })]
        );
    }

    #[test]
    fn test_malformed() {
        assert_eq!(Reader::new(&[0; 10]).err(), Some(PcapError::Truncated));
        assert_eq!(Reader::new(&[0; 24]).err(), Some(PcapError::BadMagic));
        let mut file = Writer::new(Vec::new()).unwrap().into_inner();
        file.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 10, 0, 0, 0, 10, 0, 0, 0, 1, 2]);
        let mut reader = Reader::new(&file).unwrap();
        assert_eq!(reader.next(), Some(Err(PcapError::Truncated)));
        assert_eq!(reader.next(), None);
    }
}
