//! Shared test engine: an export table, RAM volumes, and a loop that feeds
//! requests to `rnbd::server` and executes what it submits.
//!
//! The engine counts every block request it executes, so tests can assert
//! that a refused request reached no volume.

#![allow(dead_code)]

use rnbd::server::{
    Action, BlockOp, BlockRequest, Completion, Error, Export, Exports, Grant, IoError, IoTicket,
    LookupError, Request, Server, Session, VolumeId, VolumeInfo,
};
use rnbd::wire::RtrsDirection;

/// One export: path, volume, and this session's rights (`None`: denied).
#[derive(Clone)]
pub struct Entry {
    pub path: String,
    pub volume: VolumeInfo,
    pub grant: Option<Grant>,
}

/// An export table for one session.
#[derive(Clone, Default)]
pub struct TestExports {
    pub entries: Vec<Entry>,
}

impl TestExports {
    pub fn add(&mut self, path: &str, volume: VolumeInfo, grant: Option<Grant>) {
        self.entries.push(Entry {
            path: path.to_owned(),
            volume,
            grant,
        });
    }
}

impl Exports for TestExports {
    fn lookup(&self, device_path: &str) -> Result<Export, LookupError> {
        let entry = self
            .entries
            .iter()
            .find(|entry| entry.path == device_path)
            .ok_or(LookupError::NotFound)?;
        let grant = entry.grant.ok_or(LookupError::Denied)?;
        Ok(Export {
            volume: entry.volume,
            grant,
        })
    }
}

pub fn volume_id(index: usize) -> VolumeId {
    VolumeId::try_new(index).unwrap()
}

/// RAM volumes indexed by `VolumeId`, and a log of what was executed.
#[derive(Default)]
pub struct Disks {
    pub disks: Vec<Vec<u8>>,
    pub executed: Vec<BlockRequest>,
    /// When set, the next executions fail with this error.
    pub fail_with: Option<IoError>,
}

impl Disks {
    pub fn with_sizes(sizes: &[u64]) -> Disks {
        Disks {
            disks: sizes.iter().map(|&size| vec![0; size as usize]).collect(),
            ..Disks::default()
        }
    }

    /// Executes `request` with `chunk` as the chunk's data area.
    pub fn execute(&mut self, request: &BlockRequest, chunk: &mut [u8]) -> Result<(), IoError> {
        self.executed.push(*request);
        if let Some(error) = self.fail_with {
            return Err(error);
        }
        let disk = &mut self.disks[request.volume.index()];
        match request.op {
            BlockOp::Read { offset, len } => {
                let at = offset as usize;
                chunk[..len as usize].copy_from_slice(&disk[at..at + len as usize]);
            }
            BlockOp::Write { offset, len, .. } => {
                let at = offset as usize;
                disk[at..at + len as usize].copy_from_slice(&chunk[..len as usize]);
            }
            BlockOp::Flush => {}
            BlockOp::Discard { offset, len } | BlockOp::WriteZeroes { offset, len } => {
                let at = offset as usize;
                disk[at..at + len as usize].fill(0);
            }
        }
        Ok(())
    }
}

/// What one request came to, from the client's point of view.
#[derive(Debug, PartialEq, Eq)]
pub struct Reply {
    /// errno of the RTRS response (`None`: no reply yet, the request is
    /// pending or a CLOSE is deferred).
    pub status: Option<u16>,
    /// Data returned on the read path.
    pub data: Vec<u8>,
    /// The server's reason when it refused the request.
    pub refused: Option<Error>,
    /// The block request submitted, if any.
    pub submitted: Option<BlockRequest>,
}

/// A server, one session, its exports and RAM disks.
pub struct Harness {
    pub server: Server,
    pub session: Session,
    pub exports: TestExports,
    pub disks: Disks,
    /// Submitted and not yet completed (when `defer` is set).
    pub pending: Vec<(IoTicket, BlockRequest, Vec<u8>)>,
    /// Keep submitted requests pending instead of executing them at once.
    pub defer: bool,
}

impl Harness {
    pub fn new(exports: TestExports, disks: Disks) -> Harness {
        Harness {
            server: Server::new(),
            session: Session::new(),
            exports,
            disks,
            pending: Vec::new(),
            defer: false,
        }
    }

    /// Runs one request: `header` as the user header, `data` the chunk's
    /// data area for a WRITE (its length is `data_len`), or a read buffer
    /// of `data_len` bytes for a READ.
    pub fn request(
        &mut self,
        header: &[u8],
        direction: RtrsDirection,
        data_len: usize,
        data: &[u8],
    ) -> Reply {
        let mut chunk = vec![0u8; data_len.max(data.len())];
        chunk[..data.len()].copy_from_slice(data);
        let request = Request {
            user_header: header,
            data_len,
            direction,
            tag: 7,
        };
        let action = self
            .server
            .process(&mut self.session, &self.exports, &request, &mut chunk);
        let status = action.immediate_status();
        match action {
            Action::Respond { len } => Reply {
                status,
                data: chunk[..len].to_vec(),
                refused: None,
                submitted: None,
            },
            Action::Refuse(error) => Reply {
                status,
                data: Vec::new(),
                refused: Some(error),
                submitted: None,
            },
            Action::CloseDeferred => Reply {
                status: None,
                data: Vec::new(),
                refused: None,
                submitted: None,
            },
            Action::Submit { request, ticket } if self.defer => {
                self.pending.push((ticket, request, chunk));
                Reply {
                    status: None,
                    data: Vec::new(),
                    refused: None,
                    submitted: Some(request),
                }
            }
            Action::Submit { request, ticket } => {
                let result = self.disks.execute(&request, &mut chunk);
                let completion = self.server.complete(&mut self.session, ticket, result);
                assert_eq!(completion.close_done, None);
                Reply {
                    status: Some(completion.status),
                    data: chunk[..completion.data_len].to_vec(),
                    refused: None,
                    submitted: Some(request),
                }
            }
        }
    }

    /// Completes the oldest pending request with the chunk it arrived in;
    /// returns the completion and the read data it returns.
    pub fn complete_one(&mut self) -> Option<(Completion, Vec<u8>)> {
        if self.pending.is_empty() {
            return None;
        }
        let (ticket, request, mut chunk) = self.pending.remove(0);
        let result = self.disks.execute(&request, &mut chunk);
        let completion = self.server.complete(&mut self.session, ticket, result);
        let data = chunk[..completion.data_len].to_vec();
        Some((completion, data))
    }
}
