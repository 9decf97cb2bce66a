//! Any bytes given to the manifest parser produce a manifest or an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = ckpt::Manifest::from_bytes(data, std::path::Path::new("fuzz/manifest.json")) {
        // Whatever parses is canonical: it serialises back to the same bytes.
        assert_eq!(m.to_bytes(), data);
    }
});
