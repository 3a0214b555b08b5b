//! DataLoader workers' stack samples, folded: per (innermost Python function, scheduler state,
//! busy) a count. A sample is *busy* when the worker was preparing a batch (a frame of the
//! DataLoader's fetcher, `torch/utils/data/_utils/fetch.py`, on its stack), otherwise it waited
//! for its next index. Bounded by the functions the workers run, not by the run's length.
use std::collections::{BTreeSet, HashMap, HashSet};

use crate::event::{FuncInfo, ProcState, ReadSite, WorkerStackSample};

/// The file of the DataLoader's fetchers (map-style and iterable): a frame of it on a worker's
/// stack means the worker is making a batch.
pub const FETCH_FILE: &str = "torch/utils/data/_utils/fetch.py";
/// Worker pids remembered (for the count of workers sampled).
const MAX_PIDS: usize = 1024;
/// Files remembered with their samples; the samples of files beyond these count in
/// [`WorkerFold::reads_other`].
pub const MAX_READS: usize = 64;
/// The innermost frame of a sample with no frames.
pub const NO_FRAME: u32 = u32::MAX;

/// The fold (see the module's documentation).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WorkerFold {
    /// (innermost function id, state, busy) → samples.
    pub counts: HashMap<(u32, ProcState, bool), u64>,
    /// Workers sampled (at most [`MAX_PIDS`] remembered).
    pub pids: BTreeSet<u32>,
    pub samples: u64,
    /// Busy samples asleep or in I/O in a read system call, by what they read.
    pub reads: HashMap<ReadSite, u64>,
    /// Such samples of files beyond [`MAX_READS`].
    pub reads_other: u64,
    fetch_funcs: HashSet<u32>,
}

impl WorkerFold {
    /// An empty fold that knows the functions this one knows (a new window's).
    pub fn with_funcs(&self) -> WorkerFold {
        WorkerFold {
            fetch_funcs: self.fetch_funcs.clone(),
            ..WorkerFold::default()
        }
    }

    /// A function named: remembered when it is the DataLoader's fetcher.
    pub fn func(&mut self, f: &FuncInfo) {
        if f.file.ends_with(FETCH_FILE) {
            self.fetch_funcs.insert(f.id);
        }
    }

    pub fn push(&mut self, s: &WorkerStackSample) {
        let busy = s.frames.iter().any(|id| self.fetch_funcs.contains(id));
        let leaf = s.frames.last().copied().unwrap_or(NO_FRAME);
        *self.counts.entry((leaf, s.state, busy)).or_default() += 1;
        self.samples += 1;
        if let Some(r) = s.reading.as_ref().filter(|_| busy) {
            if let Some(n) = self.reads.get_mut(r) {
                *n += 1;
            } else if self.reads.len() < MAX_READS {
                self.reads.insert(r.clone(), 1);
            } else {
                self.reads_other += 1;
            }
        }
        if self.pids.len() < MAX_PIDS {
            self.pids.insert(s.pid);
        }
    }

    /// Samples matching `f`.
    pub fn count(&self, f: impl Fn(ProcState, bool) -> bool) -> u64 {
        self.counts
            .iter()
            .filter(|((_, st, busy), _)| f(*st, *busy))
            .map(|(_, n)| n)
            .sum()
    }

    /// Innermost functions of the samples matching `f`, with their counts.
    pub fn leaves(&self, f: impl Fn(ProcState, bool) -> bool) -> HashMap<u32, u64> {
        let mut out: HashMap<u32, u64> = HashMap::new();
        for ((leaf, st, busy), n) in &self.counts {
            if *leaf != NO_FRAME && f(*st, *busy) {
                *out.entry(*leaf).or_default() += n;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn func(id: u32, file: &str) -> FuncInfo {
        FuncInfo {
            id,
            function: format!("f{id}"),
            file: file.into(),
            line: 1,
        }
    }

    #[test]
    fn busy_samples_are_those_inside_the_fetcher() {
        let mut f = WorkerFold::default();
        f.func(&func(1, "/x/torch/utils/data/_utils/worker.py"));
        f.func(&func(
            2,
            "/x/site-packages/torch/utils/data/_utils/fetch.py",
        ));
        f.func(&func(3, "/job/dataset.py"));
        f.func(&func(4, "/usr/lib/python3.11/multiprocessing/queues.py"));
        let s = |pid, state, frames: &[u32]| WorkerStackSample {
            ts: 0,
            pid,
            state,
            frames: frames.to_vec(),
            reading: None,
        };
        f.push(&s(10, ProcState::Sleeping, &[1, 2, 3]));
        f.push(&s(10, ProcState::Running, &[1, 2, 3]));
        f.push(&s(11, ProcState::Sleeping, &[1, 4]));
        f.push(&s(11, ProcState::Sleeping, &[]));
        assert_eq!(f.samples, 4);
        assert_eq!(f.pids.len(), 2);
        assert_eq!(f.count(|_, busy| busy), 2);
        assert_eq!(f.count(|st, busy| busy && st == ProcState::Sleeping), 1);
        assert_eq!(f.leaves(|_, busy| busy), HashMap::from([(3, 2)]));
        assert_eq!(f.leaves(|_, busy| !busy), HashMap::from([(4, 1)]));
    }
}
