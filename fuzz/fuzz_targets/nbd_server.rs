//! The NBD server of `brick-initiatord` (`initiatord::nbd::Server`): one
//! connection whose client bytes are the fuzz input (after one byte
//! choosing the export: block size, read-only, failing backend, read
//! timeouts), served over a 1 MiB RAM backend.
//!
//! Invariants: no panic; the backend is only asked for ranges inside the
//! export and aligned to its block size (the contract of `NbdBackend`);
//! the server's counters add up (bytes read and written are multiples of
//! the block size and no more than the backend did, no more requests than
//! the stream could carry).
#![no_main]

use std::io::{self, Read, Write};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};

use initiatord::nbd::{BackendError, Counters, Idle, NbdBackend, Server};
use libfuzzer_sys::fuzz_target;

const SIZE: u64 = 1 << 20;

struct Ram {
    data: Vec<u8>,
    block: u32,
    read_only: bool,
    /// Every `fail_every`-th call fails (0: never).
    fail_every: u32,
    calls: u32,
    idles: u32,
    /// Bytes of successful backend reads and writes.
    read: u64,
    written: u64,
}

impl Ram {
    fn check(&mut self, offset: u64, len: u64, what: &str) -> Result<(), BackendError> {
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= SIZE),
            "{what} of {len} bytes at {offset} past the end of the {SIZE}-byte export"
        );
        let block = u64::from(self.block);
        assert!(
            offset.is_multiple_of(block) && len.is_multiple_of(block),
            "{what} of {len} bytes at {offset} not aligned to {block}"
        );
        self.calls += 1;
        if self.fail_every != 0 && self.calls.is_multiple_of(self.fail_every) {
            return Err(BackendError {
                reason: "injected failure".into(),
            });
        }
        Ok(())
    }
}

impl NbdBackend for Ram {
    fn size(&self) -> u64 {
        SIZE
    }
    fn block_size(&self) -> u32 {
        self.block
    }
    fn read_only(&self) -> bool {
        self.read_only
    }
    fn read(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), BackendError> {
        self.check(offset, buf.len() as u64, "read")?;
        self.read += buf.len() as u64;
        let at = offset as usize;
        buf.copy_from_slice(&self.data[at..at + buf.len()]);
        Ok(())
    }
    fn write(&mut self, offset: u64, data: &[u8], _fua: bool) -> Result<(), BackendError> {
        assert!(!self.read_only, "write on a read-only export");
        self.check(offset, data.len() as u64, "write")?;
        self.written += data.len() as u64;
        let at = offset as usize;
        self.data[at..at + data.len()].copy_from_slice(data);
        Ok(())
    }
    fn flush(&mut self) -> Result<(), BackendError> {
        self.check(0, 0, "flush")
    }
    fn discard(&mut self, offset: u64, len: u64) -> Result<(), BackendError> {
        assert!(!self.read_only, "discard on a read-only export");
        self.check(offset, len, "discard")
    }
    fn idle(&mut self) -> Idle {
        self.idles += 1;
        if self.idles > 64 {
            Idle::Disconnect
        } else {
            Idle::Continue
        }
    }
}

/// The client side: the fuzz input to read, replies counted. With
/// `timeouts`, every third read times out first (the idle path).
struct Stream<'a> {
    input: &'a [u8],
    timeouts: bool,
    reads: u32,
    written: u64,
}

impl Read for Stream<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.reads += 1;
        if self.timeouts && self.reads.is_multiple_of(3) {
            return Err(io::Error::from(io::ErrorKind::WouldBlock));
        }
        let n = buf.len().min(self.input.len());
        buf[..n].copy_from_slice(&self.input[..n]);
        self.input = &self.input[n..];
        Ok(n)
    }
}

impl Write for Stream<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.written += buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The server (its 32 MiB request buffer is allocated once per process).
fn server() -> &'static Mutex<(Server, Vec<u8>)> {
    static SERVER: OnceLock<Mutex<(Server, Vec<u8>)>> = OnceLock::new();
    SERVER.get_or_init(|| {
        Mutex::new((
            Server::new("vol0", Arc::new(Counters::default())),
            vec![0u8; SIZE as usize],
        ))
    })
}

fuzz_target!(|input: &[u8]| {
    let Some((&config, stream)) = input.split_first() else {
        return;
    };
    let mut guard = server().lock().unwrap_or_else(|p| p.into_inner());
    let (server, data) = &mut *guard;
    let block = [1, 512, 4096, 512][usize::from(config & 3)];
    let mut backend = Ram {
        data: std::mem::take(data),
        block,
        read_only: config & 4 != 0,
        fail_every: [0, 0, 3, 1][usize::from((config >> 3) & 3)],
        calls: 0,
        idles: 0,
        read: 0,
        written: 0,
    };
    let counters = Arc::clone(server.counters());
    let before = (
        counters.requests.load(Ordering::Relaxed),
        counters.bytes_read.load(Ordering::Relaxed),
        counters.bytes_written.load(Ordering::Relaxed),
    );
    let mut client = Stream {
        input: stream,
        timeouts: config & 0x20 != 0,
        reads: 0,
        written: 0,
    };
    let _ = server.serve(&mut client, &mut backend);
    let requests = counters.requests.load(Ordering::Relaxed) - before.0;
    let read = counters.bytes_read.load(Ordering::Relaxed) - before.1;
    let written = counters.bytes_written.load(Ordering::Relaxed) - before.2;
    // A request header is 28 bytes.
    assert!(
        requests <= stream.len() as u64 / 28,
        "{requests} requests from {} bytes",
        stream.len()
    );
    assert!(
        read % u64::from(block) == 0 && written % u64::from(block) == 0,
        "byte counters {read}/{written} not multiples of the block size {block}"
    );
    assert!(
        read <= backend.read && written <= backend.written,
        "counters say {read} bytes read and {written} written, the backend did {} and {}",
        backend.read,
        backend.written
    );
    *data = backend.data;
});
