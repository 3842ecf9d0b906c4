//! What `status` reports: each configured volume, its device, link and paths.
//!
//! Built from the config and the last observation ([`report`]); sent as
//! the typed report (the control crate's [`Status`], what `brick status
//! --json` prints for scripts) or as a [`table`] for people.

use std::fmt;

use crate::config::Config;
use crate::observe::{link_device, DeviceState, Observed};

pub use control::{ExportStatus, PathStatus, Status, VolumeStatus, ORIGIN_CONFIG, ORIGIN_RUNTIME};

/// The report for `config`'s kernel volumes as `observed` shows them
/// (no exports yet; every origin [`ORIGIN_CONFIG`]).
pub fn report(config: &Config, observed: &Observed, notices: &[String]) -> Status {
    let volumes: Vec<VolumeStatus> = config
        .volumes
        .iter()
        .filter(|volume| !volume.is_userspace())
        .map(|volume| {
            let device = observed.device_for(&volume.session, &volume.device_path);
            let state = match device.map(|d| d.state) {
                None => "not mapped",
                Some(DeviceState::Open) => "open",
                Some(DeviceState::Closed) => "closed",
                Some(DeviceState::Init) => "init",
                Some(DeviceState::Unmapped) => "unmapped",
                Some(DeviceState::Unknown) => "unknown",
            };
            let linked = device.is_some_and(|d| {
                observed
                    .links
                    .get(&volume.name)
                    .is_some_and(|target| link_device(target) == d.name)
            });
            let paths = observed
                .sessions
                .get(&volume.session)
                .map(|s| {
                    s.paths
                        .iter()
                        .map(|p| PathStatus {
                            path: p.directory.clone(),
                            connected: p.connected,
                        })
                        .collect()
                })
                .unwrap_or_default();
            VolumeStatus {
                name: volume.name.clone(),
                session: volume.session.clone(),
                device_path: volume.device_path.clone(),
                origin: ORIGIN_CONFIG.to_owned(),
                device: device.map(|d| d.name.clone()),
                state: state.to_owned(),
                linked,
                paths,
            }
        })
        .collect();
    let converged = volumes.iter().all(|v| v.state == "open" && v.linked);
    Status {
        converged,
        volumes,
        exports: Vec::new(),
        notices: notices.to_vec(),
    }
}

/// The report as a table for people (`status` with format `text`): one
/// line per volume, then its paths; the exports; the notices.
pub fn table(status: &Status) -> String {
    Table(status).to_string()
}

struct Table<'s>(&'s Status);

