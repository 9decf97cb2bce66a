//! Mutual authentication of two peers that share a per-job secret.
//!
//! The launcher generates a random secret for the job and hands it to every worker. When
//! two peers connect, each proves that it knows the secret without sending it, bound to a
//! fresh challenge from the other side, so a recorded handshake cannot be replayed:
//!
//! 1. each side sends `HELLO`: protocol version, its rank, and a fresh 32-byte nonce;
//! 2. each side sends `PROOF = HMAC-SHA256(secret, label || their_nonce || my_nonce || my_rank)`;
//! 3. each side recomputes the other's proof and compares it in constant time.
//!
//! A peer that sends garbage, the wrong version, or a wrong proof gets an error naming
//! what failed; nothing it sent is trusted before the proof checks out.

use std::io::{Read, Write};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::frame::{FrameError, read_frame, write_frame};

/// Protocol version spoken by this build.
pub const VERSION: u16 = 2;
const LABEL: &[u8] = b"steadfast-handshake-v1";
const KIND_HELLO: u8 = 0xA1;
const KIND_PROOF: u8 = 0xA2;
/// Handshake frames are tiny; anything larger is an attack or a mistake.
const MAX_HANDSHAKE_FRAME: u32 = 1024;

/// A handshake that did not complete.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// Reading or writing failed.
    #[error("handshake i/o: {0}")]
    Frame(#[from] FrameError),
    /// The peer sent something that is not a handshake message.
    #[error("malformed handshake message: {0}")]
    Malformed(String),
    /// The peer speaks another protocol version.
    #[error("the peer speaks protocol version {0}, this build speaks {VERSION}")]
    Version(u16),
    /// The peer does not know the job's secret.
    #[error("the peer (claiming rank {0}) failed to prove knowledge of the job secret")]
    BadProof(u32),
    /// No randomness available for the nonce.
    #[error("cannot draw a nonce: {0}")]
    Random(String),
}

fn proof(secret: &[u8], their_nonce: &[u8; 32], my_nonce: &[u8; 32], my_rank: u32) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(LABEL);
    mac.update(their_nonce);
    mac.update(my_nonce);
    mac.update(&my_rank.to_le_bytes());
    mac
}

/// Runs the handshake over `stream` as `my_rank`; returns the peer's rank.
pub fn handshake(stream: &mut (impl Read + Write), secret: &[u8], my_rank: u32) -> Result<u32, HandshakeError> {
    let mut my_nonce = [0u8; 32];
    getrandom::fill(&mut my_nonce).map_err(|e| HandshakeError::Random(e.to_string()))?;
    let mut hello = Vec::with_capacity(38);
    hello.extend_from_slice(&VERSION.to_le_bytes());
    hello.extend_from_slice(&my_rank.to_le_bytes());
    hello.extend_from_slice(&my_nonce);
    write_frame(stream, KIND_HELLO, &hello)?;

    let theirs = read_frame(stream, MAX_HANDSHAKE_FRAME)?;
    if theirs.kind != KIND_HELLO || theirs.payload.len() != 38 {
        return Err(HandshakeError::Malformed(format!(
            "expected HELLO of 38 bytes, got kind {:#x} with {} bytes",
            theirs.kind,
            theirs.payload.len()
        )));
    }
    let version = u16::from_le_bytes([theirs.payload[0], theirs.payload[1]]);
    if version != VERSION {
        return Err(HandshakeError::Version(version));
    }
    let peer_rank = u32::from_le_bytes(theirs.payload[2..6].try_into().expect("4 bytes"));
    let their_nonce: [u8; 32] = theirs.payload[6..38].try_into().expect("32 bytes");
    if their_nonce == my_nonce {
        return Err(HandshakeError::Malformed("the peer echoed our nonce".into()));
    }

    let mine = proof(secret, &their_nonce, &my_nonce, my_rank).finalize().into_bytes();
    write_frame(stream, KIND_PROOF, &mine)?;
    let answer = read_frame(stream, MAX_HANDSHAKE_FRAME)?;
    if answer.kind != KIND_PROOF {
        return Err(HandshakeError::Malformed(format!("expected PROOF, got kind {:#x}", answer.kind)));
    }
    proof(secret, &my_nonce, &their_nonce, peer_rank)
        .verify_slice(&answer.payload)
        .map_err(|_| HandshakeError::BadProof(peer_rank))?;
    Ok(peer_rank)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    fn pair(
        secret_a: &'static [u8],
        secret_b: &'static [u8],
    ) -> (Result<u32, HandshakeError>, Result<u32, HandshakeError>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            handshake(&mut s, secret_b, 1)
        });
        let mut c = TcpStream::connect(addr).unwrap();
        let a = handshake(&mut c, secret_a, 0);
        (a, t.join().unwrap())
    }

    #[test]
    fn peers_with_the_secret_learn_each_others_rank() {
        let (a, b) = pair(b"job-secret", b"job-secret");
        assert_eq!(a.unwrap(), 1);
        assert_eq!(b.unwrap(), 0);
    }

    #[test]
    fn a_wrong_secret_is_refused_on_both_sides() {
        let (a, b) = pair(b"job-secret", b"other-secret");
        assert!(matches!(a, Err(HandshakeError::BadProof(1))), "{a:?}");
        assert!(matches!(b, Err(HandshakeError::BadProof(0))), "{b:?}");
    }

    #[test]
    fn garbage_and_oversized_frames_are_refused() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            handshake(&mut s, b"k", 1)
        });
        let mut c = TcpStream::connect(addr).unwrap();
        // Take the server's HELLO, answer with an absurd length prefix, then hang up.
        read_frame(&mut c, MAX_HANDSHAKE_FRAME).unwrap();
        c.write_all(&[0xff, 0xff, 0xff, 0x7f, KIND_HELLO]).unwrap();
        drop(c);
        let err = t.join().unwrap().unwrap_err();
        assert!(matches!(err, HandshakeError::Frame(FrameError::TooLarge { .. })), "{err}");
    }
}
