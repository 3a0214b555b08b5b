//! The input pipeline's own profile: the DataLoader workers' folded stack samples
//! ([`WorkerFold`]) turned into the summary's [`WorkerProfile`]: how often a worker was making a
//! batch, in which scheduler state, in which functions, and the workers' CPU time per batch.
//! Pure.
use std::collections::HashMap;

use crate::engine::WorkerFold;
use crate::event::{FuncInfo, ProcState};
use crate::profile::{Handover, ranked};
use crate::summary::{PipelineBound, PipelineSplit, ReadShare, WorkerProfile};

/// Fewer worker samples than this make no profile (about half a second of one worker).
pub const MIN_SAMPLES: u64 = 5;

/// The hand-over is what limits the pipeline when it holds at least this share of the training
/// thread's input wait.
pub const IPC_BOUND: f64 = 0.5;
/// Fewer input-wait samples than this give no hand-over share.
pub const MIN_HANDOVER_SAMPLES: u64 = 5;
/// Files listed in `reads_from`.
pub const TOP_READS: usize = 3;

/// The profile of `w` (`funcs`: the stream's function names); `worker_cpu_s`: the workers' CPU
/// seconds over the run, `batches`: the batches the training thread fetched over it; `handover`:
/// the training thread's input-wait samples ([`crate::profile::handover`]).
pub fn worker_profile(
    w: &WorkerFold,
    funcs: &HashMap<u32, FuncInfo>,
    worker_cpu_s: Option<f64>,
    batches: Option<u64>,
    handover: &Handover,
) -> Option<WorkerProfile> {
    if w.samples < MIN_SAMPLES {
        return None;
    }
    let busy_n = w.count(|_, busy| busy);
    let of_busy = |st: ProcState| w.count(|s, busy| busy && s == st);
    let share = |n: u64| {
        if busy_n == 0 {
            0.0
        } else {
            n as f64 / busy_n as f64
        }
    };
    let (on_cpu, blocked, io) = (
        share(of_busy(ProcState::Running)),
        share(of_busy(ProcState::Sleeping)),
        share(of_busy(ProcState::DiskSleep)),
    );
    let ipc = (handover.samples >= MIN_HANDOVER_SAMPLES)
        .then(|| handover.handover as f64 / handover.samples as f64);
    let bound = if ipc.is_some_and(|i| i >= IPC_BOUND) {
        PipelineBound::Ipc
    } else if io >= on_cpu && io >= blocked {
        PipelineBound::Io
    } else if blocked > on_cpu {
        PipelineBound::Wait
    } else {
        PipelineBound::Cpu
    };
    let asleep = |s: ProcState| matches!(s, ProcState::Sleeping | ProcState::DiskSleep);
    let cpu_n = of_busy(ProcState::Running);
    let blocked_n = w.count(|s, busy| busy && asleep(s));
    let batch_cpu_ms = match (worker_cpu_s, batches) {
        (Some(cpu), Some(b)) if b > 0 && cpu.is_finite() && cpu >= 0.0 => {
            Some(cpu * 1e3 / b as f64)
        }
        _ => None,
    };
    let reads_from = reads_from(w, blocked_n);
    Some(WorkerProfile {
        samples: w.samples,
        workers_sampled: u32::try_from(w.pids.len()).unwrap_or(u32::MAX),
        busy: busy_n as f64 / w.samples as f64,
        on_cpu,
        blocked,
        io,
        bound,
        top_functions: if busy_n > 0 {
            ranked(&w.leaves(|_, busy| busy), busy_n, funcs)
        } else {
            Vec::new()
        },
        cpu_in: if cpu_n > 0 {
            ranked(
                &w.leaves(|s, busy| busy && s == ProcState::Running),
                cpu_n,
                funcs,
            )
        } else {
            Vec::new()
        },
        blocked_in: if blocked_n > 0 {
            ranked(&w.leaves(|s, busy| busy && asleep(s)), blocked_n, funcs)
        } else {
            Vec::new()
        },
        batch_cpu_ms,
        ipc,
        ipc_in: if ipc.is_some() {
            handover.functions.clone()
        } else {
            Vec::new()
        },
        split: ipc.map(|i| split(i, on_cpu, blocked, io)),
        reads_from,
    })
}

/// The files (or sockets, pipes) the busy workers were blocked reading, the most first, each
/// with its share of the `blocked_n` blocked samples.
fn reads_from(w: &WorkerFold, blocked_n: u64) -> Vec<ReadShare> {
    let mut reads: Vec<(&crate::event::ReadSite, u64)> =
        w.reads.iter().map(|(r, &n)| (r, n)).collect();
    reads.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    reads
        .into_iter()
        .take(TOP_READS)
        .filter(|_| blocked_n > 0)
        .map(|(site, n)| ReadShare {
            site: site.clone(),
            share: n as f64 / blocked_n as f64,
            samples: n,
        })
        .collect()
}

/// The input wait split: `ipc` the hand-over; the rest of the wait is for a worker to finish,
/// shared as the busy workers' states (all of it `blocked` when no busy sample says otherwise).
fn split(ipc: f64, on_cpu: f64, blocked: f64, io: f64) -> PipelineSplit {
    let rest = 1.0 - ipc;
    let states = on_cpu + blocked + io;
    let of = |x: f64| if states > 0.0 { rest * x / states } else { 0.0 };
    PipelineSplit {
        cpu: of(on_cpu),
        blocked: if states > 0.0 { of(blocked) } else { rest },
        io: of(io),
        ipc,
    }
}

