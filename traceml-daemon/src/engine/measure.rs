//! A step's measure at harvest: its phases from the timeline, its stack samples placed in it,
//! and the thread's off-CPU time split by phase and state.
use super::*;

/// The training thread's stack samples that fell inside a step, with the phase at their instant.
pub(super) fn place_samples(
    stacks: &[crate::event::StackSample],
    tid: u32,
    steps: &[Step],
    timeline: &Timeline,
) -> Vec<PhaseSample> {
    stacks
        .iter()
        .filter(|s| s.tid == tid)
        .filter_map(|s| {
            let i = steps.partition_point(|st| st.end_ns <= s.ts);
            let step = steps.get(i).filter(|st| st.start_ns <= s.ts)?;
            Some(PhaseSample {
                ts: s.ts,
                step: step.index,
                phase: timeline.phase_at(s.ts),
                frames: s.frames.clone(),
                off_cpu: None,
                lines: s.lines.clone(),
                wait: None,
            })
        })
        .collect()
}

/// Phase times and counts of each step; `first_index` numbers them.
pub(super) fn measure<'a>(
    cut: &Cut,
    first_index: u64,
    tid: u32,
    main: &ThreadTrace,
    threads: impl Iterator<Item = (u32, &'a ThreadTrace)>,
    timeline: &Timeline,
) -> Vec<Step> {
    let mut steps: Vec<Step> = cut
        .steps
        .iter()
        .enumerate()
        .map(|(i, &(start_ns, end_ns))| Step {
            index: u32::try_from(first_index + i as u64).unwrap_or(u32::MAX),
            start_ns,
            end_ns,
            phase_ns: timeline.split(start_ns, end_ns),
            micro_batches: cut.micro[i].unwrap_or_else(|| {
                let inside = |b: &&u64| (start_ns..end_ns).contains(*b);
                u32::try_from(main.backward_starts.iter().filter(inside).count())
                    .unwrap_or(u32::MAX)
            }),
            ..Step::default()
        })
        .collect();
    let find = |steps: &[Step], ts: u64| {
        let i = steps.partition_point(|s| s.end_ns <= ts);
        (i < steps.len() && steps[i].start_ns <= ts).then_some(i)
    };
    for (t, trace) in threads.filter(|(_, t)| t.tgid == main.tgid) {
        for &(ts, bytes) in &trace.collectives {
            if let Some(i) = find(&steps, ts) {
                steps[i].collectives += 1;
                steps[i].collective_bytes += bytes.unwrap_or(0);
            }
        }
        for &(ts, path) in &trace.launches {
            if let Some(i) = find(&steps, ts) {
                steps[i].launches[timeline.phase_at(ts).index()] += 1;
                if let Some(p) = path.counted_index() {
                    steps[i].launches_by_path[p] += 1;
                }
            }
        }
        for c in &trace.copies {
            let Some(i) = find(&steps, c.start) else {
                continue;
            };
            let s = &mut steps[i];
            let host_ns = if t == tid {
                c.end.unwrap_or(c.start).min(s.end_ns) - c.start
            } else {
                0
            };
            match c.dir {
                Dir::H2d => {
                    s.h2d_bytes += c.bytes;
                    s.h2d_copies += 1;
                    s.h2d_ns += host_ns;
                }
                Dir::D2h => {
                    s.d2h_bytes += c.bytes;
                    s.d2h_copies += 1;
                    s.d2h_ns += host_ns;
                }
                Dir::Other => {}
            }
        }
    }
    for &ts in &main.syncs {
        if let Some(i) = find(&steps, ts) {
            steps[i].syncs += 1;
        }
    }
    off_cpu(&mut steps, &main.off_cpu, timeline);
    steps
}

/// Splits the training thread's off-CPU intervals over the steps and, inside each, over the
/// phases in force (see [`Step::blocked_ns`]).
fn off_cpu(steps: &mut [Step], intervals: &[(u64, u64, crate::event::OffCpu)], tl: &Timeline) {
    let mut sorted: Vec<_> = intervals.to_vec();
    sorted.sort_unstable_by_key(|i| i.0);
    let mut first = 0;
    for s in steps.iter_mut() {
        while first < sorted.len() && sorted[first].1 <= s.start_ns {
            first += 1;
        }
        for &(a, b, state) in &sorted[first..] {
            if a >= s.end_ns {
                break;
            }
            let (a, b) = (a.max(s.start_ns), b.min(s.end_ns));
            if b <= a {
                continue;
            }
            let into = if state.blocked() {
                &mut s.blocked_ns
            } else {
                &mut s.runnable_ns
            };
            let split = tl.split(a, b);
            for (sum, ns) in into.iter_mut().zip(split) {
                *sum += ns;
            }
            if state == crate::event::OffCpu::Uninterruptible {
                for (sum, ns) in s.io_ns.iter_mut().zip(split) {
                    *sum += ns;
                }
            }
        }
    }
}
