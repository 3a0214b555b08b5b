//! Engine tests on synthetic traces built with [`Trace`].
use super::*;
use crate::event::{Api, CodeInfo, CopyKind, Event, Kind};

const PID: u32 = 100;
const WORKER: u32 = 101;

const DL: u64 = 0xd1;
const MODULE: u64 = 0x30d;
const OPT: u64 = 0x0b7;
const BWD: u64 = 0xb3d;
const OTHER: u64 = 0x07e;

/// A synthetic event stream for process [`PID`].
#[derive(Default)]
struct Trace {
    items: Vec<StreamItem>,
}

impl Trace {
    fn new() -> Trace {
        Trace::default()
    }

    /// Appends the `Code` items of the test code objects (after the events: lazy classification).
    fn codes(mut self) -> Trace {
        for (ptr, class) in [
            (DL, Class::DataLoaderNext),
            (MODULE, Class::ModuleCall),
            (OPT, Class::OptimizerStep),
            (BWD, Class::Backward),
            (OTHER, Class::Ignore),
        ] {
            self.items.push(StreamItem::Code(Box::new(CodeInfo {
                address: ptr,
                ptr,
                qualname: format!("q{ptr:x}"),
                filename: "f.py".into(),
                class,
            })));
        }
        self
    }

    fn ev(&mut self, ts: u64, tid: u32, kind: Kind) -> &mut Trace {
        self.items.push(StreamItem::Event(Event {
            ts,
            tgid: PID,
            tid,
            kind,
        }));
        self
    }
    fn enter(&mut self, ts: u64, tid: u32, code: u64) -> &mut Trace {
        self.ev(ts, tid, Kind::PyEnter { code, depth: 1 })
    }
    fn exit(&mut self, ts: u64, tid: u32, code: u64) -> &mut Trace {
        self.ev(
            ts,
            tid,
            Kind::PyExit {
                code,
                raised: false,
            },
        )
    }
    fn raise(&mut self, ts: u64, tid: u32, code: u64) -> &mut Trace {
        self.ev(ts, tid, Kind::PyExit { code, raised: true })
    }
    fn call(&mut self, ts: u64, tid: u32, api: Api) -> &mut Trace {
        self.ev(
            ts,
            tid,
            Kind::CallEnter {
                api,
                bytes: None,
                copy: None,
                group: None,
            },
        )
    }
    fn copy(&mut self, ts: u64, tid: u32, api: Api, kind: CopyKind, bytes: u64) -> &mut Trace {
        self.ev(
            ts,
            tid,
            Kind::CallEnter {
                api,
                bytes: Some(bytes),
                copy: Some(kind),
                group: None,
            },
        )
    }
    fn ret(&mut self, ts: u64, tid: u32, api: Api) -> &mut Trace {
        self.ev(ts, tid, Kind::CallExit { api, ret: 0 })
    }
    fn launch(&mut self, ts: u64, tid: u32, api: Api) -> &mut Trace {
        self.ev(ts, tid, Kind::Launch { api, path: None })
    }
    fn rec(&mut self, ts: u64, tid: u32, name: &str) -> &mut Trace {
        self.ev(ts, tid, Kind::RecordEnter { name: name.into() })
    }
    fn rec_end(&mut self, ts: u64, tid: u32) -> &mut Trace {
        self.ev(ts, tid, Kind::RecordExit)
    }

    /// The frame-evaluator probe's detach at `ts` (a `probe_set` item).
    fn detach(&mut self, ts: u64) -> &mut Trace {
        self.items
            .push(StreamItem::ProbeSet(Box::new(crate::event::ProbeSet {
                ts,
                python: false,
                launch_events: true,
                reason: String::new(),
                watching: false,
                python_steady: false,
            })));
        self
    }

    /// Markers only (after a detach), from 1510: the backward and optimizer of step 1, step 2
    /// (DataLoader record at 2000, backward, optimizer), and the record that starts step 3 at 3000.
    fn markers_after_detach(&mut self) -> &mut Trace {
        let (p, dl) = (
            PID,
            "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
        );
        self.call(1510, p, Api::TorchBackward)
            .ret(1710, p, Api::TorchBackward)
            .rec(1720, p, "Optimizer.step#SGD.step")
            .rec_end(1850, p);
        self.rec(2000, p, dl).rec_end(2200, p);
        self.call(2510, p, Api::TorchBackward)
            .ret(2710, p, Api::TorchBackward)
            .rec(2720, p, "Optimizer.step#SGD.step")
            .rec_end(2850, p);
        self.rec(3000, p, dl)
    }

    /// One 1000 ns step of the main thread starting at `b`, no two events at the same instant:
    /// input 250 (the fetch's 200, and the 50 from its return to the model's first call less the
    /// copy), h2d 50 (4096 B), forward 210 (the model's first call to backward: nested modules,
    /// 1 launch), backward 200 (1 launch from another thread),
    /// optimizer 130 (1 launch), gpu_wait 50 (1 sync), residual 110.
    fn step(&mut self, b: u64) -> &mut Trace {
        let t = PID;
        self.enter(b, t, DL)
            .exit(b + 200, t, DL)
            .copy(
                b + 210,
                t,
                Api::CudaMemcpyAsync,
                CopyKind::HostToDevice,
                4096,
            )
            .ret(b + 260, t, Api::CudaMemcpyAsync)
            .enter(b + 300, t, MODULE)
            .enter(b + 350, t, MODULE)
            .launch(b + 360, t, Api::CudaLaunchKernel)
            .exit(b + 400, t, MODULE)
            .exit(b + 500, t, MODULE)
            .call(b + 510, t, Api::TorchBackward)
            .launch(b + 520, WORKER, Api::CudaLaunchKernel)
            .ret(b + 710, t, Api::TorchBackward)
            .rec(b + 720, t, "Optimizer.step#SGD.step")
            .launch(b + 730, t, Api::CudaLaunchKernel)
            .rec_end(b + 850, t)
            .call(b + 900, t, Api::CudaStreamSynchronize)
            .ret(b + 950, t, Api::CudaStreamSynchronize)
    }

    fn run(&self) -> EngineOutput {
        let out = run(&self.items);
        for s in &out.steps {
            assert_eq!(
                s.phase_ns.iter().sum::<u64>(),
                s.duration_ns(),
                "phases must sum to the step: {s:?}"
            );
        }
        out
    }
}

/// Phase ns in [`Phase::ALL`] order from (phase, ns) pairs; the rest 0.
fn phases(pairs: &[(Phase, u64)]) -> [u64; N_PHASES] {
    let mut a = [0; N_PHASES];
    for &(p, ns) in pairs {
        a[p.index()] = ns;
    }
    a
}

fn standard_step_phases() -> [u64; N_PHASES] {
    phases(&[
        (Phase::InputWait, 250),
        (Phase::H2d, 50),
        (Phase::Forward, 210),
        (Phase::Backward, 200),
        (Phase::Optimizer, 130),
        (Phase::GpuWait, 50),
        (Phase::Residual, 110),
    ])
}

#[test]
fn empty_stream() {
    let out = run(&[]);
    assert_eq!(out.boundary, Some(Boundary::None));
    assert!(out.steps.is_empty());
    assert_eq!(out.training_tid, None);
}

#[test]
fn dataloader_steps_with_exact_phases_and_counts() {
    let mut t = Trace::new();
    for k in 0..3 {
        t.step(k * 1000);
    }
    t.enter(3000, PID, DL);
    let out = t.codes().run();
    assert_eq!(out.boundary, Some(Boundary::DataloaderNext));
    assert_eq!(out.training_tid, Some(PID));
    assert_eq!(out.steps.len(), 3);
    assert_eq!(
        out.partial_steps_dropped, 1,
        "the step opened at 3000 never ends"
    );
    assert_eq!(out.unmatched_events, 0);
    assert_eq!(out.reordered_events, 0);
    for (k, s) in out.steps.iter().enumerate() {
        assert_eq!(s.index, k as u32);
        assert_eq!(
            (s.start_ns, s.end_ns),
            (k as u64 * 1000, k as u64 * 1000 + 1000)
        );
        assert_eq!(s.phase_ns, standard_step_phases());
        assert_eq!(
            s.launches,
            phases(&[
                (Phase::Forward, 1),
                (Phase::Backward, 1),
                (Phase::Optimizer, 1)
            ])
            .map(|n| n as u32)
        );
        assert_eq!((s.h2d_bytes, s.h2d_copies, s.h2d_ns), (4096, 1, 50));
        assert_eq!((s.d2h_bytes, s.d2h_copies, s.d2h_ns), (0, 0, 0));
        assert_eq!(s.syncs, 1);
    }
}

#[test]
fn epoch_end_stops_and_restarts_steps() {
    let mut t = Trace::new();
    t.step(0).step(1000);
    // StopIteration: ends step 1 at 2000, starts none.
    t.enter(2000, PID, DL).raise(2010, PID, DL);
    // Evaluation between epochs: not a step.
    t.enter(2500, PID, MODULE).exit(4000, PID, MODULE);
    t.step(5000).step(6000);
    t.enter(7000, PID, DL).exit(7100, PID, DL);
    let out = t.codes().run();
    let spans: Vec<_> = out.steps.iter().map(|s| (s.start_ns, s.end_ns)).collect();
    assert_eq!(spans, [(0, 1000), (1000, 2000), (5000, 6000), (6000, 7000)]);
    assert_eq!(out.partial_steps_dropped, 1);
    // Step 1 runs to the raising entry: its residual includes 1950..2000.
    assert_eq!(out.steps[1].phase_ns, standard_step_phases());
    assert_eq!(
        out.steps.iter().map(|s| s.index).collect::<Vec<_>>(),
        [0, 1, 2, 3]
    );
}

#[test]
fn events_before_first_next_are_dropped() {
    let mut t = Trace::new();
    // Attached mid-step: the end of a forward, a backward.
    t.exit(10, PID, MODULE)
        .call(20, PID, Api::TorchBackward)
        .ret(300, PID, Api::TorchBackward);
    t.step(500).step(1500);
    t.enter(2500, PID, DL);
    let out = t.codes().run();
    assert_eq!(out.steps.len(), 2);
    assert_eq!(out.steps[0].start_ns, 500);
    assert_eq!(
        out.partial_steps_dropped, 2,
        "the attach fragment and the unterminated last step"
    );
    assert_eq!(out.unmatched_events, 1, "the module exit without entry");
    assert_eq!(out.steps[0].phase_ns, standard_step_phases());
}

