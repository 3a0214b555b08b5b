use std::io::Write;

use super::binary::{
    BINARY_VERSION, BLOCK_BYTES, Encoder, FRAME_EVENT, FRAME_ITEM, HEADER_LEN, MAGIC,
    file_of_block_body,
};
use super::compact::put_varint;
use super::*;
use crate::event::{
    Api, Class, CodeInfo, CopyKind, Event, FuncInfo, Kind, LaunchTotals, LibraryInfo, Lost,
    ProbeFailure, ProbeSet, ProbeStats, StackSample, TargetInfo,
};
use crate::sample::{GpuSample, ProcessSample, Sample, SystemSample};

/// An `end` item, built from its JSON (fields may be added to `End`).
fn end(ts: u64, reason: &str) -> StreamItem {
    serde_json::from_value(serde_json::json!({"t": "end", "ts": ts, "reason": reason})).unwrap()
}

fn ev(ts: u64, tid: u32, kind: Kind) -> StreamItem {
    StreamItem::Event(Event {
        ts,
        tgid: 100,
        tid,
        kind,
    })
}

/// One item of every variant, and an event of every kind (with and without optional fields).
fn every_item() -> Vec<StreamItem> {
    vec![
        StreamItem::Target(Box::new(TargetInfo {
            pid: 100,
            comm: "python3".into(),
            cmdline: vec!["python3".into(), "train.py".into()],
            python_version: Some("3.11.7".into()),
            python_elf: Some("/usr/bin/python3.11".into()),
            attach_ts_ns: 1_000,
            attach_unix_s: 1.8e9,
            num_cpus: 2,
            mem_total_bytes: Some(1 << 34),
            hostname: "h".into(),
            daemon_version: "0.1.0".into(),
            launch_count_only: false,
            overhead_budget_pct: Some(0.5),
            identity: Some(crate::event::Identity {
                uid: Some(1000),
                user: Some("alice".into()),
                container_runtime: Some("docker".into()),
                ..Default::default()
            }),
            calibration: Some(crate::event::Calibration {
                uprobe_ns: 612.5,
                uretprobe_ns: 803.25,
            }),
        })),
        StreamItem::Library(Box::new(LibraryInfo {
            path: "/x/libcudart.so.12".into(),
            role: "cudart".into(),
            probes: vec!["cudaLaunchKernel+4".into()],
            ts: 1_100,
        })),
        StreamItem::ProbeFailed(Box::new(ProbeFailure {
            probe: "cuLaunchKernel".into(),
            file: "/x/libcuda.so".into(),
            reason: "not found".into(),
        })),
        StreamItem::ProbeSet(Box::new(ProbeSet {
            ts: 1_150,
            python: true,
            launch_events: true,
            reason: "learning".into(),
            watching: false,
            python_steady: false,
        })),
        StreamItem::Code(Box::new(CodeInfo {
            ptr: 0xdead_beef_0000_0001,
            address: 0x7f00_0000_1000,
            qualname: "Module.__call__".into(),
            filename: "torch/nn/modules/module.py".into(),
            class: Class::ModuleCall,
        })),
        ev(
            1_200,
            100,
            Kind::PyEnter {
                code: 0xdead_beef_0000_0001,
                depth: 2,
            },
        ),
        ev(
            1_250,
            101,
            Kind::CallEnter {
                api: Api::CudaMemcpyAsync,
                bytes: Some(1 << 20),
                copy: Some(CopyKind::HostToDevice),
                group: None,
            },
        ),
        ev(
            1_240,
            101,
            Kind::CallExit {
                api: Api::CudaMemcpyAsync,
                ret: 0,
            },
        ),
        ev(
            1_300,
            100,
            Kind::CallEnter {
                api: Api::CudaStreamSynchronize,
                bytes: None,
                copy: None,
                group: None,
            },
        ),
        ev(
            1_310,
            100,
            Kind::CallExit {
                api: Api::CudaStreamSynchronize,
                ret: u64::MAX,
            },
        ),
        ev(
            1_320,
            100,
            Kind::Launch {
                api: Api::CudaGraphLaunch,
                path: None,
            },
        ),
        ev(
            1_330,
            100,
            Kind::RecordEnter {
                name: "Optimizer.step#SGD.step".into(),
            },
        ),
        ev(1_340, 100, Kind::RecordExit),
        // An exec (a JSON frame amid the compact events).
        ev(1_345, 100, Kind::Exec),
        ev(
            1_350,
            100,
            Kind::PyExit {
                code: 0xdead_beef_0000_0001,
                raised: true,
            },
        ),
        StreamItem::Func(Box::new(FuncInfo {
            id: 3,
            function: "train_step".into(),
            file: "train.py".into(),
            line: 40,
        })),
        StreamItem::Stack(Box::new(StackSample {
            ts: 1_345,
            tid: 100,
            frames: vec![3, 4, 5],
            lines: vec![88, 0],
        })),
        StreamItem::Sample(Box::new(Sample {
            ts: 1_400,
            system: SystemSample {
                cpu_pct: Some(12.5),
                mem_used_bytes: Some(1 << 30),
                mem_total_bytes: None,
            },
            process: Some(ProcessSample {
                pid: 100,
                cpu_pct_one_core: Some(99.0),
                rss_bytes: Some(1 << 28),
                threads: Some(4),
                cpu_seconds: Some(1.25),
            }),
            workers: vec![],
            gpus: Some(vec![GpuSample {
                index: 0,
                name: Some("H200".into()),
                util_pct: Some(50.0),
                ..Default::default()
            }]),
            gpu_note: Some(
                "NVML calls took up to 210 ms (nvmlDeviceGetName), read off the event loop".into(),
            ),
        })),
        StreamItem::ProbeStats(ProbeStats {
            ts: 1_450,
            py_enter: 10,
            exit: 9,
            call_enter: 2,
            record: 2,
            launch: 1,
            ..Default::default()
        }),
        StreamItem::Lost(Lost {
            ring_full: 1,
            read_failed: 2,
            state_full: 3,
            undecodable: 4,
            seq_gaps: 5,
            off_cpu_ring_full: 6,
            too_deep: 7,
        }),
        StreamItem::LaunchTotals(LaunchTotals {
            runtime: 7,
            driver: 8,
            nested: 5,
            library: 2,
            direct: 1,
        }),
        end(2_000, "target_exited"),
    ]
}

