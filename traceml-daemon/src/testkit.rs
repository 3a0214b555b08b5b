//! Synthetic runs for the unit tests of analysis, diagnosis, render, compare, sweep and
//! metrics: scenarios built into engine output, then summaries.
use crate::analysis::*;
use crate::engine::Boundary;
use crate::engine::{EngineOutput, Step};
use crate::event::{End, LibraryInfo, Lost};
use crate::event::{EndReason, StreamItem, TargetInfo};
use crate::phase::Phase;
use crate::sample::Sample;
use crate::sample::{GpuSample, ProcessSample, SystemSample};
use crate::summary::Summary;

/// A deterministic pseudo-random generator (no dependency, same numbers everywhere).
pub struct Lcg(pub u64);
impl Lcg {
    /// Uniform in [0, 1).
    pub fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// What a synthetic run looks like.
#[derive(Clone)]
pub struct Scenario {
    pub steps: usize,
    /// Mean ms per phase, in `Phase::ALL` order.
    pub phase_ms: [f64; 7],
    /// Relative jitter (0.05 = ±5 %).
    pub jitter: f64,
    pub seed: u64,
    pub workers: usize,
    pub worker_cpu: f64,
    pub gpu: bool,
    pub gpu_util: f64,
    /// RSS growth per step, bytes.
    pub rss_growth: u64,
    pub cuda: bool,
    pub lost: u64,
}

impl Default for Scenario {
    fn default() -> Self {
        Scenario {
            steps: 200,
            phase_ms: [2.0, 1.0, 30.0, 50.0, 8.0, 5.0, 4.0],
            jitter: 0.05,
            seed: 1,
            workers: 4,
            worker_cpu: 50.0,
            gpu: true,
            gpu_util: 85.0,
            rss_growth: 0,
            cuda: true,
            lost: 0,
        }
    }
}

pub fn input_bound() -> Scenario {
    Scenario {
        phase_ms: [70.0, 1.0, 20.0, 25.0, 4.0, 0.5, 2.0],
        workers: 4,
        worker_cpu: 98.0,
        gpu_util: 30.0,
        ..Default::default()
    }
}

pub fn input_fixed() -> Scenario {
    Scenario {
        phase_ms: [3.0, 1.0, 20.0, 25.0, 4.0, 0.5, 2.0],
        workers: 12,
        worker_cpu: 70.0,
        seed: 7,
        ..Default::default()
    }
}

pub fn compute_bound() -> Scenario {
    Scenario {
        phase_ms: [1.0, 0.5, 40.0, 70.0, 10.0, 60.0, 2.0],
        gpu_util: 97.0,
        ..Default::default()
    }
}

pub fn balanced() -> Scenario {
    Scenario {
        phase_ms: [8.0, 4.0, 30.0, 40.0, 8.0, 8.0, 8.0],
        ..Default::default()
    }
}

/// When the synthetic daemon attaches; the first step starts 500 ms later.
const ATTACH_NS: u64 = 1_000_000_000;
const PID: u32 = 4242;

/// The engine output and the stream of a scenario.
pub fn build(sc: &Scenario) -> (EngineOutput, Vec<StreamItem>) {
    let mut rng = Lcg(sc.seed);
    let start = ATTACH_NS + 500_000_000;
    let steps = synthetic_steps(sc, &mut rng, start);
    let end = steps.last().map_or(start, |s| s.end_ns) + 100_000_000;
    let mut items = target_and_libraries(sc);
    items.extend(samples(sc, &mut rng, end));
    items.push(StreamItem::Lost(Lost {
        ring_full: sc.lost,
        ..Lost::default()
    }));
    // Each step has at least a few events.
    for s in &steps {
        for _ in 0..10 {
            items.push(StreamItem::Event(crate::event::Event {
                ts: s.start_ns,
                tgid: PID,
                tid: PID,
                kind: crate::event::Kind::RecordExit,
            }));
        }
    }
    items.push(StreamItem::End(End {
        ts: end,
        reason: EndReason::TargetExited,
        target: None,
    }));
    let engine = EngineOutput {
        steps,
        boundary: Some(Boundary::DataloaderNext),
        training_tid: Some(PID),
        unmatched_events: 0,
        reordered_events: 0,
        partial_steps_dropped: 1,
        ..EngineOutput::default()
    };
    (engine, items)
}

/// `sc.steps` back-to-back steps from `start`, each phase jittered around its mean.
fn synthetic_steps(sc: &Scenario, rng: &mut Lcg, start: u64) -> Vec<Step> {
    let mut t = start;
    let mut steps = Vec::new();
    for i in 0..sc.steps {
        // Scenarios list the single-process phases (no collective wait): residual last.
        let mut phase_ns = [0u64; crate::phase::N_PHASES];
        for (k, ms) in sc.phase_ms.iter().enumerate() {
            let f = 1.0 + sc.jitter * (2.0 * rng.next() - 1.0);
            let p = if k == 6 {
                Phase::Residual
            } else {
                Phase::ALL[k]
            };
            phase_ns[p.index()] = (ms * f * 1e6).max(0.0) as u64;
        }
        let dur: u64 = phase_ns.iter().sum();
        let launches = if sc.cuda {
            [0, 0, 120, 240, 30, 0, 0, 2]
        } else {
            [0; crate::phase::N_PHASES]
        };
        steps.push(Step {
            index: i as u32,
            start_ns: t,
            end_ns: t + dur,
            phase_ns,
            launches,
            h2d_bytes: if sc.cuda { 2 * 6_291_456 } else { 0 },
            d2h_bytes: if sc.cuda { 4 } else { 0 },
            h2d_copies: if sc.cuda { 2 } else { 0 },
            d2h_copies: if sc.cuda { 1 } else { 0 },
            h2d_ns: phase_ns[Phase::H2d.index()],
            d2h_ns: 50_000,
            syncs: if sc.cuda { 1 } else { 0 },
            collectives: 0,
            collective_bytes: 0,
            micro_batches: 1,
            learning: false,
            ..Step::default()
        });
        t += dur;
    }
    steps
}

/// The stream's opening: the target, and the CUDA libraries when the scenario has CUDA.
fn target_and_libraries(sc: &Scenario) -> Vec<StreamItem> {
    let mut items = vec![StreamItem::Target(Box::new(TargetInfo {
        pid: PID,
        comm: "python".into(),
        cmdline: vec![
            "python".into(),
            "train.py".into(),
            "--epochs".into(),
            "3".into(),
        ],
        python_version: Some("3.11.7".into()),
        python_elf: Some("/usr/lib/libpython3.11.so.1.0".into()),
        attach_ts_ns: ATTACH_NS,
        attach_unix_s: 1_767_225_600.0,
        num_cpus: 16,
        mem_total_bytes: Some(64 << 30),
        hostname: "trainer-1".into(),
        daemon_version: "0.1.0".into(),
        launch_count_only: false,
        overhead_budget_pct: None,
        identity: None,
        calibration: None,
    }))];
    if sc.cuda {
        for (path, role) in [
            ("/venv/nvidia/cuda_runtime/lib/libcudart.so.12", "cudart"),
            ("/usr/lib/libcuda.so.1", "cuda_driver"),
        ] {
            items.push(StreamItem::Library(Box::new(LibraryInfo {
                path: path.into(),
                role: role.into(),
                probes: vec![],
                ts: ATTACH_NS,
            })));
        }
    }
    items
}

/// One sample every 500 ms from the attach to `end`; RSS grows with the steps done.
fn samples(sc: &Scenario, rng: &mut Lcg, end: u64) -> Vec<StreamItem> {
    let mut items = Vec::new();
    let mut ts = ATTACH_NS;
    let mut k = 0u64;
    while ts <= end {
        let frac = (ts - ATTACH_NS) as f64 / (end - ATTACH_NS) as f64;
        let steps_done = (frac * sc.steps as f64) as u64;
        let s = sample(sc, rng, ts, k, steps_done);
        items.push(StreamItem::Sample(Box::new(s)));
        ts += 500_000_000;
        k += 1;
    }
    items
}

/// The `k`-th sample, at `ts`, after `steps_done` steps.
fn sample(sc: &Scenario, rng: &mut Lcg, ts: u64, k: u64, steps_done: u64) -> Sample {
    let rss = (2u64 << 30) + steps_done * sc.rss_growth;
    Sample {
        ts,
        system: SystemSample {
            cpu_pct: Some(40.0 + 10.0 * rng.next()),
            mem_used_bytes: Some(20 << 30),
            mem_total_bytes: Some(64 << 30),
        },
        process: Some(ProcessSample {
            pid: PID,
            cpu_pct_one_core: Some(100.0 + 5.0 * rng.next()),
            rss_bytes: Some(rss),
            threads: Some(37),
            cpu_seconds: Some(k as f64 * 0.5),
        }),
        workers: (0..sc.workers)
            .map(|w| ProcessSample {
                pid: 5000 + w as u32,
                cpu_pct_one_core: Some(sc.worker_cpu),
                rss_bytes: Some(300 << 20),
                threads: Some(3),
                cpu_seconds: None,
            })
            .collect(),
        gpus: sc.gpu.then(|| {
            vec![GpuSample {
                index: 0,
                name: Some("NVIDIA H200".into()),
                util_pct: Some(sc.gpu_util),
                mem_used_bytes: Some(20 << 30),
                mem_total_bytes: Some(143_771_000_832),
                temp_c: Some(61.0),
                power_w: Some(420.0),
                power_limit_w: Some(700.0),
                process_mem_bytes: Some((18u64 << 30) + steps_done * sc.rss_growth),
                process_util_pct: None,
            }]
        }),
        gpu_note: None,
    }
}

pub fn summary(sc: &Scenario) -> Summary {
    let (e, items) = build(sc);
    summarize(&e, &items)
}

/// A function that holds `share` of a phase's stack samples.
pub fn top_function(name: &str, file: &str, share: f64) -> crate::profile::TopFunction {
    crate::profile::TopFunction {
        function: name.into(),
        file: file.into(),
        line: 12,
        share,
        samples: (share * 100.0) as u64,
    }
}

/// [`with_thread_and_stacks`]' thread states in phase `p`, shares of its mean: on CPU, blocked, of it in
/// I/O, waiting for a CPU; and the function the blocked time waited in, with its share.
pub fn thread_states(p: Phase) -> ([f64; 4], Option<(&'static str, f64)>) {
    match p {
        Phase::InputWait => (
            [0.02, 0.97, 0.1, 0.01],
            Some(("main.<locals>.get_batch", 1.0)),
        ),
        Phase::GpuWait => ([0.03, 0.97, 0.0, 0.0], Some(("Tensor.item", 1.0))),
        // Under a fifth blocked, or the function under 30 %: no function named.
        Phase::Forward => ([0.85, 0.1, 0.0, 0.05], Some(("Module._call_impl", 0.5))),
        Phase::H2d => ([0.28, 0.72, 0.0, 0.0], Some(("Condition.wait", 0.2))),
        _ => ([0.95, 0.0, 0.0, 0.05], None),
    }
}

/// `s` with the thread states ([`thread_states`]) and stack samples a live run has (the
/// card's THREAD and CODE tables): four functions in each phase, two lines where the GPU
/// waits; the rules run again.
pub fn with_thread_and_stacks(mut s: Summary) -> Summary {
    for p in Phase::ALL {
        let st = &mut s.phases[p];
        let Some(mean) = st.mean_ms else { continue };
        let ([cpu, blocked, io, runnable], within) = thread_states(p);
        st.cpu_ms = Some(mean * cpu);
        st.blocked_ms = Some(mean * blocked);
        st.io_ms = Some(mean * io);
        st.runnable_ms = Some(mean * runnable);
        st.blocked_in = within
            .map(|(f, share)| top_function(f, "/u/train.py", share))
            .into_iter()
            .collect();
        st.top_functions = vec![
            top_function("tok", "/u/workloads/recipes2.py", 0.53),
            top_function(
                "TorchFormatter._tensorize",
                "/v/site-packages/datasets/formatting/torch_formatter.py",
                0.14,
            ),
            top_function("<frozen importlib._bootstrap>", "<frozen importlib>", 0.03),
            top_function("Queue.get", "/usr/lib/python3.11/queue.py", 0.02),
        ];
    }
    s.phases.gpu_wait.wait_sites = [
        (crate::profile::WaitKind::D2hCopy, "cudaMemcpyAsync", 0.92),
        (
            crate::profile::WaitKind::Sync,
            "cudaStreamSynchronize",
            0.08,
        ),
    ]
    .into_iter()
    .map(|(kind, api, share)| crate::profile::WaitSite {
        function: "run".into(),
        file: "/u/workloads/groundtruth.py".into(),
        line: Some(208),
        kind,
        api: api.into(),
        share,
        samples: (share * 100.0) as u64,
    })
    .collect();
    let (primary, findings) = crate::diagnosis::diagnose(&s);
    s.primary_diagnosis = primary;
    s.findings = findings;
    s
}
