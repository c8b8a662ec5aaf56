//! Fuzzes the raw YAML/JSON reader, `capgate_spec::yaml::parse`.
#![no_main]

use capgate_spec::diag::Diagnostics;
use capgate_spec::yaml::{self, Limits};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut diags = Diagnostics::new();
    let _ = yaml::parse(data, &Limits::DEFAULT, &mut diags);
});
