//! Volumes with a volatile write cache, as the engine's device sees the
//! requests: FLUSH reaches the device, a FUA write goes out with the FUA
//! flag when the volume has native FUA, and as a write followed by a FLUSH
//! (completing only after it) when it has not.

mod common;

use std::cell::RefCell;
use std::rc::Rc;

use common::{config, pattern, run, World};
use hal::block::{BlockDevice, BufferAccess, Completion, DeviceInfo, Op, Request, SubmitError};
use initiator::AccessMode;
use target_image::{Chunk, RamVolume};

const MANIFEST: &str = r#"
[target]
name = "brick-initiator-cache"

[limits]
queue_depth = 32

[[interfaces]]
name = "eth0"
mac = "52:54:00:77:00:01"
address = "10.77.0.1/24"

[[volumes]]
name = "writeback"
kind = "ram"
size = "4MiB"

[[volumes]]
name = "native"
kind = "ram"
size = "4MiB"

[[access]]
sessions = "*"
volumes = ["writeback", "native"]
mode = "rw"
"#;

/// What a device was asked to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seen {
    Read,
    Write { fua: bool },
    Flush,
    Discard,
}

/// A device's request log, shared with the test.
type Log = Rc<RefCell<Vec<Seen>>>;

/// A RAM volume that claims a volatile write cache (and FUA if `fua`) and
/// logs every request it gets.
struct CacheVolume {
    inner: Box<RamVolume>,
    fua: bool,
    log: Log,
}

impl BlockDevice<Chunk> for CacheVolume {
    fn info(&self) -> DeviceInfo {
        let mut info = self.inner.info();
        info.volatile_write_cache = true;
        info.fua = self.fua;
        info
    }

    fn submit<A: BufferAccess<Chunk> + ?Sized>(
        &mut self,
        request: Request<Chunk>,
        buffers: &mut A,
    ) -> Result<(), SubmitError> {
        let seen = match request.op {
            Op::Read { .. } => Seen::Read,
            Op::Write { fua, .. } => Seen::Write { fua },
            Op::Flush => Seen::Flush,
            _ => Seen::Discard,
        };
        self.log.borrow_mut().push(seen);
        self.inner.submit(request, buffers)
    }

    fn poll<A: BufferAccess<Chunk> + ?Sized>(
        &mut self,
        now: u64,
        buffers: &mut A,
        max: usize,
        on_completion: &mut impl FnMut(Completion<Chunk>),
    ) -> usize {
        self.inner.poll(now, buffers, max, on_completion)
    }

    fn poll_at(&self) -> Option<u64> {
        self.inner.poll_at()
    }

    fn in_flight(&self) -> usize {
        self.inner.in_flight()
    }
}

#[test]
fn flush_and_fua_reach_a_write_back_device() {
    run(|| {
        let logs: Rc<RefCell<Vec<(String, Log)>>> = Rc::default();
        let registry = Rc::clone(&logs);
        let mut world = World::with_volumes(
            MANIFEST,
            Box::new(move |_, volume| {
                let log = Rc::new(RefCell::new(Vec::new()));
                registry
                    .borrow_mut()
                    .push((volume.name.to_string(), Rc::clone(&log)));
                Ok(CacheVolume {
                    inner: Box::new(target_image::ram_volume(volume)?),
                    fua: volume.name == "native",
                    log,
                })
            }),
        );
        let log_of = |name: &str| {
            logs.borrow()
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, log)| Rc::clone(log))
                .unwrap()
        };
        let node = world.add_node(2, config(2));
        world.connect(node, "cache", &["10.77.0.1:1234"]);
        let wb = world
            .open(node, "writeback", AccessMode::ReadWrite)
            .unwrap();
        let native = world.open(node, "native", AccessMode::ReadWrite).unwrap();
        assert!(wb.write_cache && !wb.fua);
        assert!(native.write_cache && native.fua);
        let wb_log = log_of("writeback");
        let native_log = log_of("native");

        // FLUSH goes to the device.
        world.flush(node, wb.id).unwrap();
        assert_eq!(*wb_log.borrow(), [Seen::Flush]);

        // A plain write: no FUA, no flush.
        wb_log.borrow_mut().clear();
        world
            .write(node, wb.id, 0, &pattern(1, 4096), false)
            .unwrap();
        assert_eq!(*wb_log.borrow(), [Seen::Write { fua: false }]);

        // FUA without native FUA: the pieces, then one FLUSH, then done.
        wb_log.borrow_mut().clear();
        let data = pattern(2, 300 * 1024);
        world.write(node, wb.id, 1 << 20, &data, true).unwrap();
        let seen = wb_log.borrow().clone();
        assert_eq!(seen.len(), 4, "{seen:?}");
        assert!(
            seen[..3].iter().all(|s| *s == Seen::Write { fua: false }),
            "{seen:?}"
        );
        assert_eq!(seen[3], Seen::Flush);
        assert_eq!(world.read(node, wb.id, 1 << 20, 300 * 1024).unwrap(), data);

        // Native FUA: the flag on every piece, no flush.
        world.write(node, native.id, 0, &data, true).unwrap();
        let seen = native_log.borrow().clone();
        assert_eq!(seen, vec![Seen::Write { fua: true }; 3]);
        world.flush(node, native.id).unwrap();
        assert_eq!(native_log.borrow().last(), Some(&Seen::Flush));
        let stats = world.nodes[node].init.volume_stats(wb.id).unwrap();
        assert_eq!((stats.flushes, stats.writes, stats.errors), (1, 2, 0));
    });
}
