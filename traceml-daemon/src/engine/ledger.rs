//! The collective ledger of one process: each collective it issued (a c10d op through gloo, an
//! NCCL call), with its group, its order on that group (its sequence number), its op, when the
//! process entered it and when the collective wait that followed ended. Kept bounded: the last
//! [`RING`] collectives, the totals exact. Pure: events in, entries out; the job's ranks are
//! joined in [`crate::ranks`] (who the job waits for, desyncs).
//!
//! A collective's entry is the probe on its issue (`ProcessGroupGloo::allreduce`, `ncclAllReduce`:
//! the rank's arrival). Its exit is the end of the first collective wait of the process
//! (`c10d::Work::wait`, DDP's `Reducer::finalize_backward`: a wait a thread entered) that ends
//! after it: exact for a synchronous `dist.all_reduce`, the last bucket's end for DDP's
//! buckets.
use std::collections::{HashMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::event::{Api, CollectiveOp, Kind};

/// Collectives kept per process (the newest).
pub const RING: usize = 4096;
/// Groups told apart per process; the collectives of groups beyond these are counted in
/// [`Ledger::total`] only.
pub const MAX_GROUPS: usize = 64;

/// One collective of one process.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LedgerEntry {
    /// Its order on its group in this process, from 0 at the first one seen.
    pub seq: u64,
    /// The group, by order of first use in this process (0: the first seen). NCCL calls (their
    /// communicator is not read) share one group of their own.
    pub group: u32,
    /// The op (`collective` when the recording did not say).
    pub op: CollectiveOp,
    pub tid: u32,
    pub enter_ts: u64,
    /// The end of the collective wait that followed (`None`: none yet).
    pub exit_ts: Option<u64>,
    /// Bytes, where the call says (NCCL's count × datatype).
    pub bytes: Option<u64>,
}

/// The ledger (see the module's documentation).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Ledger {
    /// The newest collectives, oldest first.
    pub entries: VecDeque<LedgerEntry>,
    /// Collectives issued in all (the ring's and those it let go).
    pub total: u64,
    /// Collectives per group (by the group's index).
    pub per_group: Vec<u64>,
    /// Collectives of groups beyond [`MAX_GROUPS`] (in `total`, in no entry).
    pub other_groups: u64,
    #[serde(skip)]
    groups: HashMap<u64, u32>,
    /// Entries pushed into the ring in all (its positions: the entry pushed n-th is at
    /// `n - 1 - (pushed - len)`).
    #[serde(skip)]
    pushed: u64,
    /// Entries still waiting for an exit, by the number they were pushed as (1-based).
    #[serde(skip)]
    open: Vec<u64>,
    /// Threads inside a collective wait.
    #[serde(skip)]
    waiting: std::collections::HashSet<u32>,
}

/// The key of NCCL calls' group (their communicator is not read).
const NCCL_GROUP: u64 = u64::MAX;

impl Ledger {
    /// Folds one event of the process (in timestamp order).
    pub fn push(&mut self, ts: u64, tid: u32, kind: &Kind) {
        match kind {
            Kind::CallEnter {
                api, bytes, group, ..
            } if api.is_collective() => self.enter(ts, tid, *api, *bytes, *group),
            Kind::CallEnter {
                api: Api::CollectiveWait,
                ..
            } => {
                self.waiting.insert(tid);
            }
            // The end of a wait this thread entered (the exit marker also fires on its own
            // where torch calls it outside a wait: right after an issue).
            Kind::CallExit {
                api: Api::CollectiveWait,
                ..
            } if self.waiting.remove(&tid) => self.exit(ts),
            _ => {}
        }
    }

    fn enter(&mut self, ts: u64, tid: u32, api: Api, bytes: Option<u64>, group: Option<u64>) {
        self.total += 1;
        let key = group.unwrap_or(if api.has_group() { 0 } else { NCCL_GROUP });
        let next = self.groups.len() as u32;
        let g = match self.groups.get(&key) {
            Some(&g) => g,
            None if self.groups.len() < MAX_GROUPS => {
                self.groups.insert(key, next);
                self.per_group.push(0);
                next
            }
            None => {
                self.other_groups += 1;
                return;
            }
        };
        let seq = self.per_group[g as usize];
        self.per_group[g as usize] += 1;
        if self.entries.len() == RING {
            self.entries.pop_front();
        }
        self.entries.push_back(LedgerEntry {
            seq,
            group: g,
            op: api.collective_op().unwrap_or(CollectiveOp::Collective),
            tid,
            enter_ts: ts,
            exit_ts: None,
            bytes,
        });
        self.pushed += 1;
        self.open.push(self.pushed);
        // An entry the ring let go is no longer open.
        let gone = self.pushed - self.entries.len() as u64;
        self.open.retain(|&n| n > gone);
    }

