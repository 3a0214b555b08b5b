//! Fuzzes the recording decoder: any bytes give a `Recording` or a `RecordError`, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = traceml_daemon::record::read_from(data, std::path::Path::new("fuzz.jsonl"));
});
