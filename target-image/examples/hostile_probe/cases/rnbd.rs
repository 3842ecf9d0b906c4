//! RNBD cases (rnbd.md §4, §8.3): OPEN and CLOSE misuse, IO after close,
//! malformed and out-of-range IO, flush storms. Each rogue session's own
//! valid IO stays byte-exact.

use rnbd::client::Device;
use rnbd::errno as e;
use rnbd::wire::{AccessMode, Io, IoFlags, IoOp};

use super::{case, client_session, Case};
use crate::clients::{pattern, Fabric};
use crate::outcome::{errno_name, tally};
use crate::wire::Wire;
use crate::Args;

/// OPENs of the open storm.
const OPENS: usize = 64;
/// FLUSHes of the flush storm.
const FLUSHES: u64 = 200;

pub fn cases(_args: &Args) -> Vec<Case> {
    vec![
        case(
            "bi_size_beyond_data",
            format!("write {}, read {}, valid IO 0", n(e::EINVAL), n(e::EINVAL)),
            |wire, args| {
                let (c, device) = open_rw(wire, args, "bi-size");
                // bi_size 8 KiB, 4 KiB of data; bi_size 8 KiB, a 4 KiB buffer.
                let write = wire.write_request(
                    c,
                    2,
                    &io(&device, IoOp::Write, 8, 8192),
                    &pattern(31, 4096),
                    false,
                );
                let (read, _) =
                    wire.read_request(c, 3, &io(&device, IoOp::Read, 8, 8192), 4096, false);
                format!(
                    "write {}, read {}, valid IO {}",
                    n(write),
                    n(read),
                    valid_io(wire, c, &device)
                )
            },
        ),
        case(
            "write_through_read_only_open",
            format!("read 0, write {}", n(e::EPERM)),
            |wire, args| {
                let c = client_session(wire, args, "read-only");
                let device = match wire.open(c, 1, &args.ro_volume, AccessMode::ReadOnly) {
                    Ok(device) => device,
                    Err(errno) => return format!("OPEN {} {}", args.ro_volume, n(errno)),
                };
                let (read, _) = wire.read(c, 2, &device, 0, 4096);
                let mut forced = device;
                forced.mode = AccessMode::ReadWrite;
                let write = wire.write(c, 3, &forced, 0, &pattern(33, 16384));
                format!("read {}, write {}", n(read), n(write))
            },
        ),
        case(
            "open_read_only_volume_read_write",
            // The access rule grants read-only (rnbd.md §8.3 #30).
            n(e::EACCES),
            |wire, args| {
                let c = client_session(wire, args, "ro-as-rw");
                match wire.open(c, 1, &args.ro_volume, AccessMode::ReadWrite) {
                    Ok(_) => "opened".into(),
                    Err(errno) => n(errno),
                }
            },
        ),
        case(
            "unknown_device_id",
            format!("write {}, read {}", n(e::ENOTCONN), n(e::ENOTCONN)),
            |wire, args| {
                let (c, device) = open_rw(wire, args, "device-id");
                let mut unknown = device;
                unknown.id = 999;
                let write = wire.write(c, 2, &unknown, 0, &[1; 4096]);
                let (read, _) = wire.read(c, 3, &unknown, 0, 4096);
                format!("write {}, read {}", n(write), n(read))
            },
        ),
        case(
            "open_storm",
            format!("{OPENS} answered 0 with one device id"),
            // OPENs of one volume, one after the other, in one session: a
            // re-OPEN returns the open id (rnbd.md §8.3 #31), nothing more
            // is held.
            |wire, args| {
                let c = client_session(wire, args, "open-storm");
                let mut ids = Vec::new();
                let outcomes: Vec<String> = (0..OPENS as u64)
                    .map(
                        |tag| match wire.open(c, 1 + tag, &args.ro_volume, AccessMode::ReadOnly) {
                            Ok(device) => {
                                if !ids.contains(&device.id) {
                                    ids.push(device.id);
                                }
                                "0".to_string()
                            }
                            Err(errno) => n(errno),
                        },
                    )
                    .collect();
                if ids.len() == 1 && outcomes.iter().all(|o| o == "0") {
                    format!("{OPENS} answered 0 with one device id")
                } else {
                    format!("{}; device ids {ids:?}", tally(&outcomes))
                }
            },
        ),
        case(
            "double_open",
            format!(
                "again the same id, another writer {0}, read-only 0, upgraded {0}",
                n(e::EPERM)
            ),
            // The same session again; a second session as a second writer,
            // read-only, then upgrading its read-only open (rnbd.md §8.3 #31).
            |wire, args| {
                let (c, device) = open_rw(wire, args, "double-open");
                let again = match wire.open(c, 2, &args.rw_volume, AccessMode::ReadWrite) {
                    Ok(d) if d.id == device.id => "the same id".to_string(),
                    Ok(d) => format!("id {} (first {})", d.id, device.id),
                    Err(errno) => n(errno),
                };
                let other = client_session(wire, args, "second-writer");
                let opened = |r: Result<Device, u16>| r.map_or_else(n, |_| "0".into());
                let writer = opened(wire.open(other, 1, &args.rw_volume, AccessMode::ReadWrite));
                let reader = opened(wire.open(other, 2, &args.rw_volume, AccessMode::ReadOnly));
                let upgrade = opened(wire.open(other, 3, &args.rw_volume, AccessMode::ReadWrite));
                format!("again {again}, another writer {writer}, read-only {reader}, upgraded {upgrade}")
            },
        ),
        case(
            "close_unknown_device",
            // Silently succeeds, as Linux (rnbd.md §8.3 #32).
            "close 0; valid IO 0",
            |wire, args| {
                let (c, device) = open_rw(wire, args, "close-unknown");
                let mut unknown = device;
                unknown.id = 999;
                let close = wire.close_device(c, 2, &unknown);
                format!(
                    "close {}; valid IO {}",
                    n(close),
                    valid_io(wire, c, &device)
                )
            },
        ),
        case(
            "io_after_close",
            format!(
                "close 0, write {0}, read {0}, close again 0",
                n(e::ENOTCONN)
            ),
            |wire, args| {
                let (c, device) = open_rw(wire, args, "after-close");
                let close = wire.close_device(c, 2, &device);
                let write = wire.write(c, 3, &device, 0, &[2; 4096]);
                let (read, _) = wire.read(c, 4, &device, 0, 4096);
                let again = wire.close_device(c, 5, &device);
                format!(
                    "close {}, write {}, read {}, close again {}",
                    n(close),
                    n(write),
                    n(read),
                    n(again)
                )
            },
        ),
        case(
            "io_message_undersized",
            format!(
                "16 bytes {}, 0 bytes {}; valid IO 0",
                n(e::EINVAL),
                n(e::EINVAL)
            ),
            |wire, args| {
                let (c, device) = open_rw(wire, args, "short-io");
                let header = io(&device, IoOp::Write, 8, 4096);
                let short = wire.write_request(c, 2, &header[..16], &pattern(35, 4096), false);
                let empty = wire.write_request(c, 3, &[], &pattern(35, 4096), false);
                format!(
                    "16 bytes {}, 0 bytes {}; valid IO {}",
                    n(short),
                    n(empty),
                    valid_io(wire, c, &device)
                )
            },
        ),
        case(
            "io_message_oversized",
            "answered 0; valid IO 0",
            // A valid IO message followed by 900 bytes of junk in its user
            // header: the message is what counts (rnbd.md §8.3 #24 asks for
            // at least its size).
            |wire, args| {
                let (c, device) = open_rw(wire, args, "long-io");
                let mut header = io(&device, IoOp::Write, 8, 4096);
                header.extend(std::iter::repeat_n(0xa5, 900));
                let errno = wire.write_request(c, 2, &header, &pattern(36, 4096), false);
                format!(
                    "answered {}; valid IO {}",
                    n(errno),
                    valid_io(wire, c, &device)
                )
            },
        ),
        case(
            "unsupported_ops",
            format!("op 7 {}, WRITE_SAME {}", n(e::EOPNOTSUPP), n(e::EOPNOTSUPP)),
            |wire, args| {
                let (c, device) = open_rw(wire, args, "ops");
                let mut header = io(&device, IoOp::Write, 8, 4096);
                header[16] = 7;
                let unknown = wire.write_request(c, 2, &header, &pattern(37, 4096), false);
                header[16] = 5;
                let same = wire.write_request(c, 3, &header, &pattern(37, 4096), false);
                format!("op 7 {}, WRITE_SAME {}", n(unknown), n(same))
            },
        ),
        case(
            "io_beyond_the_end",
            format!(
                "write {0}, read {0}, overflowing range {0}; valid IO 0",
                n(e::EINVAL)
            ),
            |wire, args| {
                let (c, device) = open_rw(wire, args, "beyond-end");
                let last = device.nsectors - 4;
                let write = wire.write_request(
                    c,
                    2,
                    &io(&device, IoOp::Write, last, 4096),
                    &pattern(38, 4096),
                    false,
                );
                let (read, _) = wire.read_request(
                    c,
                    3,
                    &io(&device, IoOp::Read, device.nsectors, 4096),
                    4096,
                    false,
                );
                let overflow = wire.write_request(
                    c,
                    4,
                    &io(&device, IoOp::Write, u64::MAX - 3, 4096),
                    &pattern(38, 4096),
                    false,
                );
                format!(
                    "write {}, read {}, overflowing range {}; valid IO {}",
                    n(write),
                    n(read),
                    n(overflow),
                    valid_io(wire, c, &device)
                )
            },
        ),
        case(
            "discard_and_erase_out_of_range",
            format!("discard {0}, secure erase {0}; valid IO 0", n(e::EINVAL)),
            |wire, args| {
                let (c, device) = open_rw(wire, args, "discard-range");
                let last = device.nsectors - 4;
                let discard =
                    wire.write_request(c, 2, &io(&device, IoOp::Discard, last, 4096), &[], false);
                let erase = wire.write_request(
                    c,
                    3,
                    &io(&device, IoOp::SecureErase, device.nsectors, 4096),
                    &[],
                    false,
                );
                format!(
                    "discard {}, secure erase {}; valid IO {}",
                    n(discard),
                    n(erase),
                    valid_io(wire, c, &device)
                )
            },
        ),
        case(
            "size_not_a_sector_multiple",
            format!("{}; valid IO 0", n(e::EINVAL)),
            |wire, args| {
                let (c, device) = open_rw(wire, args, "odd-size");
                let mut header = io(&device, IoOp::Write, 8, 4096);
                header[20..24].copy_from_slice(&1000u32.to_le_bytes());
                let errno = wire.write_request(c, 2, &header, &pattern(39, 1000), false);
                format!("{}; valid IO {}", n(errno), valid_io(wire, c, &device))
            },
        ),
        case(
            "write_carried_as_rtrs_read",
            format!("{}; valid IO 0", n(e::EINVAL)),
            |wire, args| {
                let (c, device) = open_rw(wire, args, "write-as-read");
                let (errno, _) =
                    wire.read_request(c, 2, &io(&device, IoOp::Write, 8, 4096), 4096, false);
                format!("{}; valid IO {}", n(errno), valid_io(wire, c, &device))
            },
        ),
        case(
            "flush_storm",
            // The probe volumes are RAM: no write-back cache to flush
            // (rnbd.md §8.3 #37, what the block layer gives Linux).
            format!(
                "{FLUSHES} flushes answered {}; valid IO 0",
                n(e::EOPNOTSUPP)
            ),
            |wire, args| {
                let (c, device) = open_rw(wire, args, "flushes");
                let header = io(&device, IoOp::Flush, u64::MAX, 0);
                let outcomes: Vec<String> = (0..FLUSHES)
                    .map(|tag| n(wire.read_request(c, 10 + tag, &header, 0, false).0))
                    .collect();
                let outcome = match outcomes.first() {
                    Some(first) if outcomes.iter().all(|o| o == first) => {
                        format!("{FLUSHES} flushes answered {first}")
                    }
                    _ => tally(&outcomes),
                };
                format!("{outcome}; valid IO {}", valid_io(wire, c, &device))
            },
        ),
    ]
}

