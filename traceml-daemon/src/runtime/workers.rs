//! The DataLoader workers' Python stacks, sampled from the daemon (no probe runs in them): each
//! worker process of the target (`procinfo::workers`: a forked or spawned copy of it, not a
//! compiler or a helper it started) that is a Python of a version we read gets a [`StackReader`] of
//! its own (forked or spawned, its own mappings), its main thread's state is found from
//! `_PyRuntime`, and each sample is read with `process_vm_readv` while the worker runs, with the
//! worker's scheduler state from `/proc/<pid>/stat` at that instant; a worker asleep or in I/O
//! also gets what it reads, where it sleeps in a read system call (`host::reads`: the file, its
//! kind and its mount). A child that is not such a Python is remembered and left alone. The
//! cost is the daemon's (a few reads per frame); the worker is not stopped.
use std::collections::HashMap;

use crate::attach::maps;
use crate::attach::memory::TargetMemory;
use crate::attach::pystack::{self, Stack, StackReader};
use crate::attach::python;
use crate::event::{ProcState, ReadSite};
use crate::host::{procinfo, reads};

/// How often the target's workers are listed again (the list reads every thread's
/// `children` file: a torch process has dozens of threads).
pub const RELIST: std::time::Duration = std::time::Duration::from_secs(1);

/// Children followed at once (a DataLoader has a few; a process that forks hundreds is not
/// sampled beyond these).
pub const MAX_WORKERS: usize = 64;

struct WorkerReader {
    /// `starttime` of the process the reader is for (a reused pid is another process).
    start: u64,
    mem: TargetMemory,
    stacks: StackReader,
    runtime: u64,
    tstate: Option<u64>,
    /// The worker's mount table (read once: a worker does not mount).
    mounts: Vec<(String, String, String)>,
}

/// One sample of one worker.
pub struct WorkerSample {
    pub pid: u32,
    pub state: ProcState,
    pub stack: Stack,
    /// What it read, when it slept in a read.
    pub reading: Option<ReadSite>,
}

/// Readers of the target's worker processes, by pid.
#[derive(Default)]
pub struct WorkerStacks {
    readers: HashMap<u32, WorkerReader>,
    /// Children that are not a Python we read (pid → starttime).
    refused: HashMap<u32, u64>,
    /// Samples that could not be read (a torn read, a worker that just exited).
    pub errors: u64,
    /// The workers sampled: those of the last two listings; the last listing, and when.
    kids: Vec<u32>,
    last_listed: Vec<u32>,
    listed: Option<std::time::Instant>,
}

impl WorkerStacks {
    /// One sample of each worker of `parent` now.
    pub fn sample(&mut self, parent: u32) -> Vec<WorkerSample> {
        if self.listed.is_none_or(|t| t.elapsed() >= RELIST) {
            // Workers in two listings in a row: a fork about to exec another program is a copy
            // of the target for a moment (see `sampler::proc::to_sample`).
            let now = procinfo::workers(parent);
            self.kids = now
                .iter()
                .copied()
                .filter(|p| self.last_listed.contains(p))
                .collect();
            self.last_listed = now;
            self.listed = Some(std::time::Instant::now());
        }
        let kids = self.kids.clone();
        self.readers.retain(|pid, _| kids.contains(pid));
        self.refused.retain(|pid, _| kids.contains(pid));
        let mut out = Vec::new();
        for pid in kids.into_iter().take(MAX_WORKERS) {
            let Some(stat) = procinfo::stat(pid) else {
                continue;
            };
            let start = stat.starttime;
            if self.refused.get(&pid) == Some(&start) {
                continue;
            }
            if self.readers.get(&pid).is_some_and(|r| r.start != start) {
                self.readers.remove(&pid);
            }
            if let std::collections::hash_map::Entry::Vacant(slot) = self.readers.entry(pid) {
                match open(pid, start) {
                    Ok(r) => {
                        slot.insert(r);
                    }
                    Err(e) => {
                        tracing::debug!("worker {pid}: no stack samples: {e}");
                        self.refused.insert(pid, start);
                        continue;
                    }
                }
            }
            let r = self.readers.get_mut(&pid).expect("inserted");
            let state = ProcState::from_stat(stat.state);
            let reading = matches!(state, ProcState::Sleeping | ProcState::DiskSleep)
                .then(|| reads::reading(pid, &r.mounts))
                .flatten();
            match read(r) {
                Ok(stack) => out.push(WorkerSample {
                    pid,
                    state,
                    stack,
                    reading,
                }),
                Err(e) => {
                    self.errors += 1;
                    r.tstate = None;
                    tracing::trace!("worker {pid}: stack sample: {e}");
                }
            }
        }
        out
    }
}

fn open(pid: u32, start: u64) -> Result<WorkerReader, String> {
    let mappings = maps::read(pid).map_err(|e| e.to_string())?;
    let py = python::find(pid, &mappings).map_err(|e| e.to_string())?;
    let mem = TargetMemory::new(pid);
    let stacks = StackReader::from_target(&py, &mem).map_err(|e| e.to_string())?;
    let runtime = pystack::runtime_addr(&py).map_err(|e| e.to_string())?;
    Ok(WorkerReader {
        start,
        mem,
        stacks,
        runtime,
        tstate: None,
        mounts: reads::mounts(pid),
    })
}

fn read(r: &mut WorkerReader) -> Result<Stack, pystack::StackError> {
    let tstate = match r.tstate {
        Some(t) => t,
        None => {
            let t = r.stacks.main_or_first_thread(&r.mem, r.runtime)?;
            r.tstate = Some(t);
            t
        }
    };
    r.stacks.read(&r.mem, tstate)
}
