//! Writes every frame of `tests/vectors/*.pcap` into `corpus/<target>/` as the
//! seed corpus of the frame-level targets, and the CM MADs into `corpus/cm/`.
//!
//! Run from `roce/fuzz`: `cargo run --example seed_corpus`.

use std::fs;
use std::path::Path;

use roce::pcap::Reader;
use roce::wire::{cm, Frame};

fn main() -> std::io::Result<()> {
    let vectors = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/vectors");
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    for dir in ["frame", "cm"] {
        fs::create_dir_all(corpus.join(dir))?;
    }
    let mut count = 0;
    for entry in fs::read_dir(&vectors)? {
        let path = entry?.path();
        if path.extension().is_none_or(|ext| ext != "pcap") {
            continue;
        }
        let file = fs::read(&path)?;
        let stem = path
            .file_stem()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let Ok(reader) = Reader::new(&file) else {
            continue;
        };
        for (index, record) in reader.flatten().enumerate() {
            let name = format!("{stem}-{:04}", index + 1);
            fs::write(corpus.join("frame").join(&name), record.data)?;
            if let Ok(Frame::Roce(roce)) = Frame::parse(record.data) {
                if cm::Repr::parse(roce.payload).is_ok() {
                    fs::write(corpus.join("cm").join(&name), roce.payload)?;
                }
            }
            count += 1;
        }
    }
    println!("wrote {count} frames to {}", corpus.display());
    Ok(())
}
