//! A peer that sends arbitrary bytes gets a handshake error, never a panic, and never
//! passes: without the job's secret it cannot prove anything.
#![no_main]

use std::io::{Read, Write};

use libfuzzer_sys::fuzz_target;

/// A connection whose peer sends `input` and swallows whatever we send.
struct Peer<'a> {
    input: &'a [u8],
}

impl Read for Peer<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.input.read(buf)
    }
}

impl Write for Peer<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fuzz_target!(|data: &[u8]| {
    let result = comm::handshake::handshake(&mut Peer { input: data }, b"fuzz-job-secret", 0);
    assert!(result.is_err(), "a peer without the secret passed the handshake: {result:?}");
});