#[test]
fn lost_exits_and_entries_are_survived() {
    let mut t = Trace::new();
    let p = PID;
    // Step 0: __next__ exit lost; the sync's exit lost (closed by the next event, at 400);
    // an exit without entry.
    t.enter(0, p, DL);
    t.enter(300, p, MODULE)
        .call(350, p, Api::CudaStreamSynchronize);
    t.launch(400, p, Api::CudaLaunchKernel).exit(500, p, MODULE);
    t.exit(600, p, BWD);
    t.rec_end(650, p);
    // Step 1: the next __next__ entry closes the stale one.
    t.enter(1000, p, DL).exit(1100, p, DL);
    // Module exit lost; the backward frame nested in it exits; then the outer OTHER frame exits
    // and closes the module.
    t.enter(1150, p, OTHER)
        .enter(1200, p, MODULE)
        .enter(1300, p, BWD)
        .exit(1400, p, BWD)
        .exit(1600, p, OTHER);
    t.ret(1700, p, Api::CudaDeviceSynchronize);
    t.enter(2000, p, DL);
    let out = t.codes().run();
    assert_eq!(out.steps.len(), 2);
    // Step 0: the stale __next__ holds input_wait until the next entry, except where the sync
    // (350..400) outranks it.
    assert_eq!(
        out.steps[0].phase_ns,
        phases(&[(Phase::InputWait, 950), (Phase::GpuWait, 50)])
    );
    assert_eq!(out.steps[0].launches[Phase::InputWait.index()], 1);
    assert_eq!(out.steps[0].syncs, 1);
    assert_eq!(
        out.steps[1].phase_ns,
        // Input: the fetch, and from its end (1100) to the model's first call (1200).
        // Forward: from there to the backward frame (1300) and the module call (1200..1600,
        // closed by OTHER's exit), less the backward inside.
        phases(&[
            (Phase::InputWait, 200),
            (Phase::Forward, 300),
            (Phase::Backward, 100),
            (Phase::Residual, 400)
        ])
    );
    // Lost: the sync (closed by the launch), bwd exit without entry, record exit without entry,
    // the stale __next__, the module closed by OTHER's exit, the sync exit without entry.
    assert_eq!(out.unmatched_events, 6);
}

#[test]
fn reordered_events_give_the_same_steps() {
    let mut t = Trace::new();
    for k in 0..4 {
        t.step(k * 1000);
    }
    t.enter(4000, PID, DL);
    let t = t.codes();
    let ordered = t.run();
    // Two per-CPU buffers drained one after the other: even events, then odd events.
    let (events, codes): (Vec<_>, Vec<_>) = t
        .items
        .iter()
        .cloned()
        .partition(|i| matches!(i, StreamItem::Event(_)));
    let mut shuffled = Trace::new();
    shuffled.items.extend(events.iter().step_by(2).cloned());
    shuffled
        .items
        .extend(events.iter().skip(1).step_by(2).cloned());
    shuffled.items.extend(codes);
    let out = shuffled.run();
    assert!(out.reordered_events > 0);
    assert_eq!(out.steps, ordered.steps);
    assert_eq!(out.unmatched_events, 0);
}

#[test]
fn nested_record_in_next_is_one_call() {
    let mut t = Trace::new();
    for k in 0..3u64 {
        let b = k * 1000;
        t.enter(b, PID, DL)
            .rec(
                b + 10,
                PID,
                "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
            )
            .rec_end(b + 190, PID)
            .exit(b + 200, PID, DL);
    }
    t.enter(3000, PID, DL);
    let out = t.codes().run();
    assert_eq!(out.steps.len(), 3);
    assert_eq!(
        out.steps[0].phase_ns,
        phases(&[(Phase::InputWait, 200), (Phase::Residual, 800)])
    );
}

#[test]
fn record_only_dataloader_and_optimizer() {
    // No Python probe: torch's record_function names alone.
    let mut t = Trace::new();
    for k in 0..3u64 {
        let b = k * 1000;
        t.rec(
            b,
            PID,
            &"enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"[..40],
        )
        .rec_end(b + 100, PID)
        .rec(b + 600, PID, "Optimizer.step#AdamW.step")
        .rec_end(b + 700, PID)
        .rec(b + 800, PID, "Optimizer.zero_grad#AdamW.zero_grad")
        .rec_end(b + 850, PID);
    }
    let out = t.run();
    assert_eq!(out.boundary, Some(Boundary::DataloaderNext));
    // The last optimizer step is complete at its exit: nothing began after it.
    assert_eq!(out.steps.len(), 3);
    assert_eq!(out.steps[2].end_ns, 2700);
    assert_eq!(out.partial_steps_dropped, 0);
    assert_eq!(
        out.steps[1].phase_ns,
        phases(&[
            (Phase::InputWait, 100),
            (Phase::Optimizer, 100),
            (Phase::Residual, 800)
        ])
    );
}

#[test]
fn optimizer_boundary_without_dataloader() {
    let mut t = Trace::new();
    let p = PID;
    // Attached mid-step: a forward, then the first optimizer step.
    t.enter(0, p, MODULE).exit(100, p, MODULE);
    for k in 0..3u64 {
        let b = 200 + k * 1000;
        // The Python wrapper frame (3.11+) with torch's record inside: one optimizer step.
        t.enter(b, p, OPT)
            .rec(b + 10, p, "Optimizer.step#SGD.step")
            .rec_end(b + 290, p)
            .exit(b + 300, p, OPT);
        t.enter(b + 400, p, MODULE).exit(b + 700, p, MODULE);
    }
    let out = t.codes().run();
    assert_eq!(out.boundary, Some(Boundary::OptimizerStep));
    let spans: Vec<_> = out.steps.iter().map(|s| (s.start_ns, s.end_ns)).collect();
    assert_eq!(spans, [(500, 1500), (1500, 2500)]);
    assert_eq!(
        out.partial_steps_dropped, 2,
        "before the first exit, after the last"
    );
    assert_eq!(
        out.steps[0].phase_ns,
        phases(&[
            (Phase::Forward, 300),
            (Phase::Optimizer, 300),
            (Phase::Residual, 400)
        ])
    );
}

#[test]
fn sync_pattern_boundary_without_dataloader_or_optimizer() {
    let mut t = Trace::new();
    let p = PID;
    for k in 0..4u64 {
        let b = k * 1000;
        t.enter(b, p, MODULE).exit(b + 500, p, MODULE);
        t.call(b + 800, p, Api::CudaStreamSynchronize)
            .ret(b + 900, p, Api::CudaStreamSynchronize);
    }
    // A one-off device sync is not the pattern.
    t.call(3950, p, Api::CudaDeviceSynchronize)
        .ret(3960, p, Api::CudaDeviceSynchronize);
    let out = t.codes().run();
    assert_eq!(out.boundary, Some(Boundary::SyncPattern));
    let spans: Vec<_> = out.steps.iter().map(|s| (s.start_ns, s.end_ns)).collect();
    assert_eq!(spans, [(900, 1900), (1900, 2900), (2900, 3900)]);
    assert_eq!(out.partial_steps_dropped, 2);
    assert_eq!(
        out.steps[0].phase_ns,
        phases(&[
            (Phase::Forward, 500),
            (Phase::GpuWait, 100),
            (Phase::Residual, 400)
        ])
    );
    assert_eq!(out.steps[0].syncs, 1);
}

#[test]
fn no_boundary_no_steps() {
    let mut t = Trace::new();
    t.launch(0, PID, Api::CudaLaunchKernel)
        .enter(10, PID, MODULE)
        .exit(20, PID, MODULE);
    let out = t.codes().run();
    assert_eq!(out.boundary, Some(Boundary::None));
    assert_eq!(out.training_tid, None);
    assert!(out.steps.is_empty());
}

#[test]
fn training_thread_is_the_one_with_most_dataloader_calls() {
    let mut t = Trace::new();
    let train = 107;
    // The main thread iterates a small loader twice (e.g. a probe at startup) and keeps running
    // modules that must not count.
    t.enter(0, PID, DL)
        .exit(10, PID, DL)
        .enter(20, PID, DL)
        .exit(30, PID, DL);
    t.enter(100, PID, MODULE).exit(5000, PID, MODULE);
    for k in 0..4u64 {
        let b = 1000 + k * 1000;
        t.enter(b, train, DL).exit(b + 100, train, DL);
        t.launch(b + 500, PID, Api::CudaLaunchKernel);
    }
    let out = t.codes().run();
    assert_eq!(out.training_tid, Some(train));
    assert_eq!(out.steps.len(), 3);
    assert_eq!(
        out.steps[0].phase_ns,
        phases(&[(Phase::InputWait, 100), (Phase::Residual, 900)])
    );
    // The other thread's launches count, in the training thread's phase at that instant.
    assert_eq!(out.steps[0].launches[Phase::Residual.index()], 1);
}

#[test]
fn precedence_inside_nesting() {
    let mut t = Trace::new();
    let p = PID;
    // h2d inside __next__ (collate moves to the device): h2d wins.
    t.enter(0, p, DL)
        .copy(50, p, Api::CudaMemcpyAsync, CopyKind::HostToDevice, 100)
        .ret(150, p, Api::CudaMemcpyAsync);
    t.exit(200, p, DL);
    // Inside forward: a .item() (D2H copy + sync) and a blocking cudaMemcpy D2H: gpu_wait.
    t.enter(300, p, MODULE).enter(310, p, MODULE);
    t.copy(400, p, Api::CudaMemcpyAsync, CopyKind::DeviceToHost, 4)
        .ret(410, p, Api::CudaMemcpyAsync);
    t.call(420, p, Api::CudaStreamSynchronize)
        .ret(480, p, Api::CudaStreamSynchronize);
    t.copy(500, p, Api::CudaMemcpy, CopyKind::DeviceToHost, 8)
        .ret(550, p, Api::CudaMemcpy);
    // A device-to-device copy has no phase of its own.
    t.copy(560, p, Api::CudaMemcpyAsync, CopyKind::DeviceToDevice, 64)
        .ret(570, p, Api::CudaMemcpyAsync);
    t.exit(590, p, MODULE).exit(600, p, MODULE);
    // A backward frame (3.9/3.10) running module calls (checkpoint recompute): backward.
    t.enter(700, p, BWD)
        .enter(710, p, MODULE)
        .exit(790, p, MODULE)
        .exit(800, p, BWD);
    t.enter(1000, p, DL);
    let out = t.codes().run();
    assert_eq!(out.steps.len(), 1);
    let s = &out.steps[0];
    assert_eq!(
        s.phase_ns,
        phases(&[
            // The fetch, and from its end (200) to the model's first call (300).
            (Phase::InputWait, 200),
            (Phase::H2d, 100),
            // The forward span runs from the model's first call (300) to the backward (700).
            (Phase::Forward, 400 - 120),
            (Phase::GpuWait, 120),
            (Phase::Backward, 100),
            (Phase::Residual, 200),
        ])
    );
    assert_eq!((s.h2d_bytes, s.h2d_copies, s.h2d_ns), (100, 1, 100));
    assert_eq!((s.d2h_bytes, s.d2h_copies, s.d2h_ns), (12, 2, 60));
    assert_eq!(s.syncs, 1);
}

