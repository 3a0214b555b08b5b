//! `traceml-daemon serve`: the long-lived service. Every second it scans /proc for training
//! processes ([`crate::policy`]), attaches to each new one (a [`live::run`] per target on one
//! thread, each folding its stream into a bounded [`Collector`]), writes each job's window
//! summaries while it runs and its final summary when it ends, and keeps running as jobs come
//! and go. SIGTERM/SIGINT detach everything, write every open job's summary and exit 0; SIGHUP
//! re-reads the config file. Readiness and stopping are told to systemd (`sd_notify`).
//!
//! Job directories: `<state-dir>/<comm>-<pid>-<start time UTC>/` holding `final_summary.json`,
//! `final_summary.txt`, `final_report.html`, and `summary-<n>.json` for each `--window` (a normal
//! summary of that window alone, readable by `compare`). The ranks of a multi-rank job
//! (`RANK`/`WORLD_SIZE` in their environment, [`crate::job`]) share one directory, named after
//! their launcher: each rank's files under `rank-<r>/`, and the job's summary (the ranks table,
//! STRAGGLER) at its top once no rank of it runs.
use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::analysis::Collector;
use crate::event::{EndReason, StreamItem};
use crate::live;
use crate::metrics::{RankValues, Verdict};
use crate::policy::{Decision, ProcInfo};
use crate::summary::{DiagnosisKind, Summary};

pub use crate::settings::{ServeConfig, ServeFlags, ServeSettings, SettingsError};

/// Why `serve` stops before it serves, with its exit status (docs/cli.md).
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A flag or the config file: 2.
    #[error(transparent)]
    Settings(#[from] SettingsError),
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
    Node(live::LiveError),
    /// Anything else (the runtime, the signal handlers): 1.
    #[error("{0}")]
    Runtime(String),
}

impl ServeError {
    pub fn exit_code(&self) -> u8 {
        match self {
            ServeError::Settings(e) => e.exit_code(),
            ServeError::StateDir { .. } | ServeError::Metrics { .. } => 2,
            ServeError::Node(e) => u8::try_from(e.exit_code()).unwrap_or(1),
            ServeError::Runtime(_) => 1,
        }
    }
}

