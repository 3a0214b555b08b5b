//! A job's collective ledgers joined: who the job waited for at each collective, and where the
//! ranks' calls disagree. Pure: each rank's [`CollectiveLog`] in, [`CollectiveWaits`] out.
//!
//! # Joining
//! A collective ends at the same instant on every rank (within the transport's latency), and a
//! rank's entries of one group are in its own issue order. So per group the entries of each rank
//! are cut into *batches* of equal exit (a synchronous `all_reduce` is a batch of one; DDP's
//! buckets of a step end together at `finalize_backward`), each batch of the lowest rank is
//! matched to the batch of every other rank whose exit is nearest (within [`MATCH_TOLERANCE`] of
//! the gap between the lowest rank's consecutive exits), and matched batches are paired entry by
//! entry, in order. Each pair's sequence numbers vote for the rank's *offset* against the lowest
//! rank (the ranks attached at different collectives: their own numbering starts at different
//! ones); the most voted offset stands, and the collectives are joined by their numbers through
//! it, open ones (no exit yet: a hang) included. A collective library pairs the calls of a group
//! by their order, so one offset holds for the whole run: a rank that skipped a call stays paired
//! one call ahead, and shows at the end as the rank missing from the collective the others are
//! inside.
//!
//! # Who the job waits for
//! At a collective joined across every rank, the last rank to enter is the one the others
//! waited for, by its entry less the median entry of the others (its *lateness*) when that is
//! more than the noise (`max(1 ms, 10 % of the job's median step)`). The rank that was last at
//! the largest share of the collectives, at least 60 % of them (the straggler rule's persistence
//! line), is the one the job waits for.
//!
//! # Desyncs
//! Ranks whose ops differ at one collective (completed or open) are a desync: "rank 1 called
//! broadcast #1043, ranks 0,2,3 all_reduce #1043".
use std::collections::{BTreeMap, HashMap};

use crate::engine::ledger::LedgerEntry;
use crate::event::CollectiveOp;
use crate::summary::{
    CollectiveLog, CollectiveWaits, Desync, JoinedCollective, OpenCollective, RankArrivals, RankOp,
    RankSpan, TIMELINE_KEPT,
};

/// Two batches are one collective when their exits are this share of the lowest rank's median
/// gap between consecutive exits apart, at most.
pub const MATCH_TOLERANCE: f64 = 0.3;
/// A rank is the one the job waited for at a collective when it entered this long after the
/// median of the others, at least (ns), or [`LATE_STEP_SHARE`] of the median step when longer.
pub const LATE_FLOOR_NS: u64 = 1_000_000;
pub const LATE_STEP_SHARE: f64 = 0.10;
/// The share of the joined collectives a rank must be last at to be the one the job waits for:
/// the straggler rule's persistence line (`ranks::STRAGGLER_PERSISTENCE`).
pub const WAITS_FOR_SHARE: f64 = 0.6;
/// Desyncs listed.
pub const MAX_DESYNCS: usize = 8;

/// One rank's entries of one group cut into batches of equal exit (open entries left out).
fn batches(entries: &[&LedgerEntry]) -> Vec<(u64, Vec<usize>)> {
    let mut out: Vec<(u64, Vec<usize>)> = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        let Some(x) = e.exit_ts else { continue };
        match out.last_mut() {
            Some((t, v)) if *t == x => v.push(i),
            _ => out.push((x, vec![i])),
        }
    }
    out
}

/// The batch of `of` whose exit is nearest `t`, within `tol`.
fn nearest(of: &[(u64, Vec<usize>)], t: u64, tol: u64) -> Option<usize> {
    let i = of.partition_point(|b| b.0 < t);
    [i.checked_sub(1), Some(i)]
        .into_iter()
        .flatten()
        .filter(|&j| j < of.len())
        .min_by_key(|&j| of[j].0.abs_diff(t))
        .filter(|&j| of[j].0.abs_diff(t) <= tol)
}

/// One collective joined across ranks: each rank's entry (`None`: not matched).
struct Joined<'a> {
    /// The lowest rank's entry.
    seq: u64,
    group: u32,
    by_rank: Vec<Option<&'a LedgerEntry>>,
}

