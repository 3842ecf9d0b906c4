//! Fuzz target: the RDMA CM (CMA) header view and repr.
//!
//! Parse, display, and parse(emit(parse(x))) == parse(x).
#![no_main]

use libfuzzer_sys::fuzz_target;
use roce::wire::rdma_cm;

fuzz_target!(|data: &[u8]| {
    let packet = rdma_cm::Packet::new_unchecked(data);
    let _ = packet.to_string();
    if let Ok(repr) = rdma_cm::Repr::parse(&packet) {
        let _ = repr.to_string();
        let mut buf = vec![0u8; repr.buffer_len()];
        repr.emit(&mut rdma_cm::Packet::new_unchecked(&mut buf[..]));
        assert_eq!(
            rdma_cm::Repr::parse(&rdma_cm::Packet::new_unchecked(&buf[..])),
            Ok(repr)
        );
    }
});
