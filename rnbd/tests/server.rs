//! `rnbd::server` unit tests: every message, and every rnbd.md §8.3 check,
//! each asserting the exact errno and that nothing reached a volume.

mod support;

use rnbd::config::MAX_DEVICES_PER_SESSION;
use rnbd::errno::*;
use rnbd::server::{
    status_for, BlockOp, DeviceState, DiscardLimits, Error, Grant, IoError, Server, Session,
    VolumeInfo,
};
use rnbd::wire::{AccessMode, Open, OpenRsp, ParseError, RtrsDirection, SessInfoRsp};
use support::{volume_id, Disks, Harness, Reply, TestExports};

const MIB: u64 = 1 << 20;
const READ: RtrsDirection = RtrsDirection::Read;
const WRITE: RtrsDirection = RtrsDirection::Write;

/// vol0: 1 MiB plain; vol1: 1 MiB, 4 KiB blocks, write-back + FUA,
/// discard (granule 4 KiB, at most 64 sectors), secure erase; vol2: granted
/// read-only; vol3: denied; "alias0": a second path to vol0.
fn harness() -> Harness {
    let mut exports = TestExports::default();
    let vol0 = VolumeInfo::new(volume_id(0), MIB / 512);
    let mut vol1 = VolumeInfo::new(volume_id(1), MIB / 512);
    vol1.logical_block_size = 4096;
    vol1.write_cache = true;
    vol1.fua = true;
    vol1.discard = Some(DiscardLimits {
        max_sectors: 64,
        granularity: 4096,
        alignment: 0,
    });
    vol1.secure_erase = true;
    exports.add("vol0", vol0, Some(Grant::ReadWrite));
    exports.add("vol1", vol1, Some(Grant::ReadWrite));
    exports.add(
        "ro",
        VolumeInfo::new(volume_id(2), MIB / 512),
        Some(Grant::ReadOnly),
    );
    exports.add("secret", VolumeInfo::new(volume_id(3), MIB / 512), None);
    exports.add("alias0", vol0, Some(Grant::ReadWrite));
    Harness::new(exports, Disks::with_sizes(&[MIB, MIB, MIB, MIB]))
}

fn sess_info(ver: u8) -> Vec<u8> {
    let mut b = vec![0u8; 36];
    b[4] = ver;
    b
}

fn open_msg(path: &str, mode: u8) -> Vec<u8> {
    let mut b = vec![0u8; 264];
    b[0] = 2;
    b[4] = mode;
    b[6..6 + path.len()].copy_from_slice(path.as_bytes());
    b
}

fn close_msg(device_id: u32) -> Vec<u8> {
    let mut b = vec![5u8, 0, 0, 0];
    b.extend_from_slice(&device_id.to_le_bytes());
    b
}

fn io_msg(device_id: u32, sector: u64, rw: u32, bi_size: u32) -> Vec<u8> {
    let mut b = vec![0u8; 32];
    b[0] = 4;
    b[4..8].copy_from_slice(&device_id.to_le_bytes());
    b[8..16].copy_from_slice(&sector.to_le_bytes());
    b[16..20].copy_from_slice(&rw.to_le_bytes());
    b[20..24].copy_from_slice(&bi_size.to_le_bytes());
    b
}

/// Opens `path` and returns the OPEN_RSP.
fn open(h: &mut Harness, path: &str, mode: u8) -> OpenRsp {
    let reply = h.request(&open_msg(path, mode), READ, 56, &[]);
    assert_eq!(reply.status, Some(OK), "{reply:?}");
    OpenRsp::parse(&reply.data).unwrap()
}

/// Asserts a refusal with `error` / `errno` that reached no volume.
#[track_caller]
fn assert_refused(h: &Harness, reply: &Reply, error: Error, errno: u16) {
    assert_eq!(reply.refused, Some(error), "{reply:?}");
    assert_eq!(reply.status, Some(errno));
    assert_eq!(status_for(&error), errno);
    assert!(reply.data.is_empty());
    assert_eq!(reply.submitted, None);
    assert!(h.disks.executed.is_empty(), "nothing reached a volume");
}

