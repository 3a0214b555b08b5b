//! What to try next for an input-bound step: the loader's workers (how many keep up, what
//! fills them), reads (storage, by path), and input loaded on the training thread.
use super::*;

pub(super) fn input_next(s: &Summary, why: &mut String) -> String {
    let w = &s.workers;
    let knobs = super::knobs::Knobs::of(s);
    let cores = s
        .system
        .num_cpus
        .map(|c| format!("{c} cores"))
        .unwrap_or_else(|| "the machine's cores".to_owned());
    let sys = s.system.cpu_pct_mean;
    let saturated = sys.is_some_and(|c| c >= 85.0);
    if let Some(next) = input_off_loader(s, why) {
        return next;
    }
    if let (Some(k), Some(p)) = (w.count.filter(|&k| k > 0), &w.profile)
        && (p.busy > 0.0 || p.bound == crate::summary::PipelineBound::Ipc)
    {
        return pipeline_next(s, p, k, why) + knobs.shards();
    }
    match (w.count, w.cpu_pct_one_core_mean, w.state) {
        (Some(0), _, _) => {
            why.push_str(
                "; no DataLoader worker processes were seen: loading runs on the training thread",
            );
            let mut next = format!(
                "set {} so batches are prepared in parallel ({cores}, system CPU {})",
                knobs.workers("N"),
                opt_pct(sys)
            );
            // Pinning only helps host-to-device copies: say it when there were some.
            if s.cuda.h2d_copies_per_step.is_some_and(|n| n > 0.0) {
                next.push_str(&format!("; add {} for the copies", knobs.pin()));
            }
            next + knobs.shards()
        }
        (Some(k), Some(c), Some(WorkerState::Busy)) => {
            why.push_str(&format!(
                "; {k} DataLoader workers were {c:.0}% busy (of one core each)"
            ));
            if saturated {
                format!(
                    "the workers are CPU-bound and the machine is saturated (system CPU {}): more workers \
                     will not help; make per-sample work cheaper (decode/augment on the GPU, pre-processed \
                     or smaller samples)",
                    opt_pct(sys)
                )
            } else {
                format!(
                    "the {k} workers are CPU-bound: more workers, {} ({cores}, system CPU {}), or \
                     move decoding and augmentation off the CPU (GPU decoding, pre-processed data)",
                    knobs.workers("N"),
                    opt_pct(sys)
                ) + knobs.shards()
            }
        }
        (Some(k), Some(c), Some(WorkerState::Idle)) => {
            why.push_str(&format!(
                "; {k} DataLoader workers were mostly idle ({c:.0}% of one core each)"
            ));
            format!(
                "the workers wait rather than compute: check storage read throughput (local disk, \
                 larger files/shards), raise {}, use {}; large samples cost in IPC (return \
                 compact dtypes such as uint8)",
                knobs.prefetch(),
                knobs.persistent()
            )
        }
        (Some(k), Some(c), _) => {
            why.push_str(&format!(
                "; {k} DataLoader workers were {c:.0}% busy (of one core each)"
            ));
            format!(
                "more workers, {} ({cores}), and a higher {}; check storage read throughput",
                knobs.workers("N"),
                knobs.prefetch()
            ) + knobs.shards()
        }
        _ => {
            format!(
                "more workers, {}, and a higher {} (worker CPU was not sampled)",
                knobs.workers("N"),
                knobs.prefetch()
            ) + knobs.shards()
        }
    }
}

/// A file the blocked workers read is named in the Next line from this share of their blocked
/// samples.
pub const READ_SHARE: f64 = 0.3;

/// What the workers read, as the card says it: "blocked in reads of /data/a.tar (82%, nfs4 at
/// /data from srv:/export)".
pub fn reading_said(r: &crate::summary::ReadShare) -> String {
    use crate::event::ReadKind;
    let share = r.share * 100.0;
    let site = &r.site;
    let mount = if site.fs_type.is_empty() {
        String::new()
    } else {
        let from = if site.source.is_empty() || site.source == site.fs_type {
            String::new()
        } else {
            format!(" from {}", site.source)
        };
        format!(", {} at {}{from}", site.fs_type, site.mount)
    };
    match site.kind {
        ReadKind::Pipe => format!("blocked reading a pipe, {} ({share:.0}%)", site.path),
        ReadKind::Socket => format!("blocked reading a socket, {} ({share:.0}%)", site.path),
        _ => format!("blocked in reads of {} ({share:.0}%{mount})", site.path),
    }
}

/// The Next line's reading of what the workers read.
fn reading_next(r: &crate::summary::ReadShare) -> String {
    use crate::event::ReadKind;
    let said = reading_said(r);
    match r.site.kind {
        ReadKind::Pipe => format!("{said}: what writes that pipe is the slow part"),
        ReadKind::Socket => format!(
            "{said}: a remote source (an object store, a data service) is the slow part: \
             more requests in flight, larger objects, or a local copy"
        ),
        _ if r.site.network() => format!(
            "{said}: a network file system: copy the data to local disk, or read larger \
             shards with more in flight"
        ),
        _ => format!(
            "{said}: storage: faster or local storage, larger sequential reads or shards, \
             or cache the decoded samples"
        ),
    }
}

