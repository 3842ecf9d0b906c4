//! The engine's printable statistics report.

use core::fmt;
use core::net::Ipv4Addr;

use crate::port::Port;
use hal::block::BlockDevice;

use crate::{Chunk, Engine};

/// The engine's statistics, printable (`Display`, several lines).
pub struct StatsReport<'e, 'm, P: Port, D: BlockDevice<Chunk>> {
    pub(crate) engine: &'e Engine<'m, P, D>,
}

impl<P: Port, D: BlockDevice<Chunk>> fmt::Display for StatsReport<'_, '_, P, D> {
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
                write!(f, "interface {} {}: ", iface.name, iface.ip)?;
                hca.write_counters(f)?;
                writeln!(f)?;
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