#[test]
fn sess_info_negotiates_version() {
    let mut h = harness();
    assert_eq!(h.session.version(), 0);
    let reply = h.request(&sess_info(2), READ, 36, &[]);
    assert_eq!(reply.status, Some(OK));
    assert_eq!(SessInfoRsp::parse(&reply.data), Ok(SessInfoRsp { ver: 2 }));
    assert_eq!(reply.data.len(), 36, "exactly the response size (§8.3 #27)");
    assert_eq!(h.session.version(), 2);
    let reply = h.request(&sess_info(7), READ, 64, &[]);
    assert_eq!(SessInfoRsp::parse(&reply.data), Ok(SessInfoRsp { ver: 2 }));
    assert_eq!(reply.data.len(), 36);
    let reply = h.request(&sess_info(1), READ, 36, &[]);
    assert_eq!(SessInfoRsp::parse(&reply.data), Ok(SessInfoRsp { ver: 1 }));
    assert_eq!(h.session.version(), 1);
}

#[test]
fn sess_info_checks_transport() {
    let mut h = harness();
    let reply = h.request(&sess_info(2), WRITE, 36, &[]);
    assert_refused(&h, &reply, Error::WrongDirection, EINVAL);
    let reply = h.request(&sess_info(2), READ, 35, &[]);
    assert_refused(&h, &reply, Error::ResponseBufferTooSmall, EINVAL);
    let reply = h.request(&sess_info(2)[..35], READ, 36, &[]);
    assert_refused(&h, &reply, Error::Malformed(ParseError::Truncated), EINVAL);
    assert_eq!(h.session.version(), 0);
}

#[test]
fn unknown_and_response_types_refused() {
    let mut h = harness();
    let mut b = sess_info(2);
    b[0] = 9;
    let reply = h.request(&b, READ, 36, &[]);
    assert_refused(
        &h,
        &reply,
        Error::Malformed(ParseError::UnknownType),
        EINVAL,
    );
    let reply = h.request(&[4, 0], WRITE, 0, &[]);
    assert_refused(&h, &reply, Error::Malformed(ParseError::Truncated), EINVAL);
    b[0] = 1; // SESS_INFO_RSP
    let reply = h.request(&b, READ, 36, &[]);
    assert_refused(&h, &reply, Error::NotARequest, EINVAL);
    let mut rsp = [0u8; 56];
    VolumeInfo::new(volume_id(0), 8)
        .open_rsp(0)
        .emit(&mut rsp)
        .unwrap();
    let reply = h.request(&rsp, READ, 56, &[]);
    assert_refused(&h, &reply, Error::NotARequest, EINVAL);
}

#[test]
fn open_answers_geometry() {
    let mut h = harness();
    let rsp = open(&mut h, "vol0", 1);
    assert_eq!(rsp.device_id, 0);
    assert_eq!(rsp.nsectors, 2048);
    assert_eq!(rsp.logical_block_size, 512);
    assert_eq!(rsp.cache_policy.0, 0);
    assert_eq!(rsp.max_discard_sectors, 0);
    let rsp = open(&mut h, "vol1", 1);
    assert_eq!(rsp.device_id, 1, "lowest free id (§2.8)");
    assert_eq!(rsp.logical_block_size, 4096);
    assert_eq!(rsp.cache_policy.0, 3, "WRITEBACK | FUA");
    assert_eq!(rsp.max_discard_sectors, 64);
    assert_eq!(rsp.discard_granularity, 4096);
    assert_eq!(rsp.secure_discard, 1);
    assert_eq!(h.server.writers(volume_id(0)), 1);
    assert_eq!(h.session.stats().opens, 2);
    assert_eq!(h.server.volume_stats(volume_id(1)).opens, 1);
}

#[test]
fn open_checks_transport() {
    let mut h = harness();
    let reply = h.request(&open_msg("vol0", 1), WRITE, 56, &[]);
    assert_refused(&h, &reply, Error::WrongDirection, EINVAL);
    let reply = h.request(&open_msg("vol0", 1), READ, 55, &[]);
    assert_refused(&h, &reply, Error::ResponseBufferTooSmall, EINVAL);
    assert!(h.session.is_idle());
    assert_eq!(h.server.writers(volume_id(0)), 0);
}

