//! Which processes make one training job on this node: from any pid of the job (the launcher —
//! `torchrun`/`torch.distributed.run`, `accelerate launch`, `deepspeed`, an `mpirun`-style
//! parent — or any rank), the ranks found through the process tree and each rank's environment
//! (`RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `MASTER_ADDR`/`MASTER_PORT`, `TORCHELASTIC_RUN_ID`).
//! DataLoader workers inherit their rank's environment; they are children of a rank with its
//! command line and stay workers. A process with no rank in its environment is a job of one.
use std::collections::HashMap;

use crate::serve::proc_info;

/// One rank process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankProc {
    pub pid: u32,
    pub rank: u32,
    pub local_rank: Option<u32>,
    pub world_size: Option<u32>,
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
    let env = crate::procinfo::environ(pid)?;
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
        ]
        .into_iter()
        .filter_map(|k| Some((k.to_owned(), get(k)?)))
        .collect(),
    )
}

/// `pid` as a rank: `None` when its environment has no `RANK` (a job of one).
pub fn rank_of(pid: u32) -> Option<RankProc> {
    let env = rank_env(pid)?;
    let num = |k: &str| env.get(k).and_then(|v| v.parse().ok());
    Some(RankProc {
        pid,
        rank: num("RANK")?,
        local_rank: num("LOCAL_RANK"),
        world_size: num("WORLD_SIZE"),
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
            for c in crate::procinfo::children(p) {
                match rank_env(c) {
                    Some(env) if proc_info(c).is_some_and(|i| i.python) => {
                        let num = |k: &str| env.get(k).and_then(|v| v.parse().ok());
                        if let Some(rank) = num("RANK") {
                            out.push((
                                RankProc {
                                    pid: c,
                                    rank,
                                    local_rank: num("LOCAL_RANK"),
                                    world_size: num("WORLD_SIZE"),
                                },
                                env,
                            ));
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
        proc_info(p).is_some_and(|i| crate::policy::is_launcher(&i.cmdline))
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
    JobSpec {
        launcher,
        run_id: env.get("TORCHELASTIC_RUN_ID").cloned(),
        master: env
            .get("MASTER_ADDR")
            .zip(env.get("MASTER_PORT"))
            .map(|(a, p)| format!("{a}:{p}")),
        ranks: ranks.into_iter().map(|(r, _)| r).collect(),
    }
}
