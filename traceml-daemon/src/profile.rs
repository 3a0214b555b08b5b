//! What code fills each phase: the training thread's stack samples, placed in its timeline by
//! the engine, reduced to the functions that hold most of each phase's samples.
//!
//! Attribution: the *loop frame* is the deepest frame shared by at least
//! [`LOOP_FRAME_SHARE`] of the in-step samples (the function running the training loop, e.g.
//! `Trainer._inner_training_loop`). In `residual` a sample counts for what the loop called
//! at that instant (the frame just below the loop frame: `_maybe_log_save_evaluate`,
//! `clip_grad_norm_`, or the loop function itself for statements in its own body), which is the
//! line of the loop to look at. In every other phase it counts for its innermost Python frame
//! (`MyDataset.__getitem__` in input_wait, a module's `forward` in forward), which is where the
//! time goes. Pure: samples and names in, ranking out.
use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::engine::PhaseSample;
use crate::event::FuncInfo;
use crate::phase::{N_PHASES, Phase};

/// Share of in-step samples that must hold a frame for it to be part of the loop's prefix.
pub const LOOP_FRAME_SHARE: f64 = crate::engine::LOOP_QUORUM;
/// Functions listed per phase.
pub const TOP_N: usize = 5;

/// One function and its share of a phase's samples.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TopFunction {
    /// `file:function` as a user would search for it.
    pub function: String,
    pub file: String,
    /// First line of the function.
    pub line: u32,
    /// Share of the phase's samples, 0..1.
    pub share: f64,
    pub samples: u64,
}

/// Where the host waited for the device: a line of Python and what it called there.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WaitSite {
    /// The function executing the line (innermost Python frame) and its file.
    pub function: String,
    pub file: String,
    /// The line that called the wait (`null`: its line could not be read; then only the
    /// function is known).
    pub line: Option<u32>,
    /// `sync` (a synchronize API: `torch.cuda.synchronize()`, a stream's or event's) or
    /// `d2h_copy` (a device-to-host copy that waited for the device: `.item()`, `.cpu()`,
    /// `.tolist()`, a `print` of a CUDA tensor; torch copies to pageable memory).
    pub kind: WaitKind,
    /// The CUDA function the samples were in (`cudaStreamSynchronize`, `cuMemcpyDtoH`, ...).
    pub api: String,
    /// Share of the `gpu_wait` samples taken in a wait, 0..1.
    pub share: f64,
    pub samples: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitKind {
    Sync,
    D2hCopy,
}

impl WaitKind {
    pub fn of(api: crate::event::Api) -> WaitKind {
        if api.is_sync() {
            WaitKind::Sync
        } else {
            WaitKind::D2hCopy
        }
    }

    /// How the card says it.
    pub fn said(self) -> &'static str {
        match self {
            WaitKind::Sync => "sync",
            WaitKind::D2hCopy => "D2H copy",
        }
    }
}

/// Per phase (in [`Phase::ALL`] order), its samples and the functions that hold most of them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Profile {
    pub samples: [u64; N_PHASES],
    pub top: [Vec<TopFunction>; N_PHASES],
    /// The innermost functions of the samples taken while the thread was blocked (asleep or in
    /// I/O), per phase: what the blocked time waited in.
    pub blocked: [Vec<TopFunction>; N_PHASES],
    /// The loop function the residual is attributed under, when found.
    pub loop_function: Option<String>,
    /// The lines the `gpu_wait` samples taken in a sync or D2H copy were called from, most
    /// first ([`TOP_N`]).
    pub wait_sites: Vec<WaitSite>,
}

/// Depth of the loop frame: the longest prefix of frames held by [`LOOP_FRAME_SHARE`] of the
/// samples (a frame is the same when its function id is).
fn loop_depth(samples: &[PhaseSample]) -> Option<usize> {
    crate::engine::loop_prefix(
        samples.iter().map(|s| s.frames.as_slice()),
        LOOP_FRAME_SHARE,
    )
    .len()
    .checked_sub(1)
}

/// Ranks the functions of each phase.
pub fn profile(samples: &[PhaseSample], funcs: &HashMap<u32, FuncInfo>) -> Profile {
    let mut out = Profile::default();
    let depth = loop_depth(samples);
    if let (Some(d), Some(s)) = (depth, samples.first()) {
        out.loop_function = s
            .frames
            .get(d)
            .and_then(|id| funcs.get(id))
            .map(|f| f.function.clone());
    }
    let mut counts: [HashMap<u32, u64>; N_PHASES] = Default::default();
    let mut blocked: [HashMap<u32, u64>; N_PHASES] = Default::default();
    let mut blocked_n = [0u64; N_PHASES];
    for s in samples {
        let key = if s.phase == Phase::Residual {
            depth.and_then(|d| s.frames.get(d + 1).or_else(|| s.frames.get(d)))
        } else {
            s.frames.last()
        };
        let p = s.phase.index();
        out.samples[p] += 1;
        if let Some(&k) = key {
            *counts[p].entry(k).or_default() += 1;
        }
        if s.off_cpu.is_some_and(|o| o.blocked()) {
            blocked_n[p] += 1;
            if let Some(&k) = s.frames.last() {
                *blocked[p].entry(k).or_default() += 1;
            }
        }
    }
    for p in Phase::ALL {
        let i = p.index();
        out.top[i] = ranked(&counts[i], out.samples[i], funcs);
        out.blocked[i] = ranked(&blocked[i], blocked_n[i], funcs);
    }
    out.wait_sites = wait_sites(samples, funcs);
    out
}

