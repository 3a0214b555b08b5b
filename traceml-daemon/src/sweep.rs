//! Fleet regression sweeps: the jobs of a baseline and a candidate directory tree, paired by
//! their relative directory path, each pair run through [`crate::compare`], and one row per job
//! with an exit status for the whole sweep. Its text and JSON renderings are in
//! [`crate::render::sweep`].
//!
//! Finding and reading the summaries ([`find_jobs`], [`run`]) is the only I/O; pairing
//! ([`pair`]), the row of one pair ([`row`]) and the exit status ([`Sweep::exit_code`]) are pure.
//! Reading and parsing the JSON dominates (a summary with 1,000 step samples is ~60 KB), so the
//! pairs are read and compared on every core with scoped std threads (no pool dependency: the
//! work is a flat list of independent pairs). Rows come back in job order whatever the
//! scheduling.
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::compare::{self, Change, CompareVerdict, TimeDelta};
use crate::phase::Phase;
use crate::summary::{Summary, SummaryError};

/// The file that marks a job directory.
pub const SUMMARY_FILE: &str = "final_summary.json";
/// Bad files named in the error before "and N more".
const MAX_NAMED: usize = 10;

/// What happened to one job between the baseline and the candidate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum JobVerdict {
    Regression,
    Mixed,
    Inconclusive,
    /// The job is in one tree only.
    Unpaired,
    Improvement,
    Equivalent,
}

impl JobVerdict {
    pub fn as_str(self) -> &'static str {
        match self {
            JobVerdict::Regression => "REGRESSION",
            JobVerdict::Mixed => "MIXED",
            JobVerdict::Inconclusive => "INCONCLUSIVE",
            JobVerdict::Unpaired => "UNPAIRED",
            JobVerdict::Improvement => "IMPROVEMENT",
            JobVerdict::Equivalent => "EQUIVALENT",
        }
    }

    /// Every verdict, worst first (the order of the sweep's tally).
    pub const ALL: [JobVerdict; 6] = [
        JobVerdict::Regression,
        JobVerdict::Mixed,
        JobVerdict::Inconclusive,
        JobVerdict::Unpaired,
        JobVerdict::Improvement,
        JobVerdict::Equivalent,
    ];
}

impl From<CompareVerdict> for JobVerdict {
    fn from(v: CompareVerdict) -> Self {
        match v {
            CompareVerdict::Improvement => JobVerdict::Improvement,
            CompareVerdict::Regression => JobVerdict::Regression,
            CompareVerdict::Mixed => JobVerdict::Mixed,
            CompareVerdict::Equivalent => JobVerdict::Equivalent,
            CompareVerdict::Inconclusive => JobVerdict::Inconclusive,
        }
    }
}

/// Which tree holds an unpaired job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Side {
    Baseline,
    Candidate,
}

/// When the sweep exits 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailOn {
    /// Any job is a `REGRESSION`.
    Regression,
    /// Any job is neither `EQUIVALENT` nor `IMPROVEMENT` (unpaired jobs included).
    Any,
}

/// The phase whose median moved most (among those that passed compare's test and floor).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PhaseMove {
    pub phase: Phase,
    /// Candidate median − baseline median, ms.
    pub delta_ms: f64,
    pub change: Change,
}

/// What fixing the cause buys in one run: its first what-if (the verdict's cause, or the largest
/// gain), the phase and the throughput factor.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Headroom {
    pub phase: Phase,
    pub throughput_factor: f64,
}

impl Headroom {
    fn of(s: &Summary) -> Option<Headroom> {
        s.what_if.first().map(|w| Headroom {
            phase: w.phase,
            throughput_factor: w.throughput_factor,
        })
    }
}

