use which::which;

/// The eBPF crate depends on the `bpf-linker` binary without declaring it; rebuild when it changes.
fn main() {
    match which("bpf-linker") {
        Ok(p) => println!("cargo:rerun-if-changed={}", p.display()),
        Err(e) => {
            println!("cargo:warning=bpf-linker not found on PATH: {e} (run `cargo xtask setup`)")
        }
    }
}