#[test]
fn open_unknown_path() {
    let mut h = harness();
    let reply = h.request(&open_msg("nope", 0), READ, 56, &[]);
    assert_refused(&h, &reply, Error::NoSuchVolume, ENOENT);
    assert_eq!(h.session.stats().errors.open_refused, 1);
}

#[test]
fn open_path_not_in_access_list() {
    let mut h = harness();
    let reply = h.request(&open_msg("secret", 0), READ, 56, &[]);
    assert_refused(&h, &reply, Error::AccessDenied, EACCES);
    // Read-only grant: RW and MIGRATION refused, RO allowed.
    let reply = h.request(&open_msg("ro", 1), READ, 56, &[]);
    assert_refused(&h, &reply, Error::AccessDenied, EACCES);
    let reply = h.request(&open_msg("ro", 2), READ, 56, &[]);
    assert_refused(&h, &reply, Error::AccessDenied, EACCES);
    assert!(h.session.is_idle());
    assert_eq!(open(&mut h, "ro", 0).device_id, 0);
}

#[test]
fn open_bad_device_path() {
    let mut h = harness();
    let cases: [(Vec<u8>, ParseError); 5] = [
        (open_msg("a/../vol0", 1), ParseError::PathTraversal),
        (open_msg("", 1), ParseError::EmptyPath),
        (open_msg("vol 0", 1), ParseError::ForbiddenPathChar),
        (
            {
                let mut b = open_msg("", 1);
                b[6..261].fill(b'a');
                b
            },
            ParseError::PathNotTerminated,
        ),
        (open_msg("vol0", 3), ParseError::UnknownAccessMode),
    ];
    for (bytes, error) in cases {
        let reply = h.request(&bytes, READ, 56, &[]);
        assert_refused(&h, &reply, Error::Malformed(error), EINVAL);
    }
    let reply = h.request(&open_msg("vol0", 1)[..263], READ, 56, &[]);
    assert_refused(&h, &reply, Error::Malformed(ParseError::Truncated), EINVAL);
    assert!(h.session.is_idle());
}

#[test]
fn second_rw_open_refused_across_sessions() {
    let mut h = harness();
    open(&mut h, "vol0", 1);
    // Another session of the same server.
    let mut other = Session::new();
    let mut chunk = [0u8; 56];
    let header = open_msg("vol0", 1);
    let request = rnbd::server::Request {
        user_header: &header,
        data_len: 56,
        direction: READ,
        tag: 1,
    };
    let action = h
        .server
        .process(&mut other, &h.exports, &request, &mut chunk);
    assert_eq!(action, rnbd::server::Action::Refuse(Error::WriterLimit));
    assert_eq!(action.immediate_status(), Some(EPERM));
    // Read-only is always allowed; MIGRATION allowed with one writer.
    let header = open_msg("vol0", 0);
    let request = rnbd::server::Request {
        user_header: &header,
        ..request
    };
    let action = h
        .server
        .process(&mut other, &h.exports, &request, &mut chunk);
    assert_eq!(action.immediate_status(), Some(OK));
    let mut third = Session::new();
    let header = open_msg("vol0", 2);
    let request = rnbd::server::Request {
        user_header: &header,
        ..request
    };
    let action = h
        .server
        .process(&mut third, &h.exports, &request, &mut chunk);
    assert_eq!(action.immediate_status(), Some(OK));
    assert_eq!(h.server.writers(volume_id(0)), 2);
    // A second migration writer would be the third: refused.
    let mut fourth = Session::new();
    let action = h
        .server
        .process(&mut fourth, &h.exports, &request, &mut chunk);
    assert_eq!(action, rnbd::server::Action::Refuse(Error::WriterLimit));
    // Ending the sessions releases the writers.
    assert_eq!(h.server.end_session(&mut third), 0);
    assert_eq!(h.server.end_session(&mut h.session), 0);
    assert_eq!(h.server.writers(volume_id(0)), 0);
    assert!(h.disks.executed.is_empty());
}