/// Whether `file` is in torch's Python package (a `torch/` directory): its wrappers
/// (`Tensor.__format__`, a Python-level `Tensor.item`) are not the line a user changes, their
/// caller is. (A user's own directory named `torch/` is passed over the same way.)
fn in_torch(file: &str) -> bool {
    file.starts_with("torch/") || file.contains("/torch/")
}

/// Where a sample's wait was called: the innermost frame outside torch's Python package whose
/// executing line is known, else the innermost frame (and its line, when known).
fn site_of(s: &PhaseSample, funcs: &HashMap<u32, FuncInfo>) -> Option<(u32, Option<u32>)> {
    let innermost = *s.frames.last()?;
    let known = s
        .frames
        .iter()
        .rev()
        .zip(&s.lines)
        .find(|&(f, &l)| l != 0 && funcs.get(f).is_some_and(|f| !in_torch(&f.file)));
    Some(match known {
        Some((&f, &l)) => (f, Some(l)),
        None => (innermost, s.lines.first().copied().filter(|&l| l != 0)),
    })
}

/// The lines of the waits: `gpu_wait` samples taken in a sync or a D2H copy, by the function
/// and line that called the wait ([`site_of`]) and the API; shares of those samples.
fn wait_sites(samples: &[PhaseSample], funcs: &HashMap<u32, FuncInfo>) -> Vec<WaitSite> {
    let mut counts: HashMap<(u32, Option<u32>, crate::event::Api), u64> = HashMap::new();
    let mut total = 0;
    for s in samples.iter().filter(|s| s.phase == Phase::GpuWait) {
        let (Some(api), Some((f, line))) = (s.wait, site_of(s, funcs)) else {
            continue;
        };
        total += 1;
        *counts.entry((f, line, api)).or_default() += 1;
    }
    let mut ranked: Vec<_> = counts.into_iter().collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    ranked
        .into_iter()
        .take(TOP_N)
        .filter_map(|((id, line, api), n)| {
            let f = funcs.get(&id)?;
            Some(WaitSite {
                function: f.function.clone(),
                file: f.file.clone(),
                line,
                kind: WaitKind::of(api),
                api: api.symbol().to_owned(),
                share: n as f64 / total as f64,
                samples: n,
            })
        })
        .collect()
}

/// The multiprocessing queue a DataLoader's batches arrive by (its `get` receives and unpickles
/// them in the training process) and the pipe under it.
const QUEUE_FILES: [&str; 2] = ["multiprocessing/queues.py", "multiprocessing/connection.py"];
/// Functions that wait for a batch to arrive (the queue empty: a worker has not finished it):
/// the poll under `Queue.get` and the selector under it.
const ARRIVAL_WAITS: [&str; 4] = ["poll", "_poll", "wait", "select"];
/// Unpickling a tensor in the training process (`rebuild_storage_fd`, `rebuild_tensor`): part of
/// the hand-over.
const REBUILD_FILE: &str = "torch/multiprocessing/reductions.py";

/// The training thread's share of its input wait spent taking the workers' finished batches
/// over: reading them off the queue's pipe, unpickling them, rebuilding what they hold.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Handover {
    /// `input_wait` samples.
    pub samples: u64,
    /// Of them, those in the hand-over.
    pub handover: u64,
    /// The innermost functions of the hand-over samples, with their share of them.
    pub functions: Vec<TopFunction>,
}

/// Whether `f` is the bare name or the qualified name (3.11+) of one of `names`.
fn named(f: &FuncInfo, names: &[&str]) -> bool {
    let bare = f.function.rsplit('.').next().unwrap_or(&f.function);
    names.contains(&bare)
}

