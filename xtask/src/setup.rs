//! `cargo xtask setup`: installs what a fresh machine lacks, each step idempotent and named in
//! its error. The eBPF toolchain recipe is CONTRIBUTING.md's (the pinned toolchains).
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};

use crate::{root, run, show};

const BPF_LINKER_VERSION: &str = "0.13.0";
/// Real PyTorch for the CPU end-to-end tests (PyPI's wheel; CUDA libraries are installed but
/// unused without a GPU).
const TORCH_PIN: &str = "torch==2.15.0";
/// torch warns at import without numpy.
const NUMPY_PIN: &str = "numpy<3";
/// The trainer frameworks of the real-framework workloads (`tests/workloads/frameworks/`): the
/// newest releases whose requirements pip resolves against the torch pin without replacing it
/// (checked with `pip install --dry-run` in the torch venv).
const FRAMEWORK_PINS: [&str; 3] = [
    "transformers==5.24.0",
    "accelerate==1.15.0",
    "pytorch-lightning==2.6.6",
];
/// Added to the torch virtualenv without rebuilding it (pip resolves them against what is
/// there): Hugging Face `datasets`, for the Trainer over a streaming `IterableDataset`.
const FRAMEWORK_EXTRAS: [&str; 1] = ["datasets==5.2.0"];
const CUDART_PIN: &str = "nvidia-cuda-runtime==13.2.86";
/// zig from PyPI (the `ziglang` wheel) as the linker of the shipped binary, through
/// cargo-zigbuild: it links against glibc 2.28's symbol versions (`elfneeds::GLIBC_MAX`).
const ZIG_PIN: &str = "ziglang==0.17.1";
const ZIGBUILD_VERSION: &str = "0.24.1";
/// The target of the shipped binary: x86-64 glibc, linked for glibc 2.28 (RHEL/Rocky 8).
pub const SHIP_TARGET: &str = "x86_64-unknown-linux-gnu";
pub const SHIP_GLIBC: &str = "2.28";
const TORCH_PYTHON: &str = "3.11";

fn step(name: &str, f: impl FnOnce() -> anyhow::Result<()>) -> anyhow::Result<()> {
    eprintln!("xtask setup: {name}");
    f().with_context(|| format!("setup step `{name}` failed"))
}

pub fn output(cmd: &mut Command) -> String {
    cmd.output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

pub fn cache_dir() -> PathBuf {
    std::env::var_os("TRACEML_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
                .join(".cache/traceml")
        })
}

/// A step that installs apt `packages` unless `have` exists.
pub fn apt_step(name: &str, have: &str, packages: &[&str]) -> anyhow::Result<()> {
    step(name, || {
        if Path::new(have).exists() {
            return Ok(());
        }
        run(Command::new("apt-get").arg("update"))?;
        run(Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends"])
            .args(packages)
            .env("DEBIAN_FRONTEND", "noninteractive"))
    })
}

/// The eBPF build's pins, from the workspace's Cargo.toml (`[workspace.metadata.ebpf]`): the
/// nightly toolchain (by date) and the LLVM major it, bpf-linker and apt's llvm-dev share.
pub struct EbpfPin {
    pub toolchain: String,
    pub llvm_major: u32,
}

impl EbpfPin {
    pub fn read() -> anyhow::Result<EbpfPin> {
        let path = root().join("Cargo.toml");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let section = text
            .split_once("[workspace.metadata.ebpf]")
            .map(|(_, rest)| rest.split("\n[").next().unwrap_or_default())
            .with_context(|| format!("{}: no [workspace.metadata.ebpf]", path.display()))?;
        let value = |key: &str| {
            section
                .lines()
                .filter_map(|l| l.split_once('='))
                .find(|(k, _)| k.trim() == key)
                .map(|(_, v)| v.trim().trim_matches('"').to_owned())
                .with_context(|| {
                    format!("{}: no {key} in [workspace.metadata.ebpf]", path.display())
                })
        };
        Ok(EbpfPin {
            toolchain: value("toolchain")?,
            llvm_major: value("llvm-major")?.parse().context("llvm-major")?,
        })
    }

    fn llvm_prefix(&self) -> String {
        format!("/usr/lib/llvm-{}", self.llvm_major)
    }
}

