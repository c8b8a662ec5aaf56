//! Fuzzes `capgate_spec::load` (YAML/JSON kit descriptors) under every profile, and checks
//! that a valid descriptor's published JSON form reads back to an equal, valid descriptor.
#![no_main]

use capgate_spec::{Options, Profile, load};
use libfuzzer_sys::fuzz_target;

const PROFILES: [Profile; 3] = [Profile::Authored, Profile::Published, Profile::Effective];

fuzz_target!(|data: &[u8]| {
    for profile in PROFILES {
        for declarations_only in [false, true] {
            let opts = Options { profile, declarations_only, ..Options::default() };
            let loaded = load(data, &opts);
            let Some(descriptor) = loaded.valid() else { continue };
            let json = serde_json::to_vec(descriptor).expect("a valid descriptor serializes to JSON");
            let reloaded = load(&json, &opts);
            assert!(
                reloaded.is_valid(),
                "published JSON of a valid descriptor ({profile:?}, declarations_only={declarations_only}) \
                 does not re-read as valid\njson: {}\ndiagnostics: {:#?}",
                String::from_utf8_lossy(&json),
                reloaded.diagnostics,
            );
            assert_eq!(
                reloaded.descriptor, loaded.descriptor,
                "published JSON does not round-trip ({profile:?}, declarations_only={declarations_only})\njson: {}",
                String::from_utf8_lossy(&json),
            );
        }
    }
});
