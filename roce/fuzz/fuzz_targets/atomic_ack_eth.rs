//! Fuzz target: the AtomicAckETH view and repr.
//!
//! Parse, display, and parse(emit(parse(x))) == parse(x).
#![no_main]

use libfuzzer_sys::fuzz_target;
use roce::wire::atomic_ack_eth;

fuzz_target!(|data: &[u8]| {
    let packet = atomic_ack_eth::Packet::new_unchecked(data);
    let _ = packet.to_string();
    if let Ok(repr) = atomic_ack_eth::Repr::parse(&packet) {
        let _ = repr.to_string();
        let mut buf = vec![0u8; repr.buffer_len()];
        repr.emit(&mut atomic_ack_eth::Packet::new_unchecked(&mut buf[..]));
        assert_eq!(
            atomic_ack_eth::Repr::parse(&atomic_ack_eth::Packet::new_unchecked(&buf[..])),
            Ok(repr)
        );
    }
});