/// A launch-heavy loop: many events of a repeating shape, with stack samples between them.
fn busy_items(steps: u64) -> Vec<StreamItem> {
    let mut v = vec![every_item()[0].clone(), every_item()[4].clone()];
    let mut ts = 5_000u64;
    for s in 0..steps {
        for i in 0..40u64 {
            ts += 3_000 + (i * 7919 + s * 104_729) % 1_500;
            v.push(ev(
                ts,
                100,
                Kind::Launch {
                    api: Api::CudaLaunchKernel,
                    path: Some(crate::event::LaunchPath::Runtime),
                },
            ));
        }
        v.push(StreamItem::Stack(Box::new(StackSample {
            ts,
            tid: 100,
            frames: vec![1, 2, 3],
            lines: Vec::new(),
        })));
    }
    v.push(end(ts, "interrupted"));
    v
}

fn encode(items: &[StreamItem], block: usize) -> Vec<u8> {
    let mut e = Encoder::new(Vec::new(), "0.1.0")
        .unwrap()
        .block_bytes(block);
    for it in items {
        e.write(it).unwrap();
    }
    e.finish().unwrap()
}

#[test]
fn every_variant_round_trips_in_each_format() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["r.trec", "r.jsonl", "r.jsonl.gz"] {
        let p = dir.path().join(name);
        let mut w = Writer::create(&p).unwrap();
        for it in every_item() {
            w.write(&it).unwrap();
        }
        drop(w);
        let r = read(&p).unwrap();
        assert_eq!(r.items, every_item(), "{name}");
        assert!(!r.truncated_tail, "{name}");
        let reader = Reader::open(&p).unwrap();
        assert_eq!(reader.daemon_version(), Some(DAEMON_VERSION), "{name}");
    }
    let bytes = std::fs::read(dir.path().join("r.trec")).unwrap();
    assert_eq!(&bytes[..8], &MAGIC);
    assert_eq!(
        u16::from_le_bytes([bytes[8], bytes[9]]),
        BINARY_VERSION,
        "version"
    );
}

