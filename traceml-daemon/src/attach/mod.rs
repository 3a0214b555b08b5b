//! Attaching to a live process: find what it maps ([`maps`]), resolve symbols and probe sites in
//! those files ([`elf`]), learn its CPython ([`python`]), load the eBPF programs and place uprobes
//! scoped to its pid ([`Attacher`]). The only module besides `live` and `sampler` that touches
//! the kernel.
pub mod btf;
pub mod calibrate;
pub mod callers;
pub mod elf;
pub mod follow;
pub mod linetable;
pub mod maps;
pub mod memory;
pub mod multi;
pub mod pystack;
pub mod python;
pub mod release;
mod specs;

use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroU32;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use aya::programs::uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLinkId, UProbeScope};
use aya::programs::{ProgramError, UProbe};
use aya::{Ebpf, EbpfLoader};
use traceml_common::ProbeId;

use crate::event::ProbeFailure;
use ProbeId as P;
use elf::ElfFile;
use maps::Role;
use multi::MultiLink;
pub use specs::{CUDA_DRIVER, CUDA_RUNTIME, Matcher, NCCL, PYTHON, ProbeSpec, TORCH, specs};

#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error("cannot load the eBPF programs: {0}")]
    Load(#[source] aya::EbpfError),
    #[error("eBPF program {0} is missing from the object")]
    NoProgram(&'static str),
    #[error("eBPF map {0} is missing from the object")]
    NoMap(&'static str),
    #[error("cannot write an eBPF map: {0}")]
    Map(#[source] aya::maps::MapError),
    #[error("cannot load eBPF program {name}: {source}")]
    Program {
        name: &'static str,
        source: ProgramError,
    },
}

/// Probe settings fixed at load time.
#[derive(Clone, Copy, Debug)]
pub struct LoadConfig {
    pub frame_code_offset: u64,
    pub code_ptr_mask: u64,
    /// Offset of `co_name` in code objects (part of a code object's identity).
    pub code_name_offset: u64,
    /// Per-launch events (true) or launch counting only, at load (see
    /// [`Attacher::set_launch_events`]).
    pub launch_events: bool,
    /// Ring buffer size in bytes (power of two, multiple of the page size).
    pub ring_bytes: u32,
}

/// One placed link: a perf-event uprobe (held by its aya program) or a `uprobe_multi` link
/// (held here).
#[derive(Debug)]
enum Placed {
    Perf(&'static str, UProbeLinkId),
    Multi(MultiLink),
}

/// A link taken out of the [`Attacher`]: dropping it takes its probes out of the target.
pub type TakenLink = Box<dyn Send>;

/// Environment variable that, set to `perf`, places one perf-event link per probe even where
/// the kernel has `uprobe_multi` links (a diagnostic escape hatch; docs/overhead.md).
pub const LINKS_ENV: &str = "TRACEML_UPROBE_LINKS";

/// Whether probes are placed with `uprobe_multi` links (decided once per process, logged).
fn use_multi() -> bool {
    static ANSWER: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ANSWER.get_or_init(|| {
        if std::env::var_os(LINKS_ENV).is_some_and(|v| v == "perf") {
            tracing::info!("{LINKS_ENV}=perf: one perf-event link per probe");
            return false;
        }
        match multi::supported() {
            Ok(()) => {
                tracing::debug!("uprobe_multi links: one link per program and file");
                true
            }
            Err(why) => {
                tracing::info!(
                    "{why}: one perf-event link per probe (taking each out costs the kernel \
                     ~130 ms, one after another)"
                );
                false
            }
        }
    })
}

/// Owns the loaded eBPF object and every attached probe (dropping it detaches them all).
pub struct Attacher {
    pub ebpf: Ebpf,
    pid: NonZeroU32,
    /// Probes go in as `uprobe_multi` links (programs loaded for them), else as perf links.
    multi: bool,
    loaded: BTreeSet<&'static str>,
    files: BTreeSet<PathBuf>,
    /// The `uprobe_multi` links placed (the frame evaluator's aside).
    links: Vec<MultiLink>,
    /// How many perf-event links were placed (the frame evaluator's aside; aya holds them).
    perf_links: usize,
    /// Where the frame-evaluator probe sits (host path, file offset), so the governor can
    /// detach and re-arm it.
    python_site: Option<(PathBuf, u64)>,
    /// Its links while armed (entry, return).
    python_links: Vec<Placed>,
    /// [`Attacher::attach_file`] arms the frame evaluator where it finds it (otherwise it only
    /// locates it, for [`Attacher::arm_python`]).
    arm_python_at_attach: bool,
    /// The files looked at for the driver launches' caller ranges ([`callers`]).
    callers: callers::Callers,
    /// Driver entry points reached through `cuGetProcAddress` pointers, looked at already
    /// (file, file offset): [`follow`].
    followed: std::collections::HashSet<(PathBuf, u64)>,
}

/// What happened when probing one file.
#[derive(Debug, Default)]
pub struct FileReport {
    /// `symbol -> program` of each placed probe.
    pub attached: Vec<String>,
    pub failures: Vec<ProbeFailure>,
}

impl Attacher {
    pub fn load(pid: NonZeroU32, cfg: LoadConfig) -> Result<Self, AttachError> {
        // The scheduler program's offsets; without them it does nothing (no thread states).
        let (pid_off, state_off, tgid_after_pid) = match btf::kernel()
            .map_err(|e| e.to_string())
            .and_then(|b| btf::task_offsets(&b).map_err(|e| e.to_string()))
        {
            Ok(t) => (t.pid, t.state.unwrap_or(0), u64::from(t.tgid_after_pid)),
            Err(e) => {
                tracing::warn!("threads' on-CPU and blocked time will not be measured: {e}");
                (0, 0, 0)
            }
        };
        let ebpf = EbpfLoader::new()
            .override_global("TASK_PID_OFFSET", &pid_off, true)
            .override_global("TASK_STATE_OFFSET", &state_off, true)
            .override_global("TASK_TGID_AFTER_PID", &tgid_after_pid, true)
            .override_global("FRAME_CODE_OFFSET", &cfg.frame_code_offset, true)
            .override_global("CODE_PTR_MASK", &cfg.code_ptr_mask, true)
            .override_global("CODE_NAME_OFFSET", &cfg.code_name_offset, true)
            .override_global("TARGET_TGID", &pid.get(), true)
            .map_max_entries("EVENTS", cfg.ring_bytes)
            .load(crate::EBPF_OBJECT)
            .map_err(AttachError::Load)?;
        let mut attacher = Attacher {
            ebpf,
            pid,
            multi: use_multi(),
            loaded: BTreeSet::new(),
            files: BTreeSet::new(),
            links: Vec::new(),
            perf_links: 0,
            python_site: None,
            python_links: Vec::new(),
            arm_python_at_attach: true,
            callers: callers::Callers::default(),
            followed: Default::default(),
        };
        attacher.set_launch_events(cfg.launch_events)?;
        if let Err(e) = attacher.watch_exec() {
            // The run still ends at an exec (the connector or the memory map says so), only
            // less exactly: what the new program does before that is seen counts.
            tracing::warn!("the target's exec will not be marked in the event stream: {e}");
        }
        if pid_off != 0
            && let Err(e) = attacher.watch_sched()
        {
            tracing::warn!("threads' on-CPU and blocked time will not be measured: {e}");
        }
        Ok(attacher)
    }

    /// Places the `sched_process_exec` program (a raw tracepoint: no tracefs needed), which
    /// marks the target's exec in the event stream (see `traceml_common::EventKind::Exec`).
    fn watch_exec(&mut self) -> Result<(), AttachError> {
        self.raw_tracepoint("process_exec", "sched_process_exec")
    }

    /// Places the `sched_switch` program (a raw tracepoint), which reports each interval a
    /// watched thread of the target spent off its CPU (`traceml_common::EventKind::OffCpu`).
    fn watch_sched(&mut self) -> Result<(), AttachError> {
        self.raw_tracepoint("sched_switch", "sched_switch")
    }

    /// Loads the raw-tracepoint program `name` and attaches it to `tracepoint`.
    fn raw_tracepoint(&mut self, name: &'static str, tracepoint: &str) -> Result<(), AttachError> {
        let prog: &mut aya::programs::RawTracePoint = self
            .ebpf
            .program_mut(name)
            .ok_or(AttachError::NoProgram(name))?
            .try_into()
            .map_err(|source| AttachError::Program { name, source })?;
        prog.load()
            .map_err(|source| AttachError::Program { name, source })?;
        prog.attach(tracepoint)
            .map_err(|source| AttachError::Program { name, source })?;
        Ok(())
    }

    /// Every kernel launch an event (true) or only counted (false); takes effect at once.
    pub fn set_launch_events(&mut self, on: bool) -> Result<(), AttachError> {
        let map = self
            .ebpf
            .map_mut("CONFIG")
            .ok_or(AttachError::NoMap("CONFIG"))?;
        let mut config = aya::maps::Array::<_, u32>::try_from(map).map_err(AttachError::Map)?;
        config
            .set(
                traceml_common::Config::LaunchEvents as u32,
                u32::from(on),
                0,
            )
            .map_err(AttachError::Map)
    }

    /// Whether [`Attacher::attach_file`] arms the frame-evaluator probe (default) or only
    /// locates it: a probe placed and taken out at once costs the target seconds of return
    /// probes (the kernel takes ~120 ms per link out, the return probe last).
    pub fn set_arm_python_at_attach(&mut self, on: bool) {
        self.arm_python_at_attach = on;
    }

    /// Whether the frame-evaluator probe is armed.
    pub fn python_armed(&self) -> bool {
        !self.python_links.is_empty()
    }

    /// Re-arms the frame-evaluator probe placed by [`Attacher::attach_file`] for
    /// [`Role::Python`] (no-op when armed).
    pub fn arm_python(&mut self) -> Result<(), String> {
        if self.python_armed() {
            return Ok(());
        }
        let (host, offset) = self
            .python_site
            .clone()
            .ok_or("the frame evaluator was never probed")?;
        self.python_links = self.place(&PYTHON[0], &host, offset)?;
        Ok(())
    }

    /// Takes the frame-evaluator probe's links out (entry first, to be dropped in that order):
    /// the probe goes when they are dropped, which takes the kernel an RCU-tasks-trace grace
    /// period per link (tens of ms; ~0.3 s for both with perf-event links, more under load), so
    /// callers drop them off the event loop. Until then the breakpoint stays
    /// and the return program still runs; frames entered while it was armed report no exit,
    /// and the engine closes them at the switch.
    pub fn take_python(&mut self) -> Result<Vec<TakenLink>, String> {
        // Entry probe first: were the return probe to go first, frames entered meanwhile would
        // stay on the kernel's per-thread stack of open calls (no return pops them) and fill it,
        // and native calls pushed after them (backward, copies, syncs) would be lost. Exits seen
        // meanwhile are dropped by the engine after the switch.
        std::mem::take(&mut self.python_links)
            .into_iter()
            .map(|placed| self.take(placed))
            .collect()
    }

    /// Ownership of a placed link (dropping it takes the probes out).
    fn take(&mut self, placed: Placed) -> Result<TakenLink, String> {
        Ok(match placed {
            Placed::Perf(name, link) => Box::new(
                self.program(name)
                    .map_err(|e| e.to_string())?
                    .take_link(link)
                    .map_err(|e| error_chain(&e))?,
            ),
            Placed::Multi(link) => Box::new(link),
        })
    }

    /// Takes out the links this attacher holds itself (every probe's, with `uprobe_multi`; the
    /// frame evaluator's, with perf links), for [`release`]. aya keeps the others (perf links),
    /// taken out when the attacher is dropped.
    pub fn take_links(&mut self) -> Result<Vec<TakenLink>, String> {
        let mut links = self.take_python()?;
        links.extend(
            std::mem::take(&mut self.links)
                .into_iter()
                .map(|l| Box::new(l) as TakenLink),
        );
        Ok(links)
    }

    /// How many kernel links hold the probes placed (the frame evaluator's included).
    pub fn link_count(&self) -> usize {
        self.links.len() + self.perf_links + self.python_links.len()
    }

    /// Whether probes are placed as `uprobe_multi` links.
    pub fn uses_multi_links(&self) -> bool {
        self.multi
    }

    /// Whether probes were already placed in this file.
    pub fn has_file(&self, path: &Path) -> bool {
        self.files.contains(path)
    }

    fn program(&mut self, name: &'static str) -> Result<&mut UProbe, AttachError> {
        let prog: &mut UProbe = self
            .ebpf
            .program_mut(name)
            .ok_or(AttachError::NoProgram(name))?
            .try_into()
            .map_err(|source| AttachError::Program { name, source })?;
        if !self.loaded.contains(name) {
            if self.multi {
                prog.load_multi()
            } else {
                prog.load()
            }
            .map_err(|source| AttachError::Program { name, source })?;
            self.loaded.insert(name);
        }
        Ok(prog)
    }

    /// Places every probe of `role` found in the file (`path` as the target sees it).
    pub fn attach_file(&mut self, path: &Path, role: Role) -> Result<FileReport, AttachError> {
        self.files.insert(path.to_path_buf());
        let mut report = FileReport::default();
        let host = python::host_path(self.pid.get(), path);
        let file = match ElfFile::open(&host) {
            Ok(f) => f,
            Err(e) => {
                report.failures.push(ProbeFailure {
                    probe: role.name().into(),
                    file: path.display().to_string(),
                    reason: e.to_string(),
                });
                return Ok(report);
            }
        };
        // Where each probe of the file goes, placed together below.
        let mut sites: Vec<(&'static ProbeSpec, String, u64)> = Vec::new();
        let resolved = resolve_sites(&file, &host, role);
        for (spec, found) in specs(role).iter().zip(resolved.iter()) {
            let (sym, site) = match found {
                Ok(Some(found)) => found.clone(),
                Ok(None) if !spec.required => continue,
                Ok(None) => {
                    report
                        .failures
                        .push(failure(spec, path, "symbol not found"));
                    continue;
                }
                Err(e) => {
                    report.failures.push(failure(spec, path, e));
                    continue;
                }
            };
            let shown = format!("{}+{}", sym.name, site.skipped);
            if spec.probe == P::PyEval && !self.arm_python_at_attach {
                // Located for later; a uprobe is proven placeable in this file on a function
                // the interpreter calls only at its exit, taken out at once.
                self.python_site = Some((host.clone(), site.file_offset));
                match self.prove_uprobes(&file, &host) {
                    Ok(()) => report.attached.push(format!("{shown} (not armed)")),
                    Err(e) => {
                        report
                            .failures
                            .push(failure(spec, path, &format!("{}: {e}", sym.name)))
                    }
                }
                continue;
            }
            if spec.probe == P::PyEval {
                // Its own links: the governor takes them out and re-arms them.
                match self.place(spec, &host, site.file_offset) {
                    Ok(links) => {
                        self.python_site = Some((host.clone(), site.file_offset));
                        self.python_links = links;
                        report.attached.push(shown);
                    }
                    Err(e) => {
                        report
                            .failures
                            .push(failure(spec, path, &format!("{}: {e}", sym.name)))
                    }
                }
                continue;
            }
            sites.push((spec, shown, site.file_offset));
        }
        if self.multi && !sites.is_empty() {
            match self.place_together(&sites, &host) {
                Ok(links) => {
                    self.links.extend(links);
                    report.attached.extend(sites.into_iter().map(|(_, s, _)| s));
                    return Ok(report);
                }
                Err(e) => {
                    // One probe the kernel refuses fails its whole link: probe by probe, so
                    // each refusal is reported and the others are placed.
                    tracing::debug!("{}: probes placed one by one: {e}", path.display());
                }
            }
        }
        for (spec, shown, offset) in sites {
            match self.place(spec, &host, offset) {
                Ok(links) => {
                    for l in links {
                        match l {
                            Placed::Multi(l) => self.links.push(l),
                            Placed::Perf(..) => self.perf_links += 1,
                        }
                    }
                    report.attached.push(shown)
                }
                Err(e) => {
                    let name = shown.rsplit_once('+').map_or(shown.as_str(), |(n, _)| n);
                    report
                        .failures
                        .push(failure(spec, path, &format!("{name}: {e}")))
                }
            }
        }
        Ok(report)
    }

    /// Places and takes out the frame evaluator's entry program on `Py_FinalizeEx` (called at
    /// interpreter exit only): the kernel's answer to a uprobe in this file, without a hit.
    fn prove_uprobes(&mut self, file: &ElfFile, host: &Path) -> Result<(), String> {
        const PROOF: &str = "Py_FinalizeEx";
        let Some(sym) = file.find(|s| s == PROOF).map_err(|e| e.to_string())? else {
            return Ok(());
        };
        let site = file.probe_site(&sym, false).map_err(|e| e.to_string())?;
        let spec = ProbeSpec {
            exit: false,
            ..PYTHON[0]
        };
        let placed = self.place(&spec, host, site.file_offset)?;
        let taken = placed
            .into_iter()
            .map(|p| self.take(p))
            .collect::<Result<Vec<_>, _>>()?;
        // Not waited for: see [`release`].
        release::drop_in_background(taken);
        Ok(())
    }

    /// Places the probes of one file with one `uprobe_multi` link per program (the return
    /// program, then the entry programs, as [`Self::place`] and for its reason): all or none.
    fn place_together(
        &mut self,
        sites: &[(&'static ProbeSpec, String, u64)],
        host: &Path,
    ) -> Result<Vec<MultiLink>, String> {
        // (at entry, program) -> (offsets, cookies): the return program first. An entry probe
        // placed before its return probe records the calls entered in between with no exit: a
        // `backward` left open for the rest of the run takes every later forward with it.
        let mut groups: BTreeMap<(bool, &'static str), Offsets> = BTreeMap::new();
        for (spec, _, offset) in sites {
            let mut add = |key| {
                let (o, c) = groups.entry(key).or_default();
                o.push(*offset);
                c.push(spec.probe as u64);
            };
            add((true, spec.entry));
            if spec.exit {
                add((false, spec.exit_program));
            }
        }
        let mut links = Vec::with_capacity(groups.len());
        for ((entry, name), (offsets, cookies)) in groups {
            let ret = !entry;
            // Were one link refused, those made already go when `links` is dropped.
            links.push(self.place_multi(name, host, &offsets, &cookies, ret)?);
        }
        // Taken out (dropped) entries first, the return program last: no entry is recorded
        // after its return probe went.
        links.reverse();
        Ok(links)
    }

    /// One `uprobe_multi` link of program `name` (loaded for them).
    fn place_multi(
        &mut self,
        name: &'static str,
        host: &Path,
        offsets: &[u64],
        cookies: &[u64],
        ret: bool,
    ) -> Result<MultiLink, String> {
        let pid = self.pid.get();
        let prog = self.program(name).map_err(|e| e.to_string())?;
        let fd = prog.fd().map_err(|e| error_chain(&e))?;
        multi::attach(fd.as_fd(), host, offsets, cookies, ret, pid)
            .map_err(|e| format!("uprobe_multi link of {name} in {}: {e}", host.display()))
    }

    /// Attaches the entry (and return) program of `spec` at `file_offset`; returns the links,
    /// entry first (the order they are taken out in), though the return probe went in first.
    fn place(
        &mut self,
        spec: &ProbeSpec,
        host: &Path,
        file_offset: u64,
    ) -> Result<Vec<Placed>, String> {
        if self.multi {
            let cookie = [spec.probe as u64];
            // The return probe goes in first (see the perf path below); on failure of the entry
            // the exit link goes with `links`.
            let mut links = Vec::with_capacity(2);
            if spec.exit {
                let exit =
                    self.place_multi(spec.exit_program, host, &[file_offset], &cookie, true)?;
                links.push(Placed::Multi(exit));
            }
            let entry = self.place_multi(spec.entry, host, &[file_offset], &cookie, false)?;
            links.insert(0, Placed::Multi(entry));
            return Ok(links);
        }
        let pid = self.pid;
        let point = || UProbeAttachPoint {
            location: UProbeAttachLocation::AbsoluteOffset(file_offset),
            cookie: Some(spec.probe as u64),
        };
        // The return probe goes in before the entry probe. A uretprobe only fires for calls
        // entered after it was placed, so a call entered between the two attaches is seen
        // either as an exit without its entry (counted unmatched, harmless) or not at all;
        // the other order would record an entry whose exit never comes, and a `backward`
        // left open for the rest of the run takes every later forward with it.
        let mut links = Vec::with_capacity(2);
        if spec.exit {
            let exit = self.program(spec.exit_program).map_err(|e| e.to_string())?;
            let l = exit
                .attach(point(), host, UProbeScope::OneProcess(pid))
                .map_err(|e| error_chain(&e))?;
            links.push(Placed::Perf(spec.exit_program, l));
        }
        let entry = self.program(spec.entry).map_err(|e| e.to_string())?;
        match entry.attach(point(), host, UProbeScope::OneProcess(pid)) {
            Ok(l) => links.insert(0, Placed::Perf(spec.entry, l)),
            Err(e) => {
                // Never leave a return probe without its entry.
                if let Some(Placed::Perf(name, link)) = links.pop()
                    && let Ok(p) = self.program(name)
                {
                    let _ = p.detach(link);
                }
                return Err(error_chain(&e));
            }
        }
        Ok(links)
    }
}

/// A probe of a file, resolved: its symbol and where the uprobe goes; `None` when the file has
/// no such symbol; `Err` why the site cannot be probed.
/// Where one probe goes in a file: `Ok(None)` when the file lacks its symbol, `Err` when the
/// site is refused (e.g. a LOCK-prefixed first instruction).
pub type Resolved = Result<Option<(elf::Symbol, elf::ProbeSite)>, String>;

/// Where each probe of `role` goes in the file at `path`, resolved as
/// [`Attacher::attach_file`] resolves it (same symbol search, same [`ElfFile::probe_site`]),
/// nothing placed: for checks against real libraries (`tests/coverage.rs`).
pub fn probe_sites(
    path: &Path,
    role: Role,
) -> Result<Vec<(&'static ProbeSpec, Resolved)>, elf::ElfError> {
    let file = ElfFile::open(path)?;
    let resolved = resolve_sites(&file, path, role);
    Ok(specs(role).iter().zip(resolved.iter().cloned()).collect())
}

/// A file as the kernel knows it: device, inode, size and modification time. The ranks of a job
/// (and the jobs of a node) map the same libtorch: its symbol tables are read once.
type FileKey = (u64, u64, u64, i64, i64, Role);

/// Resolved probe sites by file, at most [`SITE_CACHE_FILES`] files (then cleared).
static SITES: std::sync::Mutex<BTreeMap<FileKey, std::sync::Arc<Vec<Resolved>>>> =
    std::sync::Mutex::new(BTreeMap::new());
const SITE_CACHE_FILES: usize = 64;

/// Every probe spec of `role` in `file` (at `host`), in [`specs`]' order: one pass over the
/// symbol tables, or none when this file was resolved before.
fn resolve_sites(file: &ElfFile, host: &Path, role: Role) -> std::sync::Arc<Vec<Resolved>> {
    use std::os::unix::fs::MetadataExt;
    let key = std::fs::metadata(host)
        .ok()
        .map(|m| (m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec(), role));
    if let Some(k) = &key
        && let Some(hit) = SITES.lock().unwrap_or_else(|p| p.into_inner()).get(k)
    {
        return hit.clone();
    }
    let started = std::time::Instant::now();
    let specs = specs(role);
    let matchers: Vec<Matcher> = specs.iter().map(|s| s.matcher).collect();
    let resolved: Vec<Resolved> = match file.find_all(&matchers) {
        Ok(found) => found
            .into_iter()
            .zip(specs)
            .map(|(sym, spec)| match sym {
                None => Ok(None),
                Some(sym) => file
                    .probe_site(&sym, spec.movable)
                    .map(|site| Some((sym, site)))
                    .map_err(|e| e.to_string()),
            })
            .collect(),
        Err(e) => specs.iter().map(|_| Err(e.to_string())).collect(),
    };
    tracing::debug!(
        "{}: {} probe sites resolved in {:?}",
        host.display(),
        specs.len(),
        started.elapsed()
    );
    let resolved = std::sync::Arc::new(resolved);
    if let Some(k) = key {
        let mut cache = SITES.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= SITE_CACHE_FILES {
            cache.clear();
        }
        cache.insert(k, resolved.clone());
    }
    resolved
}

pub use release::release;

/// The file offsets of one `uprobe_multi` link and their cookies.
type Offsets = (Vec<u64>, Vec<u64>);

fn failure(spec: &ProbeSpec, path: &Path, reason: &str) -> ProbeFailure {
    ProbeFailure {
        probe: format!("{:?}", spec.probe),
        file: path.display().to_string(),
        reason: reason.into(),
    }
}

/// An error with its sources, on one line.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

/// Opens an ELF file of the target (re-exported for the live loop).
pub fn open_elf(pid: u32, path: &Path) -> Result<ElfFile, elf::ElfError> {
    ElfFile::open(&python::host_path(pid, path))
}
