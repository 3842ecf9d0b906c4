//! Golden output: the pretty-printer's reading of rping-linux.pcap.
//!
//! `roce/tests/golden/rping-linux.txt` is reviewed by hand against the tshark
//! decode in `tests/vectors/rping-linux.decoded.txt` / `.cm.txt`. After an
//! intended change of the output, regenerate it with
//! `BRICK_BLESS=1 cargo test -p brick-roce --test golden` and review the diff.

mod common;

use std::fmt::Write;
use std::path::PathBuf;

use common::Capture;
use roce::wire::PrettyPrinter;

fn render(capture: &Capture) -> String {
    let mut out = String::new();
    for (index, frame) in capture.frames().into_iter().enumerate() {
        writeln!(out, "#{} {}", index + 1, PrettyPrinter::new(frame)).unwrap();
    }
    out
}

#[test]
fn rping_linux_pretty_print_matches_golden() {
    let capture = Capture::load("rping-linux");
    let actual = render(&capture);
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/rping-linux.txt");
    if std::env::var_os("BRICK_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (BRICK_BLESS=1 creates it)", path.display()));
    if actual != expected {
        let first = actual
            .lines()
            .zip(expected.lines())
            .position(|(a, e)| a != e)
            .unwrap_or(actual.lines().count().min(expected.lines().count()));
        panic!(
            "pretty-printer output differs from {} at line {}:\n  actual:   {:?}\n  expected: {:?}\n\
             (BRICK_BLESS=1 rewrites the golden file)",
            path.display(),
            first + 1,
            actual.lines().nth(first),
            expected.lines().nth(first)
        );
    }
}