/// One job of the sweep.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobRow {
    /// The job directory relative to each root (`/`-separated; `.` for the root itself).
    pub job: String,
    pub verdict: JobVerdict,
    /// Set for `UNPAIRED` jobs: the tree that has the job.
    pub only_in: Option<Side>,
    /// Compare's reason (empty for unpaired jobs).
    pub reason: String,
    /// The step-time change: medians, delta, p-value and whether it counts (`change`).
    pub step_ms: Option<TimeDelta>,
    /// `null` when no phase moved beyond noise.
    pub moved_most: Option<PhaseMove>,
    /// Primary diagnosis kind of each run (`INPUT_BOUND`, ...).
    pub baseline_diagnosis: Option<String>,
    pub candidate_diagnosis: Option<String>,
    /// What fixing the cause buys in each run (`null`: the run names no what-if, or the job is
    /// in one tree only): the bound moving between the runs.
    #[serde(default)]
    pub baseline_what_if: Option<Headroom>,
    #[serde(default)]
    pub candidate_what_if: Option<Headroom>,
}

/// A whole sweep: one row per job, in job order.
#[derive(Clone, Debug, PartialEq)]
pub struct Sweep {
    pub baseline: PathBuf,
    pub candidate: PathBuf,
    pub jobs: Vec<JobRow>,
}

impl Sweep {
    /// Jobs with this verdict.
    pub fn count(&self, v: JobVerdict) -> usize {
        self.jobs.iter().filter(|j| j.verdict == v).count()
    }

    /// 1 when a job fails the `fail_on` policy, else 0.
    pub fn exit_code(&self, fail_on: FailOn) -> u8 {
        u8::from(self.jobs.iter().any(|j| fails(j.verdict, fail_on)))
    }
}

/// Whether a job with this verdict fails the sweep.
pub fn fails(v: JobVerdict, fail_on: FailOn) -> bool {
    match fail_on {
        FailOn::Regression => v == JobVerdict::Regression,
        FailOn::Any => !matches!(v, JobVerdict::Equivalent | JobVerdict::Improvement),
    }
}

/// A file or directory the sweep could not use.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("cannot read {}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error("{}: {source}", path.display())]
    Summary { path: PathBuf, source: SummaryError },
}

/// Why a sweep could not run.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error("{} is not a directory", .0.display())]
    NotADirectory(PathBuf),
    #[error("no {SUMMARY_FILE} under {}", .0.display())]
    NoJobs(PathBuf),
    /// Every unreadable or malformed file (sorted by path).
    #[error("{}", list(.0))]
    Files(Vec<FileError>),
}

fn list(errors: &[FileError]) -> String {
    let mut lines: Vec<String> = errors
        .iter()
        .take(MAX_NAMED)
        .map(|e| e.to_string())
        .collect();
    if errors.len() > MAX_NAMED {
        lines.push(format!("and {} more", errors.len() - MAX_NAMED));
    }
    lines.join("\n")
}

/// The job directories under `root`: relative path → summary file. Walks every subdirectory
/// (not through symbolic links to directories, so a link loop cannot hang the sweep).
pub fn find_jobs(root: &Path) -> Result<BTreeMap<String, PathBuf>, SweepError> {
    if !root.is_dir() {
        return Err(SweepError::NotADirectory(root.to_owned()));
    }
    let mut jobs = BTreeMap::new();
    let mut errors = Vec::new();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(source) => {
                errors.push(FileError::Io { path: dir, source });
                continue;
            }
        };
        for entry in entries {
            let entry = match entry {
                Ok(e) => e,
                Err(source) => {
                    errors.push(FileError::Io {
                        path: dir.clone(),
                        source,
                    });
                    continue;
                }
            };
            let path = entry.path();
            match entry.file_type() {
                Ok(t) if t.is_dir() => stack.push(path),
                Ok(_) if entry.file_name() == SUMMARY_FILE => {
                    jobs.insert(job_name(root, &dir), path);
                }
                Ok(_) => {}
                Err(source) => errors.push(FileError::Io { path, source }),
            }
        }
    }
    if !errors.is_empty() {
        errors.sort_by(|a, b| file_of(a).cmp(file_of(b)));
        return Err(SweepError::Files(errors));
    }
    Ok(jobs)
}

