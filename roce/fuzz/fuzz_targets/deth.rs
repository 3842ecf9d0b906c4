//! Fuzz target: the DETH view and repr.
//!
//! Parse, display, and parse(emit(parse(x))) == parse(x).
#![no_main]

use libfuzzer_sys::fuzz_target;
use roce::wire::deth;

fuzz_target!(|data: &[u8]| {
    let packet = deth::Packet::new_unchecked(data);
    let _ = packet.to_string();
    if let Ok(repr) = deth::Repr::parse(&packet) {
        let _ = repr.to_string();
        let mut buf = vec![0u8; repr.buffer_len()];
        repr.emit(&mut deth::Packet::new_unchecked(&mut buf[..]));
        assert_eq!(
            deth::Repr::parse(&deth::Packet::new_unchecked(&buf[..])),
            Ok(repr)
        );
    }
});
