//! The RNBD server's message handling (`rnbd::server::Server`): two
//! sessions over one export table (a writable volume with discard and a
//! read-only one), driven by a script of requests (SESS_INFO, OPEN in any
//! mode and path, CLOSE, IO of every op with any sector, size and flags —
//! well-formed or with raw bytes laid over them — in either RTRS
//! direction), IO completions (success or any error, in any order) and
//! session ends with IO in flight.
//!
//! Invariants: no panic; a submitted block request lies inside its
//! volume, is aligned to its logical block size and never writes the
//! read-only volume; an immediate reply fits the response buffer; each
//! volume's writer count equals the writable devices that hold it.
#![no_main]

use brick_fuzz::script::Script;
use libfuzzer_sys::fuzz_target;
use rnbd::server::{
    Action, BlockOp, DeviceState, DiscardLimits, Export, Exports, Grant, IoError, IoTicket,
    LookupError, Request, Server, Session, VolumeId, VolumeInfo,
};
use rnbd::wire::{AccessMode, Close, Io, IoFlags, IoOp, Message, Open, RtrsDirection, SessInfo};

/// Devices a session can name (above the per-session limit on purpose).
const DEVICE_IDS: u8 = 40;

struct Table {
    volumes: [VolumeInfo; 2],
}

impl Table {
    fn new() -> Self {
        let mut rw = VolumeInfo::new(VolumeId::try_new(0).unwrap(), 2048);
        rw.discard = Some(DiscardLimits {
            max_sectors: 256,
            granularity: 4096,
            alignment: 0,
        });
        rw.secure_erase = true;
        rw.write_cache = true;
        rw.fua = true;
        let mut ro = VolumeInfo::new(VolumeId::try_new(1).unwrap(), 512);
        ro.logical_block_size = 4096;
        Self { volumes: [rw, ro] }
    }
}

impl Exports for Table {
    fn lookup(&self, device_path: &str) -> Result<Export, LookupError> {
        match device_path {
            "vol0" => Ok(Export {
                volume: self.volumes[0],
                grant: Grant::ReadWrite,
            }),
            "ro" => Ok(Export {
                volume: self.volumes[1],
                grant: Grant::ReadOnly,
            }),
            "denied" => Err(LookupError::Denied),
            _ => Err(LookupError::NotFound),
        }
    }
}

/// An RNBD message from the script, in `buf`; its length.
fn message(script: &mut Script<'_>, buf: &mut [u8; 512]) -> usize {
    let device_id = u32::from(script.below(DEVICE_IDS));
    let message = match script.below(5) {
        0 => Message::SessInfo(SessInfo { ver: script.u8() }),
        1 => {
            let paths = ["vol0", "ro", "denied", "nope", "vol0/../ro", ""];
            Message::Open(Open {
                access_mode: match script.below(3) {
                    0 => AccessMode::ReadOnly,
                    1 => AccessMode::ReadWrite,
                    _ => AccessMode::Migration,
                },
                device_path: paths[usize::from(script.below(paths.len() as u8))],
            })
        }
        2 => Message::Close(Close { device_id }),
        _ => {
            let sectors = u64::from(script.u16()) % 2200;
            let sizes = [0, 512, 4096, 8192, 65536, 131072, 4097, 1 << 20];
            let mut flags = IoFlags::NONE;
            if script.u8() & 1 != 0 {
                flags = flags.union(IoFlags::FUA);
            }
            Message::Io(Io {
                device_id,
                sector: sectors,
                op: IoOp::from(script.below(7)),
                flags,
                bi_size: sizes[usize::from(script.below(sizes.len() as u8))],
                prio: 0,
            })
        }
    };
    let mut len = message.emit(&mut buf[..]).unwrap_or(0);
    // Raw bytes over the message: any field, any length.
    if script.u8() < 48 {
        let at = usize::from(script.u8()) % 300;
        let raw = script.bytes(64);
        let end = (at + raw.len()).min(buf.len());
        buf[at..end].copy_from_slice(&raw[..end - at]);
        len = len.max(end);
        if script.u8() & 1 == 0 {
            len = usize::from(script.u16()) % buf.len();
        }
    }
    len
}

