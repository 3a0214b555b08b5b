use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::analysis::summarize;
use crate::testkit;

/// A synthetic run's summary and totals, as the run loops hand them over.
fn values(sc: &testkit::Scenario) -> (Summary, StepTotals) {
    let (engine, items) = testkit::build(sc);
    let totals = StepTotals::from_steps(&engine.steps);
    (summarize(&engine, &items), totals)
}

/// `name{labels}` → value of every sample line.
fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').expect("sample line");
            (without_identity(series), value.parse().expect("value"))
        })
        .collect()
}

/// A series without its cross-node identity labels (`job_id`, `node`, `local_rank`,
/// `world_size`: checked by `every_series_carries_the_job_identity`).
fn without_identity(series: &str) -> String {
    let Some((name, labels)) = series.split_once('{') else {
        return series.to_owned();
    };
    let labels = labels.trim_end_matches('}');
    let kept: Vec<&str> = labels
        .split(",")
        .filter(|l| {
            !["job_id=", "node=", "local_rank=", "world_size="]
                .iter()
                .any(|k| l.starts_with(k))
        })
        .collect();
    format!("{name}{{{}}}", kept.join(","))
}

#[test]
fn every_series_carries_the_job_identity() {
    let mut e = Exporter::default();
    let info = |rank: u32| JobLabels {
        job_id: Some("10.0.0.1:29500".into()),
        local_rank: Some(rank % 2),
        world_size: Some(4),
        node: "node-b".into(),
        ..Default::default()
    };
    e.attached("torchrun-9-x", "2", info(2));
    e.attached("torchrun-9-x", "3", info(3));
    e.update("torchrun-9-x", "3", RankValues::default());
    e.set_verdict(
        "torchrun-9-x",
        Verdict {
            kind: DiagnosisKind::Straggler,
            severity: Severity::Warning,
        },
    );
    e.set_stragglers(
        "torchrun-9-x",
        Some(&crate::summary::Stragglers {
            class: crate::summary::StragglerClass::Transient,
            rank: Some(3),
            steps: 80,
            slow_share: 0.25,
            episodes: Vec::new(),
            lost_ms: 400.0,
            from_runs: false,
        }),
    );
    e.set_collectives(
        "torchrun-9-x",
        Some(&crate::summary::CollectiveWaits {
            compared: 40,
            ranks: vec![crate::summary::RankArrivals {
                rank: 3,
                last: 30,
                last_share: 0.75,
                caused_ms: 1500.0,
                median_late_ms: Some(50.0),
            }],
            waits_for: Some(3),
            desyncs: Vec::new(),
            open: vec![crate::summary::OpenCollective {
                rank: 2,
                seq: 41,
                group: 0,
                op: "all_reduce".into(),
                enter_ts: 7_000_000_000,
            }],
            timeline: Vec::new(),
        }),
    );
    // A job of one process: its job_id is node-qualified, never shared with another node's.
    e.attached(
        "python-1-y",
        "0",
        JobLabels {
            node: "node-b".into(),
            ..Default::default()
        },
    );
    let text = e.encode();
    let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    assert!(
        lines.contains(&r#"traceml_steps_total{job="torchrun-9-x",rank="3",job_id="10.0.0.1:29500",node="node-b",local_rank="1",world_size="4"} 0"#),
        "{text}"
    );
    assert!(
        lines.iter().any(|l| l.starts_with(r#"traceml_verdict{job="torchrun-9-x",job_id="10.0.0.1:29500",node="node-b",kind="STRAGGLER""#)),
        "{text}"
    );
    assert!(
        lines.iter().any(|l| l.starts_with(
            r#"traceml_job_info{job="python-1-y",rank="0",job_id="node-b/python-1-y",node="node-b""#
        )),
        "{text}"
    );
    // The straggler class, with the rank it names and the wait it cost.
    assert!(
        lines.iter().any(|l| l.starts_with(
            r#"traceml_straggler_class{job="torchrun-9-x",job_id="10.0.0.1:29500",node="node-b""#
        ) && l.contains(r#"class="transient",rank="3"} 1"#)),
        "{text}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("traceml_straggler_lost_seconds{")
                && l.contains(r#"class="transient",rank="3"} 0.4"#)),
        "{text}"
    );
    // The joined ledgers: who the others waited for, what it cost, who is inside what.
    for want in [
        r#"traceml_collective_last{job="torchrun-9-x",job_id="10.0.0.1:29500",node="node-b",rank="3"} 30"#,
        r#"traceml_collective_caused_seconds{job="torchrun-9-x",job_id="10.0.0.1:29500",node="node-b",rank="3"} 1.5"#,
        r#"traceml_collectives_joined{job="torchrun-9-x",job_id="10.0.0.1:29500",node="node-b"} 40"#,
        r#"traceml_collective_desyncs{job="torchrun-9-x",job_id="10.0.0.1:29500",node="node-b"} 0"#,
        r#"traceml_collective_open_since_seconds{job="torchrun-9-x",job_id="10.0.0.1:29500",node="node-b",rank="2",op="all_reduce",seq="41"} 7.0"#,
    ] {
        assert!(lines.contains(&want), "{want}\n{text}");
    }
    for l in lines
        .iter()
        .filter(|l| l.starts_with("traceml_") && !l.starts_with("traceml_attached_jobs"))
    {
        assert!(l.contains("job_id=\""), "{l}");
    }
}

/// The metric names of the sample lines (`traceml_steps_total`, `..._bucket`, ...).
pub(crate) fn sample_names(text: &str) -> BTreeSet<String> {
    samples(text)
        .keys()
        .map(|k| k.split('{').next().unwrap().to_owned())
        .collect()
}

fn exporter_with(sc: &testkit::Scenario) -> (Exporter, Summary, StepTotals) {
    let (mut s, t) = values(sc);
    // The fixture's stream has no probe counters; a live run's summary has its cost.
    s.daemon_overhead = Some(crate::summary::DaemonOverhead {
        steady_pct_of_step: Some(0.3),
        ..Default::default()
    });
    let mut e = Exporter::default();
    e.attached(
        "python-4242-20260101-000000",
        "0",
        JobLabels {
            pid: 4242,
            comm: "python".into(),
            command: "python train.py --lr 0.1".into(),
            user: Some("alice".into()),
            container: Some("0123456789ab".into()),
            pod: Some("team-a/trainer-0".into()),
            unit: None,
            ..Default::default()
        },
    );
    e.update(
        "python-4242-20260101-000000",
        "0",
        RankValues::from_summary(
            &s,
            &t,
            GpuNow {
                utilization: sc.gpu.then_some(0.85),
                memory_bytes: sc.gpu.then_some(3 << 30),
            },
        ),
    );
    e.set_verdict("python-4242-20260101-000000", Verdict::of(&s));
    (e, s, t)
}

#[test]
fn exposition_holds_every_series_in_base_units() {
    let sc = testkit::input_bound();
    let (e, s, t) = exporter_with(&sc);
    let text = e.encode();
    assert!(text.ends_with("# EOF\n"), "{text}");
    let v = samples(&text);
    let l = r#"job="python-4242-20260101-000000",rank="0""#;
    assert_eq!(v[&format!("traceml_steps_total{{{l}}}")], t.count as f64);
    assert_eq!(t.count, 200);
    let sum = v[&format!("traceml_step_duration_seconds_sum{{{l}}}")];
    assert!((sum - t.duration_ns as f64 / 1e9).abs() < 1e-9);
    assert_eq!(
        v[&format!("traceml_step_duration_seconds_count{{{l}}}")],
        200.0
    );
    assert_eq!(
        v[&format!(r#"traceml_step_duration_seconds_bucket{{le="+Inf",{l}}}"#)],
        200.0
    );
    // Input-bound steps are ~98 ms: all in the 100 ms bucket or above, none at 50 ms.
    assert_eq!(
        v[&format!(r#"traceml_step_duration_seconds_bucket{{le="0.05",{l}}}"#)],
        0.0
    );
    let le_250 = v[&format!(r#"traceml_step_duration_seconds_bucket{{le="0.25",{l}}}"#)];
    assert_eq!(le_250, 200.0);
    let mut phase_sum = 0.0;
    for p in Phase::ALL {
        let x = v[&format!(r#"traceml_phase_seconds_total{{{l},phase="{}"}}"#, p.name())];
        assert_eq!(x, t.phase_ns[p.index()] as f64 / 1e9, "{}", p.name());
        phase_sum += x;
    }
    assert!((phase_sum - sum).abs() < 1e-6, "{phase_sum} vs {sum}");
    let input = v[&format!(r#"traceml_phase_seconds_total{{{l},phase="input_wait"}}"#)];
    assert!(
        (input / sum - 70.0 / 122.5).abs() < 0.02,
        "{input} of {sum}"
    );
    assert_eq!(
        v[&format!("traceml_h2d_bytes_total{{{l}}}")],
        (200u64 * 2 * 6_291_456) as f64
    );
    assert_eq!(
        v[&format!("traceml_kernel_launches_total{{{l}}}")],
        (200 * 392) as f64
    );
    assert_eq!(v[&format!("traceml_gpu_utilization_ratio{{{l}}}")], 0.85);
    assert_eq!(
        v[&format!("traceml_gpu_memory_used_bytes{{{l}}}")],
        (3u64 << 30) as f64
    );
    assert_eq!(v[&format!("traceml_events_lost_total{{{l}}}")], 0.0);
    assert_eq!(v[&format!("traceml_probe_failures_total{{{l}}}")], 0.0);
    let kind = s.primary_diagnosis.kind.as_str();
    assert_eq!(kind, "INPUT_BOUND");
    assert_eq!(
        v[&format!(
            r#"traceml_verdict{{job="python-4242-20260101-000000",kind="{kind}",severity="{}"}}"#,
            s.primary_diagnosis.severity.as_str()
        )],
        1.0
    );
    assert_eq!(v["traceml_attached_jobs"], 1.0);
    assert_eq!(
        v[&format!(
            r#"traceml_job_info{{{l},pid="4242",comm="python",command="python train.py --lr 0.1",user="alice",container="0123456789ab",pod="team-a/trainer-0",unit=""}}"#
        )],
        1.0
    );
    // Types as Prometheus reads them.
    for t in [
        "# TYPE traceml_steps counter",
        "# TYPE traceml_step_duration_seconds histogram",
        "# TYPE traceml_phase_seconds counter",
        "# TYPE traceml_verdict gauge",
        "# TYPE traceml_job info",
    ] {
        assert!(text.contains(t), "{t}");
    }
}

#[test]
fn never_measured_is_absent_not_zero() {
    let sc = testkit::Scenario {
        gpu: false,
        cuda: false,
        ..testkit::balanced()
    };
    let (e, s, _) = exporter_with(&sc);
    assert!(s.gpu.is_none());
    let names = sample_names(&e.encode());
    for absent in [
        "traceml_gpu_utilization_ratio",
        "traceml_gpu_memory_used_bytes",
        "traceml_h2d_bytes_total",
        "traceml_kernel_launches_total",
    ] {
        assert!(!names.contains(absent), "{absent} in {names:?}");
    }
    assert!(names.contains("traceml_steps_total"));
    // Without NVML samples the latest utilization is unknown too.
    let sample = Sample::default();
    assert_eq!(gpu_utilization(&sample), None);
}

#[test]
fn gpu_utilization_of_the_gpus_the_target_uses() {
    use crate::sample::GpuSample;
    let g = |index, util, mem| GpuSample {
        index,
        util_pct: Some(util),
        process_mem_bytes: mem,
        ..GpuSample::default()
    };
    let s = |gpus| Sample {
        gpus: Some(gpus),
        ..Sample::default()
    };
    assert_eq!(
        gpu_utilization(&s(vec![g(0, 90.0, Some(1)), g(1, 10.0, Some(0))])),
        Some(0.9)
    );
    assert_eq!(
        gpu_utilization(&s(vec![g(0, 90.0, None), g(1, 10.0, None)])),
        Some(0.5)
    );
    assert_eq!(gpu_utilization(&s(Vec::new())), None);
}

#[test]
fn counters_never_go_backwards() {
    let mut e = Exporter::default();
    let v = |steps: u64, input: f64| RankValues {
        steps,
        step_seconds_sum: steps as f64 * 0.1,
        step_buckets: vec![0, steps],
        phase_seconds: vec![(Phase::InputWait, input), (Phase::Residual, 1.0)],
        events_lost: Some(steps),
        ..RankValues::default()
    };
    e.update("j", "0", v(10, 2.0));
    e.update("j", "0", v(9, 2.5));
    let text = e.encode();
    let s = samples(&text);
    assert_eq!(s[r#"traceml_steps_total{job="j",rank="0"}"#], 10.0);
    assert_eq!(
        s[r#"traceml_phase_seconds_total{job="j",rank="0",phase="input_wait"}"#],
        2.5
    );
    assert_eq!(
        s[r#"traceml_step_duration_seconds_count{job="j",rank="0"}"#],
        10.0
    );
    assert_eq!(s[r#"traceml_events_lost_total{job="j",rank="0"}"#], 10.0);
}

#[test]
fn series_of_an_ended_job_go_after_the_retention_time() {
    let t0 = Instant::now();
    let mut e = Exporter::new(Duration::from_secs(300));
    for job in ["a", "b"] {
        e.attached(job, "0", JobLabels::default());
        e.update(job, "0", RankValues::default());
    }
    e.attached("failed", "0", JobLabels::default());
    e.forget("failed", "0");
    assert_eq!(e.attached_jobs(), 2);
    e.ended("a", "0", t0);
    assert_eq!(e.attached_jobs(), 1);
    e.prune(t0 + Duration::from_secs(299));
    let s = samples(&e.encode());
    assert!(s.contains_key(r#"traceml_steps_total{job="a",rank="0"}"#));
    assert!(!s.keys().any(|k| k.contains("failed")));
    assert_eq!(s["traceml_attached_jobs"], 1.0);
    // A later end does not move the first one.
    e.ended("a", "0", t0 + Duration::from_secs(200));
    e.prune(t0 + Duration::from_secs(301));
    let s = samples(&e.encode());
    assert!(!s.keys().any(|k| k.contains(r#"job="a""#)), "{s:?}");
    assert!(s.contains_key(r#"traceml_steps_total{job="b",rank="0"}"#));
    // Bounded: 1,000 jobs come and go, nothing is left of them.
    for i in 0..1000 {
        let job = format!("python-{i}-x");
        e.attached(&job, "0", JobLabels::default());
        e.update(&job, "0", RankValues::default());
        e.ended(&job, "0", t0);
    }
    e.prune(t0 + Duration::from_secs(301));
    assert_eq!(e.jobs.len(), 1);
}

#[test]
fn hostile_names_cannot_break_the_exposition() {
    let mut e = Exporter::default();
    for (i, name) in crate::sanitize::tests::hostile_names().iter().enumerate() {
        let job = format!("{name}-{i}");
        e.attached(
            &job,
            "0",
            JobLabels {
                pid: 1,
                comm: name.clone(),
                command: format!("python {name}"),
                user: Some(name.clone()),
                container: Some(name.clone()),
                pod: Some(format!("{name}/{name}")),
                unit: Some(name.clone()),
                job_id: Some(name.clone()),
                node: name.clone(),
                ..Default::default()
            },
        );
        e.update(&job, "0", RankValues::default());
    }
    let text = e.encode();
    assert!(!text.contains('\x1b') && !text.contains('\r') && !text.contains('\0'));
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        // One sample per line: a name, its labels, one value; every quote inside a label value
        // is escaped, so the labels close where the encoder closed them.
        let (series, value) = line.rsplit_once(' ').unwrap();
        assert!(value.parse::<f64>().is_ok(), "{line:.300}");
        let mut in_value = false;
        let mut escaped = false;
        for c in series.chars() {
            match (in_value, escaped, c) {
                (true, false, '\\') => escaped = true,
                (true, true, _) => escaped = false,
                (_, false, '"') => in_value = !in_value,
                _ => {}
            }
        }
        assert!(!in_value, "unterminated label value: {line:.300}");
        assert!(
            line.len() < 2000,
            "label values are bounded: {}",
            line.len()
        );
    }
}

/// The Grafana dashboard (packaging/grafana/traceml.json) is valid JSON with the panels it
/// promises, and every metric its queries name is one the exporter writes.
#[test]
fn grafana_dashboard_queries_name_exported_metrics() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/grafana/traceml.json");
    let text = std::fs::read_to_string(&path).expect("the dashboard");
    let d: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    let (e, _, _) = exporter_with(&testkit::input_bound());
    let names = sample_names(&e.encode());
    let mut exprs = Vec::new();
    let mut titles = Vec::new();
    fn walk(v: &serde_json::Value, exprs: &mut Vec<String>, titles: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                if let Some(serde_json::Value::String(x)) = m.get("expr") {
                    exprs.push(x.clone());
                }
                if m.contains_key("gridPos")
                    && let Some(serde_json::Value::String(t)) = m.get("title")
                {
                    titles.push(t.clone());
                }
                m.values().for_each(|v| walk(v, exprs, titles));
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| walk(v, exprs, titles)),
            _ => {}
        }
    }
    walk(&d["panels"], &mut exprs, &mut titles);
    for var in d["templating"]["list"].as_array().expect("variables") {
        if let Some(q) = var["query"].as_str().or(var["query"]["query"].as_str())
            && q.contains("traceml_")
        {
            exprs.push(q.to_owned());
        }
    }
    assert!(exprs.len() >= 8, "{exprs:?}");
    for x in &exprs {
        let used: Vec<&str> = x
            .match_indices("traceml_")
            .map(|(i, _)| {
                let rest = &x[i..];
                let end = rest
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(rest.len());
                &rest[..end]
            })
            .collect();
        // Prometheus's own ALERTS series of the shipped rules.
        if x.starts_with("ALERTS{") {
            continue;
        }
        assert!(!used.is_empty(), "a query on no traceml metric: {x}");
        for m in used {
            assert!(names.contains(m), "{m} (in {x}) is not exported: {names:?}");
        }
    }
    for want in [
        "Step time",
        "Phase shares",
        "Verdict",
        "straggler",
        "Daemon",
    ] {
        assert!(
            titles.iter().any(|t| t.contains(want)),
            "no panel titled {want}: {titles:?}"
        );
    }
    assert_eq!(d["uid"], "traceml");
}

/// What a refresh costs on a long run: a recorded run (30 steps) replayed 140 times end to end
/// (about 4,200 steps: the engine keeps at most 4,096) is folded, then `snapshot_with_totals` is timed. No
/// assertion on the time (tests never assert timings); the numbers are printed.
#[test]
fn refresh_cost() {
    use crate::event::StreamItem;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/recordings/input_bound_single.jsonl.gz");
    let items = crate::record::read(&path).expect("recording").items;
    let ts: Vec<u64> = items
        .iter()
        .filter_map(|i| match i {
            StreamItem::Event(e) => Some(e.ts),
            _ => None,
        })
        .collect();
    let span = ts.iter().max().unwrap() - ts.iter().min().unwrap() + 1_000_000;
    let copies = 140u64;
    let mut c = crate::analysis::Collector::new();
    let fold = std::time::Instant::now();
    for k in 0..copies {
        let shift = k * span;
        for i in &items {
            let item = match i {
                StreamItem::Event(e) => {
                    let mut e = e.clone();
                    e.ts += shift;
                    StreamItem::Event(e)
                }
                StreamItem::Stack(s) => {
                    let mut s = s.clone();
                    s.ts += shift;
                    StreamItem::Stack(s)
                }
                StreamItem::Sample(s) => {
                    let mut s = s.clone();
                    s.ts += shift;
                    StreamItem::Sample(s)
                }
                StreamItem::End(e) if k + 1 == copies => {
                    let mut e = e.clone();
                    e.ts += shift;
                    StreamItem::End(e)
                }
                _ if k == 0 => i.clone(),
                _ => continue,
            };
            c.push(&item);
        }
    }
    let fold = fold.elapsed();
    let mut times = Vec::new();
    let mut steps = 0;
    for _ in 0..5 {
        let t = std::time::Instant::now();
        let (s, totals) = c.snapshot_with_totals();
        times.push(t.elapsed());
        steps = totals.count;
        assert_eq!(u64::from(s.steps.count), totals.count);
    }
    times.sort();
    eprintln!(
        "refresh_cost: {steps} steps, {} events folded in {fold:?}; snapshot_with_totals median \
         {:?} (min {:?}, max {:?}){}",
        c.events(),
        times[2],
        times[0],
        times[4],
        if cfg!(debug_assertions) {
            " [debug build]"
        } else {
            ""
        }
    );
    assert!(steps > 2000, "{steps}");
}

/// A step of exactly a bucket's bound is in that bucket (`le`), one nanosecond more in the next;
/// steps beyond the last bound are in +Inf.
#[test]
fn step_buckets_follow_le() {
    use crate::engine::Step;
    let step = |ns: u64| Step {
        start_ns: 1_000,
        end_ns: 1_000 + ns,
        ..Step::default()
    };
    let t = StepTotals::from_steps(&[
        step(1_000_000),
        step(1_000_001),
        step(300_000_000_000),
        step(300_000_000_001),
        step(0),
    ]);
    let mut want = [0u64; STEP_BUCKETS_NS.len() + 1];
    want[0] = 2;
    want[1] = 1;
    want[STEP_BUCKETS_NS.len() - 1] = 1;
    want[STEP_BUCKETS_NS.len()] = 1;
    assert_eq!(t.step_buckets, want);
    assert_eq!(t.step_buckets.iter().sum::<u64>(), t.count);
}

#[test]
fn job_info_says_where_the_process_runs() {
    let id = crate::host::identity::from_cgroup_path(
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1f2e3d4c_5b6a_7980_1a2b_3c4d5e6f7a8b.slice/cri-containerd-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.scope",
    );
    let i = JobLabels::with_identity(7, "python".into(), "python t.py".into(), &id);
    assert_eq!(i.container.as_deref(), Some("0123456789ab"));
    assert!(i.pod.is_some(), "{id:?}");
    let plain = JobLabels::with_identity(
        7,
        "python".into(),
        "python t.py".into(),
        &crate::event::Identity {
            uid: Some(1000),
            ..Default::default()
        },
    );
    assert_eq!(plain.user.as_deref(), Some("1000"));
    assert_eq!((plain.container, plain.pod, plain.unit), (None, None, None));
}