fn file_of(e: &FileError) -> &Path {
    match e {
        FileError::Io { path, .. } | FileError::Summary { path, .. } => path,
    }
}

/// `a/b` for `root/a/b`, `.` for the root itself.
fn job_name(root: &Path, dir: &Path) -> String {
    let rel = dir.strip_prefix(root).unwrap_or(dir);
    let parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.is_empty() {
        ".".to_owned()
    } else {
        parts.join("/")
    }
}

/// One job and where it is in each tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pairing<P> {
    pub job: String,
    pub baseline: Option<P>,
    pub candidate: Option<P>,
}

/// Pairs the jobs of two trees by name, in job order.
pub fn pair<P: Clone>(
    baseline: &BTreeMap<String, P>,
    candidate: &BTreeMap<String, P>,
) -> Vec<Pairing<P>> {
    let mut names: Vec<&String> = baseline.keys().chain(candidate.keys()).collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .map(|job| Pairing {
            job: job.clone(),
            baseline: baseline.get(job).cloned(),
            candidate: candidate.get(job).cloned(),
        })
        .collect()
}

/// The row of a job present in both trees.
pub fn row(job: &str, baseline: &Summary, candidate: &Summary) -> JobRow {
    let c = compare::compare(baseline, candidate);
    let moved_most = c
        .phases
        .iter()
        .filter(|(_, d)| matches!(d.change, Change::Better | Change::Worse))
        .filter_map(|(p, d)| d.delta_ms.map(|x| (p, x, d.change)))
        .max_by(|x, y| x.1.abs().total_cmp(&y.1.abs()))
        .map(|(phase, delta_ms, change)| PhaseMove {
            phase,
            delta_ms,
            change,
        });
    JobRow {
        job: job.to_owned(),
        verdict: c.verdict.into(),
        only_in: None,
        reason: c.reason,
        step_ms: Some(c.step_ms),
        moved_most,
        baseline_diagnosis: Some(baseline.primary_diagnosis.kind.as_str().to_owned()),
        candidate_diagnosis: Some(candidate.primary_diagnosis.kind.as_str().to_owned()),
        baseline_what_if: Headroom::of(baseline),
        candidate_what_if: Headroom::of(candidate),
    }
}

/// The row of a job present in one tree only.
pub fn unpaired(job: &str, only_in: Side) -> JobRow {
    JobRow {
        job: job.to_owned(),
        verdict: JobVerdict::Unpaired,
        only_in: Some(only_in),
        reason: String::new(),
        step_ms: None,
        moved_most: None,
        baseline_diagnosis: None,
        candidate_diagnosis: None,
        baseline_what_if: None,
        candidate_what_if: None,
    }
}

/// Reads and parses one summary file.
fn load(path: &Path) -> Result<Summary, FileError> {
    let text = std::fs::read_to_string(path).map_err(|source| FileError::Io {
        path: path.to_owned(),
        source,
    })?;
    Summary::from_json(&text).map_err(|source| FileError::Summary {
        path: path.to_owned(),
        source,
    })
}

/// The row of one pairing, reading its files.
fn sweep_one(p: &Pairing<PathBuf>) -> Result<JobRow, Vec<FileError>> {
    match (&p.baseline, &p.candidate) {
        (Some(a), Some(b)) => match (load(a), load(b)) {
            (Ok(sa), Ok(sb)) => Ok(row(&p.job, &sa, &sb)),
            (a, b) => Err([a.err(), b.err()].into_iter().flatten().collect()),
        },
        // An unpaired summary is still read: a malformed file is bad input wherever it is.
        (Some(a), None) => load(a)
            .map(|_| unpaired(&p.job, Side::Baseline))
            .map_err(|e| vec![e]),
        (None, Some(b)) => load(b)
            .map(|_| unpaired(&p.job, Side::Candidate))
            .map_err(|e| vec![e]),
        (None, None) => Ok(unpaired(&p.job, Side::Baseline)),
    }
}

