//! A Python worker's state as bytes: the image that its fingerprint hashes, that it serves
//! to workers that fetch it, and that a fetch brings in.
//!
//! The Python side hands the state over as a header (the canonical JSON of its tree and
//! tensors' names, dtypes and shapes: `steadfast._tree`) and the tensors' bytes where they
//! lie in memory. The image lays them end to end: the header's length (8 bytes, little
//! endian), the header, then each tensor, each piece starting at a multiple of 8 bytes
//! and the whole padded with zeros to one. The state's fingerprint is the xxh3-64 of its
//! image, hashed from where the pieces lie without building the image; a replica serves
//! the image itself, built once per epoch (not once per step), since a fetcher asks for
//! the state of the epoch's first step.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use comm::port::Port;
use comm::transport::CommError;

use crate::host::host_bytes;

/// A tensor's address and size in bytes, as the Python side reports it.
pub(crate) type At = (usize, usize);

/// Zeros to pad a piece with (every piece is padded to a multiple of 8 bytes).
const ZEROS: [u8; 8] = [0; 8];

fn padding(len: usize) -> &'static [u8] {
    &ZEROS[..len.next_multiple_of(8) - len]
}

/// The pieces of the image of `(header, tensors)`, in order (padding included).
fn pieces<'a>(header: &'a [u8], tensors: &'a [At], length: &'a [u8; 8]) -> impl Iterator<Item = &'a [u8]> + 'a {
    let head = [&length[..], header, padding(header.len())];
    head.into_iter().chain(tensors.iter().flat_map(|&(address, bytes)| [host_bytes(address, bytes), padding(bytes)]))
}

/// The fingerprint of the state `(header, tensors)`: the xxh3-64 of its image.
pub(crate) fn fingerprint(header: &[u8], tensors: &[At]) -> u64 {
    let length = (header.len() as u64).to_le_bytes();
    let mut h = ckpt::checksummer();
    for piece in pieces(header, tensors, &length) {
        h.update(piece);
    }
    h.digest()
}

/// The image of the state `(header, tensors)` at `step`.
pub(crate) struct Image {
    pub step: u64,
    pub fingerprint: u64,
    /// The header's xxh3-64: what a fetcher asks for, with the length.
    pub layout: u64,
    pub bytes: Vec<u8>,
}

impl Image {
    /// Builds the image of the state `(header, tensors)` at `step`, reusing `bytes`.
    pub(crate) fn build(step: u64, header: &[u8], tensors: &[At], mut bytes: Vec<u8>) -> Image {
        let length = (header.len() as u64).to_le_bytes();
        bytes.clear();
        for piece in pieces(header, tensors, &length) {
            bytes.extend_from_slice(piece);
        }
        let fingerprint = ckpt::checksum(&bytes);
        Image { step, fingerprint, layout: ckpt::checksum(header), bytes }
    }

    /// Its size in 4-byte elements, as a fetch counts it.
    pub(crate) fn elements(&self) -> u64 {
        self.bytes.len() as u64 / 4
    }

    /// The header's length, from the image's first 8 bytes; `None` when the image is too
    /// short to hold them, or the header it says.
    pub(crate) fn header_len(bytes: &[u8]) -> Option<usize> {
        let n = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?) as usize;
        (bytes.len() >= 8usize.checked_add(n)?).then_some(n)
    }
}

/// The image this worker serves, shared with the server's threads: a fetch of a state not
/// imaged yet waits a little for it (a source may hear of the epoch after its fetcher).
#[derive(Clone, Default)]
pub(crate) struct Served(Arc<(Mutex<Option<Image>>, Condvar)>);

/// How long a fetch of a state not imaged yet waits for it.
const WAIT_FOR_IMAGE: Duration = Duration::from_secs(20);

impl Served {
    /// Serves `image` from now on, and gives back the buffer of the one it replaces.
    pub(crate) fn put(&self, image: Image) -> Vec<u8> {
        let (lock, news) = &*self.0;
        let old = lock.lock().unwrap_or_else(|e| e.into_inner()).replace(image);
        news.notify_all();
        old.map(|i| i.bytes).unwrap_or_default()
    }

    /// The image of step `step` with `fingerprint`: runs `f` on it, waiting a little for
    /// it; or says what is served instead.
    fn with<R>(&self, (step, fingerprint): (u64, u64), f: impl FnOnce(&Image) -> R) -> Result<R, String> {
        let (lock, news) = &*self.0;
        let deadline = Instant::now() + WAIT_FOR_IMAGE;
        let mut held = lock.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            match &*held {
                Some(i) if (i.step, i.fingerprint) == (step, fingerprint) => return Ok(f(i)),
                Some(i) if i.step > step => return Err(format!("holds step {}, not step {step}", i.step)),
                _ => {}
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(match &*held {
                    Some(i) => format!(
                        "holds step {} ({}), not step {step} ({})",
                        i.step,
                        repro::fingerprint::hex(i.fingerprint),
                        repro::fingerprint::hex(fingerprint)
                    ),
                    None => format!("holds no image of step {step}"),
                });
            }
            held = news.wait_timeout(held, left).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// Serves fetches from the port's transfer connections until the process ends.
    pub(crate) fn spawn_server(&self, port: &mut Port) -> Result<(), CommError> {
        let transfers = port.transfers().ok_or_else(|| CommError::Setup("the port's transfers are taken".into()))?;
        let served = self.clone();
        std::thread::spawn(move || {
            while let Ok((_peer, stream)) = transfers.recv() {
                let served = served.clone();
                std::thread::spawn(move || {
                    let describe =
                        &mut |step, fingerprint| served.with((step, fingerprint), |i| (i.layout, i.elements()));
                    comm::transfer::serve_described(
                        stream,
                        Duration::from_secs(60),
                        describe,
                        &mut |want, range, out| {
                            served.with((want.step, want.fingerprint), |i| {
                                if (want.layout, want.elements) != (i.layout, i.elements()) {
                                    return Err("the image's layout differs".to_owned());
                                }
                                out.extend_from_slice(&i.bytes[4 * range.start..4 * range.end]);
                                Ok(0)
                            })?
                        },
                    );
                });
            }
        });
        Ok(())
    }
}
