//! Any bytes given to the safetensors header parser produce a header or an error, never a
//! panic; a header that parses describes tensors that lie inside the file.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some(first8) = data.get(..8) else { return };
    let len = data.len() as u64;
    let Ok(n) = ckpt::safetensors::header_len(first8.try_into().unwrap(), len) else { return };
    if let Ok(h) = ckpt::safetensors::parse_header(&data[8..8 + n as usize], len) {
        for e in &h.entries {
            assert!(h.data_start + e.end <= len);
        }
    }
});
