//! Probe coverage of torch's CUDA libraries as PyPI ships them (issue 52), read from the files
//! of the torch venv (`cargo xtask setup --torch`), nothing run:
//!
//! - every launch, copy, sync or collective entry point that torch's CUDA libraries import, or
//!   that libcudart and libnccl export, is either probed (an exact name in the daemon's probe
//!   table for its library's role) or in [`DELIBERATELY_NOT`] with the reason: a torch upgrade
//!   that brings a new one fails here naming it, and so does a probe taken out of the table;
//! - an entry of [`DELIBERATELY_NOT`] said to be unused by torch is imported by none of torch's
//!   libraries, and every entry is still there (the list is kept exact);
//! - every probe of the runtime and NCCL roles resolves in the real file, as the attacher
//!   resolves it (the symbol, then the probe site: `attach::probe_sites`).
//!
//! The rule for an entry point, on a dynamic symbol's name (imported: undefined; exported:
//! defined):
//! - launches: names starting `cudaLaunch`, `cuLaunch`, `cudaGraphLaunch`, `cuGraphLaunch`;
//! - copies: `cudaMemcpy`, `cuMemcpy`;
//! - syncs: names starting `cu` (runtime and driver) that contain `Synchronize`;
//! - collectives: names starting `nccl` whose rest does not start with one of [`NCCL_NOT_CALLS`]
//!   (communicators, memory, groups, parameters, errors: what moves no data). `pncclX`, NCCL's
//!   profiling alias of `ncclX` at the same address (checked), stands for `ncclX`.
//!
//! A name's role is its prefix: `cuda` the runtime, `cu` the driver, `nccl` NCCL.
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use object::{Object, ObjectSymbol};
use support::*;
use traceml_daemon::attach::maps::Role;
use traceml_daemon::attach::{Matcher, probe_sites, specs};

/// The files read, relative to the venv's site-packages: torch's CUDA libraries (whose imports
/// are torch's calls) and the runtime and NCCL they load (whose exports are what may be called).
const TORCH_LIBS: [&str; 4] = [
    "torch/lib/libtorch_cuda.so",
    "torch/lib/libc10_cuda.so",
    "torch/lib/libtorch_python.so",
    "torch/lib/libcaffe2_nvrtc.so",
];
const CUDART: &str = "nvidia/cu13/lib/libcudart.so.13";
const NCCL: &str = "nvidia/nccl/lib/libnccl.so.2";

/// After `nccl`: NCCL calls that move no data (setup, teardown, queries, registration, groups).
const NCCL_NOT_CALLS: [&str; 13] = [
    "Comm", "Get", "Group", "Mem", "Param", "RedOp", "Reset", "Team", "Dev", "Gin", "LLA2A", "Lsa",
    "Win",
];

/// The reason of an entry that torch's libraries do not call (checked: none imports it).
const UNUSED: &str = "exported, imported by none of torch 2.15's CUDA libraries";
const COPY_2D3D: &str =
    "2D/3D/array copies: a pitch or extent, no byte count in a register; unused by torch 2.15";
const CUDART_PTSZ: &str = "per-thread default stream variant of an unprobed call; unused by torch";

