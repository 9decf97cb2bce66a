//! Counter-based random numbers (Philox4x32-10).
//!
//! A counter-based generator is a keyed bijection: `block(key, counter)` returns four
//! random words, and nothing else is remembered between calls. That is what the
//! determinism contract needs: the random numbers that a micro-batch, a dropout mask or a
//! weight initialiser consumes are a pure function of *what they are for* (the seed, a
//! purpose tag and a few indices such as epoch and step), never of which thread or rank
//! asks first, or of how many numbers were drawn before.
//!
//! The 128-bit counter is split in two halves: the high 64 bits name a *stream* (derived
//! from a purpose tag and indices by [`stream_id`]), the low 64 bits are the position in
//! it. The key is the user's seed. Philox4x32-10 is the generator of Salmon et al.,
//! "Parallel random numbers: as easy as 1, 2, 3" (SC 2011); it passes BigCrush and is the
//! one PyTorch and JAX use on GPUs. The known-answer tests below pin our implementation
//! to the published vectors.
//!
//! Only integer arithmetic and exact conversions are used (no `ln`, `cos`), so the bits
//! do not depend on the platform's maths library.

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

/// One Philox4x32-10 block: four random words for a key and a 128-bit counter.
pub fn philox4x32_10(key: [u32; 2], counter: [u32; 4]) -> [u32; 4] {
    let [mut k0, mut k1] = key;
    let mut c = counter;
    for round in 0..10 {
        if round > 0 {
            k0 = k0.wrapping_add(W0);
            k1 = k1.wrapping_add(W1);
        }
        let p0 = u64::from(M0) * u64::from(c[0]);
        let p1 = u64::from(M1) * u64::from(c[2]);
        let (hi0, lo0) = ((p0 >> 32) as u32, p0 as u32);
        let (hi1, lo1) = ((p1 >> 32) as u32, p1 as u32);
        c = [hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0];
    }
    c
}

/// Derives a stream identifier from a purpose tag and indices, e.g.
/// `stream_id("permutation", &[epoch])`. Distinct inputs give distinct streams with
/// overwhelming probability (a 64-bit xxh3 of the tag and the little-endian indices).
pub fn stream_id(tag: &str, indices: &[u64]) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(&(tag.len() as u64).to_le_bytes());
    h.update(tag.as_bytes());
    for i in indices {
        h.update(&i.to_le_bytes());
    }
    h.digest()
}

/// A sequence of random numbers: the stream `stream` of the generator keyed by `seed`,
/// read from position `position`. Cloning a `Stream` clones its position, so the state
/// of any consumer is just `(seed, stream, position)` and can be checkpointed as such.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stream {
    key: [u32; 2],
    stream: u64,
    /// Index of the next block to generate.
    block: u64,
    buf: [u32; 4],
    /// Next unread word in `buf`; 4 means empty.
    used: usize,
}

impl Stream {
    /// Opens stream `stream` of the generator keyed by `seed`, at position 0.
    pub fn new(seed: u64, stream: u64) -> Self {
        Stream { key: [seed as u32, (seed >> 32) as u32], stream, block: 0, buf: [0; 4], used: 4 }
    }

    /// Opens the stream for a purpose tag and indices; see [`stream_id`].
    pub fn for_purpose(seed: u64, tag: &str, indices: &[u64]) -> Self {
        Self::new(seed, stream_id(tag, indices))
    }

    /// The next uniformly distributed 32-bit word.
    pub fn next_u32(&mut self) -> u32 {
        if self.used == 4 {
            let b = self.block;
            let ctr = [b as u32, (b >> 32) as u32, self.stream as u32, (self.stream >> 32) as u32];
            self.buf = philox4x32_10(self.key, ctr);
            self.block = self.block.wrapping_add(1);
            self.used = 0;
        }
        let w = self.buf[self.used];
        self.used += 1;
        w
    }

    /// The next uniformly distributed 64-bit word.
    pub fn next_u64(&mut self) -> u64 {
        let lo = u64::from(self.next_u32());
        (u64::from(self.next_u32()) << 32) | lo
    }

