//! Fuzz `rtrs::wire::ConnRsp::parse`: never panics; what parses re-emits to itself.

#![no_main]

use libfuzzer_sys::fuzz_target;
use rtrs::wire::ConnRsp;

fuzz_target!(|data: &[u8]| {
    if let Ok(repr) = ConnRsp::parse(data) {
        let _ = repr.to_string();
        let mut buf = vec![0u8; repr.buffer_len()];
        repr.emit(&mut buf).expect("a parsed value emits");
        assert_eq!(ConnRsp::parse(&buf), Ok(repr));
    }
});