#[test]
fn driver_call_nested_in_runtime_call_is_one_copy_and_one_sync() {
    let mut t = Trace::new();
    let p = PID;
    t.enter(0, p, DL).exit(10, p, DL);
    t.copy(100, p, Api::CudaMemcpy, CopyKind::HostToDevice, 1000);
    t.copy(110, p, Api::CuMemcpyHtoD, CopyKind::HostToDevice, 1000)
        .ret(190, p, Api::CuMemcpyHtoD);
    t.ret(200, p, Api::CudaMemcpy);
    t.call(300, p, Api::CudaDeviceSynchronize)
        .call(305, p, Api::CuCtxSynchronize);
    t.ret(390, p, Api::CuCtxSynchronize)
        .ret(400, p, Api::CudaDeviceSynchronize);
    t.enter(1000, p, DL);
    let out = t.codes().run();
    let s = &out.steps[0];
    assert_eq!((s.h2d_bytes, s.h2d_copies, s.h2d_ns), (1000, 1, 100));
    assert_eq!(s.syncs, 1);
    assert_eq!(s.phase(Phase::H2d), 100);
    assert_eq!(s.phase(Phase::GpuWait), 100);
    assert_eq!(out.unmatched_events, 0);
}

#[test]
fn each_launch_is_counted_once_by_its_path() {
    use crate::event::LaunchPath as L;
    let mut t = Trace::new();
    let p = PID;
    let mut via = |ts, tid, api, path| {
        t.ev(
            ts,
            tid,
            Kind::Launch {
                api,
                path: Some(path),
            },
        );
    };
    // cudaLaunchKernel and the runtime's own cuLaunchKernel (called from inside the runtime's
    // text): one launch, the runtime's.
    via(100_000, p, Api::CudaLaunchKernel, L::Runtime);
    via(101_000, p, Api::CuLaunchKernel, L::Nested);
    // cuBLAS's own runtime copy launching 5 µs after an eager kernel: its own launch (a time
    // window would have taken it for the eager kernel's driver call).
    via(106_000, p, Api::CuLaunchKernel, L::Library);
    // Triton's launcher calling the driver directly, on another thread too.
    via(200_000, p, Api::CuLaunchKernelEx, L::Direct);
    via(201_000, WORKER, Api::CuLaunchKernelEx, L::Direct);
    t.enter(0, p, DL).exit(10, p, DL);
    t.enter(1_000_000, p, DL);
    // Recorded before paths were read: a runtime probe's launch is the runtime's, a driver
    // probe's direct.
    t.launch(1_100_000, p, Api::CudaLaunchKernel)
        .launch(1_105_000, p, Api::CuLaunchKernel);
    t.enter(2_000_000, p, DL);
    let out = t.codes().run();
    let s = &out.steps;
    assert_eq!(s[0].launches.iter().sum::<u32>(), 4);
    assert_eq!(s[0].launches_by_path, [1, 1, 2]);
    assert_eq!(s[1].launches_by_path, [1, 0, 1]);
}

#[test]
fn pending_and_ignored_frames_carry_no_phase() {
    let mut t = Trace::new();
    let p = PID;
    t.enter(0, p, DL).exit(100, p, DL);
    // 0x999 has no Code item at all (still pending when the trace ended).
    t.enter(200, p, 0x999)
        .enter(300, p, OTHER)
        .exit(400, p, OTHER)
        .exit(500, p, 0x999);
    t.enter(1000, p, DL);
    let out = t.codes().run();
    assert_eq!(
        out.steps[0].phase_ns,
        phases(&[(Phase::InputWait, 100), (Phase::Residual, 900)])
    );
    assert_eq!(out.unmatched_events, 0);
}

#[test]
fn timeline_split_and_phase_at() {
    let tl = timeline::Timeline::build(
        &[
            (0, 100, Phase::Forward),
            (50, 60, Phase::GpuWait),
            (80, 200, Phase::Backward),
            (300, 300, Phase::H2d),
        ],
        &[],
    );
    assert_eq!(tl.phase_at(0), Phase::Forward);
    assert_eq!(tl.phase_at(55), Phase::GpuWait);
    assert_eq!(tl.phase_at(60), Phase::Forward);
    assert_eq!(tl.phase_at(80), Phase::Backward);
    assert_eq!(tl.phase_at(200), Phase::Residual);
    assert_eq!(tl.phase_at(300), Phase::Residual);
    assert_eq!(
        tl.split(40, 250),
        phases(&[
            (Phase::Forward, 30),
            (Phase::GpuWait, 10),
            (Phase::Backward, 120),
            (Phase::Residual, 50)
        ])
    );
}

#[test]
fn random_lossy_streams_never_panic_and_phases_always_sum() {
    // A small LCG: deterministic, no dependency.
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = |n: u64| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) % n
    };
    let apis = [
        Api::CudaStreamSynchronize,
        Api::CuStreamSynchronize,
        Api::CudaMemcpyAsync,
        Api::CuMemcpyDtoH,
        Api::TorchBackward,
        Api::CudaLaunchKernel,
        Api::CuLaunchKernel,
    ];
    let kinds = [
        CopyKind::HostToDevice,
        CopyKind::DeviceToHost,
        CopyKind::Default,
        CopyKind::Unknown,
    ];
    let names = [
        "enumerate(DataLoader)#X.__next__",
        "Optimizer.step#SGD.step",
        "Optimizer.zero_grad#SGD.zero_grad",
        "x",
    ];
    let mut total_steps = 0;
    for round in 0..20 {
        let mut t = Trace::new();
        let mut ts = 0u64;
        for _ in 0..5_000 {
            ts += next(300);
            // Some events out of order, some at the same instant.
            let at = if next(10) == 0 {
                ts.saturating_sub(next(1000))
            } else {
                ts
            };
            let tid = [PID, PID, PID, WORKER][next(4) as usize];
            let code = [DL, MODULE, OPT, BWD, OTHER, 0x999][next(6) as usize];
            let api = apis[next(apis.len() as u64) as usize];
            match next(9) {
                0 => t.enter(at, tid, code),
                1 => t.exit(at, tid, code),
                2 => t.raise(at, tid, code),
                3 => t.copy(at, tid, api, kinds[next(4) as usize], next(1 << 20)),
                4 => t.call(at, tid, api),
                5 => t.ret(at, tid, api),
                6 => t.launch(at, tid, api),
                7 => t.rec(at, tid, names[next(4) as usize]),
                _ => t.rec_end(at, tid),
            };
        }
        let t = if round % 2 == 0 { t.codes() } else { t };
        let out = t.run();
        for w in out.steps.windows(2) {
            assert!(w[0].end_ns <= w[1].start_ns);
        }
        assert!(out.unmatched_events > 0 && out.reordered_events > 0);
        total_steps += out.steps.len();
    }
    assert!(
        total_steps > 100,
        "the random streams must exercise steps: {total_steps}"
    );
}

/// Lightning's automatic optimization: the batch is fetched, then `optimizer.step(closure)`
/// opens the optimizer record and the closure runs zero_grad, the forward and backward inside
/// it; only the update after backward is the optimizer's. Markers only (no Python probe).
#[test]
fn forward_and_backward_inside_the_optimizer_record_are_their_own() {
    let mut t = Trace::new();
    let p = PID;
    for k in 0..3u64 {
        let b = k * 1000;
        t.rec(
            b,
            p,
            "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
        )
        .rec_end(b + 100, p)
        .rec(b + 150, p, "Optimizer.step#SGD.step")
        .rec(b + 160, p, "Optimizer.zero_grad#SGD.zero_grad")
        .rec_end(b + 180, p)
        .call(b + 500, p, Api::TorchBackward)
        .ret(b + 800, p, Api::TorchBackward)
        .rec_end(b + 900, p);
    }
    t.rec(
        3000,
        p,
        "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
    );
    let out = t.codes().run();
    assert_eq!(out.boundary, Some(Boundary::DataloaderNext));
    assert_eq!(out.steps.len(), 3);
    for s in &out.steps {
        assert_eq!(
            s.phase_ns,
            phases(&[
                (Phase::InputWait, 100),
                // 100..500 less zero_grad's 20.
                (Phase::Forward, 380),
                (Phase::Backward, 300),
                (Phase::Optimizer, 100),
                (Phase::Residual, 20 + 100),
            ])
        );
    }
}

/// A batch fetched with no backward before the next one (evaluation) has no forward span.
#[test]
fn no_forward_span_without_backward() {
    let mut t = Trace::new();
    let p = PID;
    let dl = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__";
    t.rec(0, p, dl).rec_end(100, p);
    t.rec(1000, p, dl).rec_end(1100, p);
    t.call(1500, p, Api::TorchBackward)
        .ret(1600, p, Api::TorchBackward);
    t.rec(2000, p, dl);
    let out = t.codes().run();
    assert_eq!(out.steps.len(), 2);
    assert_eq!(
        out.steps[0].phase_ns,
        phases(&[(Phase::InputWait, 100), (Phase::Residual, 900)])
    );
    assert_eq!(
        out.steps[1].phase_ns,
        phases(&[
            (Phase::InputWait, 100),
            (Phase::Forward, 400),
            (Phase::Backward, 100),
            (Phase::Residual, 400)
        ])
    );
}

/// The governor detaches the frame-evaluator probe mid-frame: open frames report no exit, and
/// the engine closes them at the switch instead of letting them run to the trace's end.
#[test]
fn python_probe_detach_closes_open_frames_at_the_switch() {
    let mut t = Trace::new();
    let p = PID;
    let dl = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__";
    t.step(0);
    // Step 1: the module frame is open when the probe goes (at 1420); the DataLoader record
    // carries the boundary from then on.
    t.enter(1000, p, DL)
        .rec(1010, p, dl)
        .rec_end(1190, p)
        .exit(1200, p, DL)
        .enter(1300, p, MODULE);
    t.detach(1420);
    t.markers_after_detach();
    let out = t.codes().run();
    assert_eq!(out.steps.len(), 3);
    assert_eq!(out.unmatched_events, 0, "a detach is no loss");
    // Step 1: the frame evaluator saw the model's first call (1300), the end of the input's
    // preparation; step 2 has only markers: from the fetch's end to backward is forward.
    assert_eq!(
        out.steps[1].phase_ns,
        phases(&[
            (Phase::InputWait, 300),
            (Phase::Forward, 210),
            (Phase::Backward, 200),
            (Phase::Optimizer, 130),
            (Phase::Residual, 160),
        ])
    );
    assert_eq!(
        out.steps[2].phase_ns,
        phases(&[
            (Phase::InputWait, 200),
            (Phase::Forward, 310),
            (Phase::Backward, 200),
            (Phase::Optimizer, 130),
            (Phase::Residual, 160),
        ])
    );
}

