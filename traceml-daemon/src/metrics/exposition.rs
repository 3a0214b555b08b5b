//! The Prometheus exposition: the exporter's series encoded as metric families.
use super::*;

/// A label value from a target: control characters made visible, bounded.
pub(super) fn label(s: &str) -> String {
    terminal_bounded(s, LABEL_MAX)
}

/// The registry's view of the exporter at one scrape.
#[derive(Debug)]
pub(super) struct Exposition(pub(super) Exporter);

pub(super) type Labels = Vec<(&'static str, String)>;

/// The identity labels of a series: `job` (this node's job directory), `job_id` (the job across
/// nodes: [`crate::host::jobs::job_identity`], else `<node>/<job>`), and where known `node`.
pub(super) fn job_labels(job: &str, info: &JobLabels) -> Labels {
    let mut l = vec![
        ("job", job.to_owned()),
        (
            "job_id",
            label(
                &info
                    .job_id
                    .clone()
                    .unwrap_or_else(|| format!("{}/{job}", info.node)),
            ),
        ),
    ];
    if !info.node.is_empty() {
        l.push(("node", label(&info.node)));
    }
    l
}

/// A rank's labels: [`job_labels`], `rank` (the global `RANK`), and where known `local_rank`
/// and `world_size`.
pub(super) fn rank_labels(job: &str, rank: &str, info: &JobLabels) -> Labels {
    let mut l = job_labels(job, info);
    l.insert(1, ("rank", rank.to_owned()));
    if let Some(lr) = info.local_rank {
        l.push(("local_rank", lr.to_string()));
    }
    if let Some(w) = info.world_size {
        l.push(("world_size", w.to_string()));
    }
    l
}

/// One metric family: its descriptor, then one sample per label set.
pub(super) fn family<M: EncodeMetric>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    samples: Vec<(Labels, M)>,
) -> std::fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, kind)?;
    for (labels, metric) in &samples {
        metric.encode(m.encode_family(labels)?)?;
    }
    Ok(())
}

pub(super) fn counters<
    'a,
    N: EncodeCounterValue + std::fmt::Debug,
    F: Fn(&'a RankValues) -> Option<N>,
>(
    e: &'a Exporter,
    f: F,
) -> Vec<(Labels, ConstCounter<N>)> {
    e.values()
        .filter_map(|(l, v)| Some((l, ConstCounter::new(f(v)?))))
        .collect()
}

pub(super) fn gauges<'a, F: Fn(&'a RankValues) -> Option<f64>>(
    e: &'a Exporter,
    f: F,
) -> Vec<(Labels, ConstGauge<f64>)> {
    e.values()
        .filter_map(|(l, v)| Some((l, ConstGauge::new(f(v)?))))
        .collect()
}

impl Collector for Exposition {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let e = &self.0;
        step_families(&mut enc, e)?;
        step_histogram(&mut enc, e)?;
        phase_and_verdict_families(&mut enc, e)?;
        rank_state_families(&mut enc, e)?;
        cuda_and_cost_families(&mut enc, e)?;
        job_info_family(&mut enc, e)
    }
}

/// Steps, micro-batches and the evaluation segments: counters per rank.
pub(super) fn step_families(enc: &mut DescriptorEncoder, e: &Exporter) -> std::fmt::Result {
    family(
        enc,
        "traceml_steps",
        "Complete training steps measured.",
        MetricType::Counter,
        counters(e, |v| Some(v.steps)),
    )?;
    family(
        enc,
        "traceml_micro_batches",
        "Micro-batches (fetch, forward, backward) of the complete steps: more than the steps \
         under gradient accumulation (absent where no backward was seen).",
        MetricType::Counter,
        counters(e, |v| v.micro_batches),
    )?;
    family(
        enc,
        "traceml_evaluation_seconds",
        "Wall time of the evaluation segments between optimizer steps (fetches and forwards \
         no backward followed): not in the steps.",
        MetricType::Counter,
        counters(e, |v| Some(v.evaluation_seconds)),
    )?;
    family(
        enc,
        "traceml_evaluation_batches",
        "Batches fetched in the evaluation segments.",
        MetricType::Counter,
        counters(e, |v| Some(v.evaluation_batches)),
    )?;
    Ok(())
}

