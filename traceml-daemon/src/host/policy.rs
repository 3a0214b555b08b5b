//! Whom `serve` attaches to: the node's training processes (Python processes that map libtorch,
//! not launchers, not DataLoader workers), filtered by the operator's policy and by each
//! target's own opt-out. Pure: a [`ProcFacts`] in, a [`AttachDecision`] out; `serve` reads /proc.
//!
//! Defaults: every user's training processes are candidates; a target opts out with
//! `TRACEML_DISABLE=1` in its environment; launchers (`torchrun`, `torch.distributed.run`,
//! `accelerate launch`, `deepspeed`) and multiprocessing workers are never targets themselves.
//! `--include`/`--exclude` (and the config file's `include`/`exclude`) are globs on the command
//! line joined by spaces; `include_users`/`exclude_users` take user names or numeric uids;
//! `include_cgroups`/`exclude_cgroups` are globs on the cgroup path (a systemd slice, a container,
//! a Kubernetes pod). An empty include list includes everything; an exclude always wins.
//!
//! User names are resolved to uids by the system's name service when the policy is compiled
//! (serve passes [`crate::host::users::uid_of`]) and matched against a process's uid or its name (also
//! from the name service). An excluded name the name service does not know cannot be told apart
//! from the process's user when that user has no name either: such a process is excluded (an
//! exclude always wins, also when the directory is down).
use super::procinfo;
use globset::{Glob, GlobSet, GlobSetBuilder};
use serde::Deserialize;

/// What the policy needs to know about a process.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcFacts {
    pub pid: u32,
    pub ppid: u32,
    pub uid: u32,
    /// The user's name when the system's name service has it.
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
pub enum AttachDecision {
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

/// A user of `include_users`/`exclude_users`: a numeric uid, or a name and the uid the name
/// service gave it when the policy was compiled.
#[derive(Clone, Debug, PartialEq, Eq)]
enum UserRef {
    Uid(u32),
    Name { name: String, uid: Option<u32> },
}

impl UserRef {
    fn new(s: &str, resolve: &dyn Fn(&str) -> Option<u32>) -> UserRef {
        match s.parse() {
            Ok(uid) => UserRef::Uid(uid),
            Err(_) => UserRef::Name {
                name: s.to_owned(),
                uid: resolve(s),
            },
        }
    }

    fn matches(&self, p: &ProcFacts) -> bool {
        match self {
            UserRef::Uid(u) => *u == p.uid,
            UserRef::Name { name, uid } => {
                *uid == Some(p.uid) || p.user.as_deref() == Some(name.as_str())
            }
        }
    }