#[test]
fn format_follows_the_name_and_reading_sniffs_the_bytes() {
    assert_eq!(Format::for_path(Path::new("a.trec")), Format::Binary);
    assert_eq!(Format::for_path(Path::new("a.jsonl")), Format::Jsonl);
    assert_eq!(Format::for_path(Path::new("a.jsonl.gz")), Format::JsonlGz);
    assert_eq!(Format::for_path(Path::new("a.rec")), Format::Jsonl);
    // A binary recording named .jsonl, and one gzip-compressed, still read as binary.
    let dir = tempfile::tempdir().unwrap();
    let bin = encode(&every_item(), BLOCK_BYTES);
    let p = dir.path().join("misnamed.jsonl");
    std::fs::write(&p, &bin).unwrap();
    assert_eq!(read(&p).unwrap().items, every_item());
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&bin).unwrap();
    let gz = gz.finish().unwrap();
    assert_eq!(
        read_from(&gz[..], Path::new("x.trec.gz")).unwrap().items,
        every_item()
    );
    assert!(looks_like_recording(&bin[..8]));
    assert!(looks_like_recording(&gz[..2]));
    assert!(looks_like_recording(
        b"{\"format\":\"traceml-recording\",\"version\":1}"
    ));
    assert!(!looks_like_recording(b"{\"schema_version\": 1"));
}

#[test]
fn binary_is_far_smaller_than_json_lines() {
    let items = busy_items(200);
    let bin = encode(&items, BLOCK_BYTES);
    let json: usize = items
        .iter()
        .map(|i| serde_json::to_string(i).unwrap().len() + 1)
        .sum();
    assert!(
        bin.len() * 20 < json,
        "binary {} bytes vs JSON Lines {json}",
        bin.len()
    );
    assert_eq!(read_from(&bin[..], Path::new("x")).unwrap().items, items);
}

/// The block boundaries of an encoded file (file offsets where a block ends), read from the
/// block headers.
fn block_ends(file: &[u8]) -> Vec<usize> {
    let mut ends = Vec::new();
    let mut at = HEADER_LEN;
    while at < file.len() {
        let mut b = super::compact::Bytes::new(&file[at + 1..]);
        let _raw = b.varint().unwrap();
        let data = b.varint().unwrap() as usize;
        at += 1 + b.pos() + 4 + data;
        ends.push(at);
    }
    assert_eq!(at, file.len());
    ends
}

#[test]
fn a_file_cut_anywhere_reads_up_to_its_last_whole_block() {
    let items = busy_items(12);
    let file = encode(&items, 300);
    let ends = block_ends(&file);
    assert!(ends.len() > 10, "many small blocks: {}", ends.len());
    let mut last_count = 0;
    for cut in 0..=file.len() {
        let r = read_from(&file[..cut], Path::new("cut.trec"));
        if cut < HEADER_LEN {
            let e = r.unwrap_err();
            assert!(
                matches!(e, RecordError::CutHeader { .. } | RecordError::Empty { .. }),
                "{cut}: {e}"
            );
            continue;
        }
        let r = r.unwrap_or_else(|e| panic!("cut at {cut}: {e}"));
        let whole = ends
            .iter()
            .rev()
            .find(|&&e| e <= cut)
            .copied()
            .unwrap_or(HEADER_LEN);
        assert_eq!(r.truncated_tail, cut != whole, "cut at {cut}");
        assert_eq!(r.dropped_bytes, (cut - whole) as u64, "cut at {cut}");
        assert_eq!(
            r.items[..],
            items[..r.items.len()],
            "cut at {cut}: a prefix"
        );
        assert!(r.items.len() >= last_count, "cut at {cut}");
        if ends.contains(&cut) && cut > ends[0] {
            assert!(r.items.len() > last_count, "each block adds items ({cut})");
        }
        last_count = r.items.len();
    }
    assert_eq!(last_count, items.len());
}

