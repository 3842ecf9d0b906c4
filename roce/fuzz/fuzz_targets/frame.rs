//! Fuzz target: every layer of a whole frame at once.
//!
//! `Frame::parse`, the pretty-printer, `parse_frame`, and emit of whatever
//! parsed (which must succeed and reach a fixpoint).
#![no_main]

use libfuzzer_sys::fuzz_target;
use roce::wire::{parse_frame, Frame, PrettyPrinter};

fuzz_target!(|data: &[u8]| {
    let _ = PrettyPrinter::new(data).to_string();
    let _ = parse_frame(data);
    if let Ok(frame) = Frame::parse(data) {
        let mut once = vec![0; frame.buffer_len()];
        assert_eq!(frame.emit(&mut once), Ok(once.len()));
        let again = Frame::parse(&once).expect("emitted frames parse");
        let mut twice = vec![0; again.buffer_len()];
        assert_eq!(again.emit(&mut twice), Ok(twice.len()));
        assert_eq!(once, twice);
    }
});
