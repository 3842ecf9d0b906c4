//! Fuzz target: a whole CM MAD.
//!
//! `cm::Repr::parse`, display, and the emit round trip.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roce::wire::cm;

fuzz_target!(|data: &[u8]| {
    if let Ok(repr) = cm::Repr::parse(data) {
        let _ = repr.to_string();
        let mut buf = [0u8; 256];
        repr.emit(&mut buf);
        // Reserved bits and beyond-ARI bytes are dropped, so compare reprs.
        assert_eq!(cm::Repr::parse(&buf), Ok(repr));
    }
    let _ = cm::ReqPacket::new_unchecked(data).to_string();
    let _ = cm::RepPacket::new_unchecked(data).to_string();
    let _ = cm::RejPacket::new_unchecked(data).to_string();
    let _ = cm::MraPacket::new_unchecked(data).to_string();
    let _ = cm::DreqPacket::new_unchecked(data).to_string();
});