/// The workers' profile in one line: "2 workers sampled · making a batch 95% of the time: 96%
/// blocked, 4% on CPU, 0% in I/O · in dataset.py:Slow.__getitem__ 92%".
pub fn pipeline_line(p: &crate::summary::WorkerProfile) -> String {
    let top = p
        .top_functions
        .first()
        .map(|f| {
            format!(
                " · in {}:{} {:.0}%",
                crate::profile::short_file(&f.file),
                f.function,
                f.share * 100.0
            )
        })
        .unwrap_or_default();
    let handover = p
        .ipc
        .filter(|&i| i >= 0.05)
        .map(|i| {
            let f = p
                .ipc_in
                .first()
                .map(|f| format!(" in {}", f.function))
                .unwrap_or_default();
            format!(" · hand-over {:.0}% of the wait{f}", i * 100.0)
        })
        .unwrap_or_default();
    let reading = p
        .reads_from
        .first()
        .map(|r| format!(" · {}", reading_said(r)))
        .unwrap_or_default();
    format!(
        "{} sampled · making a batch {:.0}% of the time: {:.0}% on CPU, {:.0}% blocked, {:.0}% in \
         I/O{top}{reading}{handover}",
        plural(p.workers_sampled, "worker"),
        p.busy * 100.0,
        p.on_cpu * 100.0,
        p.blocked * 100.0,
        p.io * 100.0
    )
}

