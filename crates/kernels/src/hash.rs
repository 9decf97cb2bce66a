//! XXH3-64 (its default secret, no seed) with the loop over long inputs compiled per
//! instruction set.
//!
//! Steadfast hashes whole training states several times a step (the fingerprint after an
//! update, the checks at rest, the checkpoints' checksums). XXH3's loop over a long input
//! is 64-bit lanes of additions, exclusive ors and 32x32-bit multiplications, which a
//! vector unit runs eight lanes at a time; compiled for the baseline x86-64 it runs two.
//! This module compiles that loop for the instruction set the process selected
//! ([`per_isa!`](crate::lanes)) and gives the same 64-bit digest as every other XXH3-64 for
//! every input and every way of cutting it into updates (inputs of at most 240 bytes take
//! the `xxhash-rust` crate's short paths, which are not loops).
//!
//! The long-input algorithm, as the format defines it: eight 64-bit accumulators start at
//! fixed primes; the input is read in stripes of 64 bytes, each mixed into the accumulators
//! with the secret read from an offset that advances 8 bytes a stripe; after 16 stripes (a
//! block) the accumulators are scrambled. A stripe counts as one of these only when at
//! least one byte follows it: the input's last 64 bytes are mixed once more with the
//! secret at offset 121, and the accumulators are merged with the length into the digest.

use crate::Isa;
use crate::lanes::per_isa;

/// The format's default secret.
const SECRET: [u8; 192] = [
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c, 0xde, 0xd4, 0x6d,
    0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f, 0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0,
    0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21, 0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0,
    0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c, 0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b,
    0x1b, 0x53, 0x2e, 0xa3, 0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac,
    0xd8, 0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d, 0x8a, 0x51,
    0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64, 0xea, 0xc5, 0xac, 0x83, 0x34,
    0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb, 0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49,
    0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e, 0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8,
    0xd1, 0x7a, 0xd0, 0x31, 0xce, 0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b,
    0x40, 0x7e,
];
const STRIPE: usize = 64;
const STRIPES_PER_BLOCK: usize = (SECRET.len() - STRIPE) / 8;
/// Inputs up to this length take the short paths.
const SHORT_MAX: usize = 240;
/// Bytes a hasher holds before it mixes any stripe: more than [`SHORT_MAX`], so that a
/// short input is whole at the digest, and a whole number of stripes.
const HEAD: usize = 256;

const PRIME32_1: u64 = 0x9E37_79B1;
const PRIME32_2: u64 = 0x85EB_CA77;
const PRIME32_3: u64 = 0xC2B2_AE3D;
const PRIME64_1: u64 = 0x9E37_79B1_85EB_CA87;
const PRIME64_2: u64 = 0xC2B2_AE3D_27D4_EB4F;
const PRIME64_3: u64 = 0x1656_67B1_9E37_79F9;
const PRIME64_4: u64 = 0x85EB_CA77_C2B2_AE63;
const PRIME64_5: u64 = 0x27D4_EB2F_1656_67C5;
const START: [u64; 8] = [PRIME32_3, PRIME64_1, PRIME64_2, PRIME64_3, PRIME64_4, PRIME32_2, PRIME64_5, PRIME32_1];