/// `traceml_step_duration_seconds`: the step-time histogram per rank.
pub(super) fn step_histogram(enc: &mut DescriptorEncoder, e: &Exporter) -> std::fmt::Result {
    let mut m = enc.encode_descriptor(
        "traceml_step_duration_seconds",
        "Duration of the complete training steps.",
        None,
        MetricType::Histogram,
    )?;
    for (labels, v) in e.values() {
        let bounds = STEP_BUCKETS_NS
            .iter()
            .map(|&ns| ns as f64 / 1e9)
            .chain([f64::INFINITY]);
        let buckets: Vec<(f64, u64)> = bounds.zip(v.step_buckets.iter().copied()).collect();
        let count = v.step_buckets.iter().sum();
        m.encode_family(&labels)?.encode_histogram::<NoLabelSet>(
            v.step_seconds_sum,
            count,
            &buckets,
            None,
        )?;
    }
    Ok(())
}

/// Time per phase (a `phase` label on each rank's series) and each job's primary verdict.
pub(super) fn phase_and_verdict_families(
    enc: &mut DescriptorEncoder,
    e: &Exporter,
) -> std::fmt::Result {
    let phases: Vec<(Labels, ConstCounter<f64>)> = e
        .values()
        .flat_map(|(l, v)| {
            v.phase_seconds.iter().map(move |(p, s)| {
                let mut l = l.clone();
                l.insert(2, ("phase", p.name().to_owned()));
                (l, ConstCounter::new(*s))
            })
        })
        .collect();
    family(
        enc,
        "traceml_phase_seconds",
        "Time of the complete steps spent in each phase (exclusive; the phases add up to the \
         step time).",
        MetricType::Counter,
        phases,
    )?;
    let verdicts: Vec<(Labels, ConstGauge<i64>)> = e
        .jobs
        .iter()
        .filter_map(|(j, job)| {
            let v = job.verdict?;
            let info = job.ranks.values().next().map(|r| r.info.clone());
            let mut l = job_labels(j, &info.unwrap_or_default());
            l.push(("kind", v.kind.as_str().to_owned()));
            l.push(("severity", v.severity.as_str().to_owned()));
            Some((l, ConstGauge::new(1)))
        })
        .collect();
    family(
        enc,
        "traceml_verdict",
        "1 for the job's current primary verdict (the last window's in serve, the run so far \
         before it).",
        MetricType::Gauge,
        verdicts,
    )?;
    // The straggler class: 1 for the class, with the rank it names ("" when rotating), and the
    // others' wait it cost.
    let straggler_labels = |j: &String, job: &Job| {
        let st = job.stragglers.as_ref()?;
        let info = job.ranks.values().next().map(|r| r.info.clone());
        let mut l = job_labels(j, &info.unwrap_or_default());
        l.push(("class", st.class.as_str().to_owned()));
        l.push(("rank", st.rank.map(|r| r.to_string()).unwrap_or_default()));
        Some((l, st.lost_ms / 1e3))
    };
    let classes: Vec<(Labels, ConstGauge<i64>)> = e
        .jobs
        .iter()
        .filter_map(|(j, job)| straggler_labels(j, job).map(|(l, _)| (l, ConstGauge::new(1))))
        .collect();
    family(
        enc,
        "traceml_straggler_class",
        "1 for the job's straggler class (persistent, transient, rotating) and the rank it names \
         (empty when rotating), from the aligned steps of every rank so far.",
        MetricType::Gauge,
        classes,
    )?;
    let lost: Vec<(Labels, ConstGauge<f64>)> = e
        .jobs
        .iter()
        .filter_map(|(j, job)| straggler_labels(j, job).map(|(l, s)| (l, ConstGauge::new(s))))
        .collect();
    family(
        enc,
        "traceml_straggler_lost_seconds",
        "The other ranks' wait the slow steps cost so far (each slow step's excess, summed).",
        MetricType::Gauge,
        lost,
    )?;
    collective_families(enc, e)
}

