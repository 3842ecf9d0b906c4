//! Fuzz `rnbd::wire::Close::parse`: never panics; what parses re-emits to itself.

#![no_main]

use libfuzzer_sys::fuzz_target;
use rnbd::wire::Close;

fuzz_target!(|data: &[u8]| {
    if let Ok(repr) = Close::parse(data) {
        let _ = repr.to_string();
        let mut buf = vec![0u8; repr.buffer_len()];
        repr.emit(&mut buf).expect("a parsed value emits");
        assert_eq!(Close::parse(&buf), Ok(repr));
    }
});