#[test]
fn reopen_same_path() {
    let mut h = harness();
    let first = open(&mut h, "vol0", 1);
    // Same path, same or lesser mode: the same id (Linux §4.2 step 2).
    assert_eq!(open(&mut h, "vol0", 1), first);
    assert_eq!(open(&mut h, "vol0", 0), first);
    assert_eq!(h.server.writers(volume_id(0)), 1);
    // RO open, then an RW re-open: an upgrade, refused (§8.3 #31).
    let ro = open(&mut h, "ro", 0);
    assert_eq!(ro.device_id, 1);
    let reply = h.request(&open_msg("ro", 1), READ, 56, &[]);
    assert_refused(&h, &reply, Error::ModeUpgrade, EPERM);
    let reply = h.request(&open_msg("vol1", 0), READ, 56, &[]);
    assert_eq!(reply.status, Some(OK));
    let reply = h.request(&open_msg("vol1", 1), READ, 56, &[]);
    assert_refused(&h, &reply, Error::ModeUpgrade, EPERM);
}

#[test]
fn same_volume_other_path_refused() {
    let mut h = harness();
    open(&mut h, "vol0", 0);
    let reply = h.request(&open_msg("alias0", 0), READ, 56, &[]);
    assert_refused(&h, &reply, Error::AlreadyMapped, EEXIST);
}

#[test]
fn device_table_full() {
    let mut exports = TestExports::default();
    for index in 0..=MAX_DEVICES_PER_SESSION {
        exports.add(
            &format!("v{index}"),
            VolumeInfo::new(volume_id(index), 8),
            Some(Grant::ReadWrite),
        );
    }
    let mut h = Harness::new(exports, Disks::default());
    for index in 0..MAX_DEVICES_PER_SESSION {
        assert_eq!(
            open(&mut h, &format!("v{index}"), 0).device_id as usize,
            index
        );
    }
    let last = format!("v{MAX_DEVICES_PER_SESSION}");
    let reply = h.request(&open_msg(&last, 1), READ, 56, &[]);
    assert_refused(&h, &reply, Error::TooManyDevices, EMFILE);
    assert_eq!(h.server.writers(volume_id(MAX_DEVICES_PER_SESSION)), 0);
    // Close id 5: the next open gets id 5.
    let reply = h.request(&close_msg(5), WRITE, 0, &[]);
    assert_eq!(reply.status, Some(OK));
    assert_eq!(open(&mut h, &last, 1).device_id, 5);
}

#[test]
fn bad_geometry_is_refused_not_sent() {
    let mut exports = TestExports::default();
    let mut volume = VolumeInfo::new(volume_id(0), 8);
    volume.logical_block_size = 0;
    exports.add("bad", volume, Some(Grant::ReadWrite));
    let mut h = Harness::new(exports, Disks::default());
    let reply = h.request(&open_msg("bad", 1), READ, 56, &[]);
    assert_refused(&h, &reply, Error::BadGeometry, EIO);
    assert!(h.session.is_idle());
    assert_eq!(h.server.writers(volume_id(0)), 0);
}

#[test]
fn close_and_id_reuse() {
    let mut h = harness();
    open(&mut h, "vol0", 1);
    open(&mut h, "vol1", 1);
    let reply = h.request(&close_msg(0), WRITE, 0, &[]);
    assert_eq!(reply.status, Some(OK));
    assert_eq!(h.server.writers(volume_id(0)), 0);
    // IO for the closed id: ENOTCONN.
    let reply = h.request(&io_msg(0, 0, 0x100, 4096), READ, 4096, &[]);
    assert_refused(&h, &reply, Error::UnknownDevice, ENOTCONN);
    assert_eq!(open(&mut h, "vol0", 1).device_id, 0, "id reused");
    // Unknown ids: success, as Linux (§8.3 #32).
    for id in [9, u32::MAX] {
        let reply = h.request(&close_msg(id), WRITE, 0, &[]);
        assert_eq!(reply.status, Some(OK));
    }
    // CLOSE must arrive as an RTRS WRITE.
    let reply = h.request(&close_msg(0), READ, 0, &[]);
    assert_refused(&h, &reply, Error::WrongDirection, EINVAL);
    assert_eq!(h.session.devices_in_use(), 2);
}