/// The joined ledgers: per rank the collectives it entered last and the wait that cost the
/// others, the collectives joined, the desyncs named and the ranks inside an open collective.
pub(super) fn collective_families(enc: &mut DescriptorEncoder, e: &Exporter) -> std::fmt::Result {
    fn of<'a>(j: &str, job: &'a Job) -> Option<(Labels, &'a crate::summary::CollectiveWaits)> {
        let w = job.collectives.as_ref()?;
        let info = job.ranks.values().next().map(|r| r.info.clone());
        Some((job_labels(j, &info.unwrap_or_default()), w))
    }
    let per_rank = |f: &dyn Fn(&crate::summary::RankArrivals) -> f64| -> Vec<(Labels, f64)> {
        e.jobs
            .iter()
            .filter_map(|(j, job)| of(j, job))
            .flat_map(|(l, w)| {
                w.ranks.iter().map(move |r| {
                    let mut l = l.clone();
                    l.push(("rank", r.rank.to_string()));
                    (l, f(r))
                })
            })
            .collect()
    };
    let job_value = |f: &dyn Fn(&crate::summary::CollectiveWaits) -> f64| -> Vec<(Labels, f64)> {
        e.jobs
            .iter()
            .filter_map(|(j, job)| of(j, job))
            .map(|(l, w)| (l, f(w)))
            .collect()
    };
    let ints = |v: Vec<(Labels, f64)>| -> Vec<(Labels, ConstGauge<i64>)> {
        v.into_iter()
            .map(|(l, x)| (l, ConstGauge::new(x as i64)))
            .collect()
    };
    let floats = |v: Vec<(Labels, f64)>| -> Vec<(Labels, ConstGauge<f64>)> {
        v.into_iter()
            .map(|(l, x)| (l, ConstGauge::new(x)))
            .collect()
    };
    family(
        enc,
        "traceml_collective_last",
        "Collectives (of those joined across the ranks, the newest 512 per rank) the rank \
         entered last, by more than the noise: the one the others waited for.",
        MetricType::Gauge,
        ints(per_rank(&|r| r.last as f64)),
    )?;
    family(
        enc,
        "traceml_collective_caused_seconds",
        "The others' wait at those collectives: the rank's entry less the others' median entry, \
         summed.",
        MetricType::Gauge,
        floats(per_rank(&|r| r.caused_ms / 1e3)),
    )?;
    family(
        enc,
        "traceml_collectives_joined",
        "Collectives joined across every rank (their ledgers' newest entries).",
        MetricType::Gauge,
        ints(job_value(&|w| w.compared as f64)),
    )?;
    family(
        enc,
        "traceml_collective_desyncs",
        "Collectives where the ranks' ops differ (a desync: the job hangs or computes garbage).",
        MetricType::Gauge,
        ints(job_value(&|w| w.desyncs.len() as f64)),
    )?;
    let inside: Vec<(Labels, ConstGauge<f64>)> = e
        .jobs
        .iter()
        .filter_map(|(j, job)| of(j, job))
        .flat_map(|(l, w)| {
            w.open.iter().map(move |o| {
                let mut l = l.clone();
                l.push(("rank", o.rank.to_string()));
                l.push(("op", o.op.clone()));
                l.push(("seq", o.seq.to_string()));
                (l, ConstGauge::new(o.enter_ts as f64 / 1e9))
            })
        })
        .collect();
    family(
        enc,
        "traceml_collective_open_since_seconds",
        "A rank inside a collective with no end yet (op, aligned sequence number): its entry, \
         CLOCK_MONOTONIC seconds.",
        MetricType::Gauge,
        inside,
    )?;
    Ok(())
}