#[inline(always)]
fn word(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

/// The secret as little-endian words: the stripe mixed `s`-th in its block reads words
/// `s..s + 8`, the scramble words `16..24`.
const KEY: [u64; 24] = {
    let mut key = [0u64; 24];
    let mut k = 0;
    while k < 24 {
        let mut b = 0;
        while b < 8 {
            key[k] |= (SECRET[8 * k + b] as u64) << (8 * b);
            b += 1;
        }
        k += 1;
    }
    key
};

/// Mixes one stripe into the accumulators with the secret words `key`: each lane adds the
/// product of its keyed word's halves, and its neighbour's (`i ^ 1`) input word. The input
/// words are added to `swapped` in their own lanes instead, and moved to their neighbours
/// by [`unswap`] before the accumulators are next read: addition modulo 2^64 does not
/// care when (and the loop needs no shuffle).
#[inline(always)]
fn mix_stripe(acc: &mut [u64; 8], swapped: &mut [u64; 8], stripe: &[u8], key: &[u64]) {
    for i in 0..8 {
        let value = word(stripe, 8 * i);
        let keyed = value ^ key[i];
        swapped[i] = swapped[i].wrapping_add(value);
        acc[i] = acc[i].wrapping_add((keyed & 0xFFFF_FFFF).wrapping_mul(keyed >> 32));
    }
}

#[inline(always)]
fn unswap(acc: &mut [u64; 8], swapped: &mut [u64; 8]) {
    for i in 0..8 {
        acc[i] = acc[i].wrapping_add(swapped[i ^ 1]);
    }
    *swapped = [0; 8];
}

#[inline(always)]
fn scramble(acc: &mut [u64; 8]) {
    for (a, k) in acc.iter_mut().zip(&KEY[16..]) {
        *a = ((*a ^ (*a >> 47)) ^ k).wrapping_mul(PRIME32_1);
    }
}

per_isa! {
    /// Mixes the whole stripes of `data` (a multiple of 64 bytes, each followed by at least
    /// one more byte of the input) into `acc`; `in_block` counts the stripes of the current
    /// block, and a block's 16th stripe scrambles the accumulators.
    fn mix_stripes(acc: &mut [u64; 8], in_block: &mut usize, data: &[u8]) {
        assert!(data.len().is_multiple_of(STRIPE), "stripes are 64 bytes");
        let mut swapped = [0u64; 8];
        let mut stripes = data.len() / STRIPE;
        let mut at = 0;
        // The rest of the current block, then whole blocks, then the start of the next.
        while stripes > 0 {
            let n = (STRIPES_PER_BLOCK - *in_block).min(stripes);
            let block = &data[STRIPE * at..STRIPE * (at + n)];
            if n == STRIPES_PER_BLOCK {
                for s in 0..STRIPES_PER_BLOCK {
                    mix_stripe(acc, &mut swapped, &block[STRIPE * s..], &KEY[s..s + 8]);
                }
            } else {
                for s in 0..n {
                    mix_stripe(acc, &mut swapped, &block[STRIPE * s..], &KEY[*in_block + s..*in_block + s + 8]);
                }
            }
            unswap(acc, &mut swapped);
            *in_block += n;
            if *in_block == STRIPES_PER_BLOCK {
                scramble(acc);
                *in_block = 0;
            }
            at += n;
            stripes -= n;
        }
    }
}

fn avalanche(mut h: u64) -> u64 {
    h ^= h >> 37;
    h = h.wrapping_mul(0x1656_6791_9E37_79F9);
    h ^ (h >> 32)
}

fn fold(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    (p as u64) ^ ((p >> 64) as u64)
}

/// The digest of an input of `len > 240` bytes whose stripes (all but those the last byte
/// ends) are mixed into `acc`, and whose last 64 bytes are `last`.
fn finish(mut acc: [u64; 8], last: &[u8], len: u64) -> u64 {
    // The last stripe reads the secret from an offset that is not a whole word.
    let mut key = [0u64; 8];
    for (i, k) in key.iter_mut().enumerate() {
        *k = word(&SECRET, SECRET.len() - STRIPE - 7 + 8 * i);
    }
    let mut swapped = [0u64; 8];
    mix_stripe(&mut acc, &mut swapped, last, &key);
    unswap(&mut acc, &mut swapped);
    let mut h = len.wrapping_mul(PRIME64_1);
    for i in 0..4 {
        h = h.wrapping_add(fold(acc[2 * i] ^ word(&SECRET, 11 + 16 * i), acc[2 * i + 1] ^ word(&SECRET, 19 + 16 * i)));
    }
    avalanche(h)
}

/// The XXH3-64 of `data`, its long-input loop on `isa`.
pub fn xxh3_64(isa: Isa, data: &[u8]) -> u64 {
    if data.len() <= SHORT_MAX || isa == Isa::Scalar {
        return xxhash_rust::xxh3::xxh3_64(data);
    }
    let (mut acc, mut in_block) = (START, 0);
    let mixed = (data.len() - 1) / STRIPE * STRIPE;
    mix_stripes(isa, &mut acc, &mut in_block, &data[..mixed]);
    finish(acc, &data[data.len() - STRIPE..], data.len() as u64)
}

/// A streaming XXH3-64: [`update`](Xxh3::update) with the input in pieces of any sizes,
/// then [`digest`](Xxh3::digest), which gives [`xxh3_64`] of the pieces joined.
///
/// On [`Isa::Scalar`] it is the `xxhash-rust` crate's hasher, whose loop is written with
/// the baseline's two-lane vector instructions (faster there than this module's loop
/// compiled for the baseline).
#[derive(Clone)]
pub enum Xxh3 {
    /// The baseline's.
    Baseline(Box<xxhash_rust::xxh3::Xxh3>),
    /// This module's loop, compiled for a vector instruction set.
    Vector(Box<Stream>),
}

impl Xxh3 {
    /// A hasher whose loop runs on `isa`.
    pub fn new(isa: Isa) -> Xxh3 {
        match isa {
            Isa::Scalar => Xxh3::Baseline(Box::default()),
            _ => Xxh3::Vector(Box::new(Stream::new(isa))),
        }
    }

    /// Adds `data` to the input.
    pub fn update(&mut self, data: &[u8]) {
        match self {
            Xxh3::Baseline(h) => h.update(data),
            Xxh3::Vector(h) => h.update(data),
        }
    }

    /// The digest of the input so far (the hasher can go on taking input).
    pub fn digest(&self) -> u64 {
        match self {
            Xxh3::Baseline(h) => h.digest(),
            Xxh3::Vector(h) => h.digest(),
        }
    }
}

/// The streaming state of [`Xxh3`] on a vector instruction set.
#[derive(Clone, Debug)]
pub struct Stream {
    isa: Isa,
    acc: [u64; 8],
    in_block: usize,
    /// The input not mixed yet: all of it while it is at most [`HEAD`] bytes; after that,
    /// the bytes after the last stripe mixed (1 to 64 of them: a stripe is mixed only once
    /// a byte follows it).
    pending: [u8; HEAD],
    pending_len: usize,
    /// The last stripe mixed: the input's last 64 bytes may reach back into it.
    last: [u8; STRIPE],
    total: u64,
}

impl Stream {
    fn new(isa: Isa) -> Stream {
        Stream { isa, acc: START, in_block: 0, pending: [0; HEAD], pending_len: 0, last: [0; STRIPE], total: 0 }
    }

    fn update(&mut self, mut data: &[u8]) {
        if data.is_empty() {
            return;
        }
        self.total += data.len() as u64;
        // Up to HEAD bytes, all of the input is pending (nothing is mixed yet).
        if self.total <= HEAD as u64 {
            self.pending[self.pending_len..self.pending_len + data.len()].copy_from_slice(data);
            self.pending_len += data.len();
            return;
        }
        if self.pending_len > 0 {
            // Complete the pending bytes to whole stripes; mix them once a byte follows.
            let take = ((STRIPE - self.pending_len % STRIPE) % STRIPE).min(data.len());
            self.pending[self.pending_len..self.pending_len + take].copy_from_slice(&data[..take]);
            self.pending_len += take;
            data = &data[take..];
            if data.is_empty() {
                return;
            }
            let whole = self.pending_len;
            mix_stripes(self.isa, &mut self.acc, &mut self.in_block, &self.pending[..whole]);
            self.last.copy_from_slice(&self.pending[whole - STRIPE..whole]);
            self.pending_len = 0;
        }
        let mixed = (data.len() - 1) / STRIPE * STRIPE;
        if mixed > 0 {
            mix_stripes(self.isa, &mut self.acc, &mut self.in_block, &data[..mixed]);
            self.last.copy_from_slice(&data[mixed - STRIPE..mixed]);
        }
        let rest = &data[mixed..];
        self.pending[..rest.len()].copy_from_slice(rest);
        self.pending_len = rest.len();
    }

    fn digest(&self) -> u64 {
        let pending = &self.pending[..self.pending_len];
        if self.total <= SHORT_MAX as u64 {
            return xxhash_rust::xxh3::xxh3_64(pending);
        }
        let (mut acc, mut in_block) = (self.acc, self.in_block);
        let mixed = (pending.len() - 1) / STRIPE * STRIPE;
        mix_stripes(self.isa, &mut acc, &mut in_block, &pending[..mixed]);
        if pending.len() >= STRIPE {
            finish(acc, &pending[pending.len() - STRIPE..], self.total)
        } else {
            let mut last = [0u8; STRIPE];
            let from_before = STRIPE - pending.len();
            last[..from_before].copy_from_slice(&self.last[pending.len()..]);
            last[from_before..].copy_from_slice(pending);
            finish(acc, &last, self.total)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// `len` pseudo-random bytes, the same for the same seed.
    fn input(len: usize, seed: u64) -> Vec<u8> {
        let words = crate::testing::uniform(len.div_ceil(4), seed, 1.0);
        words.iter().flat_map(|w| w.to_le_bytes()).take(len).collect()
    }

    #[test]
    fn every_length_up_to_a_few_blocks_gives_the_format_s_digest_on_every_instruction_set() {
        let data = input(3 * 1024 + 200, 7);
        for isa in Isa::all_available() {
            for len in 0..data.len() {
                let want = xxhash_rust::xxh3::xxh3_64(&data[..len]);
                assert_eq!(xxh3_64(isa, &data[..len]), want, "{isa} one-shot, length {len}");
                let mut h = Stream::new(isa);
                h.update(&data[..len]);
                assert_eq!(h.digest(), want, "{isa} one update, length {len}");
            }
        }
    }

    proptest! {
        #[test]
        fn any_cut_into_updates_gives_the_digest_of_the_whole(
            len in 0usize..5000,
            cuts in proptest::collection::vec(0usize..5000, 0..12),
            seed in any::<u64>(),
        ) {
            let data = input(len, seed);
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(len)).collect();
            cuts.sort_unstable();
            for isa in Isa::all_available() {
                let mut h = Stream::new(isa);
                let mut at = 0;
                for &c in cuts.iter().chain([len].iter()) {
                    h.update(&data[at..c]);
                    at = c;
                    // A digest along the way is that of the input so far.
                    prop_assert_eq!(h.digest(), xxhash_rust::xxh3::xxh3_64(&data[..c]));
                }
                prop_assert_eq!(h.digest(), xxhash_rust::xxh3::xxh3_64(&data));
            }
        }
    }
}