/// Workers needed so that loading keeps pace with the step: one batch takes `batch_cpu_ms` of
/// one core, the training thread's own step without its input wait is `compute_ms`: at least
/// `ceil(batch / compute)`; one more for headroom.
pub fn workers_needed(batch_cpu_ms: f64, compute_ms: f64) -> Option<(u32, u32)> {
    if !(batch_cpu_ms > 0.0 && compute_ms > 0.0) {
        return None;
    }
    let n = (batch_cpu_ms / compute_ms).ceil().max(1.0);
    let n = n.min(1024.0) as u32;
    Some((n, n + 1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::WorkerStackSample;

    fn funcs() -> HashMap<u32, FuncInfo> {
        [
            (1, "/x/torch/utils/data/_utils/worker.py", "_worker_loop"),
            (
                2,
                "/x/torch/utils/data/_utils/fetch.py",
                "_MapDatasetFetcher.fetch",
            ),
            (3, "/job/dataset.py", "Slow.__getitem__"),
            (4, "/job/dataset.py", "decode"),
            (
                5,
                "/usr/lib/python3.11/multiprocessing/queues.py",
                "Queue.get",
            ),
        ]
        .into_iter()
        .map(|(id, file, function)| {
            (
                id,
                FuncInfo {
                    id,
                    function: function.into(),
                    file: file.into(),
                    line: 1,
                },
            )
        })
        .collect()
    }

    fn fold(samples: &[(ProcState, &[u32], u64)]) -> WorkerFold {
        let mut w = WorkerFold::default();
        for f in funcs().values() {
            w.func(f);
        }
        for (k, &(state, frames, n)) in samples.iter().enumerate() {
            for _ in 0..n {
                w.push(&WorkerStackSample {
                    ts: 0,
                    pid: 100 + (k as u32 % 2),
                    state,
                    frames: frames.to_vec(),
                    reading: None,
                });
            }
        }
        w
    }

    #[test]
    fn sleeping_workers_are_wait_bound_in_their_function() {
        let w = fold(&[
            (ProcState::Sleeping, &[1, 2, 3], 90),
            (ProcState::Running, &[1, 2, 3], 10),
            (ProcState::Sleeping, &[1, 5], 20),
        ]);
        let p = worker_profile(&w, &funcs(), Some(1.2), Some(60), &Handover::default()).unwrap();
        assert_eq!(p.samples, 120);
        assert_eq!(p.workers_sampled, 2);
        assert!((p.busy - 100.0 / 120.0).abs() < 1e-9);
        assert!((p.blocked - 0.9).abs() < 1e-9 && (p.on_cpu - 0.1).abs() < 1e-9);
        assert_eq!(p.bound, PipelineBound::Wait);
        assert_eq!(p.top_functions[0].function, "Slow.__getitem__");
        assert_eq!(p.blocked_in[0].function, "Slow.__getitem__");
        assert!((p.batch_cpu_ms.unwrap() - 20.0).abs() < 1e-9);
    }

    #[test]
    fn burning_workers_are_cpu_bound_and_need_more_of_them() {
        let w = fold(&[
            (ProcState::Running, &[1, 2, 3, 4], 95),
            (ProcState::Sleeping, &[1, 2, 3, 4], 5),
        ]);
        let p = worker_profile(&w, &funcs(), None, Some(10), &Handover::default()).unwrap();
        assert_eq!(p.bound, PipelineBound::Cpu);
        assert_eq!(p.cpu_in[0].function, "decode");
        assert_eq!(p.batch_cpu_ms, None);
        assert_eq!(workers_needed(120.0, 45.0), Some((3, 4)));
        assert_eq!(workers_needed(10.0, 45.0), Some((1, 2)));
        assert_eq!(workers_needed(10.0, 0.0), None);
    }

    #[test]
    fn the_files_blocked_workers_read_are_ranked() {
        use crate::event::{ReadKind, ReadSite};
        let mut w = fold(&[(ProcState::Running, &[1, 2, 3], 10)]);
        let site = |path: &str, kind| ReadSite {
            path: path.into(),
            kind,
            mount: "/data".into(),
            fs_type: "nfs4".into(),
            source: "srv:/x".into(),
        };
        let mut push = |reading: Option<ReadSite>, busy: bool, n| {
            for _ in 0..n {
                w.push(&WorkerStackSample {
                    ts: 0,
                    pid: 100,
                    state: ProcState::Sleeping,
                    frames: if busy { vec![1, 2, 3] } else { vec![1, 5] },
                    reading: reading.clone(),
                });
            }
        };
        push(Some(site("/data/a.tar", ReadKind::File)), true, 6);
        push(Some(site("pipe:[7]", ReadKind::Pipe)), true, 2);
        push(None, true, 2);
        // Idle workers' reads (waiting for an index) are not the pipeline's.
        push(Some(site("pipe:[9]", ReadKind::Pipe)), false, 5);
        let p = worker_profile(&w, &funcs(), None, None, &Handover::default()).unwrap();
        let got: Vec<(&str, f64)> = p
            .reads_from
            .iter()
            .map(|r| (r.site.path.as_str(), r.share))
            .collect();
        assert_eq!(got, vec![("/data/a.tar", 0.6), ("pipe:[7]", 0.2)]);
        assert!(p.reads_from[0].site.network());
    }

    #[test]
    fn too_few_samples_make_no_profile() {
        let w = fold(&[(ProcState::Running, &[1, 2, 3], 3)]);
        assert_eq!(
            worker_profile(&w, &funcs(), None, None, &Handover::default()),
            None
        );
    }
}