/// Whether an `input_wait` sample is in the hand-over: a frame of the queue's `get` (or a
/// tensor's rebuild) on its stack, and not waiting there for a batch to arrive (innermost in
/// the poll or the selector under it). Reading the pipe (`_recv_bytes`), unpickling (C, under
/// `get`) and the rebuild functions an item's pickle names all count.
fn in_handover(s: &PhaseSample, funcs: &HashMap<u32, FuncInfo>) -> bool {
    let info = |id: &u32| funcs.get(id);
    let in_queue = s.frames.iter().filter_map(info).any(|f| {
        f.file.ends_with(REBUILD_FILE) || (f.file.ends_with(QUEUE_FILES[0]) && named(f, &["get"]))
    });
    if !in_queue {
        return false;
    }
    let waiting = s.frames.last().and_then(info).is_some_and(|f| {
        (QUEUE_FILES.iter().any(|q| f.file.ends_with(q)) || f.file.ends_with("selectors.py"))
            && named(f, &ARRIVAL_WAITS)
    });
    !waiting
}

/// The hand-over of the training thread's input wait (see [`Handover`]).
pub fn handover(samples: &[PhaseSample], funcs: &HashMap<u32, FuncInfo>) -> Handover {
    let mut out = Handover::default();
    let mut leaves: HashMap<u32, u64> = HashMap::new();
    for s in samples.iter().filter(|s| s.phase == Phase::InputWait) {
        out.samples += 1;
        if in_handover(s, funcs) {
            out.handover += 1;
            if let Some(&leaf) = s.frames.last() {
                *leaves.entry(leaf).or_default() += 1;
            }
        }
    }
    out.functions = ranked(&leaves, out.handover, funcs);
    out
}

/// The [`TOP_N`] functions of `counts`, with their share of `total` samples.
pub fn ranked(
    counts: &HashMap<u32, u64>,
    total: u64,
    funcs: &HashMap<u32, FuncInfo>,
) -> Vec<TopFunction> {
    let mut ranked: Vec<(u32, u64)> = counts.iter().map(|(&k, &n)| (k, n)).collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    ranked
        .into_iter()
        .take(TOP_N)
        .filter_map(|(id, n)| {
            let f = funcs.get(&id)?;
            Some(TopFunction {
                function: f.function.clone(),
                file: f.file.clone(),
                line: f.line,
                share: n as f64 / total as f64,
                samples: n,
            })
        })
        .collect()
}