/// The detach lands inside a DataLoader `__next__` frame before torch's record_function of
/// that fetch was entered: the record that follows is the same batch, not a step of its own
/// (a real-torch run counted 81 steps of 80 before).
#[test]
fn python_probe_detach_inside_a_fetch_does_not_split_the_batch() {
    let mut t = Trace::new();
    let p = PID;
    let dl = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__";
    t.step(0);
    // Step 1 starts with the Python frame of the fetch; the probe goes at 1005, before the
    // record (1010).
    t.enter(1000, p, DL);
    t.detach(1005);
    t.rec(1010, p, dl).rec_end(1190, p);
    t.markers_after_detach();
    let out = t.codes().run();
    assert_eq!(out.steps.len(), 3, "the cut fetch is one batch");
    assert_eq!(out.unmatched_events, 0, "a detach is no loss");
    assert_eq!(out.steps[1].phase_ns[Phase::InputWait as usize], 185);
    assert_eq!(out.steps[1].phase_ns[Phase::Forward as usize], 320);
}

/// The probes of a program stay registered on its task after an exec and fire in the new
/// program: the exec ends the process's trace, and the new program's first DataLoader call
/// (that would have ended the step the old program's last, StopIteration, fetch started) is
/// not a step of this run (a serve run counted 201 of 200 steps before).
#[test]
fn events_after_the_exec_are_the_new_programs() {
    let mut t = Trace::new();
    let p = PID;
    for i in 0..3 {
        t.step(i * 1000);
    }
    // The old program's final fetch raises StopIteration (seen as a record only: the
    // frame-evaluator probe is detached), then it execs.
    let dl = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__";
    t.rec(3000, p, dl).rec_end(3010, p);
    t.ev(3100, p, Kind::Exec);
    // The new program, 200 ns later, with the old probes: a fetch, a backward, a fetch.
    t.rec(3300, p, dl).rec_end(3400, p);
    t.call(3500, p, Api::TorchBackward)
        .ret(3600, p, Api::TorchBackward);
    t.rec(3700, p, dl).rec_end(3800, p);
    let out = t.codes().run();
    assert_eq!(out.steps.len(), 3, "{:?}", out.steps);
    assert_eq!(out.after_exec_events, 6);
    assert_eq!(out.unmatched_events, 0);
    assert_eq!(out.last_ts, Some(3100));
    // The step the last fetch opened is cut by the exec: partial, not measured.
    assert!(out.steps.iter().all(|s| s.end_ns <= 3000));
}

/// A long run is harvested as it streams: every step is measured exactly, the kept steps are a
/// bounded sample, and what the engine holds does not grow with the run.
#[test]
fn long_streams_are_harvested_with_bounded_state() {
    let mut t = Trace::new().codes();
    let mut e = Engine::new();
    let n: u64 = 30_000;
    let step_ns = 1_000_000; // 1 ms steps: 30 s of stream time, many harvests
    let mut pushed = 0;
    let mut max_held = 0;
    for k in 0..n {
        let mut s = Trace::new();
        // The standard step, scaled: every event offset × 1000.
        s.step(0);
        for item in s.items {
            let StreamItem::Event(mut ev) = item else {
                continue;
            };
            ev.ts = k * step_ns + ev.ts * 1000;
            e.push(&StreamItem::Event(ev));
            pushed += 1;
        }
        if k == 0 {
            for c in std::mem::take(&mut t.items) {
                e.push(&c);
            }
        }
        if k % 1000 == 999 {
            let held: usize = e
                .folds
                .values()
                .map(|f| {
                    let t = f.trace();
                    t.intervals.len() + t.input_calls.len() + t.launches.len() + t.copies.len()
                })
                .sum::<usize>()
                + e.queue.len();
            max_held = max_held.max(held);
        }
    }
    e.push(&StreamItem::Event(Event {
        ts: n * step_ns,
        tgid: PID,
        tid: PID,
        kind: Kind::PyEnter { code: DL, depth: 1 },
    }));
    assert!(pushed > 0);
    let out = e.finish();
    assert_eq!(out.totals.count, n);
    assert!(out.steps.len() <= MAX_STEPS_KEPT, "{}", out.steps.len());
    assert!(out.step_stride >= 8);
    assert_eq!(out.steps[0].index, 0);
    assert!(out.steps.windows(2).all(|w| w[0].index < w[1].index));
    let want: Vec<u64> = standard_step_phases().iter().map(|p| p * 1000).collect();
    assert!(out.steps.iter().all(|s| s.phase_ns.to_vec() == want));
    for (i, p) in want.iter().enumerate() {
        assert_eq!(out.totals.phase_ns[i], p * n);
    }
    assert_eq!(out.totals.h2d_bytes, 4096 * n);
    assert_eq!(out.unmatched_events, 0);
    // The reorder window (200 ms = 200 steps) and one harvest period (2 s) of state at most.
    assert!(max_held < 20 * 2_200, "held {max_held}");
}

/// DDP: the gradient all-reduce is waited for at the end of backward; the wait is its own
/// phase (innermost wins), ended by the marker after it or, unseen, by the next event.
#[test]
fn collective_wait_inside_backward() {
    let mut t = Trace::new();
    let p = PID;
    let dl = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__";
    for k in 0..2u64 {
        let b = k * 1000;
        t.rec(b, p, dl).rec_end(b + 100, p);
        t.call(b + 400, p, Api::TorchBackward);
        t.call(b + 500, p, Api::Collective);
        t.call(b + 600, p, Api::CollectiveWait);
        if k == 0 {
            // The end marker: the function that follows the wait.
            t.ret(b + 750, p, Api::CollectiveWait);
        }
        // Without it (k = 1) the backward's return ends the wait.
        t.ret(b + 800, p, Api::TorchBackward);
        t.rec(b + 850, p, "Optimizer.step#SGD.step")
            .rec_end(b + 900, p);
    }
    t.rec(2000, p, dl);
    let out = t.codes().run();
    assert_eq!(out.steps.len(), 2);
    assert_eq!(
        out.steps[0].phase_ns,
        phases(&[
            (Phase::InputWait, 100),
            (Phase::Forward, 300),
            // The wait follows the issue at 500 with nothing between: blocked from there.
            (Phase::Backward, 150),
            (Phase::CollectiveWait, 250),
            (Phase::Optimizer, 50),
            (Phase::Residual, 150),
        ])
    );
    assert_eq!(out.steps[1].phase(Phase::CollectiveWait), 300);
    assert!(out.steps.iter().all(|s| s.collectives == 1));
    assert_eq!(
        out.unmatched_events, 1,
        "the wait ended by the backward's return"
    );
}

// ---- Optimizer-step windows: gradient accumulation, fetches ahead, evaluation segments ----

const OPT_REC: &str = "Optimizer.step#SGD.step";

impl Trace {
    /// A DataLoader fetch of `d` ns (the `__next__` frame).
    fn fetch(&mut self, ts: u64, d: u64) -> &mut Trace {
        self.enter(ts, PID, DL).exit(ts + d, PID, DL)
    }
    /// The fetch that raised StopIteration (an epoch's or an evaluation loop's end).
    fn stop(&mut self, ts: u64) -> &mut Trace {
        self.enter(ts, PID, DL).raise(ts + 10, PID, DL)
    }
    /// Forward (a module frame) of `f` ns, then a backward of `b` ns.
    fn fwd_bwd(&mut self, ts: u64, f: u64, b: u64) -> &mut Trace {
        self.enter(ts, PID, MODULE)
            .exit(ts + f, PID, MODULE)
            .call(ts + f, PID, Api::TorchBackward)
            .ret(ts + f + b, PID, Api::TorchBackward)
    }
    /// An evaluation forward of `f` ns: a module frame, no backward.
    fn fwd(&mut self, ts: u64, f: u64) -> &mut Trace {
        self.enter(ts, PID, MODULE).exit(ts + f, PID, MODULE)
    }
    fn opt(&mut self, ts: u64, d: u64) -> &mut Trace {
        self.rec(ts, PID, OPT_REC).rec_end(ts + d, PID)
    }
    fn arm(&mut self, ts: u64, python: bool) -> &mut Trace {
        self.items
            .push(StreamItem::ProbeSet(Box::new(crate::event::ProbeSet {
                ts,
                python,
                launch_events: true,
                reason: String::new(),
                watching: false,
                python_steady: false,
            })));
        self
    }
}

/// A hand-written accumulation loop: 4 × (fetch 50, forward 100, backward 100), then the
/// optimizer (50): each optimizer step is one step of 4 micro-batches, 1050 ns.
#[test]
fn gradient_accumulation_makes_one_step_per_optimizer_step() {
    let mut t = Trace::new();
    let mut ts = 1000;
    for _ in 0..6 {
        for _ in 0..4 {
            t.fetch(ts, 50).fwd_bwd(ts + 50, 100, 100);
            ts += 250;
        }
        t.opt(ts, 50);
        ts += 50;
    }
    t.stop(ts);
    let out = t.codes().run();
    assert_eq!(out.steps.len(), 6, "{:?}", out.steps);
    assert_eq!(
        out.partial_steps_dropped, 0,
        "attached before the first fetch"
    );
    for s in &out.steps {
        assert_eq!(s.micro_batches, 4);
        assert_eq!(s.duration_ns(), 1050);
        assert_eq!(
            s.phase_ns,
            phases(&[
                (Phase::InputWait, 200),
                (Phase::Forward, 400),
                (Phase::Backward, 400),
                (Phase::Optimizer, 50),
            ])
        );
    }
    assert_eq!(out.totals.micro_batches, 24);
    assert_eq!(out.evaluation, EvalTotals::default());
}