/// The eBPF toolchain the daemon's build needs: apt's LLVM, the pinned nightly with `rust-src`
/// (`.ci/toolchain` installs or names it; here it is checked), its LLVM major the same as
/// bpf-linker's, and bpf-linker built on that LLVM.
pub fn toolchain() -> anyhow::Result<()> {
    let pin = EbpfPin::read()?;
    let major = pin.llvm_major;
    let prefix = pin.llvm_prefix();
    step(
        &format!("LLVM {major} development files (apt llvm-{major}-dev)"),
        || {
            if Path::new(&prefix).join("bin/llvm-config").exists() {
                return Ok(());
            }
            run(Command::new("apt-get").arg("update"))?;
            run(Command::new("apt-get")
                .args(["install", "-y", &format!("llvm-{major}-dev")])
                .env("DEBIAN_FRONTEND", "noninteractive"))
        },
    )?;
    step(
        &format!("{} with rust-src (builds the eBPF crate)", pin.toolchain),
        || nightly(&pin),
    )?;
    step(&format!("bpf-linker 0.13 on LLVM {major}"), || {
        if output(Command::new("bpf-linker").arg("--version")).contains(BPF_LINKER_VERSION) {
            return Ok(());
        }
        run(Command::new("cargo")
            .args([
                "install",
                "bpf-linker",
                "--version",
                BPF_LINKER_VERSION,
                "--no-default-features",
            ])
            .args(["--features", &format!("llvm-{major}"), "--locked"])
            .env("LLVM_PREFIX", &prefix))
    })?;
    Ok(())
}

/// The pinned nightly installed with `rust-src`, and built on the LLVM major bpf-linker links.
fn nightly(pin: &EbpfPin) -> anyhow::Result<()> {
    let name = pin.toolchain.as_str();
    let installed = |args: &[&str]| output(Command::new("rustup").args(args));
    if !installed(&["toolchain", "list"])
        .lines()
        .any(|l| l.starts_with(&format!("{name}-")))
    {
        // Fetched by rustup; `.ci/toolchain` names an installed nightly of that date first
        // where nothing can be fetched.
        run(Command::new("rustup").args(["toolchain", "install", name, "--profile", "minimal"]))?;
    }
    if !installed(&["component", "list", "--toolchain", name, "--installed"])
        .lines()
        .any(|l| l.starts_with("rust-src"))
    {
        run(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", name]))?;
    }
    let verbose = output(Command::new("rustc").arg(format!("+{name}")).arg("-vV"));
    let llvm = verbose
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .and_then(|v| v.split('.').next()?.parse::<u32>().ok());
    match llvm {
        Some(m) if m == pin.llvm_major => Ok(()),
        Some(m) => bail!(
            "{name} is built on LLVM {m}, but bpf-linker links LLVM {} (llvm-major in Cargo.toml's \
             [workspace.metadata.ebpf]): the eBPF object would not link; pin a nightly on LLVM {} \
             or move llvm-major (and bpf-linker's feature) to {m}",
            pin.llvm_major,
            pin.llvm_major
        ),
        None => bail!("cannot read the LLVM version of {name} (rustc +{name} -vV)"),
    }
}

/// Everything `demo` and `test` need; `torch` adds the real-PyTorch virtualenv.
pub fn all(torch: bool) -> anyhow::Result<()> {
    toolchain()?;
    step(
        "Chromium (apt chromium; the HTML report's headless-browser test)",
        || {
            if Path::new("/usr/bin/chromium").exists() {
                return Ok(());
            }
            run(Command::new("apt-get").arg("update"))?;
            run(Command::new("apt-get")
                .args(["install", "-y", "chromium"])
                .env("DEBIAN_FRONTEND", "noninteractive"))
        },
    )?;
    apt_step(
        "Prometheus (apt prometheus; the /metrics test scrapes the daemon with it)",
        "/usr/bin/prometheus",
        &["prometheus"],
    )?;
    // tests/users.rs: a directory user only the name service knows (not /etc/passwd).
    apt_step(
        "libnss-extrausers (apt; the users test's directory user)",
        "/usr/lib/libnss_extrausers.so.2",
        &["libnss-extrausers"],
    )?;
    // The package install test (tests/install.rs): `systemd-analyze verify` on the installed
    // units, `man -w` on its pages, the package's Depends from dpkg-shlibdeps.
    apt_step(
        "systemd-analyze (apt systemd; the package test verifies its units)",
        "/usr/bin/systemd-analyze",
        &["systemd"],
    )?;
    apt_step(
        "man (apt man-db; the package test looks its pages up)",
        "/usr/bin/man",
        &["man-db"],
    )?;
    apt_step(
        "dpkg-shlibdeps (apt dpkg-dev; the package's Depends from the binary's libraries)",
        "/usr/bin/dpkg-shlibdeps",
        &["dpkg-dev"],
    )?;
    step("pyenv CPython 3.9–3.13", || {
        let missing: Vec<&str> = ["3.9", "3.10", "3.11", "3.12", "3.13"]
            .into_iter()
            .filter(|v| pyenv_python(v).is_err())
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            bail!(
                "pyenv has no CPython {} (the tests run against each of 3.9–3.13)",
                missing.join(", ")
            )
        }
    })?;
    native_helpers()?;
    step("real libcudart from PyPI (nvidia-cuda-runtime)", || {
        venv("cudart", &[CUDART_PIN]).map(|_| ())
    })?;
    if torch {
        torch_venv()?;
    }
    Ok(())
}