    /// A uniform float in `[0, 1)` with 24 random bits (every value exactly representable).
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u32() >> 8) as f32 * (1.0 / (1u32 << 24) as f32)
    }

    /// A uniform float in `[-a, a)`.
    pub fn uniform_symmetric(&mut self, a: f32) -> f32 {
        (2.0 * self.next_f32() - 1.0) * a
    }

    /// A uniform integer in `[0, n)` by Lemire's multiply-shift with rejection, so the
    /// result is unbiased. Panics if `n == 0`.
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "Stream::below(0)");
        loop {
            let x = self.next_u64();
            let m = u128::from(x) * u128::from(n);
            let lo = m as u64;
            if lo >= n.wrapping_neg() % n {
                return (m >> 64) as u64;
            }
        }
    }
}

/// The permutation of `0..n` for a seed and a list of indices (e.g. the epoch), by a
/// Fisher–Yates shuffle driven by its own stream. A pure function of its arguments.
pub fn permutation(seed: u64, tag: &str, indices: &[u64], n: usize) -> Vec<u32> {
    assert!(n <= u32::MAX as usize, "permutation of more than 2^32 items");
    let mut p: Vec<u32> = (0..n as u32).collect();
    let mut s = Stream::for_purpose(seed, tag, indices);
    for i in (1..n).rev() {
        let j = s.below(i as u64 + 1) as usize;
        p.swap(i, j);
    }
    p
}

/// The order in which epoch `epoch` visits `examples` training examples: the permutation
/// of the stream tagged `data.permutation`. Steadfast's training sampler and the Python
/// package's sampler both use it, so a PyTorch loop can visit the data in `steadfast
/// train`'s order.
pub fn data_order(seed: u64, examples: usize, epoch: u64) -> Vec<u32> {
    permutation(seed, "data.permutation", &[epoch], examples)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Known-answer vectors published with the Random123 library (kat_vectors).
    #[test]
    fn philox_known_answers() {
        assert_eq!(philox4x32_10([0, 0], [0; 4]), [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]);
        assert_eq!(philox4x32_10([0xffffffff; 2], [0xffffffff; 4]), [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]);
        assert_eq!(
            philox4x32_10([0xa4093822, 0x299f31d0], [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344]),
            [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
        );
    }

    #[test]
    fn streams_are_pure_functions_of_their_name() {
        let mut a = Stream::for_purpose(7, "init", &[3]);
        let mut b = Stream::for_purpose(7, "init", &[3]);
        let mut c = Stream::for_purpose(7, "init", &[4]);
        let xa: Vec<u32> = (0..9).map(|_| a.next_u32()).collect();
        let xb: Vec<u32> = (0..9).map(|_| b.next_u32()).collect();
        let xc: Vec<u32> = (0..9).map(|_| c.next_u32()).collect();
        assert_eq!(xa, xb);
        assert_ne!(xa, xc);
    }

    #[test]
    fn permutation_is_a_permutation_and_depends_on_epoch() {
        let p = permutation(1, "perm", &[0], 1000);
        let mut sorted = p.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..1000).collect::<Vec<u32>>());
        assert_eq!(p, permutation(1, "perm", &[0], 1000));
        assert_ne!(p, permutation(1, "perm", &[1], 1000));
        assert_ne!(p, permutation(2, "perm", &[0], 1000));
    }

    #[test]
    fn below_is_in_range_and_roughly_uniform() {
        let mut s = Stream::new(5, 0);
        let mut counts = [0u32; 10];
        for _ in 0..100_000 {
            counts[s.below(10) as usize] += 1;
        }
        for c in counts {
            assert!((9_000..11_000).contains(&c), "{counts:?}");
        }
    }

    #[test]
    fn f32_is_in_unit_interval() {
        let mut s = Stream::new(9, 1);
        for _ in 0..10_000 {
            let x = s.next_f32();
            assert!((0.0..1.0).contains(&x));
        }
    }
}