/// Reads what the policy needs about one process; `None` when it vanished or is unreadable.
pub fn proc_info(pid: u32) -> Option<ProcInfo> {
    use crate::procinfo;
    let stat = procinfo::stat(pid)?;
    let uid = procinfo::uid(pid)?;
    let cmdline = procinfo::cmdline_args(pid)?
        .into_iter()
        .map(|a| crate::sanitize::bounded(&a, 4096).into_owned())
        .collect();
    let exe_name = procinfo::exe(pid)
        .and_then(|e| e.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_default();
    let (mut python, mut torch) = (exe_name.starts_with("python"), false);
    for path in procinfo::mapped_paths(pid).ok()? {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default();
        python |= name.starts_with("libpython");
        torch |= name.starts_with("libtorch_cpu") || name.starts_with("libtorch_python");
    }
    let disable_env = if python && torch {
        procinfo::environ(pid).and_then(|env| {
            env.get(std::ffi::OsStr::new("TRACEML_DISABLE"))
                .map(|v| v.to_string_lossy().into_owned())
        })
    } else {
        None
    };
    let cgroup = procinfo::cgroup(pid).unwrap_or_default();
    Some(ProcInfo {
        pid,
        ppid: stat.ppid as u32,
        uid,
        user: crate::users::name_of(uid),
        cmdline,
        exe_name,
        python,
        torch,
        disable_env,
        cgroup,
    })
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
    let stat = crate::procinfo::stat(pid);
    let comm = name
        .map(str::to_owned)
        .or_else(|| stat.as_ref().map(|s| s.comm.clone()))
        .unwrap_or_default();
    let start = stat
        .and_then(|s| crate::procinfo::start_unix_secs(&s))
        .unwrap_or(0);
    format!(
        "{}-{pid}-{}",
        crate::sanitize::dir_name(&comm),
        crate::units::utc_stamp(start)
    )
}

/// Writes a summary's JSON, card and report into `dir` (`stem` = `final_summary` or
/// `summary-<n>`; the report only for the final one), each atomically (`OutDir::write`).
pub fn write_summary(dir: &Path, stem: &str, s: &Summary) -> std::io::Result<()> {
    let out = crate::output::OutDir::open(dir, None)?;
    // The JSON last: a reader that waits for it finds the card and the report in place.
    if stem == "final_summary" {
        let mut txt = Vec::new();
        crate::render::render_card(s, &mut txt, false)?;
        out.write(&format!("{stem}.txt"), &txt)?;
        out.write("final_report.html", crate::render::to_html(s).as_bytes())?;
    }
    let mut json = Vec::new();
    crate::render::render_json(s, &mut json)?;
    out.write(&format!("{stem}.json"), &json)?;
    Ok(())
}

/// One line for the log: `INPUT-BOUND warning (input_wait 34%)`.
fn verdict_line(s: &Summary) -> String {
    let d = &s.primary_diagnosis;
    let share = d
        .phase
        .zip(d.share)
        .map(|(p, sh)| format!(" ({} {:.0}%)", p.name(), sh * 100.0))
        .unwrap_or_default();
    format!(
        "{} {}{share}, {} steps",
        d.kind.headline(),
        d.severity.as_str(),
        s.steps.count
    )
}

/// A target's collectors: the whole run and the current window.
struct Folds {
    run: Collector,
    window: Collector,
    /// At the latest sample, for `/metrics` (`None` without NVML).
    gpu_utilization: Option<f64>,
}

impl Folds {
    fn new() -> Folds {
        Folds {
            run: Collector::new(),
            window: Collector::new(),
            gpu_utilization: None,
        }
    }

    fn push(&mut self, item: &StreamItem) {
        if let StreamItem::Sample(s) = item {
            self.gpu_utilization = crate::metrics::gpu_utilization(s);
        }
        self.run.push(item);
        self.window.push(item);
    }
}

/// Where a target's values go on `/metrics`: the shared exporter, its job and rank labels.
#[derive(Clone)]
struct MetricsSink {
    exporter: crate::metrics::http::Shared,
    job: String,
    rank: String,
    /// This rank's verdict is the job's while it runs (a single process, or rank 0 of a
    /// grouped job until the job's combined verdict replaces it at the end).
    sets_verdict: bool,
}

impl MetricsSink {
    fn with(&self, f: impl FnOnce(&mut crate::metrics::Exporter)) {
        f(&mut self.exporter.lock().unwrap_or_else(|p| p.into_inner()));
    }

    /// The run so far (its counters), the rank's liveness (when it last completed a step, and
    /// whether it waits in a collective: the cross-node hang rule's series) and the job's
    /// current verdict.
    fn update(
        &self,
        s: &Summary,
        t: &crate::engine::StepTotals,
        gpu: Option<f64>,
        v: Verdict,
        live: Option<(Option<f64>, bool)>,
    ) {
        let mut values = RankValues::from_summary(s, t, gpu);
        if let Some((last_step_end_unix, in_collective)) = live {
            values.last_step_end_unix = last_step_end_unix;
            values.in_collective = Some(in_collective);
        }
        self.with(|e| {
            e.update(&self.job, &self.rank, values);
            if self.sets_verdict {
                e.set_verdict(&self.job, v);
            }
        });
    }
}

/// Attaches to `pid` and runs until the target ends or `stop` says; writes its summaries and
/// returns the final one (`None` when it could not be attached).
async fn run_target(
    pid: u32,
    dir: PathBuf,
    mut opts: live::Options,
    stop: watch::Receiver<Option<EndReason>>,
    window: Duration,
    metrics: Option<MetricsSink>,
    folds: Rc<RefCell<Folds>>,
) -> Option<Summary> {
    opts.stop = Some(stop);
    let sink_folds = folds.clone();
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + window, window);
    let refresh = crate::metrics::REFRESH;
    let mut metric_ticks = tokio::time::interval_at(tokio::time::Instant::now() + refresh, refresh);
    metric_ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut n = 0u32;
    let mut last_kind: Option<DiagnosisKind> = None;
    // The verdict `/metrics` shows: the last window's, the run so far's before the first window.
    let mut window_verdict: Option<Verdict> = None;
    // Steps seen so far, and when the count last grew (unix seconds): the rank's last step end
    // as `/metrics` shows it (within one refresh), as multirank's `Progress` does for `--pid`.
    let mut progress: (u32, Option<f64>) = (0, None);
    // The run (and the sink's handle on the folds) ends with this block.
    let result = {
        let run = live::run(&opts, move |item| {
            sink_folds.borrow_mut().push(item);
            Ok(())
        });
        tokio::pin!(run);
        loop {
            tokio::select! {
                r = &mut run => break r,
                _ = metric_ticks.tick(), if metrics.is_some() => {
                    let f = folds.borrow();
                    if f.run.events() > 0 && let Some(m) = &metrics {
                        let (s, t) = f.run.snapshot_with_totals();
                        if s.steps.count > progress.0 {
                            let now = std::time::SystemTime::now()
                                .duration_since(std::time::UNIX_EPOCH)
                                .map(|d| d.as_secs_f64())
                                .ok();
                            progress = (s.steps.count, now);
                        }
                        let waiting = f.run.in_collective_wait()
                            || crate::ranks::in_collective(&f.run.last_stack());
                        m.update(
                            &s,
                            &t,
                            f.gpu_utilization,
                            window_verdict.unwrap_or(Verdict::of(&s)),
                            Some((progress.1, waiting)),
                        );
                    }
                }
                _ = ticks.tick() => {
                    n += 1;
                    let (win, so_far) = {
                        let mut f = folds.borrow_mut();
                        let fresh = f.run.fresh_window();
                        let win = std::mem::replace(&mut f.window, fresh).finish();
                        (win, f.run.snapshot())
                    };
                    if let Err(e) = write_summary(&dir, &format!("summary-{n}"), &win) {
                        tracing::warn!("pid {pid}: cannot write window summary {n}: {e}");
                    }
                    let line = format!(
                        "pid {pid} window {n}: {} · run so far: {}",
                        verdict_line(&win),
                        verdict_line(&so_far)
                    );
                    let kind = win.primary_diagnosis.kind;
                    window_verdict = Some(Verdict::of(&win));
                    match last_kind.replace(kind) {
                        // From or to "no verdict yet" is no change of verdict.
                        Some(k)
                            if k != kind
                                && ![DiagnosisKind::InsufficientData, DiagnosisKind::NotTraining]
                                    .iter()
                                    .any(|&n| n == kind || n == k) =>
                        {
                            tracing::warn!("{line} (verdict changed from {})", k.headline())
                        }
                        _ => tracing::info!("{line}"),
                    }
                }
            }
        }
    };
    // The job of a rank may hold the folds too (hang checks): what it sees from now on is empty.
    let folds = folds.replace(Folds::new());
    match result {
        Ok(reason) => tracing::info!("pid {pid}: run ended ({reason:?})"),
        Err(e) if folds.run.events() == 0 => {
            tracing::warn!("pid {pid}: not attached: {e}");
            let _ = std::fs::remove_dir(&dir);
            if let Some(m) = &metrics {
                m.with(|e| e.forget(&m.job, &m.rank));
            }
            return None;
        }
        Err(e) => tracing::warn!("pid {pid}: {e}; writing the summary of what was gathered"),
    }
    let gpu = folds.gpu_utilization;
    let (summary, totals) = folds.run.finish_with_totals();
    if let Some(m) = &metrics {
        // Ended: no liveness series (a finished rank never looks hung).
        m.update(
            &summary,
            &totals,
            gpu,
            window_verdict.unwrap_or(Verdict::of(&summary)),
            None,
        );
        m.with(|e| e.ended(&m.job, &m.rank, Instant::now()));
    }
    match write_summary(&dir, "final_summary", &summary) {
        Ok(()) => tracing::info!(
            "pid {pid}: {} → {}",
            verdict_line(&summary),
            dir.join("final_summary.json").display()
        ),
        Err(e) => tracing::warn!("pid {pid}: cannot write the final summary: {e}"),
    }
    Some(summary)
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

struct Target {
    stop: watch::Sender<Option<EndReason>>,
    done: tokio::task::JoinHandle<()>,
    start: u64,
}

/// What the supervisor knows of the node's processes between scans.
#[derive(Default)]
struct Node {
    targets: HashMap<u32, Target>,
    /// The policy's decision per (pid, start time), logged once.
    decided: HashMap<(u32, u64), Decision>,
    /// Processes attached once (a run that ended is not restarted on the same process, unless
    /// it ended because the process exec'd: its new program is looked at again).
    attached: std::collections::HashSet<(u32, u64)>,
    /// Processes whose run ended with an exec, filled by their run's task.
    execed: Rc<RefCell<Vec<(u32, u64)>>>,
    /// Job directories handed out (an exec'd process gets a new one: same pid and start time).
    /// By name, with the pid they were made for (forgotten once it is gone).
    dirs: HashMap<String, u32>,
    /// Multi-rank jobs by key (the launcher's pid and start time, or the ranks' rendezvous).
    jobs: HashMap<String, JobGroup>,
    /// Processes that run no Python, by (pid, start time): their program (exe), and the scan
    /// after which they are looked at again (a Python process is looked at every scan until it
    /// maps libtorch; one that execs another program is looked at at once).
    not_python: HashMap<(u32, u64), (Option<PathBuf>, Instant)>,
}

/// How long a process that runs no Python is left alone (unless it execs).
const NOT_PYTHON_RECHECK: Duration = Duration::from_secs(30);

/// An attached rank as its job sees it: its folds (shared with its run) and its progress
/// (steps, when they last changed).
type LiveRank = (
    crate::job::RankProc,
    Rc<RefCell<Folds>>,
    crate::multirank::Progress,
);

/// The ranks of one multi-rank job on this node: each rank runs as its own target (its summaries
/// under `rank-<r>/`); once none of them runs, the job's summary ([`crate::ranks::combine`]:
/// STRAGGLER and the ranks table) is written in the job's directory.
struct JobGroup {
    name: String,
    dir: PathBuf,
    info: crate::summary::JobInfo,
    /// Rank pids attached (their targets are in `Node::targets` while they run).
    pids: Vec<u32>,
    /// Final summaries of the ranks that ended.
    runs: Rc<RefCell<Vec<crate::ranks::RankRun>>>,
    /// Rank summaries the job's summary was last written from.
    written: usize,
    /// The launcher, whose exit (with no rank running) ends the group.
    launcher: Option<(u32, u64)>,
    /// Each attached rank's folds, and its progress (steps, when they last changed).
    live: Vec<LiveRank>,
    /// A rank is a HANG after completing no step for max(10 × its mean step, this).
    hang_after: Duration,
    /// The ranks stuck at the last check, and every rank's stack then (for the HANG).
    hung: Vec<crate::ranks::Stuck>,
    hang_stacks: HashMap<u32, Vec<String>>,
}

impl JobGroup {
    /// Writes the job's summary when no rank runs and a rank ended since the last write.
    /// `true` when the group is over (no rank runs and its launcher is gone).
    fn settle(
        &mut self,
        targets: &HashMap<u32, Target>,
        metrics: &Option<crate::metrics::http::Shared>,
    ) -> bool {
        let is_running = |p: &u32| targets.get(p).is_some_and(|t| !t.done.is_finished());
        if self.pids.iter().any(is_running) {
            self.check_hang(is_running);
            return false;
        }
        let runs = self.runs.borrow();
        if runs.len() > self.written {
            self.written = runs.len();
            // A job that ended hung (its ranks killed, or serve stopped) says so, with the
            // stacks read while it hung.
            let mut runs = runs.clone();
            if !self.hung.is_empty() {
                for r in &mut runs {
                    r.stack = self.hang_stacks.get(&r.rank).cloned().unwrap_or_default();
                }
            }
            match crate::ranks::combine(runs.clone(), self.info.clone(), &self.hung) {
                Some(sum) => {
                    if let Some(exporter) = metrics {
                        let mut e = exporter.lock().unwrap_or_else(|p| p.into_inner());
                        e.set_verdict(&self.name, Verdict::of(&sum));
                    }
                    match write_summary(&self.dir, "final_summary", &sum) {
                        Ok(()) => tracing::info!(
                            "job {} ({} ranks): {} → {}",
                            self.name,
                            runs.len(),
                            verdict_line(&sum),
                            self.dir.join("final_summary.json").display()
                        ),
                        Err(e) => {
                            tracing::warn!("job {}: cannot write its summary: {e}", self.name)
                        }
                    }
                }
                None => tracing::warn!("job {}: no rank could be measured", self.name),
            }
        }
        self.launcher
            .is_none_or(|(pid, start)| start_time(pid) != Some(start))
    }

    /// While ranks run: a rank that stopped completing steps makes the job a HANG, written to
    /// the job's `final_summary.json` at once (every running rank's stack in it) and logged at
    /// warning, once per hang (again after the job made progress).
    fn check_hang(&mut self, is_running: impl Fn(&u32) -> bool) {
        let now = Instant::now();
        let mut stuck = Vec::new();
        for (p, folds, progress) in &mut self.live {
            if !is_running(&p.pid) {
                continue;
            }
            let mut f = folds.borrow_mut();
            if let Some(idle) =
                crate::multirank::idle_rank(&mut f.run, progress, now, self.hang_after)
            {
                stuck.push(crate::ranks::Stuck {
                    rank: p.rank,
                    idle_s: idle.as_secs_f64(),
                });
            }
        }
        if stuck.is_empty() {
            self.hung.clear();
            return;
        }
        let reported = !self.hung.is_empty();
        self.hung = stuck;
        if reported {
            return;
        }
        let runs: Vec<crate::ranks::RankRun> = self
            .live
            .iter()
            .filter(|(p, _, _)| is_running(&p.pid))
            .map(|(p, folds, _)| {
                let f = folds.borrow();
                crate::ranks::RankRun {
                    rank: p.rank,
                    local_rank: p.local_rank,
                    pid: p.pid,
                    summary: f.run.snapshot(),
                    stack: f.run.last_stack(),
                }
            })
            .collect();
        self.hang_stacks = runs.iter().map(|r| (r.rank, r.stack.clone())).collect();
        if let Some(sum) = crate::ranks::combine(runs, self.info.clone(), &self.hung) {
            tracing::warn!("job {}: HANG: {}", self.name, sum.primary_diagnosis.why);
            if let Err(e) = write_summary(&self.dir, "final_summary", &sum) {
                tracing::warn!("job {}: cannot write the HANG summary: {e}", self.name);
            }
        }
    }
}

/// The signals a supervisor of many runs handles itself (its runs leave them to it).
pub(crate) struct Signals {
    pub term: tokio::signal::unix::Signal,
    pub int: tokio::signal::unix::Signal,
    pub hup: tokio::signal::unix::Signal,
}

impl Signals {
    /// Registers the handlers (inside the runtime).
    pub fn new() -> Result<Signals, String> {
        use tokio::signal::unix::{SignalKind, signal};
        let sig = |k| signal(k).map_err(|e: std::io::Error| e.to_string());
        Ok(Signals {
            term: sig(SignalKind::terminate())?,
            int: sig(SignalKind::interrupt())?,
            hup: sig(SignalKind::hangup())?,
        })
    }
}

/// What [`run`] reads before it starts (and again on `SIGHUP`): the settings, flags over the
/// config file; user names the name service does not know are logged.
fn load(flags: &ServeFlags) -> Result<ServeSettings, SettingsError> {
    let settings = ServeSettings::load(flags, &crate::users::uid_of)?;
    for name in settings.policy.unknown_users() {
        tracing::warn!(
            "{}: user {name:?} is unknown to this node's name service (a typo, or the directory \
             did not answer); a process whose user has no name is not attached while exclude_users \
             names an unknown user",
            settings.config.display()
        );
    }
    Ok(settings)
}

/// `serve --check-config`: checks what [`run`] reads before it starts, attaching nothing and
/// binding nothing. `Ok` says what serve would run with, in one line.
pub fn check_config(flags: &ServeFlags) -> Result<String, ServeError> {
    Ok(load(flags)?.describe())
}

/// Runs the service until SIGTERM/SIGINT.
pub fn run(flags: ServeFlags) -> Result<(), ServeError> {
    let mut settings = load(&flags)?;
    live::preflight_node().map_err(ServeError::Node)?;
    // Read at start only: where the summaries go and where /metrics listens.
    let state_dir = settings.state_dir.clone();
    crate::output::create_dir_private(&state_dir).map_err(|source| ServeError::StateDir {
        path: state_dir.clone(),
        source,
    })?;
    let metrics = start_metrics(settings.metrics_addr)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| ServeError::Runtime(e.to_string()))?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let Signals {
            mut term,
            mut int,
            mut hup,
        } = Signals::new().map_err(ServeError::Runtime)?;
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
                    let Node { targets, jobs, .. } = &mut node;
                    jobs.retain(|_, g| !g.settle(targets, &metrics));
                    targets.retain(|_, t| !t.done.is_finished());
                    scan_once(&settings, &state_dir, &metrics, &mut node);
                }
                _ = hup.recv() => {
                    match load(&flags) {
                        Ok(s) => {
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
        tracing::info!("stopping: detaching {} targets", node.targets.len());
        let deadline = Instant::now() + Duration::from_secs(9);
        for t in node.targets.values() {
            let _ = t.stop.send(Some(EndReason::Terminated));
        }
        for t in node.targets.values_mut() {
            let left = deadline.saturating_duration_since(Instant::now());
            if tokio::time::timeout(left, &mut t.done).await.is_err() {
                tracing::warn!("a target did not finish its summary in time");
            }
        }
        for g in node.jobs.values_mut() {
            g.settle(&node.targets, &metrics);
        }
        Ok::<(), ServeError>(())
    })
}