/// Entry points not probed, and why.
const DELIBERATELY_NOT: &[(&str, &str)] = &[
    // Runtime, called by torch.
    (
        "cudaMemcpyToSymbol",
        "upload to a __constant__/__device__ variable (symbol, src, count, offset, kind): setup, \
         not a tensor copy",
    ),
    (
        "cudaLaunchHostFunc",
        "enqueues a host callback on a stream, no kernel: not a launch",
    ),
    // Runtime, exported only.
    ("cudaLaunchHostFunc_ptsz", UNUSED),
    ("cudaLaunchHostFunc_v2", UNUSED),
    ("cudaLaunchHostFunc_v2_ptsz", UNUSED),
    ("cudaLaunchCooperativeKernel", UNUSED),
    ("cudaLaunchCooperativeKernel_ptsz", UNUSED),
    ("cudaExecutionCtxSynchronize", UNUSED),
    ("cudaMemcpyPeer", UNUSED),
    ("cudaMemcpyBatchAsync", UNUSED),
    ("cudaMemcpyBatchAsync_ptsz", UNUSED),
    ("cudaMemcpyWithAttributesAsync", UNUSED),
    ("cudaMemcpyWithAttributesAsync_ptsz", UNUSED),
    ("cudaMemcpyFromSymbol", UNUSED),
    ("cudaMemcpyFromSymbol_ptds", UNUSED),
    ("cudaMemcpyFromSymbolAsync", UNUSED),
    ("cudaMemcpyFromSymbolAsync_ptsz", UNUSED),
    ("cudaMemcpyToSymbol_ptds", CUDART_PTSZ),
    ("cudaMemcpyToSymbolAsync", UNUSED),
    ("cudaMemcpyToSymbolAsync_ptsz", UNUSED),
    ("cudaMemcpy2D", COPY_2D3D),
    ("cudaMemcpy2D_ptds", COPY_2D3D),
    ("cudaMemcpy2DAsync", COPY_2D3D),
    ("cudaMemcpy2DAsync_ptsz", COPY_2D3D),
    ("cudaMemcpy2DArrayToArray", COPY_2D3D),
    ("cudaMemcpy2DArrayToArray_ptds", COPY_2D3D),
    ("cudaMemcpy2DFromArray", COPY_2D3D),
    ("cudaMemcpy2DFromArray_ptds", COPY_2D3D),
    ("cudaMemcpy2DFromArrayAsync", COPY_2D3D),
    ("cudaMemcpy2DFromArrayAsync_ptsz", COPY_2D3D),
    ("cudaMemcpy2DToArray", COPY_2D3D),
    ("cudaMemcpy2DToArray_ptds", COPY_2D3D),
    ("cudaMemcpy2DToArrayAsync", COPY_2D3D),
    ("cudaMemcpy2DToArrayAsync_ptsz", COPY_2D3D),
    ("cudaMemcpy3D", COPY_2D3D),
    ("cudaMemcpy3D_ptds", COPY_2D3D),
    ("cudaMemcpy3DAsync", COPY_2D3D),
    ("cudaMemcpy3DAsync_ptsz", COPY_2D3D),
    ("cudaMemcpy3DBatchAsync", COPY_2D3D),
    ("cudaMemcpy3DBatchAsync_ptsz", COPY_2D3D),
    ("cudaMemcpy3DPeer", COPY_2D3D),
    ("cudaMemcpy3DPeer_ptds", COPY_2D3D),
    ("cudaMemcpy3DPeerAsync", COPY_2D3D),
    ("cudaMemcpy3DPeerAsync_ptsz", COPY_2D3D),
    ("cudaMemcpy3DWithAttributesAsync", COPY_2D3D),
    ("cudaMemcpy3DWithAttributesAsync_ptsz", COPY_2D3D),
    ("cudaMemcpyArrayToArray", COPY_2D3D),
    ("cudaMemcpyArrayToArray_ptds", COPY_2D3D),
    ("cudaMemcpyFromArray", COPY_2D3D),
    ("cudaMemcpyFromArray_ptds", COPY_2D3D),
    ("cudaMemcpyFromArrayAsync", COPY_2D3D),
    ("cudaMemcpyFromArrayAsync_ptsz", COPY_2D3D),
    ("cudaMemcpyToArray", COPY_2D3D),
    ("cudaMemcpyToArray_ptds", COPY_2D3D),
    ("cudaMemcpyToArrayAsync", COPY_2D3D),
    ("cudaMemcpyToArrayAsync_ptsz", COPY_2D3D),
    // NCCL, called by torch.
    (
        "ncclBcast",
        "legacy in-place broadcast (buff, count, datatype, root, …): torch.cuda.nccl's \
         broadcast, not c10d's; first instruction `sub` (stepped out of line)",
    ),
    (
        "ncclPutSignal",
        "one-sided put into a registered window (symmetric memory): not a collective of the \
         ledger",
    ),
    (
        "ncclSignal",
        "one-sided signal to a peer (symmetric memory): moves no tensor",
    ),
    (
        "ncclWaitSignal",
        "waits on one-sided signals (symmetric memory): enqueued on a stream, not a host wait",
    ),
];