/// The ranks' ledgers joined (`logs`: (rank, its log), any order); `median_step_ms`: the job's
/// median step, for the lateness that counts. `None` with fewer than two ranks with a ledger.
pub fn join(
    logs: &[(u32, &CollectiveLog)],
    median_step_ms: Option<f64>,
) -> Option<CollectiveWaits> {
    let mut logs: Vec<(u32, &CollectiveLog)> = logs.to_vec();
    logs.sort_by_key(|l| l.0);
    if logs.len() < 2 {
        return None;
    }
    let late_ns = LATE_FLOOR_NS.max(
        median_step_ms
            .filter(|m| m.is_finite() && *m > 0.0)
            .map_or(0, |m| (m * 1e6 * LATE_STEP_SHARE) as u64),
    );
    let groups: Vec<u32> = {
        let mut g: Vec<u32> = logs[0].1.recent.iter().map(|e| e.group).collect();
        g.sort_unstable();
        g.dedup();
        g
    };
    let mut joined: Vec<Joined> = Vec::new();
    let mut open: Vec<OpenCollective> = Vec::new();
    for &g in &groups {
        join_group(&logs, g, &mut joined, &mut open);
    }
    let desyncs = desyncs(&joined, &logs);
    let Arrivals {
        ranks,
        compared,
        waited,
    } = arrivals(&joined, &logs, late_ns);
    let waits_for = ranks
        .iter()
        .max_by(|a, b| a.last_share.total_cmp(&b.last_share))
        .filter(|r| r.last_share >= WAITS_FOR_SHARE)
        .map(|r| r.rank);
    open.sort_by_key(|o| (o.group, o.seq, o.rank));
    Some(CollectiveWaits {
        compared,
        ranks,
        waits_for,
        desyncs,
        open,
        timeline: timeline(&joined, &logs, &waited),
    })
}

/// The entries of group `g` in `log`.
fn of(log: &CollectiveLog, g: u32) -> Vec<&LedgerEntry> {
    log.recent.iter().filter(|e| e.group == g).collect()
}

