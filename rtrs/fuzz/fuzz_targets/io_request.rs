//! Fuzz `rtrs::wire::IoRequest::parse`: the first two bytes pick the offset,
//! the rest is the chunk. Never panics.

#![no_main]

use libfuzzer_sys::fuzz_target;
use rtrs::wire::IoRequest;

fuzz_target!(|data: &[u8]| {
    if let [a, b, chunk @ ..] = data {
        let offset = usize::from(u16::from_le_bytes([*a, *b]));
        if let Ok(request) = IoRequest::parse(chunk, offset) {
            let _ = request.to_string();
            assert_eq!(request.data_len + request.user_header.len(), offset);
        }
    }
});
