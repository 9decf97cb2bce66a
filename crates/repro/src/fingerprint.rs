//! 64-bit fingerprints of named f32 tensors.
//!
//! A fingerprint is the xxh3-64 of a canonical byte stream: for each tensor, in the order
//! given, its name (length-prefixed), its element count, and its elements as
//! little-endian IEEE-754 bits. Two states have the same fingerprint only if they hold the
//! same tensors, in the same order, with the same bits (up to a 2^-64 chance of
//! collision). `-0.0` and `+0.0`, or two NaN payloads, are *different* here: the
//! fingerprint is about bits, not values.

use kernels::hash::Xxh3;

/// Incremental fingerprint of a sequence of named tensors (hashed on the instruction set
/// the process selected: the same digest on every one).
#[derive(Clone)]
pub struct Fingerprinter {
    hasher: Xxh3,
}

impl Default for Fingerprinter {
    fn default() -> Self {
        Fingerprinter { hasher: Xxh3::new(kernels::isa::selected()) }
    }
}

impl Fingerprinter {
    /// A fingerprinter that has seen nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one named tensor.
    pub fn add(&mut self, name: &str, data: &[f32]) {
        self.hasher.update(&(name.len() as u64).to_le_bytes());
        self.hasher.update(name.as_bytes());
        self.hasher.update(&(data.len() as u64).to_le_bytes());
        if cfg!(target_endian = "little") {
            // The elements' memory is already the little-endian stream: hash it in place
            // (a training job fingerprints its state every step).
            self.hasher.update(bytemuck::cast_slice(data));
            return;
        }
        // Elsewhere, in fixed-size chunks, so that no allocation proportional to the
        // tensor is needed; the byte stream is the same as hashing all elements at once.
        let mut buf = [0u8; 4096];
        for chunk in data.chunks(buf.len() / 4) {
            for (dst, x) in buf.chunks_exact_mut(4).zip(chunk) {
                dst.copy_from_slice(&x.to_bits().to_le_bytes());
            }
            self.hasher.update(&buf[..chunk.len() * 4]);
        }
    }

    /// Adds a named scalar (e.g. the step counter).
    pub fn add_u64(&mut self, name: &str, value: u64) {
        self.hasher.update(&(name.len() as u64).to_le_bytes());
        self.hasher.update(name.as_bytes());
        self.hasher.update(&value.to_le_bytes());
    }

    /// The fingerprint of everything added so far.
    pub fn finish(&self) -> u64 {
        self.hasher.digest()
    }
}

/// The fingerprint of a list of named tensors, in order.
pub fn fingerprint<'a>(tensors: impl IntoIterator<Item = (&'a str, &'a [f32])>) -> u64 {
    let mut f = Fingerprinter::new();
    for (name, data) in tensors {
        f.add(name, data);
    }
    f.finish()
}

/// Formats a fingerprint as the 16 lower-case hex digits that logs and tests compare.
pub fn hex(fp: u64) -> String {
    format!("{fp:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depends_on_bits_names_and_order() {
        let a = [1.0f32, 2.0, 3.0];
        let b = [1.0f32, 2.0, 3.0000002];
        let base = fingerprint([("w", &a[..]), ("b", &a[..])]);
        assert_eq!(base, fingerprint([("w", &a[..]), ("b", &a[..])]));
        assert_ne!(base, fingerprint([("w", &a[..]), ("b", &b[..])]));
        assert_ne!(base, fingerprint([("b", &a[..]), ("w", &a[..])]));
        assert_ne!(base, fingerprint([("w", &a[..]), ("c", &a[..])]));
        assert_ne!(fingerprint([("w", &[0.0f32][..])]), fingerprint([("w", &[-0.0f32][..])]));
    }

    #[test]
    fn chunking_does_not_change_the_stream() {
        let big: Vec<f32> = (0..5000).map(|i| i as f32 * 0.5).collect();
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&1u64.to_le_bytes());
        bytes.extend_from_slice(b"x");
        bytes.extend_from_slice(&(big.len() as u64).to_le_bytes());
        for x in &big {
            bytes.extend_from_slice(&x.to_le_bytes());
        }
        assert_eq!(fingerprint([("x", &big[..])]), xxhash_rust::xxh3::xxh3_64(&bytes));
    }
}