fn check_submit(table: &Table, op: &BlockOp, volume: VolumeId) {
    let info = &table.volumes[volume.index()];
    let size = info.nsectors * 512;
    let block = u64::from(info.logical_block_size);
    let (offset, len, writes) = match *op {
        BlockOp::Read { offset, len } => (offset, u64::from(len), false),
        BlockOp::Write { offset, len, .. } => (offset, u64::from(len), true),
        BlockOp::Discard { offset, len } => (offset, u64::from(len), true),
        BlockOp::WriteZeroes { offset, len } => (offset, u64::from(len), true),
        BlockOp::Flush => return,
    };
    assert!(
        offset.checked_add(len).is_some_and(|end| end <= size),
        "{op:?} past the end of a {size}-byte volume"
    );
    assert!(
        offset % block == 0 && len % block == 0,
        "{op:?} not aligned to {block}"
    );
    assert!(
        !(writes && volume.index() == 1),
        "{op:?} on the read-only volume"
    );
}

fn check_writers(server: &Server, sessions: &[Session]) {
    for index in 0..2 {
        let volume = VolumeId::try_new(index).unwrap();
        let holders = sessions
            .iter()
            .flat_map(|s| (0..u32::from(DEVICE_IDS)).filter_map(move |id| s.device(id)))
            .filter(|state| match state {
                DeviceState::Open(d) | DeviceState::Draining { device: d, .. } => {
                    d.volume().id == volume && d.mode().is_writable()
                }
                DeviceState::Free => false,
            })
            .count();
        assert_eq!(
            server.writers(volume) as usize,
            holders,
            "volume {index}: writer count differs from the writable devices holding it"
        );
    }
}

fuzz_target!(|input: &[u8]| {
    let mut script = Script::new(input);
    let table = Table::new();
    let mut server = Server::new();
    let mut sessions = [Session::new(), Session::new()];
    let mut tickets: Vec<(usize, IoTicket)> = Vec::new();
    let mut header = [0u8; 512];
    let mut response = [0u8; 512];
    let mut tag = 0u32;
    // A session that ended takes no more requests; it is replaced once its
    // devices have drained.
    let mut ended = [false; 2];
    while !script.done() {
        let s = usize::from(script.below(2));
        match script.below(8) {
            0..=4 => {
                if ended[s] {
                    continue;
                }
                let len = message(&mut script, &mut header);
                let direction = if script.u8() < 220 {
                    Message::parse(&header[..len])
                        .ok()
                        .and_then(|m| m.rtrs_direction())
                        .unwrap_or(RtrsDirection::Write)
                } else if script.u8() & 1 == 0 {
                    RtrsDirection::Read
                } else {
                    RtrsDirection::Write
                };
                let data_len = match script.below(4) {
                    0 => 0,
                    1 => usize::from(script.u16()),
                    _ => 128 << 10,
                };
                let room = usize::from(script.u16()) % (response.len() + 1);
                tag += 1;
                let request = Request {
                    user_header: &header[..len],
                    data_len,
                    direction,
                    tag,
                };
                let action =
                    server.process(&mut sessions[s], &table, &request, &mut response[..room]);
                match action {
                    Action::Respond { len } => {
                        assert!(len <= room, "reply of {len} bytes in a {room}-byte buffer")
                    }
                    Action::Submit { request, ticket } => {
                        check_submit(&table, &request.op, request.volume);
                        tickets.push((s, ticket));
                    }
                    Action::Refuse(_) | Action::CloseDeferred => {}
                }
            }
            5 | 6 => {
                if tickets.is_empty() {
                    continue;
                }
                let at = usize::from(script.u8()) % tickets.len();
                let (owner, ticket) = tickets.swap_remove(at);
                let result = match script.below(8) {
                    0 => Err(IoError::Media),
                    1 => Err(IoError::NoSpace),
                    2 => Err(IoError::TimedOut),
                    3 => Err(IoError::Again),
                    _ => Ok(()),
                };
                let _ = server.complete(&mut sessions[owner], ticket, result);
            }
            _ => {
                let _ = server.end_session(&mut sessions[s]);
                ended[s] = true;
            }
        }
        for (session, ended) in sessions.iter_mut().zip(ended.iter_mut()) {
            if *ended && session.is_idle() {
                *session = Session::new();
                *ended = false;
            }
        }
        check_writers(&server, &sessions);
    }
});
