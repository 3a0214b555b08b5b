//! Fuzzes the binary recording decoder (`*.trec`): any bytes give a `Recording` or a
//! `RecordError`, never a panic, and whatever decodes encodes and decodes back to the same items.
//! An input that starts with the binary magic is read as a whole file; any other input is read
//! as the body of one stored block behind a valid header, so the frame, event and stack decoders
//! are reached without forging block checksums.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use traceml_daemon::record::{self, binary};

fuzz_target!(|data: &[u8]| {
    let wrapped;
    let file = if data.starts_with(&binary::MAGIC) {
        data
    } else {
        wrapped = binary::file_of_block_body(data);
        &wrapped[..]
    };
    let Ok(rec) = record::read_from(file, Path::new("fuzz.trec")) else {
        return;
    };
    let mut enc = binary::Encoder::new(Vec::new(), "fuzz").expect("in memory");
    for item in &rec.items {
        enc.write(item).expect("in memory");
    }
    let again = enc.finish().expect("in memory");
    let back = record::read_from(&again[..], Path::new("again.trec")).expect("re-encoded reads");
    assert_eq!(back.items, rec.items, "encode/decode round trip");
    assert!(!back.truncated_tail);
});
