//! Fuzz target: the TOML compiler.
//!
//! Compile arbitrary text; errors must be one line; an accepted manifest
//! must encode, read back equal, and print as TOML that compiles equal.
#![no_main]

use libfuzzer_sys::fuzz_target;
use manifest::{compile, Config, Manifest};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match compile(text, "fuzz.toml") {
        Err(error) => assert!(!error.to_string().contains('\n')),
        Ok(config) => {
            let blob = config.to_binary().expect("a compiled manifest encodes");
            let m = Manifest::parse(&blob).expect("a compiled manifest reads");
            assert_eq!(Config::from_manifest(&m), config);
            let printed = config.to_string();
            assert_eq!(compile(&printed, "printed.toml").expect("printed TOML compiles"), config);
        }
    }
});
