//! Whom `serve` attaches to: the node's training processes (Python processes that map libtorch,
//! not launchers, not DataLoader workers), filtered by the operator's policy and by each
//! target's own opt-out. Pure: a [`ProcInfo`] in, a [`Decision`] out; `serve` reads /proc.
//!
//! Defaults: every user's training processes are candidates; a target opts out with
//! `TRACEML_DISABLE=1` in its environment; launchers (`torchrun`, `torch.distributed.run`,
//! `accelerate launch`, `deepspeed`) and multiprocessing workers are never targets themselves.
//! `--include`/`--exclude` (and the config file's `include`/`exclude`) are globs on the command
//! line joined by spaces; `include_users`/`exclude_users` take user names or numeric uids;
//! `include_cgroups`/`exclude_cgroups` are globs on the cgroup path (a systemd slice, a container,
//! a Kubernetes pod). An empty include list includes everything; an exclude always wins.
use globset::{Glob, GlobSet, GlobSetBuilder};
use serde::Deserialize;

/// What the policy needs to know about a process.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcInfo {
    pub pid: u32,
    pub ppid: u32,
    pub uid: u32,
    /// The user's name when the passwd database has it.
    pub user: Option<String>,
    pub cmdline: Vec<String>,
    /// The executable's file name (`python3.11`).
    pub exe_name: String,
    /// A libpython or a python executable is mapped.
    pub python: bool,
    /// libtorch (CPU or CUDA, or the test look-alike) is mapped.
    pub torch: bool,
    /// `TRACEML_DISABLE` from the environment.
    pub disable_env: Option<String>,
    /// The unified (v2) cgroup path, or the v1 path of the first hierarchy.
    pub cgroup: String,
}

/// The policy's answer for one process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Attach,
    /// Not a training process (yet): not Python, or torch not loaded.
    NotTraining,
    /// A launcher of ranks; the ranks are attached on their own.
    Launcher,
    /// A DataLoader or multiprocessing worker of a training process.
    Worker,
    /// `TRACEML_DISABLE=1`.
    OptedOut,
    /// The operator's policy excludes it; why.
    Excluded(String),
}

/// The policy's settings (the config file's keys; the CLI's flags add to them).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyConfig {
    pub include: Vec<String>,
    pub exclude: Vec<String>,
    pub include_users: Vec<String>,
    pub exclude_users: Vec<String>,
    pub include_cgroups: Vec<String>,
    pub exclude_cgroups: Vec<String>,
}

/// A compiled [`PolicyConfig`].
#[derive(Clone, Debug)]
pub struct Policy {
    cfg: PolicyConfig,
    include: Option<GlobSet>,
    exclude: GlobSet,
    include_cgroups: Option<GlobSet>,
    exclude_cgroups: GlobSet,
}

fn globs(patterns: &[String]) -> Result<GlobSet, String> {
    let mut b = GlobSetBuilder::new();
    for p in patterns {
        b.add(Glob::new(p).map_err(|e| format!("bad pattern {p:?}: {e}"))?);
    }
    b.build().map_err(|e| e.to_string())
}

/// Launcher command lines: they start ranks and train nothing themselves.
pub fn is_launcher(cmdline: &[String]) -> bool {
    let words: Vec<&str> = cmdline.iter().map(String::as_str).collect();
    let base = |w: &str| w.rsplit('/').next().unwrap_or(w).to_owned();
    words.iter().take(3).any(|w| {
        let b = base(w);
        b == "torchrun" || b == "deepspeed" || b == "accelerate"
    }) || words.windows(2).any(|w| {
        w[0] == "-m"
            && matches!(
                w[1],
                "torch.distributed.run"
                    | "torch.distributed.launch"
                    | "accelerate.commands.launch"
                    | "deepspeed.launcher.runner"
            )
    })
}

/// Worker command lines of `multiprocessing` (spawn/forkserver start methods).
fn is_mp_worker(cmdline: &[String]) -> bool {
    cmdline.iter().any(|w| {
        w.contains("multiprocessing.spawn")
            || w.contains("multiprocessing.forkserver")
            || w == "--multiprocessing-fork"
    })
}

impl Policy {
    pub fn new(cfg: PolicyConfig) -> Result<Policy, String> {
        Ok(Policy {
            include: (!cfg.include.is_empty())
                .then(|| globs(&cfg.include))
                .transpose()?,
            exclude: globs(&cfg.exclude)?,
            include_cgroups: (!cfg.include_cgroups.is_empty())
                .then(|| globs(&cfg.include_cgroups))
                .transpose()?,
            exclude_cgroups: globs(&cfg.exclude_cgroups)?,
            cfg,
        })
    }

    pub fn config(&self) -> &PolicyConfig {
        &self.cfg
    }