/// Serves `/metrics` when an address is given (the flag over the config file's key).
fn start_metrics(
    addr: Option<std::net::SocketAddr>,
) -> Result<Option<crate::metrics::http::Shared>, ServeError> {
    let Some(addr) = addr else {
        return Ok(None);
    };
    let exporter = crate::metrics::http::Shared::default();
    let bound = crate::metrics::http::serve(addr, exporter.clone())
        .map_err(|source| ServeError::Metrics { addr, source })?;
    tracing::info!("metrics at http://{bound}/metrics");
    Ok(Some(exporter))
}

/// One scan of /proc: attaches to new training processes the policy admits.
fn scan_once(
    settings: &ServeSettings,
    state_dir: &Path,
    metrics: &Option<crate::metrics::http::Shared>,
    node: &mut Node,
) {
    let (policy, window) = (&settings.policy, settings.window);
    let Node {
        targets,
        decided,
        attached,
        execed,
        dirs,
        jobs,
        not_python,
    } = node;
    // A process that exec'd is a new program: decided on again (and attached again if it
    // trains), in a directory of its own.
    for key in execed.borrow_mut().drain(..) {
        tracing::info!("pid {} exec'd: looking at its new program", key.0);
        attached.remove(&key);
        decided.remove(&key);
    }
    let Some(all) = crate::procinfo::pids() else {
        return;
    };
    let me = std::process::id();
    let alive: std::collections::HashSet<u32> = all.iter().copied().collect();
    // Forget what was learned of processes that are gone (bounded by the node's processes).
    decided.retain(|(pid, _), _| alive.contains(pid));
    dirs.retain(|_, pid| alive.contains(pid));
    attached.retain(|(pid, _)| alive.contains(pid));
    not_python.retain(|(pid, _), _| alive.contains(pid));
    // Read once per scan, and only for processes not settled yet: an attached target, a process
    // decided on (worker, launcher, excluded, opted out: until SIGHUP) or one that runs no Python
    // costs a read of /proc/<pid>/stat per scan, not of its maps.
    let mut infos: HashMap<u32, Option<ProcInfo>> = HashMap::new();
    let now = Instant::now();
    for pid in &all {
        if *pid == me {
            continue;
        }
        let start = start_time(*pid).unwrap_or(0);
        if targets.get(pid).is_some_and(|t| t.start == start)
            || decided.contains_key(&(*pid, start))
        {
            continue;
        }
        if let Some((exe, until)) = not_python.get(&(*pid, start))
            && now < *until
            && crate::procinfo::exe(*pid) == *exe
        {
            continue;
        }
        let Some(info) = infos.entry(*pid).or_insert_with(|| proc_info(*pid)).clone() else {
            continue;
        };
        if !info.python {
            not_python.insert(
                (*pid, start),
                (crate::procinfo::exe(*pid), now + NOT_PYTHON_RECHECK),
            );
            continue;
        }
        if !info.torch {
            continue;
        }
        let parent = infos
            .entry(info.ppid)
            .or_insert_with(|| proc_info(info.ppid))
            .clone();
        let d = policy.decide(&info, parent.as_ref());
        if d == Decision::NotTraining {
            continue;
        }
        if decided.insert((*pid, start), d.clone()).is_none() && d != Decision::Attach {
            match &d {
                Decision::OptedOut => {
                    tracing::info!("pid {pid} opted out (TRACEML_DISABLE): not attached")
                }
                Decision::Excluded(why) => tracing::info!("pid {pid} not attached: {why}"),
                _ => tracing::debug!("pid {pid}: {d:?}"),
            }
        }
        if d != Decision::Attach || !attached.insert((*pid, start)) {
            continue;
        }
        let folds = Rc::new(RefCell::new(Folds::new()));
        // A rank of a multi-rank job goes under its job's directory, as `rank-<r>/`.
        let rank = crate::job::rank_of(*pid).filter(|r| r.world_size.is_none_or(|w| w > 1));
        let (job, dir, group) = match &rank {
            Some(r) => {
                let spec = crate::job::discover(*pid);
                let launcher = spec.launcher.and_then(|l| Some((l, start_time(l)?)));
                let key = match launcher {
                    Some((l, t)) => format!("launcher {l} {t}"),
                    None => format!(
                        "rendezvous {} {}",
                        spec.master.as_deref().unwrap_or("-"),
                        spec.run_id.as_deref().unwrap_or("-")
                    ),
                };
                let g = jobs.entry(key).or_insert_with(|| {
                    let name = job_dir_name_as(
                        launcher.map_or(*pid, |(l, _)| l),
                        script_name(&info.cmdline).as_deref(),
                    );
                    let dir = state_dir.join(&name);
                    let mut info = crate::multirank::job_info(&spec);
                    info.world_size = info.world_size.or(r.world_size);
                    tracing::info!("multi-rank job {name}: {info:?}");
                    JobGroup {
                        name,
                        dir,
                        info,
                        pids: Vec::new(),
                        runs: Rc::default(),
                        written: 0,
                        launcher,
                        live: Vec::new(),
                        hang_after: settings.hang_after,
                        hung: Vec::new(),
                        hang_stacks: HashMap::new(),
                    }
                });
                if let Err(e) = crate::output::create_dir_private(&g.dir) {
                    tracing::warn!("pid {pid}: cannot create {}: {e}", g.dir.display());
                    continue;
                }
                g.pids.push(*pid);
                g.live
                    .push((r.clone(), folds.clone(), crate::multirank::Progress::new()));
                let dir = g.dir.join(format!("rank-{}", r.rank));
                (g.name.clone(), dir, Some(g.runs.clone()))
            }
            None => {
                // After an exec the same pid and start time: `-2`, `-3`, ... on the name.
                let base = job_dir_name(*pid);
                let job = (1..)
                    .map(|n| {
                        if n == 1 {
                            base.clone()
                        } else {
                            format!("{base}-{n}")
                        }
                    })
                    .find(|j| !dirs.contains_key(j) && !state_dir.join(j).exists())
                    .expect("an unused name");
                dirs.insert(job.clone(), *pid);
                let dir = state_dir.join(&job);
                (job, dir, None)
            }
        };
        if let Err(e) = crate::output::create_dir_private(&dir) {
            tracing::warn!("pid {pid}: cannot create {}: {e}", dir.display());
            continue;
        }
        let mut lo = live::Options::new(*pid);
        lo.policy = settings.probe_policy;
        lo.overhead_budget = settings.overhead_budget;
        lo.stack_rate = settings.stack_rate;
        // A process found on the node may not train at all: nothing costly before it does.
        lo.watch_first = true;
        let (tx, rx) = watch::channel(None);
        tracing::info!(
            "attaching to pid {pid} ({}) → {}",
            crate::sanitize::terminal(&info.cmdline.join(" ")),
            dir.display()
        );
        let sink = metrics.as_ref().map(|exporter| {
            let sink = MetricsSink {
                exporter: exporter.clone(),
                job,
                // Single-process jobs are rank 0.
                rank: rank.as_ref().map_or(0, |r| r.rank).to_string(),
                sets_verdict: rank.as_ref().is_none_or(|r| r.rank == 0),
            };
            let info = crate::metrics::JobInfo::of(*pid);
            sink.with(|e| e.attached(&sink.job, &sink.rank, info));
            sink
        });
        let run = run_target(*pid, dir, lo, rx, window, sink, folds);
        let done = match (rank, group) {
            (Some(r), Some(runs)) => tokio::task::spawn_local(async move {
                if let Some(summary) = run.await {
                    runs.borrow_mut().push(crate::ranks::RankRun {
                        rank: r.rank,
                        local_rank: r.local_rank,
                        pid: r.pid,
                        summary,
                        stack: Vec::new(),
                    });
                }
            }),
            _ => {
                let execed = execed.clone();
                let key = (*pid, start);
                tokio::task::spawn_local(async move {
                    if run
                        .await
                        .is_some_and(|s| s.data_quality.end_reason == EndReason::TargetExeced)
                    {
                        execed.borrow_mut().push(key);
                    }
                })
            }
        };
        targets.insert(
            *pid,
            Target {
                stop: tx,
                done,
                start,
            },
        );
    }
}

fn start_time(pid: u32) -> Option<u64> {
    crate::procinfo::start_state(pid).map(|(start, _)| start)
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
