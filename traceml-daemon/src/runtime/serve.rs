//! `traceml-daemon serve`: the long-lived service. Every second it scans /proc for training
//! processes ([`crate::host::policy`]), attaches to each new one (a target task per process on
//! one thread, [`task::drive`], each folding its stream into bounded folds), writes each job's window
//! summaries while it runs and its final summary when it ends, and keeps running as jobs come
//! and go. SIGTERM/SIGINT detach everything, write every open job's summary and exit 0; SIGHUP
//! re-reads the config file. Readiness and stopping are told to systemd (`sd_notify`).
//!
//! Job directories: `<state-dir>/<comm>-<pid>-<start time UTC>/` holding `final_summary.json`,
//! `final_summary.txt`, `final_report.html`, and `summary-<n>.json` for each `--window` (a normal
//! summary of that window alone, readable by `compare`). The ranks of a multi-rank job
//! (`RANK`/`WORLD_SIZE` in their environment, [`crate::host::jobs`]) share one directory, named after
//! their launcher: each rank's files under `rank-<r>/`, and the job's summary (the ranks table,
//! STRAGGLER) at its top once no rank of it runs.
use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::event::EndReason;
use crate::host::jobs::{self, RankProc, proc_info};
use crate::host::policy::{AttachDecision, ProcFacts};
use crate::metrics::http::Shared;
use crate::runtime::group::{Group, GroupConfig};
use crate::runtime::sinks::{Metrics, SummaryFiles};
use crate::runtime::supervisor::{self, Signals};
use crate::runtime::target;
use crate::runtime::task::{self, Folds, Sink};

pub use super::settings::ServeSettings;

/// Why `serve` stops before it serves, with its exit status (docs/cli.md).
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The state directory cannot be made or written: 2.
    #[error("state directory {}: {source}", path.display())]
    StateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    /// `/metrics` cannot listen there: 2.
    #[error("metrics address {addr}: cannot listen: {source}")]
    Metrics {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    /// Not root and without the capabilities, or a kernel without uprobes: 4.
    #[error(transparent)]
    Node(target::LiveError),
    /// Anything else (the runtime, the signal handlers): 1.
    #[error("{0}")]
    Runtime(String),
}

impl ServeError {
    pub fn exit_code(&self) -> u8 {
        match self {
            ServeError::StateDir { .. } | ServeError::Metrics { .. } => 2,
            ServeError::Node(e) => u8::try_from(e.exit_code()).unwrap_or(1),
            ServeError::Runtime(_) => 1,
        }
    }
}

/// `<comm>-<pid>-<start time>`: a new directory for a new process with a reused pid.
fn job_dir_name(pid: u32) -> String {
    job_dir_name_as(pid, None)
}

/// What a multi-rank job is called: its ranks' script (`train` of `python train.py`) or module
/// (`-m pkg.train`), when their command line says; the launcher's name (`torchrun` shows as
/// `pt_elastic`) says little.
fn script_name(cmdline: &[String]) -> Option<String> {
    let mut args = cmdline.iter().skip(1);
    while let Some(a) = args.next() {
        if a == "-m" {
            return args
                .next()
                .map(|m| m.rsplit('.').next().unwrap_or(m).to_owned());
        }
        if a.ends_with(".py") {
            return Path::new(a)
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned());
        }
        if !a.starts_with('-') {
            return None;
        }
    }
    None
}

/// `<name>-<pid>-<start time>`, the name `comm` unless given.
fn job_dir_name_as(pid: u32, name: Option<&str>) -> String {
    let stat = crate::host::procinfo::stat(pid);
    let comm = name
        .map(str::to_owned)
        .or_else(|| stat.as_ref().map(|s| s.comm.clone()))
        .unwrap_or_default();
    let start = stat
        .and_then(|s| crate::host::procinfo::start_unix_secs(&s))
        .unwrap_or(0);
    format!(
        "{}-{pid}-{}",
        crate::sanitize::dir_name(&comm),
        crate::units::utc_stamp(start)
    )
}

