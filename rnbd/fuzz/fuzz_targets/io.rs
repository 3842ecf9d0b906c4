//! Fuzz `rnbd::wire::Io::parse`: never panics; what parses re-emits to itself.

#![no_main]

use libfuzzer_sys::fuzz_target;
use rnbd::wire::Io;

fuzz_target!(|data: &[u8]| {
    if let Ok(repr) = Io::parse(data) {
        let _ = repr.to_string();
        let mut buf = vec![0u8; repr.buffer_len()];
        repr.emit(&mut buf).expect("a parsed value emits");
        assert_eq!(Io::parse(&buf), Ok(repr));
    }
});