/// `site-packages/transformers/trainer.py` → `transformers/trainer.py`: the path a user
/// recognises (the part after the last `site-packages/` or `dist-packages/`), else the file name
/// with its parent directory.
pub fn short_file(file: &str) -> &str {
    for marker in ["site-packages/", "dist-packages/"] {
        if let Some(i) = file.rfind(marker) {
            return &file[i + marker.len()..];
        }
    }
    let mut cuts = file.rmatch_indices('/').map(|(i, _)| i);
    match (cuts.next(), cuts.next()) {
        (Some(_), Some(parent)) => &file[parent + 1..],
        _ => file,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn funcs() -> HashMap<u32, FuncInfo> {
        [
            (0, "<module>", "/w/train.py"),
            (
                1,
                "Trainer._inner_training_loop",
                "/v/site-packages/transformers/trainer.py",
            ),
            (
                2,
                "Trainer._maybe_log_save_evaluate",
                "/v/site-packages/transformers/trainer.py",
            ),
            (
                3,
                "clip_grad_norm_",
                "/v/site-packages/torch/nn/utils/clip_grad.py",
            ),
            (
                4,
                "_get_total_norm",
                "/v/site-packages/torch/nn/utils/clip_grad.py",
            ),
            (5, "Ds.__getitem__", "/w/train.py"),
            (
                6,
                "Linear.forward",
                "/v/site-packages/torch/nn/modules/linear.py",
            ),
            (7, "Tensor.item", "/v/site-packages/torch/_tensor.py"),
            (
                8,
                "Queue.get",
                "/usr/lib/python3.11/multiprocessing/queues.py",
            ),
            (
                9,
                "_poll",
                "/usr/lib/python3.11/multiprocessing/connection.py",
            ),
            (10, "select", "/usr/lib/python3.11/selectors.py"),
            (
                11,
                "_recv",
                "/usr/lib/python3.11/multiprocessing/connection.py",
            ),
            (12, "rebuild_record", "/w/train.py"),
        ]
        .into_iter()
        .map(|(id, f, file)| {
            (
                id,
                FuncInfo {
                    id,
                    function: f.into(),
                    file: file.into(),
                    line: 10 + id,
                },
            )
        })
        .collect()
    }

    fn s(phase: Phase, frames: &[u32]) -> PhaseSample {
        PhaseSample {
            off_cpu: None,
            ts: 0,
            step: 0,
            phase,
            frames: frames.to_vec(),
            lines: Vec::new(),
            wait: None,
        }
    }

    #[test]
    fn wait_sites_by_line_and_api() {
        use crate::event::Api;
        let at = |line, wait| PhaseSample {
            lines: vec![line],
            wait,
            ..s(Phase::GpuWait, &[0, 1])
        };
        let mut samples = vec![];
        for _ in 0..5 {
            samples.push(at(88, Some(Api::CudaStreamSynchronize)));
        }
        // Through torch's Python wrapper (`Tensor.item` in torch/_tensor.py, id 7): the
        // caller's line.
        samples.push(PhaseSample {
            lines: vec![133, 88],
            wait: Some(Api::CudaStreamSynchronize),
            ..s(Phase::GpuWait, &[0, 1, 7])
        });
        for _ in 0..3 {
            samples.push(at(91, Some(Api::CudaMemcpy)));
        }
        // The same function, another line: its own site; a gpu_wait sample outside any wait
        // (the span's edges) is not a site's.
        samples.push(at(93, Some(Api::CudaStreamSynchronize)));
        samples.push(at(95, None));
        samples.push(PhaseSample {
            wait: Some(Api::CudaStreamSynchronize),
            ..s(Phase::Forward, &[0, 6])
        });
        let w = profile(&samples, &funcs()).wait_sites;
        let got: Vec<_> = w
            .iter()
            .map(|w| (w.line, w.kind, w.api.as_str(), w.samples))
            .collect();
        assert_eq!(
            got,
            [
                (Some(88), WaitKind::Sync, "cudaStreamSynchronize", 6),
                (Some(91), WaitKind::D2hCopy, "cudaMemcpy", 3),
                (Some(93), WaitKind::Sync, "cudaStreamSynchronize", 1),
            ]
        );
        assert_eq!(w[0].share, 0.6);
        assert_eq!(w[0].function, "Trainer._inner_training_loop");
    }

    #[test]
    fn residual_counts_what_the_loop_called_and_phases_their_leaf() {
        let mut samples = Vec::new();
        for _ in 0..6 {
            samples.push(s(Phase::Residual, &[0, 1, 2]));
        }
        for _ in 0..3 {
            samples.push(s(Phase::Residual, &[0, 1, 3, 4]));
        }
        samples.push(s(Phase::Residual, &[0, 1]));
        for _ in 0..10 {
            samples.push(s(Phase::InputWait, &[0, 1, 5]));
            samples.push(s(Phase::Forward, &[0, 1, 6]));
        }
        let p = profile(&samples, &funcs());
        assert_eq!(
            p.loop_function.as_deref(),
            Some("Trainer._inner_training_loop")
        );
        let r = &p.top[Phase::Residual.index()];
        let names: Vec<(&str, f64)> = r.iter().map(|t| (t.function.as_str(), t.share)).collect();
        assert_eq!(
            names,
            [
                ("Trainer._maybe_log_save_evaluate", 0.6),
                ("clip_grad_norm_", 0.3),
                ("Trainer._inner_training_loop", 0.1)
            ]
        );
        assert_eq!(
            p.top[Phase::InputWait.index()][0].function,
            "Ds.__getitem__"
        );
        assert_eq!(p.top[Phase::Forward.index()][0].function, "Linear.forward");
        assert_eq!(p.samples[Phase::Forward.index()], 10);
        assert!(p.top[Phase::Backward.index()].is_empty());
    }

    #[test]
    fn no_samples_no_functions() {
        let p = profile(&[], &funcs());
        assert_eq!(p.loop_function, None);
        assert!(p.top.iter().all(|t| t.is_empty()));
    }

    #[test]
    fn short_files() {
        assert_eq!(
            short_file("/v/lib/python3.11/site-packages/transformers/trainer.py"),
            "transformers/trainer.py"
        );
        assert_eq!(short_file("/home/u/proj/train.py"), "proj/train.py");
        assert_eq!(short_file("train.py"), "train.py");
    }

    #[test]
    fn the_hand_over_is_taking_a_finished_batch_not_waiting_for_one() {
        let get = [0, 8];
        let mut samples = Vec::new();
        // Waiting for a worker: under the poll, or in the selector under it.
        for tail in [&[9][..], &[9, 10][..]] {
            for _ in 0..3 {
                samples.push(s(Phase::InputWait, &[&get[..], tail].concat()));
            }
        }
        // Reading the pipe, unpickling (C, under `get`), rebuilding a record.
        samples.push(s(Phase::InputWait, &[0, 8, 11]));
        samples.push(s(Phase::InputWait, &get));
        for _ in 0..2 {
            samples.push(s(Phase::InputWait, &[0, 8, 12]));
        }
        // Not in the input wait, or not under the queue: never the hand-over.
        samples.push(s(Phase::Forward, &[0, 8, 12]));
        samples.push(s(Phase::InputWait, &[0, 5]));
        let h = handover(&samples, &funcs());
        assert_eq!((h.samples, h.handover), (11, 4));
        assert_eq!(h.functions[0].function, "rebuild_record");
        assert!((h.functions[0].share - 0.5).abs() < 1e-9);
    }
}