/// One entry point: its role and which files import or export it.
#[derive(Default)]
struct Seen {
    imported_by: BTreeSet<&'static str>,
    exported_by: BTreeSet<&'static str>,
}

fn is_entry_point(name: &str) -> bool {
    let launch = ["cudaLaunch", "cuLaunch", "cudaGraphLaunch", "cuGraphLaunch"];
    let copy = ["cudaMemcpy", "cuMemcpy"];
    if launch.iter().chain(&copy).any(|p| name.starts_with(p)) {
        return true;
    }
    if name.starts_with("cu") && name.contains("Synchronize") {
        return true;
    }
    match name.strip_prefix("nccl") {
        Some(rest) => !rest.is_empty() && !NCCL_NOT_CALLS.iter().any(|p| rest.starts_with(p)),
        None => false,
    }
}

fn role_of(name: &str) -> Role {
    if name.starts_with("cuda") {
        Role::CudaRuntime
    } else if name.starts_with("nccl") {
        Role::Nccl
    } else {
        Role::CudaDriver
    }
}

/// The exact names the probe table places in files of `role`.
fn probed(role: Role) -> BTreeSet<&'static str> {
    specs(role)
        .iter()
        .filter_map(|s| match s.matcher {
            Matcher::Exact(n) => Some(n),
            Matcher::Contains(_) => None,
        })
        .collect()
}

/// The venv's site-packages, from the torch venv's interpreter.
fn site_packages() -> PathBuf {
    let py = torch_python();
    let out = Command::new(&py)
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ])
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", py.display()));
    assert!(out.status.success(), "{}: {:?}", py.display(), out);
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// (imported, exported) dynamic symbols of a file: name → address for the exported.
fn dynamic_symbols(path: &Path) -> (BTreeSet<String>, BTreeMap<String, u64>) {
    let file = std::fs::File::open(path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (the torch venv is incomplete: cargo xtask setup --torch)",
            path.display()
        )
    });
    // SAFETY: a read-only private mapping of a file nothing writes during the test.
    let data = unsafe { memmap2::Mmap::map(&file) }.unwrap();
    let obj = object::File::parse(&*data).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let (mut imported, mut exported) = (BTreeSet::new(), BTreeMap::new());
    for s in obj.dynamic_symbols() {
        let Ok(name) = s.name() else { continue };
        if name.is_empty() {
            continue;
        }
        if s.is_undefined() {
            imported.insert(name.to_owned());
        } else if s.is_definition() {
            exported.insert(name.to_owned(), s.address());
        }
    }
    (imported, exported)
}

