//! Which processes make one training job on this node: from any pid of the job (the launcher —
//! `torchrun`/`torch.distributed.run`, `accelerate launch`, `deepspeed`, an `mpirun`-style
//! parent — or any rank), the ranks found through the process tree and each rank's environment
//! (`RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `MASTER_ADDR`/`MASTER_PORT`, `TORCHELASTIC_RUN_ID`).
//! DataLoader workers inherit their rank's environment; they are children of a rank with its
//! command line and stay workers. A process with no rank in its environment is a job of one.
use std::collections::HashMap;

use crate::host::policy::ProcFacts;
use crate::host::procinfo;

/// One rank process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankProc {
    pub pid: u32,
    pub rank: u32,
    pub local_rank: Option<u32>,
    pub world_size: Option<u32>,
    /// The elastic agent's restart count (`TORCHELASTIC_RESTART_COUNT`): 0 for the job's first
    /// attempt, k once the agent restarted its ranks k times.
    pub restart: u32,
}

impl RankProc {
    /// The rank's directory in its job's: `rank-<r>`, or `rank-<r>-restart-<k>` for a rank of a
    /// restarted attempt (an earlier attempt's files stay).
    pub fn dir_name(&self) -> String {
        match self.restart {
            0 => format!("rank-{}", self.rank),
            k => format!("rank-{}-restart-{k}", self.rank),
        }
    }
}

/// A job as found from one of its pids.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobSpec {
    pub launcher: Option<u32>,
    /// By rank; empty for a single process.
    pub ranks: Vec<RankProc>,
    pub run_id: Option<String>,
    /// `MASTER_ADDR:MASTER_PORT`.
    pub master: Option<String>,
}

/// The rank variables of a process's environment.
fn rank_env(pid: u32) -> Option<HashMap<String, String>> {
    let env = procinfo::environ(pid)?;
    let get = |k: &str| {
        env.get(std::ffi::OsStr::new(k))
            .map(|v| v.to_string_lossy().into_owned())
    };
    get("RANK")?;
    Some(
        [
            "RANK",
            "LOCAL_RANK",
            "WORLD_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
            "TORCHELASTIC_RUN_ID",
            "TORCHELASTIC_RESTART_COUNT",
        ]
        .into_iter()
        .filter_map(|k| Some((k.to_owned(), get(k)?)))
        .collect(),
    )
}

/// `pid` as a rank: `None` when its environment has no `RANK` (a job of one).
pub fn rank_of(pid: u32) -> Option<RankProc> {
    rank_from(pid, &rank_env(pid)?)
}

/// Process `pid` as the rank its rank variables describe (`None` without a numeric `RANK`).
fn rank_from(pid: u32, env: &HashMap<String, String>) -> Option<RankProc> {
    let num = |k: &str| env.get(k).and_then(|v| v.parse().ok());
    Some(RankProc {
        pid,
        rank: num("RANK")?,
        local_rank: num("LOCAL_RANK"),
        world_size: num("WORLD_SIZE"),
        restart: num("TORCHELASTIC_RESTART_COUNT").unwrap_or(0),
    })
}

fn job_key(env: &HashMap<String, String>) -> (Option<String>, Option<String>, Option<String>) {
    (
        env.get("MASTER_ADDR").cloned(),
        env.get("MASTER_PORT").cloned(),
        env.get("TORCHELASTIC_RUN_ID").cloned(),
    )
}

/// The ranks below `root` (breadth first, not below a rank, at most 4 levels), of one job.
pub fn ranks_below(root: u32) -> Vec<(RankProc, HashMap<String, String>)> {
    let mut out: Vec<(RankProc, HashMap<String, String>)> = Vec::new();
    let mut level = vec![root];
    for _ in 0..4 {
        let mut next = Vec::new();
        for p in level {
            for c in procinfo::children(p) {
                match rank_env(c) {
                    Some(env) if proc_info(c).is_some_and(|i| i.python) => {
                        if let Some(rank) = rank_from(c, &env) {
                            out.push((rank, env));
                        }
                    }
                    _ => next.push(c),
                }
            }
        }
        level = next;
    }
    // One job: the ranks of the first one's master and run id.
    if let Some(key) = out.first().map(|(_, e)| job_key(e)) {
        out.retain(|(_, e)| job_key(e) == key);
    }
    out.sort_by_key(|(r, _)| r.rank);
    out
}

/// The job `pid` belongs to.
pub fn discover(pid: u32) -> JobSpec {
    let info = proc_info(pid);
    let is_launcher = |p: u32| {
        proc_info(p).is_some_and(|i| crate::host::policy::is_launcher(&i.cmdline))
            || !ranks_below(p).is_empty()
    };
    let launcher = if rank_env(pid).is_some() {
        // A rank: its launcher is the nearest ancestor that launches ranks.
        let mut p = info.as_ref().map(|i| i.ppid).unwrap_or(0);
        let mut found = None;
        for _ in 0..3 {
            if p <= 1 {
                break;
            }
            if is_launcher(p) {
                found = Some(p);
                break;
            }
            p = proc_info(p).map(|i| i.ppid).unwrap_or(0);
        }
        found
    } else if is_launcher(pid) {
        Some(pid)
    } else {
        None
    };
    let ranks = match launcher {
        Some(l) => ranks_below(l),
        None => Vec::new(),
    };
    let env = ranks.first().map(|(_, e)| e.clone()).unwrap_or_default();
    let (run_id, master) = rendezvous_of(&env);
    JobSpec {
        launcher,
        run_id,
        master,
        ranks: ranks.into_iter().map(|(r, _)| r).collect(),
    }
}

