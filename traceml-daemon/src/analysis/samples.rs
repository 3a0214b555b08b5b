//! The /proc and NVML samples of a run turned into the model's system, process, workers', GPU and
//! memory statistics, and the CUDA libraries the stream names.
use super::*;

pub(super) fn system_stats(samples: &[&Sample], t: Option<&TargetInfo>) -> SystemStats {
    let cpu: Vec<f64> = samples
        .iter()
        .filter_map(|s| s.system.cpu_pct)
        .filter(|x| x.is_finite())
        .collect();
    let mem: Vec<u64> = samples
        .iter()
        .filter_map(|s| s.system.mem_used_bytes)
        .collect();
    SystemStats {
        cpu_pct_mean: mean(cpu.iter().copied()),
        cpu_pct_max: quantile(&cpu, 1.0),
        mem_used_bytes_mean: mean(mem.iter().map(|&b| b as f64)).map(|b| b as u64),
        mem_used_bytes_max: mem.iter().copied().max(),
        mem_total_bytes: samples
            .iter()
            .rev()
            .find_map(|s| s.system.mem_total_bytes)
            .or_else(|| t.and_then(|t| t.mem_total_bytes)),
        num_cpus: t.map(|t| t.num_cpus).filter(|&n| n > 0),
    }
}

pub(super) fn process_stats(samples: &[&Sample], num_cpus: Option<u32>) -> ProcessStats {
    let procs: Vec<_> = samples.iter().filter_map(|s| s.process.as_ref()).collect();
    let cpu: Vec<f64> = procs
        .iter()
        .filter_map(|p| p.cpu_pct_one_core)
        .filter(|x| x.is_finite())
        .collect();
    let rss: Vec<u64> = procs.iter().filter_map(|p| p.rss_bytes).collect();
    let cpu_secs: Vec<f64> = procs
        .iter()
        .filter_map(|p| p.cpu_seconds)
        .filter(|x| x.is_finite())
        .collect();
    let cpu_mean = mean(cpu.iter().copied());
    ProcessStats {
        cpu_pct_one_core_mean: cpu_mean,
        cpu_pct_one_core_max: quantile(&cpu, 1.0),
        cpu_pct_machine_mean: cpu_mean.zip(num_cpus).map(|(c, n)| c / f64::from(n)),
        rss_bytes_mean: mean(rss.iter().map(|&b| b as f64)).map(|b| b as u64),
        rss_bytes_max: rss.iter().copied().max(),
        threads_max: procs.iter().filter_map(|p| p.threads).max(),
        cpu_seconds: match (cpu_secs.first(), cpu_secs.last()) {
            (Some(a), Some(b)) if cpu_secs.len() >= 2 => finite((b - a).max(0.0)),
            _ => None,
        },
    }
}

pub(super) fn worker_stats(samples: &[&Sample]) -> WorkerStats {
    if samples
        .iter()
        .all(|s| s.process.is_none() && s.workers.is_empty())
    {
        return WorkerStats::default();
    }
    let mut per_pid: BTreeMap<u32, Vec<f64>> = BTreeMap::new();
    for w in samples.iter().flat_map(|s| &s.workers) {
        let cpu = per_pid.entry(w.pid).or_default();
        if let Some(c) = w.cpu_pct_one_core.filter(|c| c.is_finite()) {
            cpu.push(c);
        }
    }
    let per_worker: Vec<f64> = per_pid
        .values()
        .filter_map(|v| mean(v.iter().copied()))
        .collect();
    let cpu_mean = mean(per_worker.iter().copied());
    WorkerStats {
        count: samples
            .iter()
            .map(|s| u32::try_from(s.workers.len()).unwrap_or(u32::MAX))
            .max(),
        cpu_pct_one_core_mean: cpu_mean,
        cpu_pct_one_core_max: quantile(&per_worker, 1.0),
        state: cpu_mean.map(WorkerState::from_pct),
        rss_bytes_max_total: samples
            .iter()
            .filter(|s| s.workers.iter().any(|w| w.rss_bytes.is_some()))
            .map(|s| s.workers.iter().filter_map(|w| w.rss_bytes).sum::<u64>())
            .max(),
        profile: None,
    }
}

