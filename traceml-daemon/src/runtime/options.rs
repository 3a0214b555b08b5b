//! What a live run is given ([`Options`]) and why it cannot start ([`LiveError`]).
use std::path::PathBuf;
use std::time::Duration;

use crate::attach::AttachError;
use crate::attach::python;
use crate::event::EndReason;
use crate::overhead::ProbePolicy;

/// Options of a live run (validated CLI).
#[derive(Clone, Debug)]
pub struct Options {
    pub pid: u32,
    /// Written once every initial probe is attached (for scripts and tests).
    pub ready_file: Option<PathBuf>,
    pub duration: Option<Duration>,
    /// Per-launch events (default) or launch counting only.
    pub launch_events: bool,
    pub ring_bytes: u32,
    pub sample_interval: Duration,
    /// How often `/proc/<pid>/maps` is re-read for new libraries (must stay under 1 s).
    pub rescan_interval: Duration,
    /// How the overhead governor may choose probes.
    pub policy: ProbePolicy,
    /// The governor's budget, a fraction of step time.
    pub overhead_budget: f64,
    /// Python stack samples of the training thread per second (0: none).
    pub stack_rate: u32,
    /// `--probe-set auto` starts by watching for training markers with torch's marker probes
    /// only (`serve`: a process found on the node may not train at all) instead of learning the
    /// loop with every probe from the attach (`--pid`: the user pointed at a training job).
    pub watch_first: bool,
    /// Ends the run when it holds a reason (a supervisor holding many targets: `serve`). With
    /// it, the run leaves SIGINT/SIGTERM/SIGHUP to the supervisor; without, it ends on them.
    pub stop: Option<tokio::sync::watch::Receiver<Option<EndReason>>>,
}

/// DataLoader workers' stacks per second each, at most (fewer when the training thread's rate
/// is lower: they are taken on its ticks).
pub const WORKER_STACK_RATE: u32 = 10;

/// Workers are sampled every this many training-thread stack ticks.
pub(super) fn worker_every(stack_rate: u32) -> u64 {
    u64::from((stack_rate / WORKER_STACK_RATE).max(1))
}

impl Options {
    pub fn new(pid: u32) -> Self {
        Options {
            pid,
            ready_file: None,
            duration: None,
            launch_events: true,
            ring_bytes: 8 << 20,
            sample_interval: Duration::from_millis(500),
            rescan_interval: Duration::from_millis(250),
            policy: ProbePolicy::Auto,
            overhead_budget: 0.005,
            stack_rate: 100,
            watch_first: false,
            stop: None,
        }
    }
}

/// Why a live run could not start. Each message is one sentence for the user.
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    #[error("no process with pid {0} (is it still running?)")]
    NoSuchProcess(u32),
    #[error(transparent)]
    NotPython(#[from] python::PythonError),
    #[error(
        "traceml-daemon needs root, or the capabilities CAP_SYS_ADMIN and CAP_SYS_PTRACE (kernels \
         with the 2025 uprobe fix refuse uprobes without CAP_SYS_ADMIN; see docs/privileges.md); \
         this process lacks {0}"
    )]
    Privileges(String),
    #[error("this kernel cannot run traceml-daemon: {0}")]
    Kernel(String),
    #[error(transparent)]
    Attach(#[from] AttachError),
    #[error("cannot read the target's code objects: {0}")]
    Memory(String),
    #[error("cannot write: {0}")]
    Sink(String),
}

impl LiveError {
    /// Distinct exit codes: 3 for target problems, 4 for privileges/kernel, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            LiveError::NotPython(python::PythonError::Unreadable { .. }) => 4,
            LiveError::NoSuchProcess(_) | LiveError::NotPython(_) | LiveError::Memory(_) => 3,
            LiveError::Privileges(_) | LiveError::Kernel(_) => 4,
            _ => 1,
        }
    }
}
