//! Fuzz `rnbd::wire::OpenRsp::parse`: never panics; what parses re-emits to itself.

#![no_main]

use libfuzzer_sys::fuzz_target;
use rnbd::wire::OpenRsp;

fuzz_target!(|data: &[u8]| {
    if let Ok(repr) = OpenRsp::parse(data) {
        let _ = repr.to_string();
        let mut buf = vec![0u8; repr.buffer_len()];
        repr.emit(&mut buf).expect("a parsed value emits");
        assert_eq!(OpenRsp::parse(&buf), Ok(repr));
    }
});
