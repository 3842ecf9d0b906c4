//! The session, path, interface and refusal metrics (see `metrics`).

use core::fmt::{self, Write};
use core::net::Ipv4Addr;

use hal::block::BlockDevice;

use crate::metrics::{family, Label};
use crate::port::Port;
use crate::{Chunk, Engine};

impl<P: Port, D: BlockDevice<Chunk>> Engine<'_, P, D> {
    pub(crate) fn write_session_metrics(&self, out: &mut dyn Write) -> fmt::Result {
        let server = &*self.server;
        let usage = server.usage();
        family(out, "brick_sessions", "gauge", "RTRS sessions open.")?;
        writeln!(out, "brick_sessions {}", usage.sessions)?;
        family(out, "brick_paths", "gauge", "RTRS paths open.")?;
        writeln!(out, "brick_paths {}", usage.paths)?;
        family(
            out,
            "brick_io_answered_total",
            "counter",
            "IO requests answered (all sessions).",
        )?;
        writeln!(out, "brick_io_answered_total {}", self.answered)?;
        let stats = server.stats();
        family(
            out,
            "brick_rtrs_accepted_total",
            "counter",
            "RTRS connect requests accepted.",
        )?;
        writeln!(out, "brick_rtrs_accepted_total {}", stats.accepted)?;
        family(
            out,
            "brick_rtrs_paths_closed_total",
            "counter",
            "RTRS paths closed.",
        )?;
        writeln!(out, "brick_rtrs_paths_closed_total {}", stats.paths_closed)?;

        // One series per session entry: name, RTRS session index, source.
        let session_label = |out: &mut dyn Write, entry: &crate::sessions::SessionEntry| {
            write!(
                out,
                "session=\"{}\",id=\"{}\",source=\"{}\"",
                Label(&entry.name),
                entry.id.index,
                entry.source.unwrap_or(Ipv4Addr::UNSPECIFIED)
            )
        };
        let name = "brick_session_up";
        family(
            out,
            name,
            "gauge",
            "1 while a session is open, 0 while a closed one drains its IO.",
        )?;
        for entry in &self.sessions {
            write!(out, "{name}{{")?;
            session_label(out, entry)?;
            writeln!(out, "}} {}", u8::from(!entry.closed))?;
        }
        let per_session: [(&str, &str); 6] = [
            ("brick_session_reads_total", "Read requests of the session."),
            (
                "brick_session_writes_total",
                "Write requests of the session.",
            ),
            ("brick_session_read_bytes_total", "Bytes the session read."),
            (
                "brick_session_written_bytes_total",
                "Bytes the session wrote.",
            ),
            (
                "brick_session_errors_total",
                "Requests of the session answered with an error (RTRS).",
            ),
            (
                "brick_session_reconnects_total",
                "Paths of the session replaced by a reconnect.",
            ),
        ];
        for (which, (name, help)) in per_session.into_iter().enumerate() {
            family(out, name, "counter", help)?;
            for entry in &self.sessions {
                let io = entry.rnbd.stats().io;
                let rtrs = server.session_stats(entry.id).unwrap_or_default();
                let value = [
                    io.reads,
                    io.writes,
                    io.read_bytes,
                    io.write_bytes,
                    rtrs.errors,
                    rtrs.reconnects,
                ][which];
                write!(out, "{name}{{")?;
                session_label(out, entry)?;
                writeln!(out, "}} {value}")?;
            }
        }
        let per_path: [(&str, &str); 7] = [
            (
                "brick_path_up",
                "1 for each path of a session the server holds.",
            ),
            ("brick_path_reads_total", "Read requests on the path."),
            ("brick_path_writes_total", "Write requests on the path."),
            ("brick_path_read_bytes_total", "Bytes read on the path."),
            (
                "brick_path_written_bytes_total",
                "Bytes written on the path.",
            ),
            (
                "brick_path_errors_total",
                "Requests on the path answered with an error.",
            ),
            (
                "brick_path_heartbeats_sent_total",
                "Heartbeats sent on the path.",
            ),
        ];
        for (which, (name, help)) in per_path.into_iter().enumerate() {
            family(
                out,
                name,
                if which == 0 { "gauge" } else { "counter" },
                help,
            )?;
            for entry in &self.sessions {
                for (path, address) in &entry.paths {
                    let Some(p) = server.path_stats(*path) else {
                        continue;
                    };
                    let on = server
                        .path_port(*path)
                        .map_or("?", |port| self.interface_name(port));
                    let value = [
                        1,
                        p.reads,
                        p.writes,
                        p.read_bytes,
                        p.write_bytes,
                        p.errors,
                        p.heartbeats_sent,
                    ][which];
                    write!(out, "{name}{{")?;
                    session_label(out, entry)?;
                    writeln!(
                        out,
                        ",path=\"{}\",interface=\"{}\",client=\"{address}\"}} {value}",
                        path.index,
                        Label(on)
                    )?;
                }
            }
        }
        self.write_path_retransmissions(out, &session_label)
    }

    /// `brick_path_retransmissions_total`: the packets the path's QPs
    /// sent again, for paths on a device that counts them per connection
    /// (the software HCA; a kernel HCA counts per port only, see
    /// `brick_interface_retransmissions_total`).
    fn write_path_retransmissions(
        &self,
        out: &mut dyn Write,
        session_label: &dyn Fn(&mut dyn Write, &crate::sessions::SessionEntry) -> fmt::Result,
    ) -> fmt::Result {
        let server = &*self.server;
        let name = "brick_path_retransmissions_total";
        family(
            out,
            name,
            "counter",
            "Packets the path's connections sent again (go-back-N or selective).",
        )?;
        for entry in &self.sessions {
            for (path, address) in &entry.paths {
                let Some(port) = server.path_port(*path) else {
                    continue;
                };
                let Some(hca) = self.hcas.get(port) else {
                    continue;
                };
                let mut total = Some(0u64);
                for conn in server.path_conns(*path) {
                    total = total.zip(hca.retransmissions(conn)).map(|(a, b)| a + b);
                }
                let Some(total) = total else {
                    continue;
                };
                write!(out, "{name}{{")?;
                session_label(out, entry)?;
                writeln!(
                    out,
                    ",path=\"{}\",interface=\"{}\",client=\"{address}\"}} {total}",
                    path.index,
                    Label(self.interface_name(port))
                )?;
            }
        }
        Ok(())
    }

    pub(crate) fn write_interface_metrics(&self, out: &mut dyn Write) -> fmt::Result {
        family(
            out,
            "brick_interface_up",
            "gauge",
            "1 for each served interface.",
        )?;
        for iface in &self.interfaces {
            writeln!(
                out,
                "brick_interface_up{{interface=\"{}\",address=\"{}\"}} 1",
                Label(&iface.name),
                iface.ip
            )?;
        }
        // The families the first port reports, each over every port.
        let mut result = Ok(());
        if let Some(first) = self.hcas.first() {
            first.for_each_counter(&mut |counter, help, _| {
                if result.is_err() {
                    return;
                }
                result = self.write_interface_counter(out, counter, help);
            });
        }
        result
    }

    fn write_interface_counter(
        &self,
        out: &mut dyn Write,
        counter: &str,
        help: &str,
    ) -> fmt::Result {
        writeln!(out, "# HELP brick_interface_{counter}_total {help}")?;
        writeln!(out, "# TYPE brick_interface_{counter}_total counter")?;
        for (iface, port) in self.interfaces.iter().zip(&self.hcas) {
            let mut result = Ok(());
            port.for_each_counter(&mut |name, _, value| {
                if name == counter && result.is_ok() {
                    result = writeln!(
                        out,
                        "brick_interface_{counter}_total{{interface=\"{}\"}} {value}",
                        Label(&iface.name)
                    );
                }
            });
            result?;
        }
        Ok(())
    }

    pub(crate) fn write_refusals(&self, out: &mut dyn Write) -> fmt::Result {
        let s = self.server.stats();
        let r = self.refusals;
        let name = "brick_refusals_total";
        family(
            out,
            name,
            "counter",
            "Connections, paths and requests refused, by reason.",
        )?;
        for (reason, value) in [
            ("rtrs_connect_rejected", s.rejected),
            ("rtrs_path_refused", s.paths_refused),
            ("rtrs_takeover_refused", s.takeovers_refused),
            ("rtrs_half_open_refused", s.half_open_refused),
            ("rtrs_half_open_evicted", s.half_open_evicted),
            ("rtrs_setup_rate_refused", s.setup_rate_refused),
            ("rnbd_access_denied", r.access_denied),
            ("rnbd_no_such_volume", r.no_such_volume),
            ("rnbd_read_only", r.read_only),
            ("rnbd_invalid", r.invalid),
        ] {
            writeln!(out, "{name}{{reason=\"{reason}\"}} {value}")?;
        }
        Ok(())
    }
}