    /// A name the name service did not know.
    fn unknown(&self) -> Option<&str> {
        match self {
            UserRef::Name { name, uid: None } => Some(name),
            _ => None,
        }
    }
}

/// A compiled [`PolicyConfig`].
#[derive(Clone, Debug)]
pub struct Policy {
    cfg: PolicyConfig,
    include_users: Vec<UserRef>,
    exclude_users: Vec<UserRef>,
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

impl Policy {
    /// Compiles `cfg`; `resolve` gives the uid of a user name (the name service, or a table in
    /// tests).
    pub fn new(cfg: PolicyConfig, resolve: &dyn Fn(&str) -> Option<u32>) -> Result<Policy, String> {
        let users = |v: &[String]| v.iter().map(|u| UserRef::new(u, resolve)).collect();
        Ok(Policy {
            include_users: users(&cfg.include_users),
            exclude_users: users(&cfg.exclude_users),
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

    /// User names of `include_users`/`exclude_users` the name service did not know when the
    /// policy was compiled (worth a warning: a typo, or a directory that did not answer).
    pub fn unknown_users(&self) -> Vec<&str> {
        self.include_users
            .iter()
            .chain(&self.exclude_users)
            .filter_map(UserRef::unknown)
            .collect()
    }

    /// Decides for `p`; `parent` is its parent when that is a Python process mapping torch (a
    /// forked DataLoader worker has the same command line as its training process).
    pub fn decide(&self, p: &ProcFacts, parent: Option<&ProcFacts>) -> AttachDecision {
        if !(p.python && p.torch) {
            return AttachDecision::NotTraining;
        }
        if is_launcher(&p.cmdline) {
            return AttachDecision::Launcher;
        }
        if procinfo::is_mp_worker(&p.cmdline)
            || parent.is_some_and(|q| q.python && q.torch && q.cmdline == p.cmdline)
        {
            return AttachDecision::Worker;
        }
        if p.disable_env
            .as_deref()
            .is_some_and(|v| !v.is_empty() && v != "0")
        {
            return AttachDecision::OptedOut;
        }
        let line = p.cmdline.join(" ");
        if self.exclude.is_match(&line) {
            return AttachDecision::Excluded("its command line matches --exclude".into());
        }
        if self.include.as_ref().is_some_and(|g| !g.is_match(&line)) {
            return AttachDecision::Excluded("its command line matches no --include".into());
        }
        let who = || match &p.user {
            Some(name) => format!("user {} ({name})", p.uid),
            None => format!("user {}", p.uid),
        };
        if self.exclude_users.iter().any(|u| u.matches(p)) {
            return AttachDecision::Excluded(format!("{} is excluded", who()));
        }
        if p.user.is_none()
            && let Some(name) = self.exclude_users.iter().find_map(UserRef::unknown)
        {
            return AttachDecision::Excluded(format!(
                "{} has no name the name service knows, and exclude_users names {name:?}, \
                 which it does not know either: excluded rather than risk that user's job",
                who()
            ));
        }
        if !self.include_users.is_empty() && !self.include_users.iter().any(|u| u.matches(p)) {
            return AttachDecision::Excluded(format!("{} is not included", who()));
        }
        if self.exclude_cgroups.is_match(&p.cgroup) {
            return AttachDecision::Excluded(format!("cgroup {} is excluded", p.cgroup));
        }
        if self
            .include_cgroups
            .as_ref()
            .is_some_and(|g| !g.is_match(&p.cgroup))
        {
            return AttachDecision::Excluded(format!("cgroup {} is not included", p.cgroup));
        }
        AttachDecision::Attach
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn train(cmd: &str) -> ProcFacts {
        ProcFacts {
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

    /// The test's name service: bob is uid 1001, carol 1002; nobody else has a name.
    fn resolve(name: &str) -> Option<u32> {
        match name {
            "bob" => Some(1001),
            "carol" => Some(1002),
            _ => None,
        }
    }

    fn policy(cfg: PolicyConfig) -> Policy {
        Policy::new(cfg, &resolve).unwrap()
    }

    #[test]
    fn defaults() {
        let p = policy(PolicyConfig::default());
        assert_eq!(
            p.decide(&train("python train.py"), None),
            AttachDecision::Attach
        );
        let mut no_torch = train("python train.py");
        no_torch.torch = false;
        assert_eq!(p.decide(&no_torch, None), AttachDecision::NotTraining);
        for launcher in [
            "/usr/bin/python3 /venv/bin/torchrun --nproc_per_node=2 train.py",
            "torchrun --nproc_per_node=2 train.py",
            "python -m torch.distributed.run --nproc_per_node 2 train.py",
            "/venv/bin/python /venv/bin/accelerate launch train.py",
        ] {
            assert_eq!(
                p.decide(&train(launcher), None),
                AttachDecision::Launcher,
                "{launcher}"
            );
        }
        let parent = train("python train.py");
        let mut worker = train("python train.py");
        worker.ppid = parent.pid;
        assert_eq!(p.decide(&worker, Some(&parent)), AttachDecision::Worker);
        let spawned = train("python -c from multiprocessing.spawn import spawn_main; spawn_main()");
        assert_eq!(p.decide(&spawned, None), AttachDecision::Worker);
        // A rank started by a launcher has its own command line: a target.
        let launcher = train("python -m torch.distributed.run train.py");
        assert_eq!(
            p.decide(&train("python -u train.py"), Some(&launcher)),
            AttachDecision::Attach
        );
    }

    #[test]
    fn opt_out() {
        let p = policy(PolicyConfig::default());
        for (v, want) in [
            ("1", AttachDecision::OptedOut),
            ("yes", AttachDecision::OptedOut),
            ("0", AttachDecision::Attach),
            ("", AttachDecision::Attach),
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
        assert_eq!(
            p.decide(&train("python train.py"), None),
            AttachDecision::Attach
        );
        assert!(matches!(
            p.decide(&train("python serve.py"), None),
            AttachDecision::Excluded(_)
        ));
        assert!(matches!(
            p.decide(&train("python train.py --debug"), None),
            AttachDecision::Excluded(_)
        ));
        let mut bob = train("python train.py");
        bob.user = Some("bob".into());
        assert!(matches!(p.decide(&bob, None), AttachDecision::Excluded(_)));
        let mut root = train("python train.py");
        root.uid = 0;
        root.user = None;
        assert!(matches!(p.decide(&root, None), AttachDecision::Excluded(_)));
        // bob's process seen without a name (its name could not be looked up when it was
        // found): matched by the uid his name resolved to.
        let mut bob_by_uid = train("python train.py");
        bob_by_uid.uid = 1001;
        bob_by_uid.user = None;
        assert!(matches!(
            p.decide(&bob_by_uid, None),
            AttachDecision::Excluded(_)
        ));
        assert!(p.unknown_users().is_empty());
        let mut docker = train("python train.py");
        docker.cgroup = "/system.slice/docker-0123abcd.scope".into();
        assert!(matches!(
            p.decide(&docker, None),
            AttachDecision::Excluded(_)
        ));
        let mut pod = train("python train.py");
        pod.cgroup = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/cri-containerd-ab.scope".into();
        assert_eq!(p.decide(&pod, None), AttachDecision::Attach);
    }

    /// An excluded name nobody knows: a process whose user has no name either may be that
    /// user's, and is excluded; a named user's process is not. Includes by name and uid.
    #[test]
    fn unknown_user_names_fail_closed_for_nameless_users() {
        let p = policy(PolicyConfig {
            exclude_users: vec!["dave".into()],
            ..PolicyConfig::default()
        });
        assert_eq!(p.unknown_users(), ["dave"]);
        assert_eq!(
            p.decide(&train("python train.py"), None),
            AttachDecision::Attach
        );
        let mut nameless = train("python train.py");
        nameless.uid = 4242;
        nameless.user = None;
        match p.decide(&nameless, None) {
            AttachDecision::Excluded(why) => assert!(why.contains("\"dave\""), "{why}"),
            d => panic!("{d:?}"),
        }
        let only = policy(PolicyConfig {
            include_users: vec!["carol".into(), "1000".into()],
            ..PolicyConfig::default()
        });
        assert_eq!(
            only.decide(&train("python train.py"), None),
            AttachDecision::Attach
        );
        let mut carol = train("python train.py");
        carol.uid = 1002;
        carol.user = None;
        assert_eq!(only.decide(&carol, None), AttachDecision::Attach);
        let mut bob = train("python train.py");
        bob.uid = 1001;
        bob.user = Some("bob".into());
        match only.decide(&bob, None) {
            AttachDecision::Excluded(why) => assert_eq!(why, "user 1001 (bob) is not included"),
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn bad_patterns_are_errors_and_config_keys_are_checked() {
        assert!(
            Policy::new(
                PolicyConfig {
                    include: vec!["[".into()],
                    ..PolicyConfig::default()
                },
                &resolve
            )
            .is_err()
        );
        let cfg: PolicyConfig =
            toml::from_str("include = [\"*train*\"]\nexclude_users = [\"bob\"]").unwrap();
        assert_eq!(cfg.include, ["*train*"]);
        assert!(toml::from_str::<PolicyConfig>("inclde = []").is_err());
    }
}