fn plural(n: u32, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// Input-bound with DataLoader workers whose stacks were sampled: what limits them, where, and
/// how many workers keep pace (numbers from their CPU per batch or their busy time per batch
/// against the step's own work).
fn pipeline_next(
    s: &Summary,
    p: &crate::summary::WorkerProfile,
    k: u32,
    why: &mut String,
) -> String {
    use crate::summary::PipelineBound;
    let func = |list: &[crate::profile::TopFunction]| {
        list.first()
            .map(|f| format!("{}:{}", crate::profile::short_file(&f.file), f.function))
    };
    why.push_str(&format!(
        "; its {k} DataLoader workers made batches {:.0}% of the time, {:.0}% of it on a CPU, \
         {:.0}% blocked, {:.0}% in I/O",
        p.busy * 100.0,
        p.on_cpu * 100.0,
        p.blocked * 100.0,
        p.io * 100.0
    ));
    let compute = match (s.step_ms.mean, s.phases.input_wait.mean_ms) {
        (Some(step), Some(input)) if step > input => Some(step - input),
        _ => None,
    };
    let batches = s
        .steps
        .micro_batches
        .as_ref()
        .map(|m| m.total)
        .unwrap_or(u64::from(s.steps.count));
    if let Some(ipc) = p.ipc.filter(|&i| i >= 0.05) {
        why.push_str(&format!(
            "; {:.0}% of the input wait was the hand-over (reading finished batches off the \
             queue, unpickling them)",
            ipc * 100.0
        ));
    }
    match p.bound {
        PipelineBound::Ipc => ipc_next(s, p, func(&p.ipc_in)),
        PipelineBound::Cpu => cpu_next(s, p, k, compute, func(&p.cpu_in)),
        PipelineBound::Wait | PipelineBound::Io => {
            wait_next(s, p, k, compute, batches, func(&p.blocked_in))
        }
    }
}

/// The workers finish first: the hand-over (`f`: where this process takes their batches
/// over) is the cost.
fn ipc_next(s: &Summary, p: &crate::summary::WorkerProfile, f: Option<String>) -> String {
    let f = f.unwrap_or_else(|| "unpickling".into());
    let ipc = p.ipc.unwrap_or(0.0);
    let cost = s
        .phases
        .input_wait
        .mean_ms
        .map(|m| format!(" ({:.0} ms a step)", m * ipc))
        .unwrap_or_default();
    format!(
        "the workers finish first: {:.0}% of the input wait{cost} is this process taking \
         their batches over, in {f}; return tensors or compact bytes, not objects that \
         rebuild on arrival: do that work in the workers (__getitem__ or collate_fn); \
         more workers will not help",
        ipc * 100.0
    )
}

/// The workers are CPU-bound in `f`: how many keep pace, or why more will not help.
fn cpu_next(
    s: &Summary,
    p: &crate::summary::WorkerProfile,
    k: u32,
    compute: Option<f64>,
    f: Option<String>,
) -> String {
    let f = f.unwrap_or_else(|| "the dataset's code".into());
    let knobs = super::knobs::Knobs::of(s);
    let (cores, sys) = (s.system.num_cpus, s.system.cpu_pct_mean);
    let saturated = sys.is_some_and(|c| c >= 85.0);
    let need = p
        .batch_cpu_ms
        .zip(compute)
        .and_then(|(b, c)| crate::pipeline::workers_needed(b, c).map(|n| (b, c, n)));
    match need {
        _ if saturated => format!(
            "the workers are CPU-bound in {f} and no core is free (system CPU {}): more \
             workers will not help; make that per-sample work cheaper (pre-process once, \
             decode on the GPU, smaller samples)",
            opt_pct(sys)
        ),
        Some((b, c, (n, headroom))) if cores.is_none_or(|cores| headroom < cores) => {
            format!(
                "the workers are CPU-bound in {f}: one batch takes {b:.0} ms of one core \
                 and a step's own work is {c:.0} ms: {} keeps pace, {headroom} with headroom \
                 (now {k}, {} cores)",
                knobs.workers(&n.to_string()),
                cores.map_or("?".into(), |c| c.to_string())
            )
        }
        Some((b, c, (n, _))) => format!(
            "the workers are CPU-bound in {f}: one batch takes {b:.0} ms of one core and a \
             step's own work is {c:.0} ms: keeping pace needs {n} workers, more than the \
             {} cores: more workers will not help; make that per-sample work cheaper",
            cores.map_or("?".into(), |c| c.to_string())
        ),
        None => format!(
            "the workers are CPU-bound in {f}: add workers while cores are free (system \
             CPU {}), or make that per-sample work cheaper",
            opt_pct(sys)
        ),
    }
}

/// The workers wait in `f` (asleep or in I/O): where, and how many workers overlap the waits.
fn wait_next(
    s: &Summary,
    p: &crate::summary::WorkerProfile,
    k: u32,
    compute: Option<f64>,
    batches: u64,
    f: Option<String>,
) -> String {
    use crate::summary::PipelineBound;
    let f = f.unwrap_or_else(|| "the dataset's code".into());
    let knobs = super::knobs::Knobs::of(s);
    let read = p.reads_from.first().filter(|r| r.share >= READ_SHARE);
    let what = match read {
        Some(r) => reading_next(r),
        None if p.bound == PipelineBound::Io => "in storage I/O (uninterruptible \
            reads): faster or local storage, larger sequential reads or shards"
            .to_owned(),
        None => "asleep (a lock, a queue, a sleep, a network or pipe read), not \
                 computing"
            .to_owned(),
    };
    // A worker's wall time per batch: its share of busy samples over the run.
    let per_batch = s
        .run
        .measured_s
        .or(s.run.duration_s)
        .filter(|_| batches > 0)
        .map(|wall| p.busy * f64::from(p.workers_sampled.max(1)) * wall * 1e3 / batches as f64);
    // A pipe's writer sets the pace: more workers would wait on it too.
    let paced = read.is_some_and(|r| r.site.kind == crate::event::ReadKind::Pipe);
    let more = per_batch
        .filter(|_| !paced)
        .zip(compute)
        .and_then(|(b, c)| crate::pipeline::workers_needed(b, c).map(|n| (b, c, n)))
        .map(|(b, c, (n, headroom))| {
            format!(
                "; a batch keeps a worker {b:.0} ms and a step's own work is {c:.0} ms: {} \
                 overlaps the waits, {headroom} with headroom (now {k})",
                knobs.workers(&n.to_string())
            )
        })
        .unwrap_or_default();
    format!("the workers wait in {f}; {what}{more}")
}

/// Input that does not come from a DataLoader on the training thread: a feeder thread's queue,
/// or preparation on the training thread itself (`get_batch`): says where, and how blocked the
/// wait is; `None` for a DataLoader on the training thread.
fn input_off_loader(s: &Summary, why: &mut String) -> Option<String> {
    let input = &s.phases.input_wait;
    let blocked = input
        .blocked_ms
        .zip(input.mean_ms)
        .filter(|&(_, m)| m > 0.0)
        .map(|(b, m)| format!(", {} of it blocked", pct((b / m).clamp(0.0, 1.0))))
        .unwrap_or_default();
    let place = input
        .top_functions
        .first()
        .map(|f| format!(" (mostly in {})", f.function))
        .unwrap_or_default();
    if let Some(f) = s.steps.feeders.first() {
        let each = if f.fetches > 0 {
            format!(", {} a batch", ms(Some(f.fetch_ms / f.fetches as f64)))
        } else {
            String::new()
        };
        why.push_str(&format!(
            "; the training thread waits for batches another thread fetches from a DataLoader \
             (thread {}: {} batches{each}){blocked}",
            f.tid, f.fetches
        ));
        return Some(format!(
            "the feeder thread loads batches one at a time: give its DataLoader worker processes, \
             {}, or feed the queue from several threads",
            super::knobs::Knobs::of(s).workers("N")
        ));
    }
    if s.steps.boundary == Some(Boundary::OptimizerStep) {
        why.push_str(&format!(
            "; the training thread prepares its input itself before each forward, outside any \
             DataLoader{place}{blocked}"
        ));
        return Some(
            "prepare the next batch while this step computes: a background thread or a \
             DataLoader(num_workers=N) over a Dataset that builds one batch; keep the data \
             in a memory-mapped array opened once"
                .to_owned(),
        );
    }
    None
}
