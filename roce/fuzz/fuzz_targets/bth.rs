//! Fuzz target: the BTH view and repr.
//!
//! Parse, display, and parse(emit(parse(x))) == parse(x).
#![no_main]

use libfuzzer_sys::fuzz_target;
use roce::wire::bth;

fuzz_target!(|data: &[u8]| {
    let packet = bth::Packet::new_unchecked(data);
    let _ = packet.to_string();
    if let Ok(repr) = bth::Repr::parse(&packet) {
        let _ = repr.to_string();
        let mut buf = vec![0u8; repr.buffer_len()];
        repr.emit(&mut bth::Packet::new_unchecked(&mut buf[..]));
        assert_eq!(
            bth::Repr::parse(&bth::Packet::new_unchecked(&buf[..])),
            Ok(repr)
        );
    }
});