/// transformers fetches the whole accumulation window before the first forward
/// (`get_batch_samples`): the fetches ahead do not split the step, and the forwards after the
/// first backward are forward, not residual.
#[test]
fn a_window_of_fetches_ahead_is_one_step() {
    let mut t = Trace::new();
    let mut ts = 1000;
    for _ in 0..5 {
        for i in 0..4 {
            t.fetch(ts + i * 20, 10);
        }
        ts += 80;
        for _ in 0..4 {
            t.fwd_bwd(ts, 100, 100);
            ts += 200;
        }
        t.opt(ts, 50);
        ts += 50;
    }
    t.stop(ts);
    let out = t.codes().run();
    assert_eq!(out.steps.len(), 5);
    for s in &out.steps {
        assert_eq!(s.micro_batches, 4);
        // The fetches, and from the last one's end to the model's first call (10).
        assert_eq!(s.phase(Phase::InputWait), 50);
        // From the model's first call to the first backward, then between backwards.
        assert_eq!(s.phase(Phase::Forward), 400);
        assert_eq!(s.phase(Phase::Backward), 400);
        assert_eq!(s.phase(Phase::Residual), 30, "the gaps between the fetches");
    }
    assert_eq!(out.evaluation.segments, 0);
}

/// A `torch.no_grad()` evaluation of 3 batches (fetch 50, forward 100) after every second
/// optimizer step: evaluation segments, and the training steps keep their own length.
#[test]
fn evaluation_between_optimizer_steps_is_a_segment_not_steps() {
    let mut t = Trace::new();
    let mut ts = 1000;
    for k in 0..6 {
        t.fetch(ts, 50).fwd_bwd(ts + 50, 100, 100).opt(ts + 250, 50);
        ts += 300;
        if k % 2 == 1 && k < 5 {
            for _ in 0..3 {
                t.fetch(ts, 50).fwd(ts + 50, 100);
                ts += 150;
            }
        }
    }
    t.stop(ts);
    let out = t.codes().run();
    assert_eq!(out.steps.len(), 6);
    assert!(out.steps.iter().all(|s| s.duration_ns() == 300));
    assert!(out.steps.iter().all(|s| s.phase(Phase::InputWait) == 50));
    assert_eq!(out.evaluation.segments, 2);
    assert_eq!(out.evaluation.batches, 6);
    assert_eq!(out.evaluation.wall_ns, 900);
    assert_eq!(out.evaluation.phase_ns[Phase::InputWait.index()], 300);
    assert_eq!(out.evaluation.phase_ns[Phase::Forward.index()], 600);
    assert_eq!(out.evaluation.phase_ns[Phase::Residual.index()], 0);
}

/// Lightning's fetcher prefetches one batch: the epoch's first window holds two fetches, the
/// last one's StopIteration comes before the last batch trains; the validation between the
/// epochs (2 batches and its own StopIteration) is one segment of 2 batches.
#[test]
fn a_prefetching_loop_with_validation_between_epochs() {
    let mut t = Trace::new();
    let mut ts = 1000;
    for epoch in 0..2 {
        if epoch == 1 {
            for _ in 0..2 {
                t.fetch(ts, 50).fwd(ts + 50, 100);
                ts += 150;
            }
            t.stop(ts);
            ts += 20;
        }
        t.fetch(ts, 50);
        ts += 50;
        for b in 0..4 {
            if b < 3 {
                t.fetch(ts, 50);
            } else {
                t.stop(ts);
            }
            t.fwd_bwd(ts + 50, 100, 100).opt(ts + 250, 50);
            ts += 300;
        }
    }
    let out = t.codes().run();
    // Every optimizer step: the last one is complete at its exit.
    assert_eq!(out.steps.len(), 8, "{:#?}", out.steps);
    assert!(out.steps.iter().all(|s| s.micro_batches == 1));
    assert_eq!(out.evaluation.segments, 1);
    assert_eq!(out.evaluation.batches, 2);
    assert_eq!(
        out.evaluation.wall_ns, 320,
        "the 2 batches and the StopIteration"
    );
}

/// The run ends in an evaluation longer than any training window: the last step ends where
/// it starts, and it is a segment.
#[test]
fn a_final_evaluation_is_a_segment() {
    let mut t = Trace::new();
    let mut ts = 1000;
    for _ in 0..3 {
        t.fetch(ts, 50).fwd_bwd(ts + 50, 100, 100).opt(ts + 250, 50);
        ts += 300;
    }
    for _ in 0..5 {
        t.fetch(ts, 50).fwd(ts + 50, 100);
        ts += 150;
    }
    let out = t.codes().run();
    assert_eq!(out.steps.len(), 3);
    assert_eq!(out.evaluation.segments, 1);
    assert_eq!(out.evaluation.batches, 5);
    assert_eq!(out.evaluation.wall_ns, 5 * 150, "to its last forward's end");
}

/// Two optimizers per batch (a GAN): the second optimizer step fetched nothing, so it is part
/// of the batch's step.
#[test]
fn two_optimizers_per_batch_are_one_step() {
    let mut t = Trace::new();
    let mut ts = 1000;
    for _ in 0..4 {
        t.fetch(ts, 50).fwd_bwd(ts + 50, 100, 100).opt(ts + 250, 50);
        t.fwd_bwd(ts + 300, 100, 100).opt(ts + 500, 50);
        ts += 550;
    }
    t.stop(ts);
    let out = t.codes().run();
    assert_eq!(out.steps.len(), 4);
    assert!(out.steps.iter().all(|s| s.micro_batches == 2));
    assert!(out.steps.iter().all(|s| s.phase(Phase::Optimizer) == 100));
}

/// Steps taken while the frame-evaluator probe was armed are `learning` and stay out of the
/// steady totals.
#[test]
fn steps_under_the_learning_probe_set_are_marked() {
    let dl = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__";
    let mut t = Trace::new();
    t.arm(0, true);
    let mut ts = 1000;
    for k in 0..6 {
        if k == 2 {
            t.arm(ts + 100, false);
        }
        t.rec(ts, PID, dl)
            .rec_end(ts + 50, PID)
            .call(ts + 150, PID, Api::TorchBackward)
            .ret(ts + 250, PID, Api::TorchBackward)
            .opt(ts + 250, 50);
        ts += 300;
    }
    t.rec(ts, PID, dl);
    let out = t.codes().run();
    assert_eq!(out.steps.len(), 6);
    let learning: Vec<bool> = out.steps.iter().map(|s| s.learning).collect();
    assert_eq!(learning, [true, true, true, false, false, false]);
    assert_eq!(out.steady.count, 3);
    assert_eq!(out.totals.count, 6);
}

/// Micro-batches harvested before the first optimizer step are not cut as DataLoader steps
/// (the first harvest comes 2 s into the stream, the first optimizer step at 3.2 s).
#[test]
fn a_slow_first_accumulation_window_is_not_cut_by_its_fetches() {
    let mut t = Trace::new().codes();
    let ms = 1_000_000;
    let mut ts = ms;
    for _ in 0..3 {
        for _ in 0..8 {
            t.fetch(ts, 50 * ms)
                .fwd_bwd(ts + 50 * ms, 150 * ms, 200 * ms);
            ts += 400 * ms;
        }
        t.opt(ts, 50 * ms);
        ts += 50 * ms;
    }
    t.stop(ts);
    let out = t.run();
    assert_eq!(out.steps.len(), 3, "{:#?}", out.steps);
    assert!(out.steps.iter().all(|s| s.micro_batches == 8));
}

/// Lightning's automatic optimization: the forward and backward run inside the optimizer step
/// (its closure), so the frame-evaluator probe is often detached while the step's Python frame
/// and torch's record_function of the step are both open. The record's exit is then the step's
/// optimizer exit; the evaluation after it is a segment, not the next step's input wait (a
/// real Lightning run counted one validation batch, 36 ms, as a step's input and merged two
/// steps into one of 2 micro-batches before).
#[test]
fn detach_inside_a_closure_optimizer_step_keeps_its_exit() {
    let dl = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__";
    for detach_in_record in [true, false] {
        let mut t = Trace::new();
        let p = PID;
        let mut ts = 1000;
        // Two steps under the frame-evaluator probe: fetch 50 (frame + record), then the
        // optimizer frame holding the record, forward 100 and backward 100 inside it.
        for _ in 0..2 {
            t.enter(ts, p, DL)
                .rec(ts + 5, p, dl)
                .rec_end(ts + 45, p)
                .exit(ts + 50, p, DL);
            t.enter(ts + 60, p, OPT).rec(ts + 70, p, OPT_REC);
            t.fwd_bwd(ts + 80, 100, 100);
            t.rec_end(ts + 300, p).exit(ts + 310, p, OPT);
            ts += 400;
        }
        // The third step: the probe goes inside its backward, or after its record returned.
        t.enter(ts, p, DL)
            .rec(ts + 5, p, dl)
            .rec_end(ts + 45, p)
            .exit(ts + 50, p, DL);
        t.enter(ts + 60, p, OPT).rec(ts + 70, p, OPT_REC);
        t.enter(ts + 80, p, MODULE)
            .exit(ts + 180, p, MODULE)
            .call(ts + 180, p, Api::TorchBackward);
        if detach_in_record {
            t.detach(ts + 200);
            t.ret(ts + 280, p, Api::TorchBackward).rec_end(ts + 300, p);
        } else {
            t.ret(ts + 280, p, Api::TorchBackward).rec_end(ts + 300, p);
            t.detach(ts + 305);
        }
        ts += 400;
        // Markers only: an evaluation of 3 batches (fetch 100 each, no backward), then two
        // training steps, and the fetch that starts a sixth.
        for _ in 0..3 {
            t.rec(ts, p, dl).rec_end(ts + 100, p);
            ts += 120;
        }
        for _ in 0..2 {
            t.rec(ts, p, dl).rec_end(ts + 50, p);
            t.rec(ts + 60, p, OPT_REC)
                .call(ts + 160, p, Api::TorchBackward)
                .ret(ts + 260, p, Api::TorchBackward)
                .rec_end(ts + 300, p);
            ts += 400;
        }
        t.rec(ts, p, dl);
        let out = t.codes().run();
        let label = if detach_in_record {
            "detached inside the record"
        } else {
            "detached after the record"
        };
        assert_eq!(out.steps.len(), 5, "{label}: {:?}", out.steps);
        assert_eq!(out.evaluation.segments, 1, "{label}");
        assert_eq!(out.evaluation.batches, 3, "{label}");
        for (i, s) in out.steps.iter().enumerate() {
            assert_eq!(s.micro_batches, 1, "{label}: step {i}");
            assert!(
                s.phase_ns[Phase::InputWait.index()] <= 50,
                "{label}: step {i} holds evaluation fetches as input: {s:?}"
            );
        }
        // The cut step ends where the evaluation's first fetch begins: 400 after its own fetch.
        assert_eq!(out.steps[2].duration_ns(), 400, "{label}");
    }
}

// ---- Issue 38: the training thread, input wherever it comes from, grad mode, thread states.