#[test]
fn a_killed_writer_leaves_its_flushed_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("killed.trec");
    let mut w = Writer::create(&p).unwrap();
    let items = busy_items(3);
    for it in &items[..50] {
        w.write(it).unwrap();
    }
    w.flush().unwrap();
    for it in &items[50..] {
        w.write(it).unwrap();
    }
    // Killed: no flush, no drop.
    std::mem::forget(w);
    let r = read(&p).unwrap();
    assert_eq!(r.items[..], items[..50]);
    assert!(!r.truncated_tail, "the flushed block is whole");
}

#[test]
fn blocks_stay_small_and_memory_bounded() {
    let items = busy_items(2_000);
    let file = encode(&items, BLOCK_BYTES);
    let mut at = HEADER_LEN;
    let mut blocks = 0;
    while at < file.len() {
        let mut b = super::compact::Bytes::new(&file[at + 1..]);
        let raw = b.varint().unwrap() as usize;
        let data = b.varint().unwrap() as usize;
        assert!(raw < BLOCK_BYTES + 1024, "block of {raw} bytes");
        at += 1 + b.pos() + 4 + data;
        blocks += 1;
    }
    assert!(blocks > 3, "{blocks} blocks");
}

/// A block body of hand-made frames: `frames` (type, payload) and the timestamp deltas of its
/// event frames.
fn body(frames: &[(u8, Vec<u8>)], deltas: &[u64]) -> Vec<u8> {
    let mut f = Vec::new();
    for (t, p) in frames {
        put_varint(&mut f, p.len() as u64);
        f.push(*t);
        f.extend_from_slice(p);
    }
    let mut b = Vec::new();
    put_varint(&mut b, f.len() as u64);
    b.extend_from_slice(&f);
    b.extend(deltas.iter().map(|d| *d as u8));
    b.extend(deltas.iter().map(|d| (*d >> 8) as u8));
    for d in deltas {
        put_varint(&mut b, d >> 16);
    }
    b
}

#[test]
fn unknown_frame_types_are_skipped() {
    let end_json = serde_json::to_vec(&end(9, "terminated")).unwrap();
    // A launch at ts 600 (zigzag 1200) by tgid/tid 5, between two frames of a future type.
    let launch = vec![4 << 5, 0b101, 5];
    let file = file_of_block_body(&body(
        &[
            (0x7f, b"from the future".to_vec()),
            (FRAME_EVENT, launch),
            (0x40, vec![]),
            (FRAME_ITEM, end_json),
        ],
        &[1_200],
    ));
    let r = read_from(&file[..], Path::new("x.trec")).unwrap();
    assert_eq!(r.skipped_frames, 2);
    assert_eq!(
        r.items,
        vec![
            StreamItem::Event(Event {
                ts: 600,
                tgid: 5,
                tid: 5,
                kind: Kind::Launch {
                    api: Api::CudaLaunchKernel,
                    path: None,
                }
            }),
            end(9, "terminated"),
        ]
    );
}

