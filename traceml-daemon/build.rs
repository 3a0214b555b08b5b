//! Sets `TRACEML_GIT_COMMIT` (for `--version`) and, with the `live` feature, builds the eBPF
//! programs (`traceml-ebpf`) with the nightly toolchain and bpf-linker, the way aya's template
//! does, leaving the object in OUT_DIR for `include_bytes_aligned!`. Without `live` nothing here
//! needs more than stable Rust.
use std::process::Command;

fn main() -> anyhow::Result<()> {
    git_commit();
    #[cfg(feature = "live")]
    build_ebpf()?;
    Ok(())
}

/// `git rev-parse --short HEAD` of the source tree, or "unknown" outside a git checkout (or
/// where git refuses it).
fn git_commit() {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .filter(|s| !s.is_empty())
    };
    let commit = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=TRACEML_GIT_COMMIT={commit}");
    println!("cargo:rerun-if-changed=build.rs");
    // Run again when HEAD moves (a commit, a checkout). Only files that exist: cargo reruns the
    // script every build for a missing one.
    let mut watch = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    watch.extend(git(&["symbolic-ref", "-q", "HEAD"]));
    let here = std::env::current_dir().unwrap_or_default();
    for name in watch {
        if let Some(p) = git(&["rev-parse", "--git-path", &name]) {
            let p = here.join(p);
            if p.exists() {
                println!("cargo:rerun-if-changed={}", p.display());
            }
        }
    }
}

#[cfg(feature = "live")]
fn build_ebpf() -> anyhow::Result<()> {
    use anyhow::{Context as _, anyhow};
    use aya_build::{Package, Toolchain};

    let cargo_metadata::Metadata {
        packages,
        workspace_metadata,
        ..
    } = cargo_metadata::MetadataCommand::new()
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
    // The nightly pinned in the workspace's Cargo.toml ([workspace.metadata.ebpf]), unless
    // TRACEML_EBPF_TOOLCHAIN names another.
    println!("cargo:rerun-if-env-changed=TRACEML_EBPF_TOOLCHAIN");
    println!("cargo:rerun-if-changed=../Cargo.toml");
    let pinned = workspace_metadata["ebpf"]["toolchain"]
        .as_str()
        .map(str::to_owned);
    let toolchain = std::env::var("TRACEML_EBPF_TOOLCHAIN").ok().or(pinned);
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