impl Trace {
    fn grad(&mut self, ts: u64, tid: u32, enabled: bool) -> &mut Trace {
        self.ev(ts, tid, Kind::GradMode { enabled })
    }
    fn off_cpu(
        &mut self,
        ts: u64,
        tid: u32,
        since: u64,
        state: crate::event::OffCpu,
    ) -> &mut Trace {
        self.ev(ts, tid, Kind::OffCpu { since, state })
    }
}

/// A background thread iterates the DataLoader into a queue; the main thread takes batches
/// from it (blocked in `q.get()`, no DataLoader call of its own), runs forward, backward and the
/// optimizer. The main thread trains; its wait for the queue, up to the model's first call, is
/// input preparation; the feeder's fetches are the input side.
#[test]
fn a_feeder_thread_is_not_the_training_thread() {
    let mut t = Trace::new();
    let feeder = 107;
    for k in 0..5u64 {
        let b = k * 10_000;
        // The feeder fetches much more often than the loop trains (it fills the queue).
        t.enter(b + 100, feeder, DL).exit(b + 9_000, feeder, DL);
        // Main: q.get() blocked until 8_000, forward 8_000-9_000, backward, optimizer.
        t.off_cpu(b + 8_000, PID, b + 500, crate::event::OffCpu::Sleeping);
        t.enter(b + 8_000, PID, MODULE).exit(b + 9_000, PID, MODULE);
        t.call(b + 9_000, PID, Api::TorchBackward)
            .ret(b + 9_600, PID, Api::TorchBackward);
        t.rec(b + 9_700, PID, OPT_REC).rec_end(b + 9_900, PID);
    }
    let out = t.codes().run();
    assert_eq!(out.training_tid, Some(PID));
    assert_eq!(out.boundary, Some(Boundary::OptimizerStep));
    assert_eq!(out.steps.len(), 4);
    let s = &out.steps[0];
    assert_eq!((s.start_ns, s.end_ns), (9_900, 19_900));
    // [9_900, 18_000): waiting for the queue (input); the model's call from 18_000.
    assert_eq!(s.phase(Phase::InputWait), 8_100);
    assert_eq!(s.phase(Phase::Forward), 1_000);
    assert_eq!(s.phase(Phase::Backward), 600);
    assert_eq!(s.phase(Phase::Optimizer), 200);
    assert_eq!(s.blocked_ns[Phase::InputWait.index()], 7_500);
    assert_eq!(s.blocked_ns.iter().sum::<u64>(), 7_500);
    assert!(out.thread_states);
    assert_eq!(out.feeders.len(), 1);
    assert_eq!(out.feeders[0].tid, feeder);
    assert!(out.feeders[0].fetches >= 4);
}

/// Two DataLoaders zipped: both fetches of a step are its input, back to back; neither is an
/// evaluation batch.
#[test]
fn zipped_loaders_are_the_steps_input_not_evaluation() {
    for slow_first in [true, false] {
        let mut t = Trace::new();
        let (a, b) = if slow_first {
            (700_000, 50_000)
        } else {
            (50_000, 700_000)
        };
        let mut ts = 1_000_000;
        for _ in 0..6 {
            t.fetch(ts, a).fetch(ts + a + 2_000, b);
            let f = ts + a + 2_000 + b;
            t.fwd_bwd(f, 100_000, 100_000).opt(f + 200_000, 50_000);
            ts = f + 250_000;
        }
        t.stop(ts);
        let out = t.codes().run();
        assert_eq!(out.evaluation.segments, 0, "slow first: {slow_first}");
        assert_eq!(out.steps.len(), 6, "slow first: {slow_first}");
        for s in &out.steps {
            assert_eq!(s.phase(Phase::InputWait), a + b, "slow first: {slow_first}");
            assert_eq!(s.micro_batches, 1);
        }
    }
}

/// Zipped loaders on a busy machine: the thread preempted for 0.95 ms of a 1 ms gap between the
/// two fetches (in wall time over a tenth of the 2 ms fetch) still fetched them back to back;
/// the same gap spent running (the model's forward of an evaluation) separates them.
#[test]
fn a_preemption_between_zipped_fetches_keeps_them_one_group() {
    for preempted in [false, true] {
        let mut t = Trace::new();
        let (a, b, gap) = (2_000_000, 100_000, 1_000_000);
        let mut ts = 1_000_000;
        for _ in 0..10 {
            t.fetch(ts, a);
            if preempted {
                t.off_cpu(
                    ts + a + gap - 20_000,
                    PID,
                    ts + a + 30_000,
                    crate::event::OffCpu::Runnable,
                );
            }
            t.fetch(ts + a + gap, b);
            let f = ts + a + gap + b;
            t.fwd_bwd(f, 1_000_000, 1_000_000)
                .opt(f + 2_000_000, 500_000);
            ts = f + 2_500_000;
        }
        t.stop(ts);
        let out = t.codes().run();
        // The trace's first windows go to the attach (learning, the window it cut).
        assert!(
            out.steps.len() >= 3,
            "preempted: {preempted}: {:?}",
            out.steps
        );
        for s in &out.steps[1..] {
            if preempted {
                // Both fetches are the step's input (the preemption between them too).
                assert!(s.phase(Phase::InputWait) >= a + b, "{s:?}");
            } else {
                // The slow fetch is a group no backward consumed: not this step's input.
                assert!(s.phase(Phase::InputWait) < a, "{s:?}");
            }
        }
    }
}

/// No DataLoader: a `get_batch()` between the optimizer step and the model's first call is
/// input preparation; `zero_grad` inside it keeps its own phase.
#[test]
fn get_batch_before_the_first_module_call_is_input() {
    let mut t = Trace::new();
    for k in 0..4u64 {
        let b = k * 1_000;
        t.rec(b, PID, "Optimizer.zero_grad#SGD.zero_grad")
            .rec_end(b + 20, PID);
        // get_batch: 20..700 (no marker), forward 700..800, backward 800..900, step 900..1000.
        t.enter(b + 700, PID, MODULE).exit(b + 800, PID, MODULE);
        t.call(b + 800, PID, Api::TorchBackward)
            .ret(b + 900, PID, Api::TorchBackward);
        t.rec(b + 900, PID, OPT_REC).rec_end(b + 1_000, PID);
    }
    let out = t.codes().run();
    assert_eq!(out.steps.len(), 3);
    assert_eq!(
        out.steps[0].phase_ns,
        phases(&[
            (Phase::Residual, 20),
            (Phase::InputWait, 680),
            (Phase::Forward, 100),
            (Phase::Backward, 100),
            (Phase::Optimizer, 100),
        ])
    );
}

/// With the frame-evaluator probe detached (a GPU loop): the batch's first host-to-device
/// copy ends input preparation; host work before the model's first kernel launch is forward
/// (a model may compute on the host before it launches anything).
#[test]
fn the_first_h2d_copy_ends_input_preparation_and_a_launch_does_not() {
    let mut t = Trace::new();
    for k in 0..4u64 {
        let b = k * 1_000;
        // get_batch 0..300, copy 300..350, host work in forward 350..600, kernels from 600.
        t.copy(
            b + 300,
            PID,
            Api::CudaMemcpyAsync,
            CopyKind::HostToDevice,
            100,
        )
        .ret(b + 350, PID, Api::CudaMemcpyAsync);
        t.launch(b + 600, PID, Api::CudaLaunchKernel)
            .launch(b + 650, PID, Api::CudaLaunchKernel);
        t.call(b + 800, PID, Api::TorchBackward)
            .ret(b + 900, PID, Api::TorchBackward);
        t.rec(b + 900, PID, OPT_REC).rec_end(b + 1_000, PID);
    }
    let out = t.codes().run();
    assert_eq!(out.steps.len(), 3);
    assert_eq!(out.steps[0].phase(Phase::InputWait), 300);
    assert_eq!(out.steps[0].phase(Phase::H2d), 50);
    assert_eq!(out.steps[0].phase(Phase::Forward), 450);

    // No copy: nothing marks the batch ready, and the span is forward.
    let mut t = Trace::new();
    for k in 0..4u64 {
        let b = k * 1_000;
        t.launch(b + 600, PID, Api::CudaLaunchKernel);
        t.call(b + 800, PID, Api::TorchBackward)
            .ret(b + 900, PID, Api::TorchBackward);
        t.rec(b + 900, PID, OPT_REC).rec_end(b + 1_000, PID);
    }
    let out = t.codes().run();
    assert_eq!(out.steps[0].phase(Phase::InputWait), 0);
    assert_eq!(out.steps[0].phase(Phase::Forward), 800);
}

/// Evaluation under `torch.no_grad()` over tensors already loaded (no fetch): a segment, and
/// the optimizer's own grad-mode guard is no evaluation.
#[test]
fn grad_mode_off_outside_the_optimizer_is_evaluation() {
    // DataLoader loop (optimizer windows).
    let mut t = Trace::new();
    let mut ts = 1_000;
    for k in 0..6 {
        t.fetch(ts, 50).fwd_bwd(ts + 50, 100, 100);
        t.rec(ts + 250, PID, OPT_REC)
            .grad(ts + 255, PID, false)
            .grad(ts + 295, PID, true)
            .rec_end(ts + 300, PID);
        ts += 300;
        if k == 2 {
            t.grad(ts, PID, false);
            t.enter(ts + 10, PID, MODULE).exit(ts + 400, PID, MODULE);
            t.grad(ts + 500, PID, true);
            ts += 500;
        }
    }
    t.stop(ts);
    let out = t.codes().run();
    assert_eq!(out.steps.len(), 6);
    assert!(
        out.steps.iter().all(|s| s.duration_ns() == 300),
        "{:?}",
        out.steps
    );
    assert_eq!(out.evaluation.segments, 1);
    assert_eq!(out.evaluation.wall_ns, 500);

    // No DataLoader (optimizer-step boundaries).
    let mut t = Trace::new();
    let mut ts = 0;
    for k in 0..6 {
        t.enter(ts + 100, PID, MODULE).exit(ts + 200, PID, MODULE);
        t.call(ts + 200, PID, Api::TorchBackward)
            .ret(ts + 300, PID, Api::TorchBackward);
        t.rec(ts + 300, PID, OPT_REC)
            .grad(ts + 310, PID, false)
            .grad(ts + 390, PID, true)
            .rec_end(ts + 400, PID);
        ts += 400;
        if k == 2 {
            t.grad(ts + 10, PID, false).grad(ts + 600, PID, true);
            ts += 600;
        }
    }
    let out = t.codes().run();
    assert_eq!(out.evaluation.segments, 1);
    assert_eq!(out.evaluation.wall_ns, 590);
    assert_eq!(out.steps.len(), 5);
    assert!(
        out.steps.iter().all(|s| s.duration_ns() <= 400),
        "{:?}",
        out.steps
    );
}