#[test]
fn close_waits_for_in_flight_io() {
    let mut h = harness();
    open(&mut h, "vol0", 1);
    h.defer = true;
    let data = vec![0xabu8; 4096];
    let first = h.request(&io_msg(0, 8, 0x001, 4096), WRITE, 4096, &data);
    let second = h.request(&io_msg(0, 16, 0x100, 4096), READ, 4096, &[]);
    assert!(first.submitted.is_some() && second.submitted.is_some());
    let reply = h.request(&close_msg(0), WRITE, 0, &[]);
    assert_eq!(reply.status, None, "CLOSE deferred (§4.3)");
    assert!(matches!(
        h.session.device(0),
        Some(DeviceState::Draining {
            close_tag: Some(7),
            ..
        })
    ));
    // New IO for the id: ENOTCONN; a second CLOSE: success at once.
    let reply = h.request(&io_msg(0, 0, 0x100, 4096), READ, 4096, &[]);
    assert_eq!(reply.refused, Some(Error::UnknownDevice));
    assert_eq!(reply.status, Some(ENOTCONN));
    // A new OPEN of the same path: the writer is still there.
    let reply = h.request(&open_msg("vol0", 1), READ, 56, &[]);
    assert_eq!(reply.refused, Some(Error::AlreadyMapped));
    let (completion, _) = h.complete_one().unwrap();
    assert_eq!((completion.status, completion.close_done), (OK, None));
    let (completion, _) = h.complete_one().unwrap();
    assert_eq!(completion.status, OK);
    assert_eq!(completion.data_len, 4096);
    assert_eq!(completion.close_done, Some(7), "CLOSE answered now");
    assert!(h.session.is_idle());
    assert_eq!(h.server.writers(volume_id(0)), 0);
    assert_eq!(h.disks.disks[0][8 * 512], 0xab);
}

#[test]
fn end_session_drains() {
    let mut h = harness();
    open(&mut h, "vol0", 1);
    open(&mut h, "vol1", 1);
    h.defer = true;
    h.request(&io_msg(1, 0, 0x100, 4096), READ, 4096, &[]);
    assert_eq!(h.server.end_session(&mut h.session), 1);
    assert_eq!(h.server.writers(volume_id(0)), 0);
    assert_eq!(h.server.writers(volume_id(1)), 1, "still draining");
    let (completion, _) = h.complete_one().unwrap();
    assert_eq!(completion.close_done, None);
    assert!(h.session.is_idle());
    assert_eq!(h.server.writers(volume_id(1)), 0);
}

#[test]
fn read_write_round_trip() {
    let mut h = harness();
    open(&mut h, "vol0", 1);
    let data: Vec<u8> = (0..8192u32).map(|i| i as u8).collect();
    let reply = h.request(&io_msg(0, 100, 0x101, 8192), WRITE, 8192, &data);
    assert_eq!(reply.status, Some(OK));
    assert_eq!(
        reply.submitted.unwrap().op,
        BlockOp::Write {
            offset: 51_200,
            len: 8192,
            fua: false
        }
    );
    let reply = h.request(&io_msg(0, 100, 0x100, 8192), READ, 8192, &[]);
    assert_eq!(reply.status, Some(OK));
    assert_eq!(reply.data, data);
    // The last sector of the device.
    let reply = h.request(&io_msg(0, 2047, 0x100, 512), READ, 512, &[]);
    assert_eq!(reply.status, Some(OK));
    let stats = h.session.stats().io;
    assert_eq!((stats.reads, stats.writes), (2, 1));
    assert_eq!((stats.read_bytes, stats.write_bytes), (8704, 8192));
    assert_eq!(h.server.volume_stats(volume_id(0)).io, stats);
}

#[test]
fn io_unknown_device_id() {
    let mut h = harness();
    open(&mut h, "vol0", 1);
    for id in [1, 31, 32, u32::MAX] {
        let reply = h.request(&io_msg(id, 0, 0x001, 4096), WRITE, 4096, &[1; 4096]);
        assert_refused(&h, &reply, Error::UnknownDevice, ENOTCONN);
    }
    assert_eq!(h.session.stats().errors.unknown_device, 4);
}

