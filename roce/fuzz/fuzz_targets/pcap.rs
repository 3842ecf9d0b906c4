//! Fuzz target: the pcap reader on arbitrary files.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roce::pcap::Reader;

fuzz_target!(|data: &[u8]| {
    if let Ok(reader) = Reader::new(data) {
        for record in reader {
            let _ = record.map(|record| record.data.len());
        }
    }
});