/// Off-CPU intervals split over the phases in force: blocked (I/O apart) and runnable.
#[test]
fn off_cpu_time_is_split_by_phase_and_state() {
    use crate::event::OffCpu;
    let mut t = Trace::new();
    let mut ts = 1_000;
    for _ in 0..4 {
        t.fetch(ts, 500)
            .fwd_bwd(ts + 500, 300, 100)
            .opt(ts + 900, 100);
        // In the fetch: 300 asleep, 100 in I/O; in forward: 50 waiting for a CPU.
        t.off_cpu(ts + 350, PID, ts + 50, OffCpu::Sleeping)
            .off_cpu(ts + 480, PID, ts + 380, OffCpu::Uninterruptible)
            .off_cpu(ts + 650, PID, ts + 600, OffCpu::Runnable);
        ts += 1_000;
    }
    t.stop(ts);
    let out = t.codes().run();
    assert!(out.thread_states);
    let s = &out.steps[1];
    assert_eq!(s.blocked_ns[Phase::InputWait.index()], 400);
    assert_eq!(s.io_ns[Phase::InputWait.index()], 100);
    assert_eq!(s.runnable_ns[Phase::Forward.index()], 50);
    assert_eq!(s.blocked_ns[Phase::Forward.index()], 0);
    assert_eq!(
        out.totals.blocked_ns[Phase::InputWait.index()],
        400 * out.totals.count
    );
}

/// The thread blocks inside a sync (its switch back on CPU is recorded before the sync
/// returns): the whole sync stays GPU wait, and the off-CPU time is GPU wait's blocked time.
#[test]
fn a_switch_back_on_cpu_inside_a_sync_does_not_end_it() {
    use crate::event::OffCpu;
    let mut t = Trace::new();
    let mut ts = 1_000;
    for _ in 0..4 {
        t.fetch(ts, 100)
            .fwd_bwd(ts + 100, 100, 100)
            .opt(ts + 300, 100);
        t.call(ts + 400, PID, Api::CudaStreamSynchronize)
            .off_cpu(ts + 880, PID, ts + 420, OffCpu::Sleeping)
            .ret(ts + 900, PID, Api::CudaStreamSynchronize);
        ts += 1_000;
    }
    t.stop(ts);
    let out = t.codes().run();
    let s = &out.steps[1];
    assert_eq!(s.phase_ns[Phase::GpuWait.index()], 500, "{s:?}");
    assert_eq!(s.blocked_ns[Phase::GpuWait.index()], 460, "{s:?}");
}

/// `clip_grad_norm_` between backward and the optimizer step, and an EMA update after it, run
/// under `torch.no_grad()` in every step: short grad-off spans, no evaluation, in a DataLoader
/// loop and in a loop with no DataLoader (optimizer-step boundaries).
#[test]
fn short_grad_off_spans_in_every_step_are_no_evaluation() {
    let mut t = Trace::new();
    let mut ts = 1_000;
    for _ in 0..6 {
        t.fetch(ts, 50).fwd_bwd(ts + 50, 100, 100);
        // clip_grad_norm_ 250..270, step 270..300, EMA 300..340.
        t.grad(ts + 250, PID, false).grad(ts + 270, PID, true);
        t.opt(ts + 270, 30);
        t.grad(ts + 300, PID, false).grad(ts + 340, PID, true);
        ts += 400;
    }
    t.stop(ts);
    let out = t.codes().run();
    assert_eq!(out.evaluation.segments, 0, "{:?}", out.evaluation);
    // The last step ends at its optimizer exit (the trace's end).
    assert_eq!(out.steps.len(), 6);
    assert!(out.steps[..5].iter().all(|s| s.duration_ns() == 400));

    let mut t = Trace::new();
    let mut ts = 0;
    for _ in 0..6 {
        t.enter(ts + 100, PID, MODULE).exit(ts + 200, PID, MODULE);
        t.call(ts + 200, PID, Api::TorchBackward)
            .ret(ts + 300, PID, Api::TorchBackward);
        t.grad(ts + 300, PID, false).grad(ts + 330, PID, true);
        t.opt(ts + 330, 70);
        ts += 400;
    }
    let out = t.codes().run();
    assert_eq!(out.evaluation.segments, 0, "{:?}", out.evaluation);
    assert_eq!(out.steps.len(), 5);
    assert!(out.steps.iter().all(|s| s.duration_ns() == 400));
}

/// The run's final evaluation (no training batch after it) ends where its last fetch returned,
/// not where the trace ends: the process saves and tears down for a while after.
#[test]
fn a_final_evaluation_ends_with_its_last_fetch() {
    let mut t = Trace::new();
    let mut ts = 1_000;
    for _ in 0..5 {
        t.fetch(ts, 50).fwd_bwd(ts + 50, 100, 100).opt(ts + 250, 50);
        ts += 300;
    }
    // Evaluation: 4 fetches of 100, each followed by a forward of 100, then StopIteration.
    let eval_start = ts;
    for _ in 0..4 {
        t.fetch(ts, 100);
        t.enter(ts + 100, PID, MODULE).exit(ts + 200, PID, MODULE);
        ts += 200;
    }
    t.stop(ts);
    // The teardown: another thread's events, 10_000 later.
    t.launch(ts + 10_000, WORKER, Api::CudaLaunchKernel);
    let out = t.codes().run();
    assert_eq!(out.evaluation.segments, 1, "{:?}", out.evaluation);
    assert_eq!(out.evaluation.batches, 4);
    // From its first fetch to the StopIteration's return.
    assert_eq!(out.evaluation.wall_ns, ts + 10 - eval_start);
}

/// Epochs with a pause between them, seen through torch's markers only: the epoch's last
/// `__next__` (StopIteration) returns like a fetch. The one fetch more than the window's
/// backwards ends the epoch; it is no one-batch evaluation, and the pause is in no step.
#[test]
fn an_epoch_end_seen_by_markers_only_is_no_evaluation() {
    const DL_REC: &str = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__";
    let mut t = Trace::new();
    let mut ts = 1_000;
    for _epoch in 0..3 {
        for _ in 0..4 {
            t.rec(ts, PID, DL_REC).rec_end(ts + 50, PID);
            t.call(ts + 150, PID, Api::TorchBackward)
                .ret(ts + 250, PID, Api::TorchBackward);
            t.opt(ts + 250, 50);
            ts += 300;
        }
        // The StopIteration (a marker that returns), then a pause of 5_000.
        t.rec(ts, PID, DL_REC).rec_end(ts + 5, PID);
        ts += 5_000;
    }
    let out = t.codes().run();
    assert_eq!(out.evaluation.segments, 0, "{:?}", out.evaluation);
    assert!(
        out.steps.iter().all(|s| s.duration_ns() == 300),
        "{:?}",
        out.steps
            .iter()
            .map(|s| s.duration_ns())
            .collect::<Vec<_>>()
    );
}

/// Attached in the middle of a window of 4 micro-batches, its libraries probed one after
/// another: before every probe is in (the attach's probe set), fetches are seen without their
/// backwards; then the window's last 2 micro-batches. Neither is evaluation nor a step: the
/// steps are the full windows, 4 micro-batches each.
#[test]
fn the_window_cut_by_the_attach_is_no_step() {
    let mut t = Trace::new();
    let armed = 1_000;
    t.arm(armed, true);
    // Before the probe set: two fetches whose backwards' probe was not in yet.
    t.fetch(100, 50).fetch(400, 50);
    // The cut window's last 2 micro-batches, then its optimizer step.
    let mut ts = armed + 100;
    for _ in 0..2 {
        t.fetch(ts, 50).fwd_bwd(ts + 50, 100, 100);
        ts += 250;
    }
    t.opt(ts, 50);
    ts += 50;
    for _ in 0..5 {
        for _ in 0..4 {
            t.fetch(ts, 50).fwd_bwd(ts + 50, 100, 100);
            ts += 250;
        }
        t.opt(ts, 50);
        ts += 50;
    }
    t.stop(ts);
    let out = t.codes().run();
    assert_eq!(out.evaluation.segments, 0, "{:?}", out.evaluation);
    assert_eq!(out.steps.len(), 5, "{:?}", out.steps);
    assert!(out.steps.iter().all(|s| s.micro_batches == 4));
    assert!(out.steps.iter().all(|s| s.duration_ns() == 1_050));
}

impl Trace {
    /// A function the stack sampler named (`file` decides what it is: see `prep::FuncKind`).
    fn func(&mut self, id: u32, function: &str, file: &str) -> &mut Trace {
        self.items
            .push(StreamItem::Func(Box::new(crate::event::FuncInfo {
                id,
                function: function.into(),
                file: file.into(),
                line: 1,
            })));
        self
    }
    fn stack(&mut self, ts: u64, frames: &[u32]) -> &mut Trace {
        self.items
            .push(StreamItem::Stack(Box::new(crate::event::StackSample {
                ts,
                tid: PID,
                frames: frames.to_vec(),
                lines: Vec::new(),
            })));
        self
    }
}

/// Markers only (the frame evaluator detached, no device), six steps of 1000 ns: a DataLoader
/// fetch (100), 500 ns of the user's own augmentation (300 of them asleep), 100 ns in the model,
/// backward, optimizer. `samples(k, base)` adds step k's stack samples: frames 0 `<module>`,
/// 1 the loop (in an installed package when `framework`), 2 `augment`, 3 a `torch/nn` module,
/// 4 `Tensor.backward`.
fn augment_loop(framework: bool, mut samples: impl FnMut(&mut Trace, u64, u64)) -> EngineOutput {
    use crate::event::OffCpu;
    let dl = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__";
    let site = "/venv/lib/python3.11/site-packages";
    let loop_file = if framework {
        format!("{site}/lightning/fit_loop.py")
    } else {
        "/home/u/train.py".to_owned()
    };
    let mut t = Trace::new();
    t.detach(0)
        .func(0, "<module>", "/home/u/train.py")
        .func(1, "train", &loop_file)
        .func(2, "augment", "/home/u/train.py")
        .func(
            3,
            "Module._call_impl",
            &format!("{site}/torch/nn/modules/module.py"),
        )
        .func(4, "Tensor.backward", &format!("{site}/torch/_tensor.py"));
    for k in 1..=6u64 {
        let b = k * 1_000;
        t.rec(b, PID, dl).rec_end(b + 100, PID);
        t.off_cpu(b + 500, PID, b + 200, OffCpu::Sleeping);
        samples(&mut t, k, b);
        t.call(b + 700, PID, Api::TorchBackward)
            .ret(b + 850, PID, Api::TorchBackward);
        t.rec(b + 860, PID, OPT_REC).rec_end(b + 950, PID);
    }
    t.rec(7_000, PID, dl).rec_end(7_100, PID);
    let out = t.codes().run();
    assert!(
        out.steps.len() >= 4,
        "framework {framework}: {:?}",
        out.steps
    );
    for s in &out.steps {
        let (input, fwd, blocked) = if framework {
            (100, 600, 0)
        } else {
            (600, 100, 300)
        };
        assert_eq!(
            s.phase(Phase::InputWait),
            input,
            "framework {framework}: {s:?}"
        );
        assert_eq!(s.phase(Phase::Forward), fwd, "framework {framework}: {s:?}");
        assert_eq!(s.blocked_ns[Phase::InputWait.index()], blocked, "{s:?}");
        assert_eq!(s.blocked_ns[Phase::Forward.index()], 300 - blocked, "{s:?}");
    }
    out
}

