//! Writes a synthetic binary recording (`.trec`) of a long training run to stdout, for the
//! replay memory bench (`cargo xtask bench --replay-only`): `synth_recording STEPS | traceml-daemon
//! replay /dev/stdin`. The stream is what the markers probe set sees on a plain loop (the
//! frame-evaluator probe detached): per step a DataLoader `record_function`, a 4 KiB H2D copy,
//! two forward launches, `THPEngine_run_backward` with a launch from the autograd thread, an
//! all_reduce of the gradients (its issue with the process group, a collective wait around its
//! completion: one collective of the ledger a step), an `Optimizer.step` `record_function` with
//! a launch, and a stream sync. Step lengths vary
//! (a fixed-seed generator), so the quantile sketches see a spread, and a stack sample and a
//! probe-counter read come every 1,000 steps, as live runs send them.
//!
//! Not a test fixture: the truth of these steps is not asserted here (the engine's unit tests do
//! that on the same step shape); the bench reads the replaying daemon's memory.
use std::io::{BufWriter, Write as _};

use traceml_daemon::event::{
    Api, CopyKind, End, EndReason, Event, Kind, LibraryInfo, ProbeStats, StreamItem, TargetInfo,
};
use traceml_daemon::record::binary::Encoder;

const PID: u32 = 4242;
const AUTOGRAD: u32 = 4243;

fn main() -> std::io::Result<()> {
    let steps: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.replace('_', "").parse().ok())
        .unwrap_or(10_000_000);
    let stdout = std::io::stdout().lock();
    let mut enc = Encoder::new(BufWriter::with_capacity(1 << 20, stdout), "synthetic")?;
    header(&mut enc)?;
    let mut rng: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |span: u64| {
        // xorshift64*: a spread of ±25 % around `span`, fixed seed.
        rng ^= rng >> 12;
        rng ^= rng << 25;
        rng ^= rng >> 27;
        let r = rng.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11;
        span * 3 / 4 + r % (span / 2 + 1)
    };
    let mut t: u64 = 1_000_000_000;
    for k in 0..steps {
        one_step(&mut enc, &mut t, &mut next)?;
        if k % 1000 == 999 {
            // Cumulative hits, as the kernel counts them: per step 4 record_function hits,
            // 3 calls with an exit probe, 3 entry markers (the all_reduce's issue, its wait's
            // start and end), 4 launches.
            let n = k + 1;
            enc.write(&StreamItem::ProbeStats(ProbeStats {
                ts: t,
                exit: 3 * n,
                call_enter: 6 * n,
                record: 4 * n,
                launch: 4 * n,
                ..ProbeStats::default()
            }))?;
        }
    }
    enc.write(&StreamItem::End(End {
        ts: t,
        reason: EndReason::TargetExited,
        target: None,
    }))?;
    enc.finish()?.flush()
}

type Enc = Encoder<BufWriter<std::io::StdoutLock<'static>>>;

/// The target and its two libraries, as the attacher sends them first.
fn header(enc: &mut Enc) -> std::io::Result<()> {
    enc.write(&StreamItem::Target(Box::new(TargetInfo {
        pid: PID,
        comm: "python3".into(),
        cmdline: vec!["python3".into(), "synthetic_train.py".into()],
        python_version: Some("3.11.9".into()),
        num_cpus: 2,
        hostname: "synthetic".into(),
        daemon_version: "synthetic".into(),
        ..TargetInfo::default()
    })))?;
    for (path, role, probes) in [
        (
            "/synthetic/libcudart.so.12",
            "cudart",
            &[
                "cudaLaunchKernel",
                "cudaMemcpyAsync",
                "cudaStreamSynchronize",
            ][..],
        ),
        (
            "/synthetic/libtorch_python.so",
            "torch",
            &["THPEngine_run_backward", "record_function"][..],
        ),
    ] {
        enc.write(&StreamItem::Library(Box::new(LibraryInfo {
            path: path.into(),
            role: role.into(),
            probes: probes.iter().map(|p| p.to_string()).collect(),
            ts: 999_000_000,
        })))?;
    }
    Ok(())
}

fn ev(enc: &mut Enc, ts: u64, tid: u32, kind: Kind) -> std::io::Result<()> {
    enc.write(&StreamItem::Event(Event {
        ts,
        tgid: PID,
        tid,
        kind,
    }))
}

/// A kernel launch (`cudaLaunchKernel`) by thread `tid` at `ts`.
fn launch(enc: &mut Enc, ts: u64, tid: u32) -> std::io::Result<()> {
    ev(
        enc,
        ts,
        tid,
        Kind::Launch {
            api: Api::CudaLaunchKernel,
            path: None,
        },
    )
}

/// One step's events from `*t` on (`next` draws a span around its argument).
fn one_step(enc: &mut Enc, t: &mut u64, next: &mut impl FnMut(u64) -> u64) -> std::io::Result<()> {
    // Input (~200 us), copy (~30 us), forward (~300 us), backward (~250 us), optimizer
    // (~150 us), sync (~50 us), residual (~20 us): about 1 ms per step.
    ev(
        enc,
        *t,
        PID,
        Kind::RecordEnter {
            name: "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__".into(),
        },
    )?;
    *t += next(200_000);
    ev(enc, *t, PID, Kind::RecordExit)?;
    *t += 5_000;
    let call = |api, bytes, copy| Kind::CallEnter {
        api,
        bytes,
        copy,
        group: None,
    };
    ev(
        enc,
        *t,
        PID,
        call(
            Api::CudaMemcpyAsync,
            Some(4096),
            Some(CopyKind::HostToDevice),
        ),
    )?;
    *t += next(30_000);
    ev(
        enc,
        *t,
        PID,
        Kind::CallExit {
            api: Api::CudaMemcpyAsync,
            ret: 0,
        },
    )?;
    for _ in 0..2 {
        *t += next(150_000);
        launch(enc, *t, PID)?;
    }
    *t += 5_000;
    ev(enc, *t, PID, call(Api::TorchBackward, None, None))?;
    *t += 20_000;
    launch(enc, *t, AUTOGRAD)?;
    *t += next(230_000);
    ev(
        enc,
        *t,
        PID,
        Kind::CallExit {
            api: Api::TorchBackward,
            ret: 0,
        },
    )?;
    // One all_reduce of the gradients (a collective of the ledger: its issue with the process
    // group, then a wait around its completion).
    *t += 5_000;
    ev(
        enc,
        *t,
        PID,
        Kind::CallEnter {
            api: Api::C10dAllReduce,
            bytes: None,
            copy: None,
            group: Some(0x7f00_0000_1000),
        },
    )?;
    *t += 5_000;
    ev(enc, *t, PID, call(Api::CollectiveWait, None, None))?;
    *t += next(40_000);
    ev(
        enc,
        *t,
        PID,
        Kind::CallExit {
            api: Api::CollectiveWait,
            ret: 0,
        },
    )?;
    *t += 5_000;
    ev(
        enc,
        *t,
        PID,
        Kind::RecordEnter {
            name: "Optimizer.step#SGD.step".into(),
        },
    )?;
    *t += 10_000;
    launch(enc, *t, PID)?;
    *t += next(140_000);
    ev(enc, *t, PID, Kind::RecordExit)?;
    *t += 5_000;
    ev(enc, *t, PID, call(Api::CudaStreamSynchronize, None, None))?;
    *t += next(50_000);
    ev(
        enc,
        *t,
        PID,
        Kind::CallExit {
            api: Api::CudaStreamSynchronize,
            ret: 0,
        },
    )?;
    *t += next(20_000);
    Ok(())
}
