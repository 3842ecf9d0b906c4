//! Fuzz `rtrs::wire::InfoReq::parse`: never panics; what parses re-emits to itself.

#![no_main]

use libfuzzer_sys::fuzz_target;
use rtrs::wire::InfoReq;

fuzz_target!(|data: &[u8]| {
    if let Ok(repr) = InfoReq::parse(data) {
        let _ = repr.to_string();
        let mut buf = vec![0u8; repr.buffer_len()];
        repr.emit(&mut buf).expect("a parsed value emits");
        assert_eq!(InfoReq::parse(&buf), Ok(repr));
    }
});