#[test]
fn future_and_foreign_binary_files_get_clear_errors() {
    let file = encode(&every_item(), BLOCK_BYTES);
    let p = Path::new("x.trec");
    let mut newer = file.clone();
    newer[8] = 2;
    let e = read_from(&newer[..], p).unwrap_err();
    assert!(
        matches!(e, RecordError::FutureVersion { found: 2, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("newer traceml-daemon"), "{e}");
    let mut flagged = file.clone();
    flagged[10] = 1;
    let e = read_from(&flagged[..], p).unwrap_err();
    assert!(e.to_string().contains("newer traceml-daemon"), "{e}");
    // Informative flag bits are ignored.
    let mut informative = file.clone();
    informative[11] = 0x80;
    assert_eq!(read_from(&informative[..], p).unwrap().items, every_item());
    // A header frame of a newer item schema.
    let mut f = Vec::new();
    f.extend_from_slice(&MAGIC);
    f.extend_from_slice(&[1, 0, 0, 0]);
    let header = br#"{"format":"traceml-recording","version":7,"daemon_version":"9"}"#;
    let mut frames = Vec::new();
    put_varint(&mut frames, header.len() as u64);
    frames.push(super::binary::FRAME_HEADER);
    frames.extend_from_slice(header);
    let mut b = Vec::new();
    put_varint(&mut b, frames.len() as u64);
    b.extend_from_slice(&frames);
    let mut crc = flate2::Crc::new();
    crc.update(&b);
    f.push(0);
    put_varint(&mut f, b.len() as u64);
    put_varint(&mut f, b.len() as u64);
    f.extend_from_slice(&crc.sum().to_le_bytes());
    f.extend_from_slice(&b);
    let e = read_from(&f[..], p).unwrap_err();
    assert!(
        matches!(e, RecordError::FutureVersion { found: 7, .. }),
        "{e}"
    );
    // Cut inside the magic.
    let e = read_from(&file[..5], p).unwrap_err();
    assert!(matches!(e, RecordError::CutHeader { .. }), "{e}");
}

#[test]
fn corrupt_blocks_are_errors_not_panics() {
    let file = encode(&busy_items(20), 2_000);
    let ends = block_ends(&file);
    // Flip one byte inside each of the first blocks' data, and each header byte.
    let mut errors = 0;
    for at in (HEADER_LEN..ends[3]).step_by(7) {
        let mut f = file.clone();
        f[at] ^= 0x5a;
        match read_from(&f[..], Path::new("x.trec")) {
            Err(RecordError::Corrupt { .. }) => errors += 1,
            Err(e) => panic!("byte {at}: unexpected error {e}"),
            // A length byte that grew past the end reads as a cut file; a flip in bits DEFLATE
            // does not use (a code length of a symbol the block never emits) decodes to the same
            // items, which the CRC of the decoded body then vouches for.
            Ok(r) => assert!(
                r.truncated_tail
                    || r.items.len() < busy_items(20).len()
                    || r.items == busy_items(20),
                "byte {at} (blocks end at {:?}): read {} items, tail {}",
                &ends[..4],
                r.items.len(),
                r.truncated_tail
            ),
        }
    }
    assert!(errors > 10, "{errors}");
    // Frames whose lengths overrun the block, and a bad timestamp column.
    for b in [
        vec![5, 9, FRAME_EVENT],
        body(&[(FRAME_EVENT, vec![4 << 5, 0b101, 5])], &[]),
        {
            let mut b = body(&[(FRAME_EVENT, vec![4 << 5, 0b101, 5])], &[1]);
            b.push(0);
            b
        },
    ] {
        let e = read_from(&file_of_block_body(&b)[..], Path::new("x.trec")).unwrap_err();
        assert!(matches!(e, RecordError::Corrupt { .. }), "{e}");
    }
}

#[test]
fn export_converts_between_formats() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("a.trec");
    std::fs::write(&src, encode(&every_item(), 64)).unwrap();
    for name in ["b.jsonl", "b.jsonl.gz", "c.trec"] {
        let out = dir.path().join(name);
        let (n, tail) = export(&src, &out).unwrap();
        assert_eq!(n as usize, every_item().len());
        assert_eq!(tail, Tail::default());
        let r = Reader::open(&out).unwrap();
        assert_eq!(r.daemon_version(), Some("0.1.0"));
        assert_eq!(read(&out).unwrap().items, every_item(), "{name}");
    }
}

// JSON Lines.

fn two_items() -> Vec<StreamItem> {
    vec![ev(5, 1, Kind::RecordExit), end(9, "target_exited")]
}

#[test]
fn gzip_round_trip_and_cut_stream() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("r.jsonl.gz");
    let mut w = Writer::create(&p).unwrap();
    for it in two_items() {
        w.write(&it).unwrap();
    }
    drop(w);
    let bytes = std::fs::read(&p).unwrap();
    assert_eq!(&bytes[..2], &[0x1f, 0x8b], "gzip magic");
    let r = read(&p).unwrap();
    assert_eq!(r.items, two_items());
    assert!(!r.truncated_tail);
    // A writer killed after a flush: no gzip trailer. Everything flushed is readable.
    let mut w = Writer::create(&p).unwrap();
    for it in two_items() {
        w.write(&it).unwrap();
    }
    w.flush().unwrap();
    let flushed = std::fs::read(&p).unwrap();
    std::mem::forget(w);
    let cut = dir.path().join("cut.jsonl.gz");
    std::fs::write(&cut, &flushed).unwrap();
    let r = read(&cut).unwrap();
    assert_eq!(r.items, two_items());
    assert!(r.truncated_tail);
}