    /// Decides for `p`; `parent` is its parent when that is a Python process mapping torch (a
    /// forked DataLoader worker has the same command line as its training process).
    pub fn decide(&self, p: &ProcInfo, parent: Option<&ProcInfo>) -> Decision {
        if !(p.python && p.torch) {
            return Decision::NotTraining;
        }
        if is_launcher(&p.cmdline) {
            return Decision::Launcher;
        }
        if is_mp_worker(&p.cmdline)
            || parent.is_some_and(|q| q.python && q.torch && q.cmdline == p.cmdline)
        {
            return Decision::Worker;
        }
        if p.disable_env
            .as_deref()
            .is_some_and(|v| !v.is_empty() && v != "0")
        {
            return Decision::OptedOut;
        }
        let line = p.cmdline.join(" ");
        if self.exclude.is_match(&line) {
            return Decision::Excluded("its command line matches --exclude".into());
        }
        if self.include.as_ref().is_some_and(|g| !g.is_match(&line)) {
            return Decision::Excluded("its command line matches no --include".into());
        }
        let user_is =
            |u: &String| u == &p.uid.to_string() || p.user.as_deref().is_some_and(|name| name == u);
        if self.cfg.exclude_users.iter().any(user_is) {
            return Decision::Excluded(format!("user {} is excluded", p.uid));
        }
        if !self.cfg.include_users.is_empty() && !self.cfg.include_users.iter().any(user_is) {
            return Decision::Excluded(format!("user {} is not included", p.uid));
        }
        if self.exclude_cgroups.is_match(&p.cgroup) {
            return Decision::Excluded(format!("cgroup {} is excluded", p.cgroup));
        }
        if self
            .include_cgroups
            .as_ref()
            .is_some_and(|g| !g.is_match(&p.cgroup))
        {
            return Decision::Excluded(format!("cgroup {} is not included", p.cgroup));
        }
        Decision::Attach
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn train(cmd: &str) -> ProcInfo {
        ProcInfo {
            pid: 10,
            ppid: 1,
            uid: 1000,
            user: Some("alice".into()),
            cmdline: cmd.split(' ').map(String::from).collect(),
            exe_name: "python3.11".into(),
            python: true,
            torch: true,
            disable_env: None,
            cgroup: "/user.slice/user-1000.slice/session-1.scope".into(),
        }
    }

    fn policy(cfg: PolicyConfig) -> Policy {
        Policy::new(cfg).unwrap()
    }

    #[test]
    fn defaults() {
        let p = policy(PolicyConfig::default());
        assert_eq!(p.decide(&train("python train.py"), None), Decision::Attach);
        let mut no_torch = train("python train.py");
        no_torch.torch = false;
        assert_eq!(p.decide(&no_torch, None), Decision::NotTraining);
        for launcher in [
            "/usr/bin/python3 /venv/bin/torchrun --nproc_per_node=2 train.py",
            "torchrun --nproc_per_node=2 train.py",
            "python -m torch.distributed.run --nproc_per_node 2 train.py",
            "/venv/bin/python /venv/bin/accelerate launch train.py",
        ] {
            assert_eq!(
                p.decide(&train(launcher), None),
                Decision::Launcher,
                "{launcher}"
            );
        }
        let parent = train("python train.py");
        let mut worker = train("python train.py");
        worker.ppid = parent.pid;
        assert_eq!(p.decide(&worker, Some(&parent)), Decision::Worker);
        let spawned = train("python -c from multiprocessing.spawn import spawn_main; spawn_main()");
        assert_eq!(p.decide(&spawned, None), Decision::Worker);
        // A rank started by a launcher has its own command line: a target.
        let launcher = train("python -m torch.distributed.run train.py");
        assert_eq!(
            p.decide(&train("python -u train.py"), Some(&launcher)),
            Decision::Attach
        );
    }

    #[test]
    fn opt_out() {
        let p = policy(PolicyConfig::default());
        for (v, want) in [
            ("1", Decision::OptedOut),
            ("yes", Decision::OptedOut),
            ("0", Decision::Attach),
            ("", Decision::Attach),
        ] {
            let mut t = train("python train.py");
            t.disable_env = Some(v.into());
            assert_eq!(p.decide(&t, None), want, "TRACEML_DISABLE={v:?}");
        }
    }

    #[test]
    fn include_exclude_users_cgroups() {
        let p = policy(PolicyConfig {
            include: vec!["*train*".into()],
            exclude: vec!["*debug*".into()],
            exclude_users: vec!["bob".into(), "0".into()],
            include_cgroups: vec!["/user.slice/**".into(), "/kubepods.slice/**".into()],
            ..PolicyConfig::default()
        });
        assert_eq!(p.decide(&train("python train.py"), None), Decision::Attach);
        assert!(matches!(
            p.decide(&train("python serve.py"), None),
            Decision::Excluded(_)
        ));
        assert!(matches!(
            p.decide(&train("python train.py --debug"), None),
            Decision::Excluded(_)
        ));
        let mut bob = train("python train.py");
        bob.user = Some("bob".into());
        assert!(matches!(p.decide(&bob, None), Decision::Excluded(_)));
        let mut root = train("python train.py");
        root.uid = 0;
        root.user = None;
        assert!(matches!(p.decide(&root, None), Decision::Excluded(_)));
        let mut docker = train("python train.py");
        docker.cgroup = "/system.slice/docker-0123abcd.scope".into();
        assert!(matches!(p.decide(&docker, None), Decision::Excluded(_)));
        let mut pod = train("python train.py");
        pod.cgroup = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/cri-containerd-ab.scope".into();
        assert_eq!(p.decide(&pod, None), Decision::Attach);
    }

    #[test]
    fn bad_patterns_are_errors_and_config_keys_are_checked() {
        assert!(
            Policy::new(PolicyConfig {
                include: vec!["[".into()],
                ..PolicyConfig::default()
            })
            .is_err()
        );
        let cfg: PolicyConfig =
            toml::from_str("include = [\"*train*\"]\nexclude_users = [\"bob\"]").unwrap();
        assert_eq!(cfg.include, ["*train*"]);
        assert!(toml::from_str::<PolicyConfig>("inclde = []").is_err());
    }
}