#[test]
fn io_write_through_read_only_open() {
    let mut h = harness();
    open(&mut h, "vol0", 0);
    let reply = h.request(&io_msg(0, 0, 0x001, 4096), WRITE, 4096, &[1; 4096]);
    assert_refused(&h, &reply, Error::ReadOnly, EPERM);
    let mut h = harness();
    open(&mut h, "vol1", 0);
    let reply = h.request(&io_msg(0, 0, 0x003, 4096), WRITE, 0, &[]);
    assert_refused(&h, &reply, Error::ReadOnly, EPERM);
    let reply = h.request(&io_msg(0, 0, 0x004, 4096), WRITE, 0, &[]);
    assert_refused(&h, &reply, Error::ReadOnly, EPERM);
    assert_eq!(h.session.stats().errors.read_only, 2);
    assert_eq!(h.server.volume_stats(volume_id(1)).errors.read_only, 2);
    // Reads and FLUSH are fine on a read-only open.
    let reply = h.request(&io_msg(0, 0, 0x100, 4096), READ, 4096, &[]);
    assert_eq!(reply.status, Some(OK));
    let reply = h.request(&io_msg(0, u64::MAX, 0x302, 0), READ, 0, &[]);
    assert_eq!(reply.status, Some(OK));
}

#[test]
fn io_sector_past_the_end() {
    let mut h = harness();
    open(&mut h, "vol0", 1);
    let reply = h.request(&io_msg(0, 2048, 0x100, 512), READ, 512, &[]);
    assert_refused(&h, &reply, Error::OutOfRange, EINVAL);
    let reply = h.request(&io_msg(0, 2047, 0x001, 1024), WRITE, 1024, &[0; 1024]);
    assert_refused(&h, &reply, Error::OutOfRange, EINVAL);
    let reply = h.request(&io_msg(0, 1 << 40, 0x100, 512), READ, 512, &[]);
    assert_refused(&h, &reply, Error::OutOfRange, EINVAL);
    assert_eq!(h.session.stats().errors.out_of_range, 3);
}

#[test]
fn io_sector_plus_len_overflows() {
    let mut h = harness();
    open(&mut h, "vol0", 1);
    let overflow = Error::Malformed(ParseError::SectorRangeOverflow);
    let reply = h.request(&io_msg(0, u64::MAX - 3, 0x100, 4096), READ, 4096, &[]);
    assert_refused(&h, &reply, overflow, EINVAL);
    let reply = h.request(&io_msg(0, u64::MAX / 512, 0x100, 512), READ, 512, &[]);
    assert_refused(&h, &reply, overflow, EINVAL);
}

#[test]
fn io_bi_size_larger_than_data_sent() {
    let mut h = harness();
    open(&mut h, "vol0", 1);
    let reply = h.request(&io_msg(0, 0, 0x001, 8192), WRITE, 4096, &[1; 4096]);
    assert_refused(&h, &reply, Error::DataLengthMismatch, EINVAL);
    let reply = h.request(&io_msg(0, 0, 0x100, 8192), READ, 4096, &[]);
    assert_refused(&h, &reply, Error::DataLengthMismatch, EINVAL);
    // Smaller is refused too: bi_size must equal the data (§8.3 #34).
    let reply = h.request(&io_msg(0, 0, 0x001, 512), WRITE, 4096, &[1; 4096]);
    assert_refused(&h, &reply, Error::DataLengthMismatch, EINVAL);
    let reply = h.request(&io_msg(0, 0, 0x101, 4096), WRITE, 0, &[]);
    assert_refused(&h, &reply, Error::DataLengthMismatch, EINVAL);
    let reply = h.request(&io_msg(0, 0, 0x100, 4095), READ, 4095, &[]);
    assert_refused(
        &h,
        &reply,
        Error::Malformed(ParseError::UnalignedSize),
        EINVAL,
    );
    assert_eq!(h.session.stats().errors.length_mismatch, 4);
}

#[test]
fn io_wrong_direction() {
    let mut h = harness();
    open(&mut h, "vol0", 1);
    // An IO WRITE sent as an RTRS READ would write stale chunk bytes (§8.3 #26).
    let reply = h.request(&io_msg(0, 0, 0x001, 4096), READ, 4096, &[]);
    assert_refused(&h, &reply, Error::WrongDirection, EINVAL);
    let reply = h.request(&io_msg(0, 0, 0x100, 4096), WRITE, 4096, &[0; 4096]);
    assert_refused(&h, &reply, Error::WrongDirection, EINVAL);
}