/// Joins group `g` of every rank's log against the lowest rank's (`logs` sorted by rank):
/// each rank's offset (reference seq − its seq) is the most frequent over the batches matched
/// by exit. Its collectives go to `joined`, the entries still open (aligned by each rank's
/// offset) to `open`.
fn join_group<'a>(
    logs: &[(u32, &'a CollectiveLog)],
    g: u32,
    joined: &mut Vec<Joined<'a>>,
    open: &mut Vec<OpenCollective>,
) {
    let n = logs.len();
    let ref_entries = of(logs[0].1, g);
    let ref_batches = batches(&ref_entries);
    let gaps: Vec<f64> = ref_batches
        .windows(2)
        .map(|w| (w[1].0 - w[0].0) as f64)
        .collect();
    let tol = crate::stats::median(&gaps).map_or(u64::MAX, |m| (m * MATCH_TOLERANCE) as u64);
    let mut by_seq: Vec<HashMap<u64, &LedgerEntry>> = Vec::with_capacity(n);
    let mut offsets: Vec<Option<i64>> = Vec::with_capacity(n);
    for (r, &(_, log)) in logs.iter().enumerate() {
        let entries = of(log, g);
        by_seq.push(entries.iter().map(|e| (e.seq, *e)).collect());
        if r == 0 {
            offsets.push(Some(0));
            continue;
        }
        let theirs = batches(&entries);
        let mut votes: HashMap<i64, u64> = HashMap::new();
        for (t, idx) in &ref_batches {
            let Some(j) = nearest(&theirs, *t, tol) else {
                continue;
            };
            for (&i, &o) in idx.iter().zip(&theirs[j].1) {
                *votes
                    .entry(ref_entries[i].seq as i64 - entries[o].seq as i64)
                    .or_default() += 1;
            }
        }
        offsets.push(
            votes
                .into_iter()
                .max_by_key(|&(off, v)| (v, std::cmp::Reverse(off.unsigned_abs())))
                .map(|(off, _)| off),
        );
    }
    for e in &ref_entries {
        let by_rank = (0..n)
            .map(|r| {
                let off = offsets[r]?;
                let seq = u64::try_from(e.seq as i64 - off).ok()?;
                by_seq[r].get(&seq).copied()
            })
            .collect();
        joined.push(Joined {
            seq: e.seq,
            group: g,
            by_rank,
        });
    }
    for (r, &(rank, log)) in logs.iter().enumerate() {
        let Some(off) = offsets[r] else { continue };
        for e in of(log, g).into_iter().filter(|e| e.exit_ts.is_none()) {
            open.push(OpenCollective {
                rank,
                seq: (e.seq as i64 + off).max(0) as u64,
                group: g,
                op: e.op.as_str().to_owned(),
                enter_ts: e.enter_ts,
            });
        }
    }
}

/// Ops that differ at one collective (completed or open), [`MAX_DESYNCS`] at most.
fn desyncs(joined: &[Joined], logs: &[(u32, &CollectiveLog)]) -> Vec<Desync> {
    let mut desyncs: Vec<Desync> = Vec::new();
    for j in joined {
        let ops: Vec<(u32, CollectiveOp)> = j
            .by_rank
            .iter()
            .zip(logs)
            .filter_map(|(e, l)| e.map(|e| (l.0, e.op)))
            .collect();
        if differ(&ops) && desyncs.len() < MAX_DESYNCS {
            desyncs.push(op_desync(j.seq, j.group, &ops));
        }
    }
    desyncs
}

/// Who arrived last at the collectives every rank completed.
struct Arrivals {
    /// Per rank (in `logs` order): how often it was late by `late_ns` or more, and by how much.
    ranks: Vec<RankArrivals>,
    /// Collectives compared (every rank in them, every one completed).
    compared: u64,
    /// (group, seq) → the rank the others waited for there.
    waited: HashMap<(u32, u64), u32>,
}

fn arrivals(joined: &[Joined], logs: &[(u32, &CollectiveLog)], late_ns: u64) -> Arrivals {
    let n = logs.len();
    let mut ranks: Vec<RankArrivals> = logs
        .iter()
        .map(|l| RankArrivals {
            rank: l.0,
            ..RankArrivals::default()
        })
        .collect();
    let mut lateness: Vec<Vec<f64>> = vec![Vec::new(); n];
    let mut compared = 0u64;
    let mut waited: HashMap<(u32, u64), u32> = HashMap::new();
    for j in joined {
        let Some(entries) = j.by_rank.iter().copied().collect::<Option<Vec<_>>>() else {
            continue;
        };
        if entries.iter().any(|e| e.exit_ts.is_none()) {
            continue;
        }
        compared += 1;
        let (last, e) = entries
            .iter()
            .enumerate()
            .max_by_key(|(_, e)| e.enter_ts)
            .expect("two ranks or more");
        let others: Vec<f64> = entries
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != last)
            .map(|(_, o)| o.enter_ts as f64)
            .collect();
        let Some(mid) = crate::stats::median(&others) else {
            continue;
        };
        let late = e.enter_ts as f64 - mid;
        if late >= late_ns as f64 {
            waited.insert((j.group, j.seq), logs[last].0);
            ranks[last].last += 1;
            ranks[last].caused_ms += late / 1e6;
            lateness[last].push(late / 1e6);
        }
    }
    for (r, l) in ranks.iter_mut().zip(&lateness) {
        r.last_share = if compared > 0 {
            r.last as f64 / compared as f64
        } else {
            0.0
        };
        r.median_late_ms = crate::stats::median(l);
    }
    Arrivals {
        ranks,
        compared,
        waited,
    }
}

/// The newest collectives every rank is in ([`TIMELINE_KEPT`] at most, by entry), for the
/// report's timeline.
fn timeline(
    joined: &[Joined],
    logs: &[(u32, &CollectiveLog)],
    waited: &HashMap<(u32, u64), u32>,
) -> Vec<JoinedCollective> {
    let mut full: Vec<&Joined> = joined
        .iter()
        .filter(|j| j.by_rank.iter().all(Option::is_some))
        .collect();
    full.sort_by_key(|j| j.by_rank[0].map(|e| e.enter_ts));
    full.iter()
        .rev()
        .take(TIMELINE_KEPT)
        .rev()
        .map(|j| JoinedCollective {
            seq: j.seq,
            group: j.group,
            waited_for: waited.get(&(j.group, j.seq)).copied(),
            ranks: j
                .by_rank
                .iter()
                .zip(logs)
                .filter_map(|(e, l)| {
                    e.map(|e| RankSpan {
                        rank: l.0,
                        op: e.op.as_str().to_owned(),
                        enter_ts: e.enter_ts,
                        exit_ts: e.exit_ts,
                    })
                })
                .collect(),
        })
        .collect()
}

