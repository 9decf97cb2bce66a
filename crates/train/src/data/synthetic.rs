//! Synthetic data sets, generated from the seed, for fast tests and machines without the
//! Debian packages.
//!
//! Images: ten classes, each a random 28x28 template; an example is its class template
//! blended with per-example noise. Text: sentences drawn from a small vocabulary with a
//! fixed grammar, so a language model has structure to learn. Both are pure functions of
//! the seed.

use repro::rng::Stream;

use super::{ImageSet, TextSet, text::tokenize};

/// Training examples in the synthetic image set.
pub const TRAIN_IMAGES: usize = 4096;
/// Test examples in the synthetic image set.
pub const TEST_IMAGES: usize = 1024;

/// The synthetic image set for `seed`.
pub fn images(seed: u64) -> ImageSet {
    let (rows, cols, classes) = (28, 28, 10);
    let size = rows * cols;
    let mut t = Stream::for_purpose(seed, "synthetic.templates", &[]);
    let templates: Vec<u8> = (0..classes * size).map(|_| (t.next_u32() >> 24) as u8).collect();
    let make = |split: u64, n: usize| {
        let mut s = Stream::for_purpose(seed, "synthetic.images", &[split]);
        let mut pixels = Vec::with_capacity(n * size);
        let mut labels = Vec::with_capacity(n);
        for _ in 0..n {
            let label = s.below(classes as u64) as usize;
            labels.push(label as u8);
            let tpl = &templates[label * size..(label + 1) * size];
            // Integer blend: 5/8 template, 3/8 noise.
            pixels.extend(tpl.iter().map(|&p| ((u32::from(p) * 5 + (s.next_u32() >> 24) * 3) / 8) as u8));
        }
        (pixels, labels)
    };
    let (train_pixels, train_labels) = make(0, TRAIN_IMAGES);
    let (test_pixels, test_labels) = make(1, TEST_IMAGES);
    ImageSet { rows, cols, classes, train_pixels, train_labels, test_pixels, test_labels }
}

/// The synthetic text corpus for `seed` (about 200 kB of training text).
pub fn text(seed: u64, context: usize) -> TextSet {
    const SUBJECTS: [&str; 6] = ["the cat", "a dog", "my friend", "the robot", "every bird", "no one"];
    const VERBS: [&str; 6] = ["sees", "likes", "follows", "paints", "ignores", "finds"];
    const OBJECTS: [&str; 6] = ["the moon", "a red ball", "old books", "the river", "some bread", "a song"];
    fn pick(s: &mut Stream, words: &[&'static str]) -> &'static str {
        words[s.below(words.len() as u64) as usize]
    }
    let make = |split: u64, bytes: usize| {
        let mut s = Stream::for_purpose(seed, "synthetic.text", &[split]);
        let mut out = Vec::with_capacity(bytes + 64);
        while out.len() < bytes {
            let sentence =
                format!("{} {} {}.\n", pick(&mut s, &SUBJECTS), pick(&mut s, &VERBS), pick(&mut s, &OBJECTS));
            out.extend_from_slice(sentence.as_bytes());
        }
        out
    };
    let train = make(0, 200_000);
    let test = make(1, 20_000);
    // The generated corpus is far larger than any context a model uses.
    tokenize(&train, &test, context).expect("synthetic corpus is large enough")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_sets_are_pure_functions_of_the_seed() {
        let (a, b, c) = (images(1), images(1), images(2));
        assert_eq!(a.train_pixels, b.train_pixels);
        assert_ne!(a.train_pixels, c.train_pixels);
        assert_eq!(text(1, 16).train, text(1, 16).train);
        assert!(a.train_labels.iter().all(|&l| l < 10));
    }
}