/// What `demo` needs and nothing more: the eBPF toolchain, pyenv's CPython 3.11, the stand-in
/// CUDA runtime and fake torch (the plain demo), or the real-PyTorch virtualenv (`--real`). Not
/// the browser, Prometheus, the packaging tools, the other CPythons nor the real libcudart,
/// which only the tests use.
pub fn demo(real: bool) -> anyhow::Result<()> {
    toolchain()?;
    step("pyenv CPython 3.11", || pyenv_python("3.11").map(|_| ()))?;
    if real { torch_venv() } else { native_helpers() }
}

fn native_helpers() -> anyhow::Result<()> {
    step(
        "stand-in CUDA runtime and fake torch native library (tests/build.sh)",
        || {
            run(Command::new("bash")
                .arg(root().join("tests/build.sh"))
                .current_dir(root()))
        },
    )
}

fn torch_venv() -> anyhow::Result<()> {
    step(
        "real PyTorch on CPU with transformers, accelerate and Lightning (virtualenv, cached)",
        || {
            let mut pins = vec![TORCH_PIN, NUMPY_PIN];
            pins.extend(FRAMEWORK_PINS);
            let py = venv("torch", &pins)?;
            venv_extras(&py, &FRAMEWORK_EXTRAS)
        },
    )
}

/// `~/.pyenv/versions/<X.Y.*>/bin/python<X.Y>`.
pub fn pyenv_python(minor: &str) -> anyhow::Result<PathBuf> {
    let root = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".pyenv")
        });
    let mut found: Vec<PathBuf> = std::fs::read_dir(root.join("versions"))
        .with_context(|| format!("no pyenv at {}", root.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.strip_prefix(minor).is_some_and(|rest| {
                    rest.starts_with('.') && rest[1..].chars().all(|c| c.is_ascii_digit())
                })
            })
        })
        .collect();
    found.sort();
    let dir = found
        .pop()
        .with_context(|| format!("pyenv has no CPython {minor}"))?;
    let py = dir.join(format!("bin/python{minor}"));
    if py.exists() {
        Ok(py)
    } else {
        bail!("{} is missing", py.display())
    }
}

/// The cargo subcommand `sub` from crate `krate` at `version`, installed with `cargo install
/// --locked` when `cargo <sub> --version` does not say that version.
pub fn cargo_tool(sub: &str, krate: &str, version: &str) -> anyhow::Result<()> {
    if output(Command::new("cargo").args([sub, "--version"])).contains(version) {
        return Ok(());
    }
    run(Command::new("cargo").args(["install", "--locked", krate, "--version", version]))
}

/// A training process of the fake torch package that waits for `ready` and then runs for good,
/// input-bound by its design (`tests/workloads/input_bound_single.py`): what the packaging
/// checks attach to.
pub fn input_bound_workload(ready: &Path) -> anyhow::Result<std::process::Child> {
    let mut target = Command::new(pyenv_python("3.11")?);
    target
        .arg(root().join("tests/workloads/input_bound_single.py"))
        .args(["--steps", "100000", "--ready"])
        .arg(ready)
        .stdout(std::process::Stdio::null());
    test_env()?.apply(&mut target);
    target.spawn().context("starting the training workload")
}