#[test]
fn io_unsupported_op() {
    let mut h = harness();
    open(&mut h, "vol0", 1);
    for rw in [0x005, 0x006, 0x0ff, 0x305] {
        let reply = h.request(&io_msg(0, 0, rw, 4096), WRITE, 4096, &[0; 4096]);
        assert_refused(
            &h,
            &reply,
            Error::Malformed(ParseError::UnsupportedOp),
            EOPNOTSUPP,
        );
    }
    // Unknown flags are ignored (§8.3 #33).
    let reply = h.request(&io_msg(0, 0, 0x0080_0100, 512), READ, 512, &[]);
    assert_eq!(reply.status, Some(OK));
}

#[test]
fn io_flush_needs_write_back() {
    let mut h = harness();
    open(&mut h, "vol0", 1);
    let reply = h.request(&io_msg(0, u64::MAX, 0x302, 0), READ, 0, &[]);
    assert_refused(&h, &reply, Error::FlushUnsupported, EOPNOTSUPP);
    let reply = h.request(&io_msg(0, u64::MAX, 0x302, 512), READ, 0, &[]);
    assert_refused(
        &h,
        &reply,
        Error::Malformed(ParseError::FlushWithData),
        EINVAL,
    );
    let mut h = harness();
    open(&mut h, "vol1", 1);
    let reply = h.request(&io_msg(0, u64::MAX, 0x302, 0), READ, 4096, &[]);
    assert_refused(&h, &reply, Error::DataLengthMismatch, EINVAL);
    let reply = h.request(&io_msg(0, u64::MAX, 0x302, 0), WRITE, 0, &[]);
    assert_refused(&h, &reply, Error::WrongDirection, EINVAL);
    let reply = h.request(&io_msg(0, u64::MAX, 0x302, 0), READ, 0, &[]);
    assert_eq!(reply.status, Some(OK));
    assert_eq!(reply.submitted.unwrap().op, BlockOp::Flush);
    assert_eq!(h.session.stats().io.flushes, 1);
}

#[test]
fn io_fua_write() {
    let mut h = harness();
    open(&mut h, "vol1", 1);
    let reply = h.request(&io_msg(0, 8, 0x301, 4096), WRITE, 4096, &[3; 4096]);
    assert_eq!(reply.status, Some(OK));
    assert_eq!(
        reply.submitted.unwrap().op,
        BlockOp::Write {
            offset: 4096,
            len: 4096,
            fua: true
        }
    );
    // Without a volatile cache every write is durable: no FUA needed.
    let mut h = harness();
    open(&mut h, "vol0", 1);
    let reply = h.request(&io_msg(0, 8, 0x301, 4096), WRITE, 4096, &[3; 4096]);
    assert!(matches!(
        reply.submitted.unwrap().op,
        BlockOp::Write { fua: false, .. }
    ));
}

#[test]
fn io_misaligned_to_logical_block() {
    let mut h = harness();
    open(&mut h, "vol1", 1); // 4 KiB logical blocks
    let reply = h.request(&io_msg(0, 1, 0x100, 4096), READ, 4096, &[]);
    assert_refused(&h, &reply, Error::Misaligned, EINVAL);
    let reply = h.request(&io_msg(0, 8, 0x001, 512), WRITE, 512, &[0; 512]);
    assert_refused(&h, &reply, Error::Misaligned, EINVAL);
}

