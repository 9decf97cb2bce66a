//! Any bytes given to the ZIP reader produce a member list or an error, never a panic; a
//! listed member's data and every copy of its CRC-32 lie inside the archive.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let len = data.len() as u64;
    let Ok(members) = ckpt::foreign::zip::members_of(&mut std::io::Cursor::new(data), len) else { return };
    for m in &members {
        assert!(m.data_offset.checked_add(m.size).is_some_and(|end| end <= len), "{m:?}");
        assert!(m.crc_positions.iter().all(|&p| p.checked_add(4).is_some_and(|end| end <= len)), "{m:?}");
    }
});
