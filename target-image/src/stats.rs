//! The engine's printable statistics report.

use core::fmt;
use core::net::Ipv4Addr;

use hal::block::BlockDevice;
use verbs::KeySource;

use crate::{Chunk, Engine};

/// The engine's statistics, printable (`Display`, several lines).
pub struct StatsReport<'e, 'm, K: KeySource, D: BlockDevice<Chunk>> {
    pub(crate) engine: &'e Engine<'m, K, D>,
}

impl<K: KeySource, D: BlockDevice<Chunk>> fmt::Display for StatsReport<'_, '_, K, D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let engine = self.engine;
        let server = &engine.server;
        let s = server.stats();
        let u = server.usage();
        writeln!(
            f,
            "brick statistics: {} IO answers; rtrs accepted {} rejected {} paths_closed {} sessions {} paths {} connections {}",
            engine.answered, s.accepted, s.rejected, s.paths_closed, u.sessions, u.paths, u.connections
        )?;
        for (port, iface) in engine.interfaces.iter().enumerate() {
            if let Some(hca) = engine.hcas.get(port) {
                let c = hca.counters();
                writeln!(
                    f,
                    "interface {} {}: frames in {} out {} retransmissions {} timeouts {} (early {}) naks sent {} dropped malformed {} checksum {} out-of-sequence {}",
                    iface.name,
                    iface.ip,
                    c.frames_in,
                    c.frames_out,
                    c.retransmissions,
                    c.timeouts,
                    c.early_timeouts,
                    c.naks_sent,
                    c.drop_malformed,
                    c.drop_bad_checksum,
                    c.drop_out_of_sequence
                )?;
            }
        }
        for entry in &engine.sessions {
            let io = entry.rnbd.stats().io;
            write!(
                f,
                "session {:?} from {}{}: opens {} closes {} reads {} ({} B) writes {} ({} B) flushes {}",
                entry.name,
                entry.source.unwrap_or(Ipv4Addr::UNSPECIFIED),
                if entry.closed { " (closed, draining)" } else { "" },
                entry.rnbd.stats().opens,
                entry.rnbd.stats().closes,
                io.reads,
                io.read_bytes,
                io.writes,
                io.write_bytes,
                io.flushes,
            )?;
            if let Some(rt) = server.session_stats(entry.id) {
                write!(f, " rtrs_errors {} reconnects {}", rt.errors, rt.reconnects)?;
            }
            writeln!(f)?;
            for (path, _) in &entry.paths {
                if let Some(p) = server.path_stats(*path) {
                    let on = server
                        .path_port(*path)
                        .map_or("?", |port| engine.interface_name(port));
                    writeln!(
                        f,
                        "  path {} on {on}: reads {} ({} B) writes {} ({} B) errors {} heartbeats {}/{}",
                        path.index,
                        p.reads,
                        p.read_bytes,
                        p.writes,
                        p.write_bytes,
                        p.errors,
                        p.heartbeats_sent,
                        p.heartbeats_acked
                    )?;
                }
            }
        }
        for served in &engine.volumes {
            let v = engine.rnbd.volume_stats(served.info.id);
            let device = served.device.info();
            writeln!(
                f,
                "volume {} ({} B{}): opens {} writers {} reads {} ({} B) writes {} ({} B) flushes {} in_flight {} parked {} (total {}) device_errors {}",
                served.name,
                device.size,
                if device.volatile_write_cache { ", write-back" } else { "" },
                v.opens,
                engine.rnbd.writers(served.info.id),
                v.io.reads,
                v.io.read_bytes,
                v.io.writes,
                v.io.write_bytes,
                v.io.flushes,
                served.device.in_flight(),
                served.parked.len(),
                served.counters.parked,
                served.counters.device_errors,
            )?;
        }
        Ok(())
    }
}