/// The samples of the training: from a second after the first kept step's start (NVML's
/// utilization covers the period before its reading, which a sample takes up to a second
/// late) to the last kept step's end. All of them when there are no steps or none falls inside:
/// a GPU idle before the loop starts is not the loop's.
pub(super) fn while_training<'a>(samples: &[&'a Sample], steps: &[Step]) -> Vec<&'a Sample> {
    let (Some(first), Some(last)) = (steps.first(), steps.last()) else {
        return samples.to_vec();
    };
    let (from, to) = (first.start_ns + 1_000_000_000, last.end_ns);
    let inside: Vec<&Sample> = samples
        .iter()
        .copied()
        .filter(|s| (from..=to).contains(&s.ts))
        .collect();
    if inside.is_empty() {
        samples.to_vec()
    } else {
        inside
    }
}

pub(super) fn gpu_stats(samples: &[&Sample]) -> Option<GpuStats> {
    let mut by_index: BTreeMap<u32, Vec<&crate::sample::GpuSample>> = BTreeMap::new();
    for g in samples.iter().filter_map(|s| s.gpus.as_ref()).flatten() {
        by_index.entry(g.index).or_default().push(g);
    }
    if by_index.is_empty() {
        return None;
    }
    let devices: Vec<GpuDeviceStats> = by_index
        .iter()
        .map(|(&index, gs)| {
            let util: Vec<f64> = gs
                .iter()
                .filter_map(|g| g.util_pct)
                .filter(|x| x.is_finite())
                .collect();
            let temp: Vec<f64> = gs
                .iter()
                .filter_map(|g| g.temp_c)
                .filter(|x| x.is_finite())
                .collect();
            let proc_mem = gs.iter().filter_map(|g| g.process_mem_bytes).max();
            GpuDeviceStats {
                index,
                name: gs.iter().rev().find_map(|g| g.name.clone()),
                util_pct_mean: mean(util.iter().copied()),
                util_pct_max: quantile(&util, 1.0),
                mem_used_bytes_max: gs.iter().filter_map(|g| g.mem_used_bytes).max(),
                mem_total_bytes: gs.iter().rev().find_map(|g| g.mem_total_bytes),
                temp_c_max: quantile(&temp, 1.0),
                power_w_mean: mean(gs.iter().filter_map(|g| g.power_w)),
                power_limit_w: gs
                    .iter()
                    .rev()
                    .find_map(|g| g.power_limit_w.and_then(finite)),
                process_mem_bytes_max: proc_mem,
                process_util_pct_mean: mean(gs.iter().filter_map(|g| g.process_util_pct)),
                used_by_target: proc_mem.is_some_and(|m| m > 0),
            }
        })
        .collect();
    let any_used = devices.iter().any(|d| d.used_by_target);
    let util_pct_mean = mean(
        devices
            .iter()
            .filter(|d| d.used_by_target || !any_used)
            .filter_map(|d| d.util_pct_mean),
    );
    Some(GpuStats {
        process_mem_bytes_max: samples.iter().filter_map(|s| s.gpu_process_mem()).max(),
        util_pct_mean,
        devices,
    })
}

/// What went wrong reading the GPUs over the run (`Sample::gpu_note`), each trouble once (a
/// slow call's milliseconds grow while it lasts: its last wording), in order of first
/// appearance.
pub(super) fn gpu_notes(samples: &[&Sample]) -> Vec<String> {
    // Notes whose numbers grow while the trouble lasts: one each, its last wording.
    const GROWING: [&str; 3] = ["NVML calls took up to ", "NVML's ", "no NVML reading for "];
    let mut out: Vec<(String, String)> = Vec::new();
    for part in samples
        .iter()
        .filter_map(|s| s.gpu_note.as_deref())
        .flat_map(|n| n.split("; "))
    {
        let key = GROWING
            .iter()
            .find(|g| part.starts_with(*g))
            .map_or(part, |g| g)
            .to_owned();
        match out.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = part.to_owned(),
            None => out.push((key, part.to_owned())),
        }
    }
    out.into_iter().map(|(_, n)| format!("GPU: {n}")).collect()
}