#[test]
fn io_discard() {
    let mut h = harness();
    open(&mut h, "vol0", 1);
    let reply = h.request(&io_msg(0, 0, 0x003, 4096), WRITE, 0, &[]);
    assert_refused(&h, &reply, Error::DiscardUnsupported, EOPNOTSUPP);
    let reply = h.request(&io_msg(0, 0, 0x004, 4096), WRITE, 0, &[]);
    assert_refused(&h, &reply, Error::DiscardUnsupported, EOPNOTSUPP);
    let mut h = harness();
    open(&mut h, "vol1", 1);
    // Misaligned to the 4 KiB logical block.
    let reply = h.request(&io_msg(0, 1, 0x003, 4096), WRITE, 0, &[]);
    assert_refused(&h, &reply, Error::Misaligned, EINVAL);
    // Data with a discard, a discard over the limit, past the end.
    let reply = h.request(&io_msg(0, 0, 0x003, 4096), WRITE, 4096, &[0; 4096]);
    assert_refused(&h, &reply, Error::DataLengthMismatch, EINVAL);
    let reply = h.request(&io_msg(0, 0, 0x003, 72 * 512), WRITE, 0, &[]);
    assert_refused(&h, &reply, Error::DiscardTooLarge, EINVAL);
    let reply = h.request(&io_msg(0, 2040, 0x003, 8 * 4096), WRITE, 0, &[]);
    assert_refused(&h, &reply, Error::OutOfRange, EINVAL);
    h.disks.disks[1][..MIB as usize].fill(0xee);
    let reply = h.request(&io_msg(0, 8, 0x003, 8192), WRITE, 0, &[]);
    assert_eq!(reply.status, Some(OK));
    assert_eq!(
        reply.submitted.unwrap().op,
        BlockOp::Discard {
            offset: 4096,
            len: 8192
        }
    );
    let reply = h.request(&io_msg(0, 64, 0x004, 4096), WRITE, 0, &[]);
    assert_eq!(
        reply.submitted.unwrap().op,
        BlockOp::WriteZeroes {
            offset: 32_768,
            len: 4096
        }
    );
    let stats = h.session.stats().io;
    assert_eq!((stats.discards, stats.write_zeroes), (1, 1));
    assert_eq!(stats.discard_bytes, 12_288);
}

#[test]
fn io_discard_trimmed_to_granules() {
    let mut exports = TestExports::default();
    let mut volume = VolumeInfo::new(volume_id(0), MIB / 512);
    volume.discard = Some(DiscardLimits {
        max_sectors: 1024,
        granularity: 4096,
        alignment: 0,
    });
    exports.add("d", volume, Some(Grant::ReadWrite));
    let mut h = Harness::new(exports, Disks::with_sizes(&[MIB]));
    open(&mut h, "d", 1);
    // 512 B .. 4608 B holds no whole granule: success, nothing executed.
    let reply = h.request(&io_msg(0, 1, 0x003, 4096), WRITE, 0, &[]);
    assert_eq!(reply.status, Some(OK));
    assert_eq!(reply.submitted, None);
    assert!(h.disks.executed.is_empty());
    let reply = h.request(&io_msg(0, 1, 0x003, 8192), WRITE, 0, &[]);
    assert_eq!(
        reply.submitted.unwrap().op,
        BlockOp::Discard {
            offset: 4096,
            len: 4096
        }
    );
}

#[test]
fn volume_errors_map_to_errno() {
    let mut h = harness();
    open(&mut h, "vol0", 1);
    for (error, errno) in [
        (IoError::Media, EIO),
        (IoError::NoSpace, ENOSPC),
        (IoError::TimedOut, ETIMEDOUT),
        (IoError::Unsupported, EOPNOTSUPP),
        (IoError::Resource, ENOMEM),
        (IoError::Again, EAGAIN),
    ] {
        h.disks.fail_with = Some(error);
        let reply = h.request(&io_msg(0, 0, 0x100, 512), READ, 512, &[]);
        assert_eq!(reply.status, Some(errno));
        assert!(reply.data.is_empty(), "no data for a failed read");
    }
    assert_eq!(h.session.stats().io.failed, 6);
    assert_eq!(h.session.stats().errors.io_failed, 6);
    assert_eq!(h.server.volume_stats(volume_id(0)).io.failed, 6);
    assert_eq!(h.server.volume_stats(volume_id(0)).errors.io_failed, 6);
}

#[test]
fn open_emits_open_wire_message() {
    // The server accepts what the wire layer emits (and a Linux-style 264-byte OPEN).
    let mut h = harness();
    let mut header = [0u8; 264];
    Open {
        access_mode: AccessMode::Migration,
        device_path: "vol0",
    }
    .emit(&mut header)
    .unwrap();
    let reply = h.request(&header, READ, 56, &[]);
    assert_eq!(reply.status, Some(OK));
    let _ = Server::default();
}
