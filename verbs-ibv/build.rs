//! Compiles the C layer (`shim/brick_ibv.c`) against the installed
//! libibverbs and librdmacm headers (Debian: `libibverbs-dev`,
//! `librdmacm-dev`, which `cargo xtask setup` installs) and links both
//! libraries.

fn main() {
    println!("cargo:rerun-if-changed=shim/brick_ibv.c");
    println!("cargo:rerun-if-changed=shim/brick_ibv.h");
    for header in ["infiniband/verbs.h", "rdma/rdma_cma.h"] {
        let found = ["/usr/include", "/usr/local/include"]
            .iter()
            .any(|dir| std::path::Path::new(dir).join(header).exists());
        if !found {
            panic!(
                "verbs-ibv needs <{header}>: install libibverbs-dev and librdmacm-dev \
                 (`cargo xtask setup` does)"
            );
        }
    }
    cc::Build::new()
        .file("shim/brick_ibv.c")
        .include("shim")
        .flag_if_supported("-Wall")
        .flag_if_supported("-Wextra")
        .warnings_into_errors(true)
        .compile("brick_ibv");
    println!("cargo:rustc-link-lib=ibverbs");
    println!("cargo:rustc-link-lib=rdmacm");
}
