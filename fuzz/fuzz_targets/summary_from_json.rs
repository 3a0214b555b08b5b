//! Fuzzes the summary parser: any text gives a `Summary` or a `SummaryError`, never a panic; a
//! summary that parses must render and parse back to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use traceml_daemon::render::to_json;
use traceml_daemon::summary::Summary;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(s) = Summary::from_json(text) {
        let again = Summary::from_json(&to_json(&s)).expect("a rendered summary parses");
        assert_eq!(to_json(&again), to_json(&s), "render/parse round trip");
    }
});
