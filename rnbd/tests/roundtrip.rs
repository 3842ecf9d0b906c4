//! Client <-> server in-process: `rnbd::client` builds the bytes, the server
//! parses and checks them, a RAM engine executes, the client reads the
//! answers.

mod support;

use rnbd::client::{self, ClientError, Device, Outgoing, RemoteError};
use rnbd::errno;
use rnbd::server::{DiscardLimits, Grant, VolumeInfo};
use rnbd::wire::{AccessMode, CachePolicy, Io, IoOp, Message};
use support::{volume_id, Disks, Harness, Reply, TestExports};

const MIB: u64 = 1 << 20;

fn harness() -> Harness {
    let mut exports = TestExports::default();
    let mut vol0 = VolumeInfo::new(volume_id(0), 4 * MIB / 512);
    vol0.write_cache = true;
    vol0.fua = true;
    vol0.discard = Some(DiscardLimits {
        max_sectors: 2048,
        granularity: 512,
        alignment: 0,
    });
    exports.add("vol0", vol0, Some(Grant::ReadWrite));
    exports.add(
        "ro",
        VolumeInfo::new(volume_id(1), 8),
        Some(Grant::ReadOnly),
    );
    exports.add("other", VolumeInfo::new(volume_id(2), 8), None);
    Harness::new(exports, Disks::with_sizes(&[4 * MIB, 4096, 4096]))
}

/// Sends what the client built, with `data` for a WRITE.
fn send(h: &mut Harness, header: &[u8], out: Outgoing, data: &[u8]) -> Reply {
    h.request(
        &header[..out.user_header_len],
        out.direction,
        out.data_len as usize,
        data,
    )
}

fn map(h: &mut Harness, path: &str, mode: AccessMode) -> Result<Device, ClientError> {
    let mut header = [0u8; 264];
    let out = client::open(path, mode, &mut header)?;
    let reply = send(h, &header, out, &[]);
    Device::from_open_rsp(reply.status.unwrap(), &reply.data, mode)
}

#[test]
fn session_map_io_unmap() {
    let mut h = harness();
    let mut header = [0u8; 264];
    let out = client::sess_info(&mut header).unwrap();
    assert_eq!(out.data_len, 36);
    let reply = send(&mut h, &header, out, &[]);
    assert_eq!(
        client::sess_info_rsp(reply.status.unwrap(), &reply.data),
        Ok(2)
    );

    let device = map(&mut h, "vol0", AccessMode::ReadWrite)
        .unwrap()
        .with_max_io_size(128 << 10);
    assert_eq!(device.id, 0);
    assert_eq!(device.capacity_bytes(), 4 * MIB);
    assert_eq!(device.policy, CachePolicy(3));
    assert_eq!(device.geometry.max_discard_sectors, 2048);

    let data: Vec<u8> = (0..65536u32).map(|i| (i * 7) as u8).collect();
    let out = device.write(MIB, 65536, false, &mut header).unwrap();
    let Ok(Message::Io(io)) = Message::parse(&header[..out.user_header_len]) else {
        panic!()
    };
    assert_eq!((io.sector, io.rw(), io.bi_size), (2048, 0x001, 65536));
    assert_eq!(
        client::io_status(send(&mut h, &header, out, &data).status.unwrap()),
        Ok(())
    );

    let out = device.read(MIB, 65536, &mut header).unwrap();
    let reply = send(&mut h, &header, out, &[]);
    assert_eq!(client::io_status(reply.status.unwrap()), Ok(()));
    assert_eq!(reply.data, data);

    let out = device.write(0, 4096, true, &mut header).unwrap();
    assert_eq!(Io::parse(&header).unwrap().rw(), 0x301);
    assert_eq!(send(&mut h, &header, out, &[9; 4096]).status, Some(0));

    let out = device.flush(&mut header).unwrap();
    let flush = Io::parse(&header).unwrap();
    assert_eq!(
        (flush.op, flush.rw(), flush.sector),
        (IoOp::Flush, 0x302, u64::MAX)
    );
    assert_eq!(send(&mut h, &header, out, &[]).status, Some(0));

    let out = device.discard(MIB, 4096, &mut header).unwrap();
    assert_eq!(send(&mut h, &header, out, &[]).status, Some(0));
    let out = device.read(MIB, 4096, &mut header).unwrap();
    assert_eq!(send(&mut h, &header, out, &[]).data, vec![0; 4096]);

    let out = device.close(&mut header).unwrap();
    assert_eq!(send(&mut h, &header, out, &[]).status, Some(0));
    assert!(h.session.is_idle());
    // IO after CLOSE: the server says ENOTCONN.
    let out = device.read(0, 512, &mut header).unwrap();
    let status = send(&mut h, &header, out, &[]).status.unwrap();
    assert_eq!(
        client::io_status(status),
        Err(ClientError::Remote(RemoteError::NotConnected))
    );
}

#[test]
fn open_errors_are_typed() {
    let mut h = harness();
    assert_eq!(
        map(&mut h, "missing", AccessMode::ReadOnly),
        Err(ClientError::Remote(RemoteError::NotFound))
    );
    assert_eq!(
        map(&mut h, "other", AccessMode::ReadOnly),
        Err(ClientError::Remote(RemoteError::AccessDenied))
    );
    assert_eq!(
        map(&mut h, "ro", AccessMode::ReadWrite),
        Err(ClientError::Remote(RemoteError::AccessDenied))
    );
    let ro = map(&mut h, "ro", AccessMode::ReadOnly).unwrap();
    assert_eq!(
        map(&mut h, "ro", AccessMode::ReadWrite),
        Err(ClientError::Remote(RemoteError::NotPermitted))
    );
    assert!(matches!(
        map(&mut h, "a/../b", AccessMode::ReadOnly),
        Err(ClientError::Invalid(_))
    ));
    // Local checks: what the server would refuse is never sent.
    let mut header = [0u8; 32];
    assert_eq!(
        ro.write(0, 512, false, &mut header),
        Err(ClientError::ReadOnly)
    );
    assert_eq!(ro.discard(0, 512, &mut header), Err(ClientError::ReadOnly));
    assert_eq!(ro.flush(&mut header), Err(ClientError::FlushUnsupported));
    assert_eq!(
        ro.read(4096, 512, &mut header),
        Err(ClientError::OutOfRange)
    );
    assert_eq!(ro.read(0, 100, &mut header), Err(ClientError::Misaligned));
    assert_eq!(ro.read(0, 0, &mut header), Err(ClientError::Empty));
    assert_eq!(
        ro.read(u64::MAX - 511, 512, &mut header),
        Err(ClientError::OutOfRange)
    );
    assert_eq!(
        ro.read(0, 512, &mut header[..31]),
        Err(ClientError::BufferTooSmall)
    );
    assert_eq!(
        ro.with_max_io_size(512).read(0, 1024, &mut header),
        Err(ClientError::TooLarge)
    );
}

#[test]
fn server_enforces_what_a_client_could_skip() {
    // A client that ignores its mapping mode: the server still refuses.
    let mut h = harness();
    let ro = map(&mut h, "ro", AccessMode::ReadOnly).unwrap();
    let rw_view = Device {
        mode: AccessMode::ReadWrite,
        ..ro
    };
    let mut header = [0u8; 32];
    let out = rw_view.write(0, 512, false, &mut header).unwrap();
    let status = send(&mut h, &header, out, &[1; 512]).status.unwrap();
    assert_eq!(status, errno::EPERM);
    assert_eq!(
        client::io_status(status),
        Err(ClientError::Remote(RemoteError::NotPermitted))
    );
    assert!(h.disks.executed.is_empty());
}
