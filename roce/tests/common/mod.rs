//! Shared helpers for the capture tests: locate and read `tests/vectors/`.

#![allow(dead_code)] // each test binary uses a different subset

use std::path::PathBuf;

use roce::pcap::{Reader, LINKTYPE_ETHERNET};

/// `tests/vectors/` at the workspace root.
pub fn vectors_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/vectors")
}

/// A capture file, read into memory.
pub struct Capture {
    /// File stem, e.g. `rping-linux`.
    pub name: String,
    /// The whole pcap file.
    pub bytes: Vec<u8>,
}

impl Capture {
    /// Reads `tests/vectors/<name>.pcap`.
    pub fn load(name: &str) -> Capture {
        let path = vectors_dir().join(format!("{name}.pcap"));
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        Capture {
            name: name.to_owned(),
            bytes,
        }
    }

    /// Every capture in `tests/vectors/`, sorted by name.
    pub fn all() -> Vec<Capture> {
        let mut names: Vec<String> = std::fs::read_dir(vectors_dir())
            .expect("tests/vectors exists")
            .filter_map(|entry| {
                let name = entry.ok()?.file_name().into_string().ok()?;
                name.strip_suffix(".pcap").map(str::to_owned)
            })
            .collect();
        names.sort();
        assert!(
            !names.is_empty(),
            "no captures in {}",
            vectors_dir().display()
        );
        names.iter().map(|name| Capture::load(name)).collect()
    }

    /// The frames, in order (frame n of the tshark decode is `frames()[n - 1]`).
    pub fn frames(&self) -> Vec<&[u8]> {
        let reader = Reader::new(&self.bytes).expect("a pcap file");
        assert_eq!(reader.link_type(), LINKTYPE_ETHERNET, "{}", self.name);
        reader
            .map(|record| record.expect("well-formed record").data)
            .collect()
    }

    /// The capture time of every frame (since the first one), in order.
    pub fn timestamps(&self) -> Vec<std::time::Duration> {
        let reader = Reader::new(&self.bytes).expect("a pcap file");
        let stamps: Vec<_> = reader
            .map(|record| record.expect("well-formed record").timestamp)
            .collect();
        let first = stamps.first().copied().unwrap_or_default();
        stamps
            .iter()
            .map(|stamp| stamp.saturating_sub(first))
            .collect()
    }

    /// The companion text file `<name>.<suffix>`, if it exists.
    pub fn companion(&self, suffix: &str) -> Option<String> {
        std::fs::read_to_string(vectors_dir().join(format!("{}.{suffix}", self.name))).ok()
    }
}