/// The markers alone call fetch-end → backward forward; the samples show the first 5 of its 6
/// samples in the user's `augment`, below a loop in the user's file: those 500 ns are input.
/// The same loop run by a framework (its loop frame in an installed package) is left as it is.
#[test]
fn augmentation_seen_in_stack_samples_is_input() {
    for framework in [false, true] {
        let out = augment_loop(framework, |t, _, b| {
            for s in [150, 250, 350, 450, 550] {
                t.stack(b + s, &[0, 1, 2]);
            }
            t.stack(b + 650, &[0, 1, 3]).stack(b + 750, &[0, 1, 4]);
        });
        let augment_input = out
            .samples
            .iter()
            .filter(|p| p.frames == [0, 1, 2] && p.phase == Phase::InputWait)
            .count();
        let expect = if framework { 0 } else { 5 * out.steps.len() };
        assert_eq!(augment_input, expect, "framework {framework}");
    }
}

/// The same loop sampled sparsely (a service's 10 samples a second): one sample a step, five
/// of six steps' samples in `augment`, one in the model. No step has samples enough of its own;
/// the share pooled over the steps (5 of 6) moves from each step's forward.
#[test]
fn sparse_samples_move_the_pooled_share() {
    for framework in [false, true] {
        augment_loop(framework, |t, k, b| {
            if k == 4 {
                t.stack(b + 650, &[0, 1, 3]);
            } else {
                t.stack(b + 350, &[0, 1, 2]);
            }
        });
    }
}

/// A periodic sampler (every 170 ns, as `--pid`'s every 10 ms) over 60 steps of 1000 ns whose
/// forward span (600 ns) is 530 ns of augmentation and the model's last 70: three or four
/// samples a span, and a fourth exactly when one lands in the model's tail. Each step's own
/// share of prep samples made the model 62.5 ns a step (−11 %); the share pooled over the steps
/// is the sampled share of all the spans (70.75 ns here).
#[test]
fn a_periodic_sampler_moves_augmentation_without_bias() {
    let dl = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__";
    let site = "/venv/lib/python3.11/site-packages";
    let mut t = Trace::new();
    t.detach(0)
        .func(0, "<module>", "/home/u/train.py")
        .func(1, "train", "/home/u/train.py")
        .func(2, "augment", "/home/u/train.py")
        .func(
            3,
            "Module._call_impl",
            &format!("{site}/torch/nn/modules/module.py"),
        )
        .func(4, "Tensor.backward", &format!("{site}/torch/_tensor.py"));
    const STEPS: u64 = 60;
    let mut sample = 1_011;
    for k in 1..=STEPS {
        let b = k * 1_000;
        t.rec(b, PID, dl).rec_end(b + 100, PID);
        while sample < b + 1_000 {
            let frames: &[u32] = match sample - b {
                100..630 => &[0, 1, 2],
                630..700 => &[0, 1, 3],
                700..850 => &[0, 1, 4],
                _ => &[0, 1],
            };
            t.stack(sample, frames);
            sample += 170;
        }
        t.call(b + 700, PID, Api::TorchBackward)
            .ret(b + 850, PID, Api::TorchBackward);
        t.rec(b + 860, PID, OPT_REC).rec_end(b + 950, PID);
    }
    t.rec((STEPS + 1) * 1_000, PID, dl)
        .rec_end((STEPS + 1) * 1_000 + 100, PID);
    let out = t.codes().run();
    assert!(out.steps.len() >= 50, "{:?}", out.steps.len());
    let n = out.steps.len() as f64;
    let forward = out
        .steps
        .iter()
        .map(|s| s.phase(Phase::Forward))
        .sum::<u64>() as f64
        / n;
    let input = out
        .steps
        .iter()
        .map(|s| s.phase(Phase::InputWait))
        .sum::<u64>() as f64
        / n;
    // Truth: 70 ns of model and 630 of input (100 fetch + 530 augmentation) a step.
    assert!(
        (forward - 70.0).abs() <= 3.5,
        "forward {forward:.1} ns a step, truth 70"
    );
    assert!(
        (input - 630.0).abs() <= 3.5,
        "input {input:.1} ns a step, truth 630"
    );
}

/// 26 steps of 100 ms, so three harvests (the engine harvests every 2 s of stream time and at
/// the end): a fetch (5 ms), the user's augmentation (75 ms), the model (8 ms), backward,
/// optimizer. The sampler (every 10 ms) lands once a step in the model until 2 s, never after:
/// the last harvest's steps alone would find no model and move nothing. They move the share
/// pooled over the run, as the earlier steps do.
#[test]
fn the_last_harvest_moves_the_share_pooled_over_the_run() {
    const MS: u64 = 1_000_000;
    let dl = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__";
    let site = "/venv/lib/python3.11/site-packages";
    let mut t = Trace::new();
    t.detach(0)
        .func(0, "<module>", "/home/u/train.py")
        .func(1, "train", "/home/u/train.py")
        .func(2, "augment", "/home/u/train.py")
        .func(
            3,
            "Module._call_impl",
            &format!("{site}/torch/nn/modules/module.py"),
        );
    const STEPS: u64 = 26;
    for k in 1..=STEPS {
        let b = k * 100 * MS;
        t.rec(b, PID, dl).rec_end(b + 5 * MS, PID);
        for s in 1..=7 {
            t.stack(b + s * 10 * MS, &[0, 1, 2]);
        }
        if b < 2_000 * MS {
            t.stack(b + 85 * MS, &[0, 1, 3]);
        }
        t.call(b + 88 * MS, PID, Api::TorchBackward)
            .ret(b + 95 * MS, PID, Api::TorchBackward);
        t.rec(b + 96 * MS, PID, OPT_REC).rec_end(b + 99 * MS, PID);
    }
    let end = (STEPS + 1) * 100 * MS;
    t.rec(end, PID, dl).rec_end(end + 5 * MS, PID);
    let out = t.codes().run();
    assert_eq!(out.steps.len() as u64, STEPS, "{:?}", out.steps);
    // Pooled: 7 of each step's 8 forward samples until 2 s, 7 of 7 after: 7/8 of the 83 ms
    // forward span moves in the steps before (10.4 ms left), 182/201 in the last harvest's
    // (7.9 ms left; truth: 8 ms). Each harvest's own share would leave all 83 ms there.
    for s in &out.steps {
        let fwd = s.phase(Phase::Forward) as f64 / MS as f64;
        assert!(
            (7.0..=11.0).contains(&fwd),
            "step {} at {} ms: forward {fwd:.1} ms, truth 8 (the pooled share leaves 7.9-10.4)",
            s.index,
            s.start_ns / MS
        );
    }
    // The run's totals at the final pooled share (182 of 201 samples prep): 26 forward spans of
    // 83 ms less 182/201 of them, 204.0 ms, not the 253 ms the harvests' own shares left.
    let fw = out.totals.phase_ns[Phase::Forward.index()] as f64 / MS as f64;
    assert!(
        (fw - 204.0).abs() < 1.0,
        "forward total {fw:.1} ms, pooled 204.0"
    );
    let sum = out.totals.phase_ns.iter().sum::<u64>();
    assert_eq!(sum, out.totals.duration_ns, "phases still sum to the steps");
}

/// An early harvest over the preparation floor, the run under it at the end: the run's totals
/// move nothing (the harvest's move is taken back), whatever the early steps kept.
#[test]
fn a_run_under_the_preparation_floor_at_its_end_moves_nothing() {
    const MS: u64 = 1_000_000;
    let dl = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__";
    let site = "/venv/lib/python3.11/site-packages";
    let mut t = Trace::new();
    t.detach(0)
        .func(0, "<module>", "/home/u/train.py")
        .func(1, "train", "/home/u/train.py")
        .func(2, "log_batch", "/home/u/train.py")
        .func(
            3,
            "Module._call_impl",
            &format!("{site}/torch/nn/modules/module.py"),
        );
    const STEPS: u64 = 26;
    for k in 1..=STEPS {
        let b = k * 100 * MS;
        t.rec(b, PID, dl).rec_end(b + 5 * MS, PID);
        // Until 2 s, 3 of a step's 8 forward samples are the user's code before the model (37 %,
        // over the floor); after, the model holds 60 samples a step: the run ends at 57 prep
        // samples of 19 × 8 + 7 × 60 = 572 (10.0 %)... under it once the last step is in.
        let prep = if b < 2_000 * MS { 3 } else { 0 };
        let model = if b < 2_000 * MS { 5 } else { 60 };
        for s in 0..prep {
            t.stack(b + 6 * MS + s * MS, &[0, 1, 2]);
        }
        for s in 0..model {
            t.stack(b + 10 * MS + s * MS, &[0, 1, 3]);
        }
        t.call(b + 88 * MS, PID, Api::TorchBackward)
            .ret(b + 95 * MS, PID, Api::TorchBackward);
        t.rec(b + 96 * MS, PID, OPT_REC).rec_end(b + 99 * MS, PID);
    }
    let end = (STEPS + 1) * 100 * MS;
    t.rec(end, PID, dl).rec_end(end + 5 * MS, PID);
    let out = t.codes().run();
    assert_eq!(out.steps.len() as u64, STEPS, "{:?}", out.steps);
    // Some early step moved input (its harvest was over the floor) ...
    assert!(
        out.steps
            .iter()
            .any(|s| s.phase(Phase::InputWait) > 5 * MS + MS),
        "{:?}",
        out.steps
    );
    // ... the run's totals did not: every step's input is its 5 ms fetch.
    assert_eq!(
        out.totals.phase_ns[Phase::InputWait.index()],
        STEPS * 5 * MS,
        "{:?}",
        out.totals
    );
}
