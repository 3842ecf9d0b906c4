//! Fuzz target: the binary manifest reader.
//!
//! Parse (the CRC is not checked under `cfg(fuzzing)`); if accepted, walk
//! every view, and check that the owned config re-encodes to a blob that
//! reads back to the same config.
#![no_main]

use libfuzzer_sys::fuzz_target;
use manifest::{Config, Manifest};

fuzz_target!(|data: &[u8]| {
    match Manifest::parse(data) {
        Err(error) => {
            let _ = error.to_string();
        }
        Ok(m) => {
            let _ = (m.target(), m.limits(), m.ram_volume_bytes());
            for volume in m.volumes() {
                let _ = m.volume_by_device_path(volume.device_path);
            }
            let _ = m.access("session", std::net::Ipv4Addr::LOCALHOST, 0);
            let config = Config::from_manifest(&m);
            let blob = config.to_binary().expect("an accepted manifest re-encodes");
            let again = Manifest::parse(&blob).expect("a re-encoded manifest reads");
            assert_eq!(Config::from_manifest(&again), config);
        }
    }
});