/// Tells systemd (`$NOTIFY_SOCKET`), when it is listening.
fn sd_notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let sock = match std::os::unix::net::UnixDatagram::unbound() {
        Ok(s) => s,
        Err(_) => return,
    };
    let p = path.to_string_lossy();
    let r = if let Some(abs) = p.strip_prefix('@') {
        use std::os::linux::net::SocketAddrExt;
        std::os::unix::net::SocketAddr::from_abstract_name(abs.as_bytes())
            .and_then(|a| sock.send_to_addr(state.as_bytes(), &a))
    } else {
        sock.send_to(state.as_bytes(), &*p)
    };
    if let Err(e) = r {
        tracing::debug!("sd_notify {state}: {e}");
    }
}

/// A single-process target: how to stop it, its task, and its process's start time.
struct Target {
    stop: watch::Sender<Option<EndReason>>,
    done: tokio::task::JoinHandle<()>,
    start: u64,
}

/// A multi-rank job: its ranks' group, and its launcher, whose exit (with no rank running) ends
/// the job.
struct HeldJob {
    group: Group,
    launcher: Option<(u32, u64)>,
}

/// The policy's decision on a process, and the command line (`/proc/<pid>/cmdline`) it was made
/// on.
type Decided = (AttachDecision, Option<Vec<u8>>);

/// What the supervisor knows of the node's processes between scans.
#[derive(Default)]
struct Node {
    targets: HashMap<u32, Target>,
    /// The policy's decision per (pid, start time), logged once, with the command line it was
    /// made on: a process caught between its fork and its exec (a launcher's child, still the
    /// launcher's copy) is decided on again once its command line is the program's.
    decided: HashMap<(u32, u64), Decided>,
    /// Processes attached once (a run that ended is not restarted on the same process, unless
    /// it ended because the process exec'd: its new program is looked at again).
    attached: std::collections::HashSet<(u32, u64)>,
    /// Processes whose run ended with an exec, filled by their run's task.
    execed: Rc<RefCell<Vec<(u32, u64)>>>,
    /// Job directories handed out (an exec'd process gets a new one: same pid and start time).
    /// By name, with the pid they were made for (forgotten once it is gone).
    dirs: HashMap<String, u32>,
    /// Multi-rank jobs by key (the launcher's pid and start time, or the ranks' rendezvous).
    jobs: HashMap<String, HeldJob>,
    /// Processes that run no Python, by (pid, start time): their program (exe), and the scan
    /// after which they are looked at again (a Python process is looked at every scan until it
    /// maps libtorch; one that execs another program is looked at at once).
    not_python: HashMap<(u32, u64), (Option<PathBuf>, Instant)>,
}

/// How long a process that runs no Python is left alone (unless it execs).
const NOT_PYTHON_RECHECK: Duration = Duration::from_secs(30);

impl Node {
    /// Once a scan: each job's hang check while its ranks run; a job whose ranks all ended
    /// writes its summary, and is over once its launcher is gone too. Ended targets go.
    fn settle(&mut self) {
        let now = Instant::now();
        self.jobs.retain(|_, j| {
            if j.group.running() {
                j.group.tick(now);
                return true;
            }
            j.group.settle();
            j.launcher
                .is_some_and(|(pid, start)| start_time(pid) == Some(start))
        });
        self.targets.retain(|_, t| !t.done.is_finished());
    }

    /// Stops every target and job, waits for their summaries (9 s at most), writes the jobs'.
    async fn stop(&mut self) {
        tracing::info!(
            "stopping: detaching {} targets and {} multi-rank jobs",
            self.targets.len(),
            self.jobs.len()
        );
        let deadline = tokio::time::Instant::now() + Duration::from_secs(9);
        for t in self.targets.values() {
            let _ = t.stop.send(Some(EndReason::Terminated));
        }
        for j in self.jobs.values_mut() {
            j.group.stop(EndReason::Terminated);
        }
        for t in self.targets.values_mut() {
            if tokio::time::timeout_at(deadline, &mut t.done)
                .await
                .is_err()
            {
                tracing::warn!("a target did not finish its summary in time");
            }
        }
        for j in self.jobs.values_mut() {
            j.group.finished_by(deadline).await;
            j.group.settle();
        }
    }