    fn exit(&mut self, ts: u64) {
        let first = self.pushed - self.entries.len() as u64;
        for n in std::mem::take(&mut self.open) {
            let Some(e) = n
                .checked_sub(first + 1)
                .and_then(|i| self.entries.get_mut(i as usize))
            else {
                continue;
            };
            if e.enter_ts <= ts {
                e.exit_ts = Some(ts);
            } else {
                self.open.push(n);
            }
        }
    }

    /// The collectives still open (entered, no wait ended since), oldest first.
    pub fn open(&self) -> impl Iterator<Item = &LedgerEntry> {
        self.entries.iter().filter(|e| e.exit_ts.is_none())
    }

    /// Collectives of group `g`, oldest first.
    pub fn of_group(&self, g: u32) -> impl Iterator<Item = &LedgerEntry> {
        self.entries.iter().filter(move |e| e.group == g)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enter(api: Api, group: Option<u64>) -> Kind {
        Kind::CallEnter {
            api,
            bytes: None,
            copy: None,
            group,
        }
    }

    fn wait_start() -> Kind {
        enter(Api::CollectiveWait, None)
    }

    fn wait_end() -> Kind {
        Kind::CallExit {
            api: Api::CollectiveWait,
            ret: 0,
        }
    }

    #[test]
    fn each_group_counts_its_own_sequence_and_waits_close_them() {
        let mut l = Ledger::default();
        let (a, b) = (Some(0x1000), Some(0x2000));
        l.push(10, 1, &enter(Api::C10dAllReduce, a));
        // The exit marker outside a wait (torch calls it after an issue too) ends nothing.
        l.push(11, 1, &wait_end());
        l.push(15, 1, &wait_start());
        l.push(20, 1, &wait_end());
        l.push(30, 1, &enter(Api::C10dBroadcast, b));
        l.push(40, 1, &enter(Api::C10dAllReduce, a));
        // A launch or a copy is no collective.
        l.push(45, 1, &enter(Api::CudaMemcpy, None));
        l.push(48, 1, &wait_start());
        l.push(50, 1, &wait_end());
        l.push(60, 1, &enter(Api::C10dAllReduce, a));
        let got: Vec<(u32, u64, &str, Option<u64>)> = l
            .entries
            .iter()
            .map(|e| (e.group, e.seq, e.op.as_str(), e.exit_ts))
            .collect();
        assert_eq!(
            got,
            vec![
                (0, 0, "all_reduce", Some(20)),
                (1, 0, "broadcast", Some(50)),
                (0, 1, "all_reduce", Some(50)),
                (0, 2, "all_reduce", None),
            ]
        );
        assert_eq!(l.total, 4);
        assert_eq!(l.per_group, vec![3, 1]);
        assert_eq!(l.open().count(), 1);
    }

    #[test]
    fn the_ring_keeps_the_newest_and_the_totals_stay_exact() {
        let mut l = Ledger::default();
        let n = RING as u64 * 3 + 7;
        for i in 0..n {
            l.push(i * 10, 1, &enter(Api::C10dAllReduce, Some(1)));
            if i % 2 == 0 {
                l.push(i * 10 + 4, 1, &wait_start());
                l.push(i * 10 + 5, 1, &wait_end());
            }
        }
        assert_eq!(l.entries.len(), RING);
        assert_eq!(l.total, n);
        assert_eq!(l.per_group, vec![n]);
        assert_eq!(l.entries.back().unwrap().seq, n - 1);
        assert_eq!(l.entries.front().unwrap().seq, n - RING as u64);
        // Every entry but one was closed by a wait after it; open entries never outgrow the
        // ring.
        assert_eq!(l.open().count(), 0);
        l.push(n * 10, 1, &enter(Api::C10dAllReduce, Some(1)));
        assert!(l.open.len() <= RING);
        assert_eq!(l.open().count(), 1);
    }
}