#[test]
fn truncated_tail_is_tolerated_and_said() {
    let text = "{\"format\":\"traceml-recording\",\"version\":1,\"daemon_version\":\"0\"}\n\
                {\"t\":\"event\",\"ts\":5,\"tgid\":1,\"tid\":1,\"k\":\"record_exit\"}\n{\"t\":\"ev";
    let r = read_from(text.as_bytes(), Path::new("x")).unwrap();
    assert_eq!(r.items.len(), 1);
    assert!(r.truncated_tail);
    assert_eq!(r.dropped_bytes, 8);
}

#[test]
fn bad_inputs_get_clear_errors() {
    let p = Path::new("x");
    assert!(matches!(
        read_from(&b""[..], p),
        Err(RecordError::Empty { .. })
    ));
    assert!(matches!(
        read_from(&b"hello\n"[..], p),
        Err(RecordError::NotRecording { .. })
    ));
    let future = b"{\"format\":\"traceml-recording\",\"version\":9}\n";
    let e = read_from(&future[..], p).unwrap_err();
    assert!(e.to_string().contains("newer traceml-daemon"), "{e}");
    let mid = b"{\"format\":\"traceml-recording\",\"version\":1}\nnot json\n{\"t\":\"end\",\"ts\":1,\"reason\":\"interrupted\"}\n";
    assert!(matches!(
        read_from(&mid[..], p),
        Err(RecordError::Malformed { line: 2, .. })
    ));
}

#[test]
fn rank_recordings_keep_their_format() {
    let p = |s: &str| PathBuf::from(s);
    assert_eq!(rank_path(&p("/r/run.trec"), 1, 0), p("/r/run.rank1.trec"));
    assert_eq!(rank_path(&p("run.jsonl.gz"), 0, 0), p("run.rank0.jsonl.gz"));
    assert_eq!(rank_path(&p("a.b.jsonl"), 3, 0), p("a.b.rank3.jsonl"));
    assert_eq!(rank_path(&p("rec"), 2, 0), p("rec.rank2"));
    // An elastic restart's ranks record next to the first attempt's, in the same format.
    assert_eq!(
        rank_path(&p("/r/run.jsonl.gz"), 1, 2),
        p("/r/run.rank1.restart2.jsonl.gz")
    );
    for (path, fmt) in [
        ("x.trec", Format::Binary),
        ("x.jsonl.gz", Format::JsonlGz),
        ("x.jsonl", Format::Jsonl),
    ] {
        assert_eq!(Format::for_path(&rank_path(&p(path), 7, 1)), fmt);
    }
}