impl fmt::Display for Table<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let status = self.0;
        writeln!(
            f,
            "{:<16} {:<10} {:<11} {:<8} SESSION/DEVICE_PATH",
            "NAME", "DEVICE", "STATE", "LINK"
        )?;
        for v in &status.volumes {
            writeln!(
                f,
                "{:<16} {:<10} {:<11} {:<8} {}/{}",
                v.name,
                v.device.as_deref().unwrap_or("-"),
                v.state,
                if v.linked { "ok" } else { "missing" },
                v.session,
                v.device_path
            )?;
            for p in &v.paths {
                writeln!(
                    f,
                    "    path {} {}",
                    p.path,
                    if p.connected {
                        "connected"
                    } else {
                        "disconnected"
                    }
                )?;
            }
        }
        for e in &status.exports {
            writeln!(
                f,
                "{:<16} nbd {} {}, {}; {} connections, {} requests, {} B read, {} B written, {} errors{}",
                e.name,
                e.address,
                if e.listening { "listening" } else { "not listening" },
                if e.session_connected {
                    "session up"
                } else {
                    "session down"
                },
                e.connections,
                e.requests,
                e.bytes_read,
                e.bytes_written,
                e.errors,
                e.last_error
                    .as_ref()
                    .map(|error| format!("; last error: {error}"))
                    .unwrap_or_default()
            )?;
        }
        for notice in &status.notices {
            writeln!(f, "note: {notice}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse;
    use crate::fake::FakeKernel;
    use crate::observe::observe;
    use crate::reconcile::{reconcile, Memory, Options};

    /// The status after one reconciliation pass of `config` against a
    /// fake kernel whose target exports only `vol0`.
    fn status_after_one_pass(config: &Config) -> Status {
        let mut kernel = FakeKernel::new();
        kernel.export("vol0");
        reconcile(
            &mut kernel,
            config,
            &mut Memory::default(),
            std::time::Instant::now(),
            Options::default(),
            &mut |_| {},
        )
        .unwrap();
        report(config, &observe(&kernel).unwrap(), &[])
    }

    #[test]
    fn test_status_json_and_text() {
        let config = parse(
            "[[volumes]]\nname = \"db\"\nsession = \"s\"\ndevice_path = \"vol0\"\npaths = [\"10.0.0.1\"]\n\n\
             [[volumes]]\nname = \"gone\"\nsession = \"s\"\ndevice_path = \"vol9\"\npaths = [\"10.0.0.1\"]\n",
            "t.toml",
        )
        .unwrap();
        let status = status_after_one_pass(&config);
        assert!(!status.converged);
        assert_eq!(
            status.to_json(),
            "{\"converged\":false,\"volumes\":[\
             {\"name\":\"db\",\"session\":\"s\",\"device_path\":\"vol0\",\"origin\":\"config\",\"device\":\"rnbd0\",\
             \"state\":\"open\",\"linked\":true,\"paths\":[{\"path\":\"ip:10.0.0.2@ip:10.0.0.1\",\"connected\":true}]},\
             {\"name\":\"gone\",\"session\":\"s\",\"device_path\":\"vol9\",\"origin\":\"config\",\"device\":null,\
             \"state\":\"not mapped\",\"linked\":false,\"paths\":[{\"path\":\"ip:10.0.0.2@ip:10.0.0.1\",\"connected\":true}]}],\
             \"exports\":[],\"notices\":[]}"
        );
        let text = table(&status);
        assert!(
            text.contains("db               rnbd0      open        ok       s/vol0"),
            "{text}"
        );
        assert!(
            text.contains("gone             -          not mapped  missing  s/vol9"),
            "{text}"
        );
    }

    #[test]
    fn test_status_shows_nbd_exports_apart_from_kernel_volumes() {
        let config = parse(
            "[[volumes]]\nname = \"db\"\nsession = \"s\"\ndevice_path = \"vol0\"\npaths = [\"10.0.0.1\"]\n\n\
             [[volumes]]\nname = \"n\"\nsession = \"u\"\ndevice_path = \"vol1\"\npaths = [\"127.0.0.1\"]\n\
             export = \"nbd:unix:/run/brick/n.nbd\"\nlink = \"udp:127.0.0.2:4791\"\n",
            "t.toml",
        )
        .unwrap();
        let mut status = status_after_one_pass(&config);
        // The export is not a kernel volume: converged without it.
        assert!(status.converged);
        assert_eq!(status.volumes.len(), 1);
        status.exports.push(ExportStatus {
            name: "n".into(),
            address: "nbd:unix:/run/brick/n.nbd".into(),
            listening: true,
            session_connected: true,
            client_connected: false,
            connections: 2,
            requests: 10,
            bytes_read: 4096,
            bytes_written: 8192,
            errors: 1,
            last_error: Some("past the end".into()),
        });
        let text = table(&status);
        assert!(
            text.contains("n                nbd nbd:unix:/run/brick/n.nbd listening, session up; 2 connections, 10 requests, 4096 B read, 8192 B written, 1 errors; last error: past the end"),
            "{text}"
        );
        assert!(status.to_json().contains("\"exports\":[{\"name\":\"n\",\"address\":\"nbd:unix:/run/brick/n.nbd\",\"listening\":true"));
    }
}
