//! Counters per session and per volume.

use super::*;

/// Completed-IO counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IoCounters {
    /// READs completed successfully.
    pub reads: u64,
    /// WRITEs completed successfully.
    pub writes: u64,
    /// FLUSHes completed successfully.
    pub flushes: u64,
    /// DISCARDs completed successfully (including ones trimmed to nothing).
    pub discards: u64,
    /// SECURE_ERASEs (write-zeroes) completed successfully.
    pub write_zeroes: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Bytes written.
    pub write_bytes: u64,
    /// Bytes discarded or zeroed.
    pub discard_bytes: u64,
    /// IOs the volume failed.
    pub failed: u64,
}

impl IoCounters {
    pub(super) fn record(&mut self, kind: IoKind, bytes: u32, ok: bool) {
        if !ok {
            self.failed += 1;
            return;
        }
        let bytes = u64::from(bytes);
        match kind {
            IoKind::Read => {
                self.reads += 1;
                self.read_bytes += bytes;
            }
            IoKind::Write => {
                self.writes += 1;
                self.write_bytes += bytes;
            }
            IoKind::Flush => self.flushes += 1,
            IoKind::Discard => {
                self.discards += 1;
                self.discard_bytes += bytes;
            }
            IoKind::WriteZeroes => {
                self.write_zeroes += 1;
                self.discard_bytes += bytes;
            }
        }
    }
}

/// Refusals, by reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ErrorCounters {
    /// Malformed messages ([`Error::Malformed`], [`Error::NotARequest`]).
    pub malformed: u64,
    /// Wrong RTRS direction or too small a response buffer.
    pub transport_mismatch: u64,
    /// OPENs refused (unknown path, access, writers, table full, ...).
    pub open_refused: u64,
    /// IO for unknown or closing device ids.
    pub unknown_device: u64,
    /// Writes through read-only opens.
    pub read_only: u64,
    /// Ops the volume does not advertise.
    pub unsupported: u64,
    /// `bi_size` / data length disagreements.
    pub length_mismatch: u64,
    /// Ranges beyond the device, misaligned, or discards too large.
    pub out_of_range: u64,
    /// IOs the volume failed.
    pub io_failed: u64,
}

impl ErrorCounters {
    pub(super) fn record(&mut self, error: &Error) {
        let counter = match error {
            Error::Malformed(_) | Error::NotARequest => &mut self.malformed,
            Error::WrongDirection | Error::ResponseBufferTooSmall => &mut self.transport_mismatch,
            Error::NoSuchVolume
            | Error::AccessDenied
            | Error::WriterLimit
            | Error::ModeUpgrade
            | Error::AlreadyMapped
            | Error::TooManyDevices
            | Error::BadGeometry => &mut self.open_refused,
            Error::UnknownDevice => &mut self.unknown_device,
            Error::ReadOnly => &mut self.read_only,
            Error::FlushUnsupported | Error::DiscardUnsupported => &mut self.unsupported,
            Error::DataLengthMismatch => &mut self.length_mismatch,
            Error::OutOfRange | Error::Misaligned | Error::DiscardTooLarge => {
                &mut self.out_of_range
            }
            Error::Io(_) => &mut self.io_failed,
        };
        *counter += 1;
    }
}

/// Per-session statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SessionStats {
    /// OPENs answered with a device (including re-opens).
    pub opens: u64,
    /// CLOSEs answered (including unknown ids).
    pub closes: u64,
    /// Completed IO.
    pub io: IoCounters,
    /// Refusals by reason.
    pub errors: ErrorCounters,
}

/// Per-volume statistics (all sessions).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VolumeStats {
    /// Opens of the volume (not counting re-opens).
    pub opens: u64,
    /// Completed IO.
    pub io: IoCounters,
    /// IO on this volume refused before submission, and failed by it, by
    /// reason.
    pub errors: ErrorCounters,
}