/// An errno by name (short: the cases spell many).
fn n(errno: u16) -> String {
    errno_name(errno)
}

/// A session `PREFIX-NAME` with `--rw-volume` open read-write (tag 1).
fn open_rw(wire: &mut Wire, args: &Args, name: &str) -> (usize, Device) {
    let c = client_session(wire, args, name);
    match wire.open(c, 1, &args.rw_volume, AccessMode::ReadWrite) {
        Ok(device) => (c, device),
        Err(errno) => panic!("OPEN {} read-write: {}", args.rw_volume, errno_name(errno)),
    }
}

/// An IO message for `device`: emitted valid (a 4 KiB write at sector 8),
/// then patched to `op`, `sector` and `bi_size` (the encoder refuses what
/// some cases send).
fn io(device: &Device, op: IoOp, sector: u64, bi_size: u32) -> Vec<u8> {
    let mut header = [0u8; 64];
    let len = Io {
        device_id: device.id,
        sector: 8,
        op: IoOp::Write,
        flags: IoFlags::NONE,
        bi_size: 4096,
        prio: 0,
    }
    .emit(&mut header)
    .expect("an IO message fits 64 bytes");
    header[8..16].copy_from_slice(&sector.to_le_bytes());
    header[16] = u8::from(op);
    header[20..24].copy_from_slice(&bi_size.to_le_bytes());
    header[..len].to_vec()
}

/// The session's own valid IO: a write and its read-back, byte for byte
/// (the errno, or 0).
fn valid_io(wire: &mut Wire, c: usize, device: &Device) -> String {
    let data = pattern(0x7a11d, 8192);
    let errno = match wire.write(c, 100, device, 65536, &data) {
        0 => match wire.read(c, 101, device, 65536, 8192) {
            (0, back) if back == data => 0,
            (0, _) => return "read back different data".into(),
            (errno, _) => errno,
        },
        errno => errno,
    };
    errno_name(errno)
}