/// Whether the known ops of `ops` differ (an op not told apart differs from none).
fn differ(ops: &[(u32, CollectiveOp)]) -> bool {
    let mut known = ops
        .iter()
        .map(|o| o.1)
        .filter(|&o| o != CollectiveOp::Collective);
    match known.next() {
        Some(first) => known.any(|o| o != first),
        None => false,
    }
}

fn op_desync(seq: u64, group: u32, ops: &[(u32, CollectiveOp)]) -> Desync {
    Desync {
        seq,
        group,
        kind: "op".into(),
        ops: ops
            .iter()
            .map(|&(rank, op)| RankOp {
                rank,
                op: op.as_str().into(),
            })
            .collect(),
    }
}

/// Who is inside the newest open collective, by op: "ranks 0,2,3 inside all_reduce #29, rank 1
/// inside barrier #29 (group 0)", and those ranks (`None`: no rank inside one).
pub fn open_said(w: &CollectiveWaits) -> Option<(String, Vec<u32>)> {
    let newest = w.open.iter().max_by_key(|o| (o.seq, o.group))?;
    let at: Vec<&OpenCollective> = w
        .open
        .iter()
        .filter(|o| o.group == newest.group && o.seq == newest.seq)
        .collect();
    let mut by_op: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    for o in &at {
        by_op.entry(o.op.as_str()).or_default().push(o.rank);
    }
    let parts: Vec<String> = by_op
        .iter()
        .map(|(op, r)| {
            let list: Vec<String> = r.iter().map(u32::to_string).collect();
            let who = if r.len() == 1 { "rank" } else { "ranks" };
            format!("{who} {} inside {op} #{}", list.join(","), newest.seq)
        })
        .collect();
    Some((
        format!("{} (group {})", parts.join(", "), newest.group),
        at.iter().map(|o| o.rank).collect(),
    ))
}