/// Runs the sweep on `threads` threads (at least 1): finds the jobs of both trees, reads and
/// compares each pair. Any unreadable or malformed summary fails the sweep, naming every such
/// file.
pub fn run(baseline: &Path, candidate: &Path, threads: usize) -> Result<Sweep, SweepError> {
    let (a, b) = (find_jobs(baseline)?, find_jobs(candidate)?);
    for (jobs, root) in [(&a, baseline), (&b, candidate)] {
        if jobs.is_empty() {
            return Err(SweepError::NoJobs(root.to_owned()));
        }
    }
    let pairs = pair(&a, &b);
    let threads = threads.clamp(1, pairs.len().max(1));
    let chunk = pairs.len().div_ceil(threads).max(1);
    let results: Vec<Result<JobRow, Vec<FileError>>> = std::thread::scope(|s| {
        let handles: Vec<_> = pairs
            .chunks(chunk)
            .map(|part| s.spawn(move || part.iter().map(sweep_one).collect::<Vec<_>>()))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("a sweep thread panicked"))
            .collect()
    });
    let mut jobs = Vec::with_capacity(results.len());
    let mut errors = Vec::new();
    for r in results {
        match r {
            Ok(row) => jobs.push(row),
            Err(e) => errors.extend(e),
        }
    }
    if !errors.is_empty() {
        errors.sort_by(|x, y| file_of(x).cmp(file_of(y)));
        return Err(SweepError::Files(errors));
    }
    Ok(Sweep {
        baseline: baseline.to_owned(),
        candidate: candidate.to_owned(),
        jobs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{self, Scenario};

    fn write(root: &Path, job: &str, s: &Summary) {
        let dir = if job == "." {
            root.to_owned()
        } else {
            root.join(job)
        };
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(SUMMARY_FILE), crate::render::to_json(s)).unwrap();
    }

    #[test]
    fn pairs_by_name_in_order() {
        let a: BTreeMap<String, u8> = [("x".into(), 1), ("a/b".into(), 2)].into();
        let b: BTreeMap<String, u8> = [("a/b".into(), 3), ("z".into(), 4)].into();
        let p = pair(&a, &b);
        let got: Vec<(&str, Option<u8>, Option<u8>)> = p
            .iter()
            .map(|p| (p.job.as_str(), p.baseline, p.candidate))
            .collect();
        assert_eq!(
            got,
            vec![
                ("a/b", Some(2), Some(3)),
                ("x", Some(1), None),
                ("z", None, Some(4))
            ]
        );
    }

    #[test]
    fn row_names_the_regression_its_phase_and_the_kind_change() {
        let fixed = testkit::summary(&testkit::input_fixed());
        let bound = testkit::summary(&testkit::input_bound());
        let r = row("job", &fixed, &bound);
        assert_eq!(r.verdict, JobVerdict::Regression, "{}", r.reason);
        let m = r.moved_most.unwrap();
        assert_eq!(m.phase, Phase::InputWait);
        assert_eq!(m.change, Change::Worse);
        assert!(m.delta_ms > 50.0, "{m:?}");
        assert_eq!(r.step_ms.unwrap().change, Change::Worse);
        assert_eq!(r.candidate_diagnosis.as_deref(), Some("INPUT_BOUND"));
        assert_ne!(r.baseline_diagnosis, r.candidate_diagnosis);
        // The bound moving: the regressed run has input wait to win back; each side is its
        // own run's first what-if.
        let h = r
            .candidate_what_if
            .as_ref()
            .expect("the input-bound run's what-if");
        assert_eq!(h.phase, Phase::InputWait);
        assert_eq!(h.throughput_factor, bound.what_if[0].throughput_factor);
        assert!(h.throughput_factor > 1.5, "{h:?}");
        assert_eq!(
            r.baseline_what_if.map(|h| h.throughput_factor),
            fixed.what_if.first().map(|w| w.throughput_factor)
        );
        // The same run twice: nothing moved.
        let same = row("job", &fixed, &fixed);
        assert_eq!(same.verdict, JobVerdict::Equivalent, "{}", same.reason);
        assert_eq!(same.moved_most, None);
    }

    #[test]
    fn exit_status_follows_the_policy() {
        let mk = |v: JobVerdict| Sweep {
            baseline: PathBuf::new(),
            candidate: PathBuf::new(),
            jobs: vec![
                JobRow {
                    verdict: v,
                    ..unpaired("a", Side::Baseline)
                },
                JobRow {
                    verdict: JobVerdict::Equivalent,
                    ..unpaired("b", Side::Baseline)
                },
            ],
        };
        for v in JobVerdict::ALL {
            let s = mk(v);
            assert_eq!(
                s.exit_code(FailOn::Regression),
                u8::from(v == JobVerdict::Regression),
                "{v:?}"
            );
            let ok = matches!(v, JobVerdict::Equivalent | JobVerdict::Improvement);
            assert_eq!(s.exit_code(FailOn::Any), u8::from(!ok), "{v:?}");
        }
    }

    #[test]
    fn sweeps_two_trees() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        let fixed = testkit::summary(&testkit::input_fixed());
        let bound = testkit::summary(&testkit::input_bound());
        let other = testkit::summary(&Scenario {
            seed: 11,
            ..Scenario::default()
        });
        write(&a, "team/resnet", &fixed);
        write(&b, "team/resnet", &bound);
        write(&a, "team/bert/rank0", &other);
        write(&b, "team/bert/rank0", &other);
        write(&a, "old", &other);
        write(&b, "new", &other);
        for threads in [1, 3, 64] {
            let s = run(&a, &b, threads).unwrap();
            let got: Vec<(&str, JobVerdict)> =
                s.jobs.iter().map(|j| (j.job.as_str(), j.verdict)).collect();
            assert_eq!(
                got,
                vec![
                    ("new", JobVerdict::Unpaired),
                    ("old", JobVerdict::Unpaired),
                    ("team/bert/rank0", JobVerdict::Equivalent),
                    ("team/resnet", JobVerdict::Regression),
                ]
            );
            assert_eq!(s.jobs[0].only_in, Some(Side::Candidate));
            assert_eq!(s.jobs[1].only_in, Some(Side::Baseline));
            assert_eq!(s.exit_code(FailOn::Regression), 1);
            assert_eq!(s.count(JobVerdict::Unpaired), 2);
        }
        // A summary at the root is the job ".".
        let c = dir.path().join("c");
        write(&c, ".", &other);
        let s = run(&c, &c, 2).unwrap();
        assert_eq!(s.jobs[0].job, ".");
        assert_eq!(s.exit_code(FailOn::Any), 0);
    }

    #[test]
    fn bad_input_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        let s = testkit::summary(&Scenario::default());
        write(&a, "j1", &s);
        write(&b, "j1", &s);
        write(&a, "j2", &s);
        std::fs::create_dir_all(b.join("j2")).unwrap();
        std::fs::write(b.join("j2").join(SUMMARY_FILE), "{\"schema_version\": 1,").unwrap();
        let e = run(&a, &b, 2).unwrap_err().to_string();
        assert!(e.contains(&format!("j2/{SUMMARY_FILE}")), "{e}");
        assert!(e.contains("truncated"), "{e}");
        // (a path component: the temporary directory's random name may hold "j1")
        assert!(!e.contains("/j1/"), "{e}");

        let e = run(&a, &dir.path().join("missing"), 2).unwrap_err();
        assert!(matches!(e, SweepError::NotADirectory(_)), "{e}");
        let empty = dir.path().join("empty");
        std::fs::create_dir_all(&empty).unwrap();
        let e = run(&a, &empty, 2).unwrap_err().to_string();
        assert!(e.starts_with("no final_summary.json under"), "{e}");
    }
}
