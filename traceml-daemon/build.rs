//! Builds the eBPF programs (`traceml-ebpf`) with the nightly toolchain and bpf-linker, the way
//! aya's template does, and leaves the object in OUT_DIR for `include_bytes_aligned!`.
use anyhow::{Context as _, anyhow};
use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
    let cargo_metadata::Metadata { packages, .. } = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("MetadataCommand::exec")?;
    let ebpf = packages
        .into_iter()
        .find(|p| p.name.as_str() == "traceml-ebpf")
        .ok_or_else(|| anyhow!("traceml-ebpf package not found"))?;
    let root_dir = ebpf
        .manifest_path
        .parent()
        .ok_or_else(|| anyhow!("no parent for {}", ebpf.manifest_path))?
        .as_str()
        .to_owned();
    println!("cargo:rerun-if-env-changed=TRACEML_EBPF_TOOLCHAIN");
    let toolchain = std::env::var("TRACEML_EBPF_TOOLCHAIN").ok();
    let toolchain = match toolchain.as_deref() {
        Some(t) => Toolchain::Custom(t),
        None => Toolchain::default(),
    };
    aya_build::build_ebpf(
        [Package {
            name: ebpf.name.as_str(),
            root_dir: &root_dir,
            ..Default::default()
        }],
        toolchain,
    )
}