/// The card's words for a desync: "rank 1 called broadcast #1043, ranks 0,2,3 all_reduce
/// #1043".
pub fn said(d: &Desync) -> String {
    let mut by_op: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    for o in &d.ops {
        by_op.entry(o.op.as_str()).or_default().push(o.rank);
    }
    let mut parts: Vec<(usize, String, &str)> = by_op
        .into_iter()
        .map(|(op, ranks)| {
            let list: Vec<String> = ranks.iter().map(u32::to_string).collect();
            let who = if ranks.len() == 1 {
                format!("rank {}", list[0])
            } else {
                format!("ranks {}", list.join(","))
            };
            (ranks.len(), who, op)
        })
        .collect();
    // The odd one out first.
    parts.sort_by_key(|p| p.0);
    parts
        .iter()
        .enumerate()
        .map(|(i, (_, who, op))| {
            let verb = if i == 0 { " called" } else { "" };
            format!("{who}{verb} {op} #{}", d.seq)
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn e(seq: u64, op: CollectiveOp, enter: u64, exit: Option<u64>) -> LedgerEntry {
        LedgerEntry {
            seq,
            group: 0,
            op,
            tid: 1,
            enter_ts: enter,
            exit_ts: exit,
            bytes: None,
        }
    }

    /// The logs joined, rank r being `logs[r]`.
    fn join_ranks(logs: &[CollectiveLog], step_ms: Option<f64>) -> CollectiveWaits {
        let refs: Vec<(u32, &CollectiveLog)> = logs
            .iter()
            .enumerate()
            .map(|(r, l)| (r as u32, l))
            .collect();
        join(&refs, step_ms).unwrap()
    }

    fn log(entries: Vec<LedgerEntry>) -> CollectiveLog {
        CollectiveLog {
            total: entries.len() as u64,
            per_group: vec![entries.len() as u64],
            recent: entries,
        }
    }

    /// `n` all_reduces 50 ms apart; rank `slow` enters `late` ms after the others (who enter
    /// 1 ms apart), from `seq0` on.
    fn rank_log(rank: u32, seq0: u64, n: u64, slow: Option<u32>, late: u64) -> CollectiveLog {
        log((0..n)
            .map(|k| {
                let t = 1_000 * MS + k * 50 * MS;
                let enter = if slow == Some(rank) {
                    t + late * MS
                } else {
                    t + u64::from(rank) * MS / 4
                };
                e(
                    seq0 + k,
                    CollectiveOp::AllReduce,
                    enter,
                    Some(t + (late + 2) * MS),
                )
            })
            .collect())
    }

    #[test]
    fn the_last_to_arrive_is_the_one_the_job_waits_for() {
        // Ranks attached at different collectives: their own numbering differs.
        let logs: Vec<CollectiveLog> = (0..4)
            .map(|r| rank_log(r, u64::from(r) * 3, 40, Some(2), 20))
            .collect();
        let w = join_ranks(&logs, Some(50.0));
        assert_eq!(w.compared, 40);
        assert_eq!(w.waits_for, Some(2));
        let r2 = &w.ranks[2];
        assert_eq!(r2.last, 40);
        assert!((r2.median_late_ms.unwrap() - 19.75).abs() < 0.3, "{r2:?}");
        assert!(w.ranks.iter().filter(|r| r.rank != 2).all(|r| r.last == 0));
        assert!(w.desyncs.is_empty(), "{:?}", w.desyncs);
    }

    #[test]
    fn an_even_job_waits_for_no_one() {
        let logs: Vec<CollectiveLog> = (0..4).map(|r| rank_log(r, 0, 30, None, 0)).collect();
        let w = join_ranks(&logs, Some(50.0));
        assert_eq!(w.compared, 30);
        assert_eq!(w.waits_for, None);
        assert!(w.ranks.iter().all(|r| r.last == 0));
    }

    #[test]
    fn a_different_op_at_one_open_collective_is_a_desync() {
        // Everyone completes 10 all_reduces; then ranks 0, 2, 3 enter all_reduce #10 and rank 1
        // broadcast #10, and nobody leaves (a hang).
        let logs: Vec<CollectiveLog> = (0..4)
            .map(|r| {
                let mut l = rank_log(r, 100, 10, None, 0);
                let op = if r == 1 {
                    CollectiveOp::Broadcast
                } else {
                    CollectiveOp::AllReduce
                };
                l.recent.push(e(110, op, 1_600 * MS, None));
                l
            })
            .collect();
        let w = join_ranks(&logs, None);
        assert_eq!(w.open.len(), 4);
        assert!(w.open.iter().all(|o| o.seq == 110), "{:?}", w.open);
        assert_eq!(w.desyncs.len(), 1, "{:?}", w.desyncs);
        assert_eq!(
            said(&w.desyncs[0]),
            "rank 1 called broadcast #110, ranks 0,2,3 all_reduce #110"
        );
        assert_eq!(
            open_said(&w).unwrap().0,
            "ranks 0,2,3 inside all_reduce #110, rank 1 inside broadcast #110 (group 0)"
        );
    }

    #[test]
    fn a_rank_that_skipped_one_is_missing_where_the_others_wait() {
        // Rank 1 skipped one all_reduce: its calls pair with the others' in order (as the
        // library pairs them), and the others end inside one more, without it.
        let logs: Vec<CollectiveLog> = (0..3u32)
            .map(|r| {
                let n = if r == 1 { 11 } else { 12 };
                log((0..n)
                    .map(|k| {
                        let t = 1_000 * MS + k * 50 * MS;
                        let exit = (k < 11).then_some(t + 2 * MS);
                        e(k + 7 * u64::from(r), CollectiveOp::AllReduce, t, exit)
                    })
                    .collect())
            })
            .collect();
        let w = join_ranks(&logs, None);
        assert_eq!(w.compared, 11);
        assert!(w.desyncs.is_empty(), "{:?}", w.desyncs);
        let open: Vec<(u32, u64)> = w.open.iter().map(|o| (o.rank, o.seq)).collect();
        assert_eq!(open, vec![(0, 11), (2, 11)]);
    }
}