/// `TORCHELASTIC_RUN_ID` and `MASTER_ADDR:MASTER_PORT` of a rank's environment.
pub fn rendezvous_of(env: &HashMap<String, String>) -> (Option<String>, Option<String>) {
    (
        env.get("TORCHELASTIC_RUN_ID").cloned(),
        env.get("MASTER_ADDR")
            .zip(env.get("MASTER_PORT"))
            .map(|(a, p)| format!("{a}:{p}")),
    )
}

/// Reads what the policy needs about one process; `None` when it vanished or is unreadable.
pub fn proc_info(pid: u32) -> Option<ProcFacts> {
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
    let disable_env = if python && torch { opt_out(pid) } else { None };
    let cgroup = procinfo::cgroup(pid).unwrap_or_default();
    Some(ProcFacts {
        pid,
        ppid: stat.ppid as u32,
        uid,
        user: crate::host::users::name_of(uid),
        cmdline,
        exe_name,
        python,
        torch,
        disable_env,
        cgroup,
    })
}

/// `TRACEML_DISABLE` in the environment of `pid`: the target's own opt-out (`serve` honours
/// it; `--pid` says it attaches anyway).
pub fn opt_out(pid: u32) -> Option<String> {
    procinfo::environ(pid).and_then(|env| {
        env.get(std::ffi::OsStr::new("TRACEML_DISABLE"))
            .map(|v| v.to_string_lossy().into_owned())
    })
}

/// A job's identity, equal on every node of one job: the `job_id` label of its series. The
/// first of (an empty value, or torchrun's default run id `none`, counts as absent):
/// 1. `TRACEML_JOB_ID` (set it from anything the scheduler knows, e.g. a Kubernetes job label
///    through the downward API);
/// 2. `TORCHELASTIC_RUN_ID` (torchrun's `--rdzv-id`, equal on every node's agent);
/// 3. `MASTER_ADDR:MASTER_PORT` (every node's ranks meet there); a loopback address
///    (`127.*`, `localhost`, `::1`) names one machine only, so it is written
///    `<host>/<addr>:<port>` with this machine's host name (`host`);
/// 4. `SLURM_JOB_ID` as `slurm-<id>`;
/// 5. the Kubernetes job name, `k8s-<namespace>/<job>` (`JOB_NAME`-style variables are not
///    standard; the pod's `batch.kubernetes.io/job-name` label reaches the environment only
///    through the downward API, as `TRACEML_JOB_ID` or `K8S_JOB_NAME`).
///
/// `None` when none is there (a job of one process): its `job` label is its identity.
pub fn job_identity(get: impl Fn(&str) -> Option<String>, host: &str) -> Option<String> {
    let get = |k: &str| get(k).filter(|v| !v.is_empty());
    if let Some(id) = get("TRACEML_JOB_ID") {
        return Some(id);
    }
    if let Some(id) = get("TORCHELASTIC_RUN_ID").filter(|v| v != "none") {
        return Some(id);
    }
    if let (Some(addr), Some(port)) = (get("MASTER_ADDR"), get("MASTER_PORT")) {
        let loopback =
            addr == "localhost" || addr == "::1" || addr == "[::1]" || addr.starts_with("127.");
        return Some(if loopback {
            format!("{host}/{addr}:{port}")
        } else {
            format!("{addr}:{port}")
        });
    }
    if let Some(id) = get("SLURM_JOB_ID") {
        return Some(format!("slurm-{id}"));
    }
    get("K8S_JOB_NAME").map(|j| match get("POD_NAMESPACE") {
        Some(ns) => format!("k8s-{ns}/{j}"),
        None => format!("k8s-{j}"),
    })
}

/// The `node` label: `TRACEML_NODE` of the daemon's environment when set (several daemons on
/// one machine standing for several nodes, or a scheduler's node name), else the host name.
pub fn node_name() -> String {
    std::env::var("TRACEML_NODE")
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(procinfo::hostname)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(vars: &[(&str, &str)]) -> Option<String> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        job_identity(|k| m.get(k).cloned(), "node-a")
    }

    #[test]
    fn job_identity_follows_the_documented_order() {
        let all = [
            ("TORCHELASTIC_RUN_ID", "run-7"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "29500"),
            ("SLURM_JOB_ID", "42"),
            ("K8S_JOB_NAME", "train"),
        ];
        assert_eq!(id(&all).as_deref(), Some("run-7"));
        let mut with_override = all.to_vec();
        with_override.push(("TRACEML_JOB_ID", "mine"));
        assert_eq!(id(&with_override).as_deref(), Some("mine"));
        // torchrun's default run id is no identity.
        let mut none = all.to_vec();
        none[0] = ("TORCHELASTIC_RUN_ID", "none");
        assert_eq!(id(&none).as_deref(), Some("10.0.0.1:29500"));
        assert_eq!(id(&all[1..]).as_deref(), Some("10.0.0.1:29500"));
        // A loopback master is one machine's.
        assert_eq!(
            id(&[("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "1")]).as_deref(),
            Some("node-a/127.0.0.1:1")
        );
        assert_eq!(id(&all[3..]).as_deref(), Some("slurm-42"));
        assert_eq!(id(&all[4..]).as_deref(), Some("k8s-train"));
        assert_eq!(
            id(&[("K8S_JOB_NAME", "train"), ("POD_NAMESPACE", "ml")]).as_deref(),
            Some("k8s-ml/train")
        );
        assert_eq!(id(&[("MASTER_ADDR", "10.0.0.1")]), None);
        assert_eq!(id(&[]), None);
    }
}