pub(super) fn memory_stats(
    steps: &[Step],
    samples: &[&Sample],
    attach_ns: Option<u64>,
) -> MemoryStats {
    // Samples sorted by time, each step paired with the sample nearest its end.
    let mut sorted: Vec<&Sample> = samples.to_vec();
    sorted.sort_by_key(|s| s.ts);
    let nearest = |ts: u64| -> Option<&Sample> {
        let i = sorted.partition_point(|s| s.ts < ts);
        let before = i.checked_sub(1).map(|j| sorted[j]);
        let after = sorted.get(i).copied();
        match (before, after) {
            (Some(b), Some(a)) => Some(if ts - b.ts <= a.ts - ts { b } else { a }),
            (b, a) => b.or(a),
        }
    };
    let paired: Vec<&Sample> = steps.iter().filter_map(|s| nearest(s.end_ns)).collect();
    let rss: Vec<u64> = paired
        .iter()
        .filter_map(|s| s.process.as_ref().and_then(|p| p.rss_bytes))
        .collect();
    let gpu: Vec<u64> = paired.iter().filter_map(|s| s.gpu_process_mem()).collect();
    let gpu_total = samples.iter().rev().find_map(|s| {
        let gpus = s.gpus.as_ref()?;
        let used: Vec<&crate::sample::GpuSample> = gpus
            .iter()
            .filter(|g| g.process_mem_bytes.is_some_and(|m| m > 0))
            .collect();
        let pick = if used.is_empty() {
            gpus.iter().collect()
        } else {
            used
        };
        let totals: Vec<u64> = pick.iter().filter_map(|g| g.mem_total_bytes).collect();
        (!totals.is_empty()).then(|| totals.iter().sum())
    });
    MemoryStats {
        rss_bytes_by_third: thirds(&rss),
        gpu_process_mem_bytes_by_third: thirds(&gpu),
        gpu_mem_total_bytes: gpu_total,
        series: memory_series(&sorted, attach_ns),
    }
}

/// The memory series of time-sorted samples (see [`MemorySeries`]); `None` without samples.
pub(super) fn memory_series(
    sorted: &[&Sample],
    attach_ns: Option<u64>,
) -> Option<crate::summary::MemorySeries> {
    use crate::summary::MemorySeries;
    let first = sorted.first()?.ts;
    let t0 = attach_ns.filter(|&a| a <= first).unwrap_or(first);
    let stride = sorted.len().div_ceil(MemorySeries::MAX).max(1);
    let mut out = MemorySeries {
        stride: u32::try_from(stride).unwrap_or(u32::MAX),
        ..MemorySeries::default()
    };
    for chunk in sorted.chunks(stride) {
        // 10 ms resolution: the chart needs no more, the file stays small.
        out.t_s
            .push(((chunk[0].ts - t0) as f64 / 1e7).round() / 100.0);
        out.rss_bytes.push(
            chunk
                .iter()
                .filter_map(|s| s.process.as_ref().and_then(|p| p.rss_bytes))
                .max(),
        );
        out.gpu_process_mem_bytes
            .push(chunk.iter().filter_map(|s| s.gpu_process_mem()).max());
    }
    Some(out)
}

/// Medians of the early, middle and late thirds; `None` with fewer than 3 values.
pub(super) fn thirds(xs: &[u64]) -> Option<[u64; 3]> {
    let n = xs.len();
    if n < 3 {
        return None;
    }
    let (a, b) = (n / 3, 2 * n / 3);
    Some([
        median_u64(&xs[..a])?,
        median_u64(&xs[a..b])?,
        median_u64(&xs[b..])?,
    ])
}

pub(super) fn cuda_libraries(items: &[StreamItem]) -> Vec<String> {
    libraries_of(items, &["cudart", "cuda_driver"])
}

/// The paths of the library items with one of `roles`, sorted, once each.
pub(super) fn libraries_of(items: &[StreamItem], roles: &[&str]) -> Vec<String> {
    let mut libs: Vec<String> = items
        .iter()
        .filter_map(|i| match i {
            StreamItem::Library(l) if roles.contains(&l.role.as_str()) => Some(l.path.clone()),
            _ => None,
        })
        .collect();
    libs.sort();
    libs.dedup();
    libs
}