/// What the hang and straggler rules read: own work, the recent median, the last step end, in a
/// collective.
pub(super) fn rank_state_families(enc: &mut DescriptorEncoder, e: &Exporter) -> std::fmt::Result {
    family(
        enc,
        "traceml_own_work_seconds",
        "Own work of the complete steps: step time less collective wait (the slowest rank's \
         is what the others wait for).",
        MetricType::Counter,
        counters(e, |v| Some(v.own_work_seconds)),
    )?;
    family(
        enc,
        "traceml_step_median_seconds",
        "Median duration of the rank's recent steps (the hang threshold is 10 times it).",
        MetricType::Gauge,
        gauges(e, |v| v.step_median_seconds),
    )?;
    family(
        enc,
        "traceml_last_step_end_timestamp_seconds",
        "When the rank last completed a step (unix time, to within 1 s); absent before its \
         first step and once its run ended.",
        MetricType::Gauge,
        gauges(e, |v| v.last_step_end_unix),
    )?;
    family(
        enc,
        "traceml_in_collective",
        "1 when the rank's latest Python stack is inside a collective (all_reduce, barrier, \
         DDP's backward...), 0 when not; absent without a stack.",
        MetricType::Gauge,
        gauges(e, |v| v.in_collective.map(|b| if b { 1.0 } else { 0.0 })),
    )?;
    Ok(())
}

/// CUDA activity, GPU utilization and the daemon's own cost (lost events, failed probes, overhead)
/// per rank; the attached jobs.
pub(super) fn cuda_and_cost_families(
    enc: &mut DescriptorEncoder,
    e: &Exporter,
) -> std::fmt::Result {
    family(
        enc,
        "traceml_h2d_bytes",
        "Bytes copied host to device in the complete steps (absent when no CUDA library was \
         probed).",
        MetricType::Counter,
        counters(e, |v| v.h2d_bytes),
    )?;
    family(
        enc,
        "traceml_kernel_launches",
        "CUDA kernel launches (absent when no CUDA library was probed).",
        MetricType::Counter,
        counters(e, |v| v.kernel_launches),
    )?;
    family(
        enc,
        "traceml_gpu_utilization_ratio",
        "Utilization (0-1) of the GPUs the target uses, at the latest NVML sample (absent \
         without NVML).",
        MetricType::Gauge,
        gauges(e, |v| v.gpu_utilization),
    )?;
    family(
        enc,
        "traceml_gpu_memory_used_bytes",
        "Device memory of the rank (and its DataLoader workers) over its GPUs, at the latest \
         NVML sample (absent without NVML).",
        MetricType::Gauge,
        gauges(e, |v| v.gpu_memory_bytes.map(|b| b as f64)),
    )?;
    family(
        enc,
        "traceml_events_lost",
        "Probe events lost (ring buffer full, read failures, undecodable).",
        MetricType::Counter,
        counters(e, |v| v.events_lost),
    )?;
    family(
        enc,
        "traceml_probe_failures",
        "Probes that could not be attached.",
        MetricType::Counter,
        counters(e, |v| Some(v.probe_failures)),
    )?;
    family(
        enc,
        "traceml_daemon_overhead_ratio",
        "The daemon's estimated added time on the target, as a share of step time, since the \
         last probe-set change.",
        MetricType::Gauge,
        gauges(e, |v| v.overhead_ratio),
    )?;
    family(
        enc,
        "traceml_attached_jobs",
        "Jobs the daemon is attached to.",
        MetricType::Gauge,
        vec![(Vec::new(), ConstGauge::new(e.attached_jobs() as i64))],
    )?;
    Ok(())
}

/// `traceml_job_info`: who each job's rank is (pids only here).
pub(super) fn job_info_family(enc: &mut DescriptorEncoder, e: &Exporter) -> std::fmt::Result {
    let mut m = enc.encode_descriptor(
        "traceml_job",
        "Who each job's rank is.",
        None,
        MetricType::Info,
    )?;
    for (j, job) in &e.jobs {
        for (r, rank) in &job.ranks {
            let pid = rank.info.pid.to_string();
            let (comm, command) = (label(&rank.info.comm), label(&rank.info.command));
            let opt = |v: &Option<String>| label(v.as_deref().unwrap_or(""));
            let user = opt(&rank.info.user);
            let (container, pod, unit) = (
                opt(&rank.info.container),
                opt(&rank.info.pod),
                opt(&rank.info.unit),
            );
            let mut labels = rank_labels(j, r, &rank.info);
            labels.extend([
                ("pid", pid),
                ("comm", comm),
                ("command", command),
                ("user", user),
                ("container", container),
                ("pod", pod),
                ("unit", unit),
            ]);
            m.encode_info(&labels)?;
        }
    }
    Ok(())
}