#[test]
#[ignore = "real PyTorch: cargo xtask test runs it (--include-ignored)"]
fn every_cuda_and_nccl_entry_point_of_torch_is_probed_or_listed() {
    let site = site_packages();
    let mut seen: BTreeMap<String, Seen> = BTreeMap::new();
    let mut problems: Vec<String> = Vec::new();
    let files: Vec<&'static str> = TORCH_LIBS.iter().copied().chain([CUDART, NCCL]).collect();
    for rel in &files {
        let (imported, exported) = dynamic_symbols(&site.join(rel));
        for name in imported.iter().filter(|n| is_entry_point(n)) {
            seen.entry(name.clone())
                .or_default()
                .imported_by
                .insert(rel);
        }
        for (name, addr) in &exported {
            if let Some(plain) = name.strip_prefix("pnccl") {
                // The profiling alias stands for `ncclX`, at the same address.
                let alias = format!("nccl{plain}");
                if is_entry_point(&alias) {
                    match exported.get(&alias) {
                        Some(a) if a == addr => {}
                        other => problems.push(format!(
                            "{rel}: {name} at {addr:#x} but {alias} at {other:x?}: not an alias"
                        )),
                    }
                }
                continue;
            }
            if is_entry_point(name) {
                seen.entry(name.clone())
                    .or_default()
                    .exported_by
                    .insert(rel);
            }
        }
    }

    let roles = [Role::CudaRuntime, Role::CudaDriver, Role::Nccl];
    let probes: BTreeMap<Role, BTreeSet<&str>> = roles.iter().map(|&r| (r, probed(r))).collect();
    let listed: BTreeMap<&str, &str> = DELIBERATELY_NOT.iter().copied().collect();
    assert_eq!(listed.len(), DELIBERATELY_NOT.len(), "a name listed twice");
    let (mut n_probed, mut n_listed) = (0, 0);
    for (name, s) in &seen {
        let is_probed = probes[&role_of(name)].contains(name.as_str());
        let why = listed.get(name.as_str());
        let whence = format!(
            "imported by [{}], exported by [{}]",
            s.imported_by.iter().copied().collect::<Vec<_>>().join(", "),
            s.exported_by.iter().copied().collect::<Vec<_>>().join(", ")
        );
        match (is_probed, why) {
            (true, None) => n_probed += 1,
            (false, Some(&why)) => {
                n_listed += 1;
                if why == UNUSED && !s.imported_by.is_empty() {
                    problems.push(format!(
                        "{name}: listed as unused by torch, yet {whence}: probe it or give \
                         the reason"
                    ));
                }
            }
            (false, None) => problems.push(format!(
                "{name} ({whence}): neither probed ({:?} probe table) nor in DELIBERATELY_NOT",
                role_of(name)
            )),
            (true, Some(_)) => problems.push(format!(
                "{name}: probed and listed in DELIBERATELY_NOT: take it off the list"
            )),
        }
    }
    for name in listed.keys() {
        if !seen.contains_key(*name) {
            problems.push(format!(
                "{name}: in DELIBERATELY_NOT but no file has it now: take it off the list"
            ));
        }
    }

    // The runtime and NCCL probes resolve in the real files, as the attacher resolves them.
    for (rel, role) in [(CUDART, Role::CudaRuntime), (NCCL, Role::Nccl)] {
        let path = site.join(rel);
        let sites = probe_sites(&path, role).unwrap_or_else(|e| panic!("{rel}: {e}"));
        assert_eq!(sites.len(), specs(role).len());
        for (spec, resolved) in sites {
            let Matcher::Exact(want) = spec.matcher else {
                continue;
            };
            match resolved {
                Ok(Some((sym, site))) if sym.name == want && site.symbol == want => {}
                Ok(Some((sym, _))) => {
                    problems.push(format!("{rel}: probe {want} resolved to {}", sym.name))
                }
                Ok(None) => problems.push(format!("{rel}: probe {want}: symbol not found")),
                Err(e) => problems.push(format!("{rel}: probe {want}: site refused: {e}")),
            }
        }
    }

    let imported = seen.values().filter(|s| !s.imported_by.is_empty()).count();
    let exported = seen.values().filter(|s| !s.exported_by.is_empty()).count();
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "coverage: {} entry points ({imported} imported by torch's libraries, {exported} \
         exported by libcudart/libnccl): {n_probed} probed, {n_listed} deliberately not",
        seen.len()
    );
    assert!(
        problems.is_empty(),
        "probe coverage of torch's CUDA libraries ({}):\n  {}",
        site.display(),
        problems.join("\n  ")
    );
    assert_eq!(n_probed + n_listed, seen.len());
}
