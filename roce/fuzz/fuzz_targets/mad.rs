//! Fuzz target: the MAD common header view and repr.
//!
//! Parse, display, and parse(emit(parse(x))) == parse(x).
#![no_main]

use libfuzzer_sys::fuzz_target;
use roce::wire::mad;

fuzz_target!(|data: &[u8]| {
    let packet = mad::Packet::new_unchecked(data);
    let _ = packet.to_string();
    if let Ok(repr) = mad::Repr::parse(&packet) {
        let _ = repr.to_string();
        let mut buf = vec![0u8; repr.buffer_len()];
        repr.emit(&mut mad::Packet::new_unchecked(&mut buf[..]));
        assert_eq!(
            mad::Repr::parse(&mad::Packet::new_unchecked(&buf[..])),
            Ok(repr)
        );
    }
});
