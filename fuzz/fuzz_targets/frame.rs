//! Any bytes read as a stream of frames give frames or an error, never a panic: the first
//! four bytes set the size limit, the rest is the stream. Every frame decoded is at most
//! the limit and encodes back to exactly the bytes it was read from.
#![no_main]

use comm::frame::{FrameError, read_frame_into, write_frame};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((max, stream)) = data.split_first_chunk::<4>() else { return };
    // Up to 1 MiB, so that the fuzzer's memory limit holds.
    let max = u32::from_le_bytes(*max) % (1 << 20);
    let mut r = stream;
    let mut payload = Vec::new();
    loop {
        let before = r;
        match read_frame_into(&mut r, max, &mut payload) {
            Ok(kind) => {
                assert!(payload.len() < max as usize);
                let mut again = Vec::new();
                write_frame(&mut again, kind, &payload).unwrap();
                assert_eq!(again, before[..before.len() - r.len()]);
            }
            Err(FrameError::Truncated { got, expected }) => {
                assert!(got < expected && got <= before.len());
                break;
            }
            Err(FrameError::Closed) => {
                assert!(before.is_empty());
                break;
            }
            Err(_) => break,
        }
    }
});