    /// Forgets what was learned of processes that are gone (bounded by the node's processes);
    /// a process that exec'd is a new program: decided on again (and attached again if it
    /// trains), in a directory of its own.
    fn forget(&mut self, alive: &std::collections::HashSet<u32>) {
        for key in self.execed.borrow_mut().drain(..) {
            tracing::info!("pid {} exec'd: looking at its new program", key.0);
            self.attached.remove(&key);
            self.decided.remove(&key);
        }
        self.decided.retain(|(pid, _), _| alive.contains(pid));
        self.dirs.retain(|_, pid| alive.contains(pid));
        self.attached.retain(|(pid, _)| alive.contains(pid));
        self.not_python.retain(|(pid, _), _| alive.contains(pid));
    }
}

/// Says what the name service does not know of the settings' users (a typo, or the directory
/// did not answer).
fn warn_unknown_users(settings: &ServeSettings) {
    for name in settings.policy.unknown_users() {
        tracing::warn!(
            "{}: user {name:?} is unknown to this node's name service (a typo, or the directory \
             did not answer); a process whose user has no name is not attached while exclude_users \
             names an unknown user",
            settings.config.display()
        );
    }
}

/// `serve --check-config`: what [`run`] would start with, in one line, attaching nothing and
/// binding nothing.
pub fn check_config(settings: &ServeSettings) -> String {
    warn_unknown_users(settings);
    settings.describe()
}

/// Runs the service until SIGTERM/SIGINT; `reload` reads the settings again on SIGHUP.
pub fn run(
    settings: ServeSettings,
    reload: &dyn Fn() -> Result<ServeSettings, String>,
) -> Result<(), ServeError> {
    let mut settings = settings;
    warn_unknown_users(&settings);
    target::preflight_node().map_err(ServeError::Node)?;
    // Read at start only: where the summaries go and where /metrics listens.
    let state_dir = settings.state_dir.clone();
    crate::host::output::create_dir_private(&state_dir).map_err(|source| ServeError::StateDir {
        path: state_dir.clone(),
        source,
    })?;
    let metrics = start_metrics(settings.metrics_addr)?;
    let served = supervisor::block_on(async move {
        let Signals {
            mut term,
            mut int,
            mut hup,
        } = Signals::new().map_err(|e| ServeError::Runtime(e.to_string()))?;
        let mut node = Node::default();
        let mut scan = tokio::time::interval(settings.scan_interval);
        scan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tracing::info!("serving: {}", settings.describe());
        sd_notify("READY=1\nSTATUS=scanning for training processes");
        if let Some(f) = &settings.ready_file {
            let _ = std::fs::write(f, "serving\n");
        }
        loop {
            tokio::select! {
                _ = scan.tick() => {
                    node.settle();
                    let scan = NodeScan { settings: &settings, state_dir: &state_dir, metrics: &metrics };
                    scan.once(&mut node);
                }
                _ = hup.recv() => {
                    match reload() {
                        Ok(s) => {
                            warn_unknown_users(&s);
                            if s.state_dir != state_dir || s.metrics_addr != settings.metrics_addr {
                                tracing::warn!(
                                    "the state directory and the metrics address are read at \
                                     start only: restart serve for them"
                                );
                            }
                            settings = s;
                            tracing::info!("config re-read: {}", settings.describe());
                            node.decided.clear();
                        }
                        Err(e) => tracing::warn!("config not re-read, keeping the old one: {e}"),
                    }
                }
                _ = term.recv() => break,
                _ = int.recv() => break,
            }
        }
        sd_notify("STOPPING=1");
        node.stop().await;
        Ok::<(), ServeError>(())
    });
    served.map_err(|e| ServeError::Runtime(e.to_string()))?
}

/// Serves `/metrics` when an address is given (the flag over the config file's key).
fn start_metrics(addr: Option<std::net::SocketAddr>) -> Result<Option<Shared>, ServeError> {
    let Some(addr) = addr else {
        return Ok(None);
    };
    let exporter = crate::metrics::http::Shared::default();
    let bound = crate::metrics::http::serve(addr, exporter.clone())
        .map_err(|source| ServeError::Metrics { addr, source })?;
    tracing::info!("metrics at http://{bound}/metrics");
    Ok(Some(exporter))
}

