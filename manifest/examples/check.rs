//! Compile a manifest and print the canonical TOML, or the error.
//!
//! `cargo run -p brick-manifest --features std --example check -- m.toml [-o m.bin]`:
//! what `brick manifest check` / `build` will do.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.first() else {
        eprintln!("usage: check FILE.toml [-o FILE.bin]");
        std::process::exit(2);
    };
    let config = match manifest::compile_file(std::path::Path::new(path)) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    let blob = match config.to_binary() {
        Ok(blob) => blob,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    print!("{config}");
    eprintln!("# {} bytes in the binary form", blob.len());
    if let (Some(flag), Some(out)) = (args.get(1), args.get(2)) {
        if flag == "-o" {
            if let Err(e) = std::fs::write(out, &blob) {
                eprintln!("{out}: {e}");
                std::process::exit(1);
            }
        }
    }
}