/// zig (PyPI's `ziglang`, in a cached virtualenv) and cargo-zigbuild: what links the shipped
/// binary against an older glibc. Returns the PATH to build with (the venv's `bin` first:
/// cargo-zigbuild runs `python -m ziglang`).
pub fn zig() -> anyhow::Result<std::ffi::OsString> {
    let py = venv("zig", &[ZIG_PIN])?;
    step(
        "cargo-zigbuild (links the shipped binary for glibc 2.28)",
        || cargo_tool("zigbuild", "cargo-zigbuild", ZIGBUILD_VERSION),
    )?;
    let bin = py.parent().expect("venv bin").to_path_buf();
    let mut paths = vec![bin];
    paths.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    std::env::join_paths(paths).context("PATH")
}

/// A cached virtualenv (from pyenv's CPython 3.11) with `packages`; rebuilt when the pins change.
fn venv(name: &str, packages: &[&str]) -> anyhow::Result<PathBuf> {
    let dir = cache_dir().join(format!("venv-{name}-py{TORCH_PYTHON}"));
    let stamp = dir.join(".traceml-pins");
    let want = packages.join("\n");
    let py = dir.join("bin/python");
    if py.exists() && std::fs::read_to_string(&stamp).is_ok_and(|s| s == want) {
        return Ok(py);
    }
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.parent().expect("cache dir"))
        .context("creating the cache directory")?;
    run(Command::new(pyenv_python(TORCH_PYTHON)?)
        .args(["-m", "venv"])
        .arg(&dir))?;
    pip_install(&py, packages, "first time only")?;
    std::fs::write(&stamp, want).context("writing the venv stamp")?;
    Ok(py)
}

/// `py -m pip install --quiet packages`, shown with `when` it runs.
fn pip_install(py: &Path, packages: &[&str], when: &str) -> anyhow::Result<()> {
    let mut pip = Command::new(py);
    pip.args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
    ])
    .args(packages);
    eprintln!("xtask setup: $ {} ({when})", show(&pip));
    run(&mut pip)
}

/// Installs `packages` into the virtualenv of `py` unless its extras stamp lists them already:
/// packages added after a venv was cached, without rebuilding it.
fn venv_extras(py: &Path, packages: &[&str]) -> anyhow::Result<()> {
    let stamp = py
        .parent()
        .and_then(Path::parent)
        .context("venv of the interpreter")?
        .join(".traceml-extras");
    let want = packages.join("\n");
    if std::fs::read_to_string(&stamp).is_ok_and(|s| s == want) {
        return Ok(());
    }
    pip_install(py, packages, "once")?;
    std::fs::write(&stamp, want).context("writing the extras stamp")
}

/// Environment the tests and the demo read to find what setup prepared.
pub struct TestEnv {
    vars: Vec<(String, PathBuf)>,
}

impl TestEnv {
    pub fn apply(&self, cmd: &mut Command) {
        for (k, v) in &self.vars {
            cmd.env(k, v);
        }
    }
}

/// The interpreter of the real-PyTorch virtualenv (`setup --torch` builds it).
pub fn torch_python() -> PathBuf {
    cache_dir().join(format!("venv-torch-py{TORCH_PYTHON}/bin/python"))
}

pub fn test_env() -> anyhow::Result<TestEnv> {
    let mut vars = vec![("TRACEML_TESTS_BUILD".to_owned(), root().join("tests/build"))];
    let cudart_py = cache_dir().join(format!("venv-cudart-py{TORCH_PYTHON}/bin/python"));
    if let Some(lib) = find_file(
        &cache_dir().join(format!("venv-cudart-py{TORCH_PYTHON}")),
        "libcudart.so.13",
    ) {
        vars.push(("TRACEML_REAL_CUDART".into(), lib));
        vars.push(("TRACEML_CUDART_PYTHON".into(), cudart_py));
    }
    let torch_py = torch_python();
    if torch_py.exists() {
        vars.push(("TRACEML_TORCH_PYTHON".into(), torch_py));
    }
    for v in ["3.9", "3.10", "3.11", "3.12", "3.13"] {
        if let Ok(p) = pyenv_python(v) {
            vars.push((format!("TRACEML_PYTHON_{}", v.replace('.', "")), p));
        }
    }
    Ok(TestEnv { vars })
}

fn find_file(dir: &Path, name: &str) -> Option<PathBuf> {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).ok()?.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.file_name().is_some_and(|n| n == name) {
                return Some(p);
            }
        }
    }
    None
}