/// One scan of /proc with what it needs.
struct NodeScan<'a> {
    settings: &'a ServeSettings,
    state_dir: &'a Path,
    metrics: &'a Option<Shared>,
}

impl NodeScan<'_> {
    /// Attaches to new training processes the policy admits.
    fn once(&self, node: &mut Node) {
        let Some(all) = crate::host::procinfo::pids() else {
            return;
        };
        let me = std::process::id();
        node.forget(&all.iter().copied().collect());
        // Read once per scan, and only for processes not settled yet: an attached target or
        // one that runs no Python costs a read of /proc/<pid>/stat per scan, a process decided
        // on (worker, launcher, excluded, opted out: until SIGHUP or its exec) that and its
        // cmdline, not its maps.
        let mut infos: HashMap<u32, Option<ProcFacts>> = HashMap::new();
        let now = Instant::now();
        for &pid in &all {
            if pid == me {
                continue;
            }
            let start = start_time(pid).unwrap_or(0);
            if let Some(info) = self.admitted(node, &mut infos, pid, start, now) {
                self.attach(node, &info, start);
            }
        }
    }

    /// The process when the policy admits it and it is not attached yet.
    fn admitted(
        &self,
        node: &mut Node,
        infos: &mut HashMap<u32, Option<ProcFacts>>,
        pid: u32,
        start: u64,
        now: Instant,
    ) -> Option<ProcFacts> {
        if node.targets.get(&pid).is_some_and(|t| t.start == start) {
            return None;
        }
        if let Some((_, cmdline)) = node.decided.get(&(pid, start)) {
            if crate::host::procinfo::cmdline(pid) == *cmdline {
                return None;
            }
            // It exec'd since (same pid, same start time): a new program to decide on.
            node.decided.remove(&(pid, start));
        }
        if let Some((exe, until)) = node.not_python.get(&(pid, start))
            && now < *until
            && crate::host::procinfo::exe(pid) == *exe
        {
            return None;
        }
        let info = infos.entry(pid).or_insert_with(|| proc_info(pid)).clone()?;
        if !info.python {
            node.not_python.insert(
                (pid, start),
                (crate::host::procinfo::exe(pid), now + NOT_PYTHON_RECHECK),
            );
            return None;
        }
        if !info.torch {
            return None;
        }
        let parent = infos
            .entry(info.ppid)
            .or_insert_with(|| proc_info(info.ppid))
            .clone();
        let d = self.settings.policy.decide(&info, parent.as_ref());
        if d == AttachDecision::NotTraining {
            return None;
        }
        let cmdline = crate::host::procinfo::cmdline(pid);
        if node
            .decided
            .insert((pid, start), (d.clone(), cmdline))
            .is_none()
            && d != AttachDecision::Attach
        {
            match &d {
                AttachDecision::OptedOut => {
                    tracing::info!("pid {pid} opted out (TRACEML_DISABLE): not attached")
                }
                AttachDecision::Excluded(why) => tracing::info!("pid {pid} not attached: {why}"),
                _ => tracing::debug!("pid {pid}: {d:?}"),
            }
        }
        (d == AttachDecision::Attach && node.attached.insert((pid, start))).then_some(info)
    }

    /// Each target's run settings: a process found on the node may not train at all, so
    /// nothing costly before it does.
    fn options(&self, pid: u32) -> target::Options {
        let mut o = self.settings.target.options(pid);
        o.watch_first = true;
        o
    }

    fn attach(&self, node: &mut Node, info: &ProcFacts, start: u64) {
        let pid = info.pid;
        tracing::info!(
            "attaching to pid {pid} ({})",
            crate::sanitize::terminal(&info.cmdline.join(" "))
        );
        // A rank of a multi-rank job goes into its job's group, under `rank-<r>/`.
        match jobs::rank_of(pid).filter(|r| r.world_size.is_none_or(|w| w > 1)) {
            Some(r) => self.attach_rank(node, info, r),
            None => self.attach_process(node, pid, start),
        }
    }

    fn attach_rank(&self, node: &mut Node, info: &ProcFacts, r: RankProc) {
        let pid = r.pid;
        let spec = jobs::discover(pid);
        let launcher = spec.launcher.and_then(|l| Some((l, start_time(l)?)));
        let key = match launcher {
            Some((l, t)) => format!("launcher {l} {t}"),
            None => format!(
                "rendezvous {} {}",
                spec.master.as_deref().unwrap_or("-"),
                spec.run_id.as_deref().unwrap_or("-")
            ),
        };
        let job = node.jobs.entry(key).or_insert_with(|| {
            let name = job_dir_name_as(
                launcher.map_or(pid, |(l, _)| l),
                script_name(&info.cmdline).as_deref(),
            );
            let mut job_info = crate::runtime::group::job_info(&spec);
            job_info.world_size = job_info.world_size.or(r.world_size);
            tracing::info!("multi-rank job {name}: {job_info:?}");
            let cfg = GroupConfig {
                dir: self.state_dir.join(&name),
                name,
                owner: None,
                hang_after: self.settings.target.hang_after(),
                window: Some(self.settings.window),
                metrics: self.metrics.clone(),
                writes_final: true,
                record: None,
            };
            HeldJob {
                group: Group::new(cfg, job_info),
                launcher,
            }
        });
        let rank_dir = job.group.dir().join(r.dir_name());
        if let Err(e) = crate::host::output::create_dir_private(job.group.dir())
            .and_then(|()| crate::host::output::create_dir_private(&rank_dir))
        {
            tracing::warn!("pid {pid}: cannot create {}: {e}", rank_dir.display());
            return;
        }
        job.group.add(r, &self.options(pid));
    }

    fn attach_process(&self, node: &mut Node, pid: u32, start: u64) {
        // After an exec the same pid and start time: `-2`, `-3`, ... on the name.
        let base = job_dir_name(pid);
        let job = (1..)
            .map(|n| {
                if n == 1 {
                    base.clone()
                } else {
                    format!("{base}-{n}")
                }
            })
            .find(|j| !node.dirs.contains_key(j) && !self.state_dir.join(j).exists())
            .expect("an unused name");
        node.dirs.insert(job.clone(), pid);
        let dir = self.state_dir.join(&job);
        if let Err(e) = crate::host::output::create_dir_private(&dir) {
            tracing::warn!("pid {pid}: cannot create {}: {e}", dir.display());
            return;
        }
        tracing::info!("pid {pid} → {}", dir.display());
        let mut sinks: Vec<Box<dyn Sink>> = Vec::new();
        if let Some(exporter) = self.metrics {
            // A single process is its job's rank 0.
            sinks.push(Box::new(Metrics::attach(
                exporter.clone(),
                &job,
                0,
                pid,
                true,
            )));
        }
        sinks.push(Box::new(SummaryFiles::new(dir, None, pid)));
        let window = self.settings.window;
        let (tx, rx) = watch::channel(None);
        let mut opts = self.options(pid);
        opts.stop = Some(rx);
        let execed = node.execed.clone();
        let done = tokio::task::spawn_local(async move {
            let folds = Rc::new(RefCell::new(Folds::windowed(Some(window))));
            let out = task::drive(&opts, folds, Rc::new(RefCell::new(sinks))).await;
            for e in &out.sink_errors {
                tracing::warn!("pid {pid}: {e}");
            }
            if let (Err(e), None) = (&out.result, &out.summary) {
                tracing::warn!("pid {pid}: not attached: {e}");
            }
            if out
                .summary
                .is_some_and(|(s, _)| s.data_quality.end_reason == EndReason::TargetExeced)
            {
                execed.borrow_mut().push((pid, start));
            }
        });
        node.targets.insert(
            pid,
            Target {
                stop: tx,
                done,
                start,
            },
        );
    }
}

fn start_time(pid: u32) -> Option<u64> {
    crate::host::procinfo::start_state(pid).map(|(start, _)| start)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_is_named_after_its_script() {
        let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            script_name(&v(&[
                "/usr/bin/python3",
                "-u",
                "/w/ddp_train.py",
                "--lr",
                "1"
            ])),
            Some("ddp_train".into())
        );
        assert_eq!(
            script_name(&v(&["python", "-m", "pkg.train", "--x"])),
            Some("train".into())
        );
        assert_eq!(script_name(&v(&["python", "-c", "print(1)"])), None);
        assert_eq!(script_name(&v(&["python"])), None);
    }
}
