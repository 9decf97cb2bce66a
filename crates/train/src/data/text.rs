//! Character-level text from Debian's `fortunes` package.
//!
//! A fortune file holds quotations separated by lines containing only `%`. We read every
//! regular file of the directory that is not a `.dat` index (symlinks such as `*.u8` are
//! skipped, they duplicate their targets), in name order, and split the quotations:
//! every tenth one (by position in that order) is held out for evaluation. Tokens are
//! bytes, renumbered densely in byte order, so the vocabulary is a pure function of the
//! corpus.

use std::path::Path;

use super::TextSet;
use crate::error::DataError;

/// Where Debian's package installs the files.
pub const DEFAULT_DIR: &str = "/usr/share/games/fortunes";

/// Loads the fortunes corpus from `dir` (default [`DEFAULT_DIR`]).
pub fn load_fortunes(dir: Option<&Path>, context: usize) -> Result<TextSet, DataError> {
    let dir = dir.unwrap_or(Path::new(DEFAULT_DIR));
    let io = |source| DataError::Io { path: dir.to_owned(), source };
    if !dir.is_dir() {
        return Err(DataError::Missing {
            path: dir.to_owned(),
            hint: "install it with `apt-get install fortunes`, or pass --data-dir".into(),
        });
    }
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let entry = entry.map_err(io)?;
        let path = entry.path();
        let is_file = entry.file_type().map_err(io)?.is_file();
        if is_file && path.extension().is_none_or(|e| e != "dat") {
            files.push(path);
        }
    }
    files.sort();
    let mut quotes = Vec::new();
    for path in &files {
        let text = std::fs::read(path).map_err(|source| DataError::Io { path: path.clone(), source })?;
        quotes.extend(split_quotes(&text));
    }
    if quotes.len() < 10 {
        return Err(DataError::Format {
            path: dir.to_owned(),
            reason: format!("found {} quotations in {} files; need at least 10", quotes.len(), files.len()),
        });
    }
    let (mut train, mut test) = (Vec::new(), Vec::new());
    for (i, q) in quotes.iter().enumerate() {
        let dst = if i % 10 == 0 { &mut test } else { &mut train };
        dst.extend_from_slice(q);
        dst.push(b'\n');
    }
    tokenize(&train, &test, context).map_err(|reason| DataError::Format { path: dir.to_owned(), reason })
}

/// Splits a fortune file into its quotations (without the `%` separators).
pub fn split_quotes(text: &[u8]) -> Vec<Vec<u8>> {
    let mut quotes = Vec::new();
    let mut current = Vec::new();
    for line in text.split_inclusive(|&b| b == b'\n') {
        if line == b"%\n" || line == b"%" {
            if !current.is_empty() {
                quotes.push(std::mem::take(&mut current));
            }
        } else {
            current.extend_from_slice(line);
        }
    }
    if !current.iter().all(u8::is_ascii_whitespace) {
        quotes.push(current);
    }
    quotes
}

/// Builds the byte vocabulary of both splits and encodes them.
pub fn tokenize(train: &[u8], test: &[u8], context: usize) -> Result<TextSet, String> {
    let mut present = [false; 256];
    for &b in train.iter().chain(test) {
        present[usize::from(b)] = true;
    }
    let vocab: Vec<u8> = (0..=255u8).filter(|&b| present[usize::from(b)]).collect();
    let mut id = [0u16; 256];
    for (i, &b) in vocab.iter().enumerate() {
        id[usize::from(b)] = i as u16;
    }
    let encode = |s: &[u8]| s.iter().map(|&b| id[usize::from(b)]).collect::<Vec<u16>>();
    let set = TextSet { vocab, context, train: encode(train), test: encode(test) };
    if set.train.len() <= context || set.test.len() <= context {
        return Err(format!(
            "{} training and {} held-out bytes are too few for a context of {context}",
            set.train.len(),
            set.test.len()
        ));
    }
    Ok(set)
}

/// Cross-entropy (nats per token) of a unigram model fitted on the training tokens, with
/// add-one smoothing, on the held-out tokens: the baseline a language model must beat.
pub fn unigram_cross_entropy(set: &TextSet) -> f64 {
    let v = set.vocab.len();
    let mut counts = vec![1.0f64; v];
    for &t in &set.train {
        counts[usize::from(t)] += 1.0;
    }
    let total: f64 = counts.iter().sum();
    let nll: f64 = set.test.iter().map(|&t| -(counts[usize::from(t)] / total).ln()).sum();
    nll / set.test.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_on_percent_lines() {
        let q = split_quotes(b"one\n%\ntwo\nlines\n%\n%\nthree");
        assert_eq!(q, vec![b"one\n".to_vec(), b"two\nlines\n".to_vec(), b"three".to_vec()]);
    }

    #[test]
    fn vocabulary_is_dense_and_sorted() {
        let t = tokenize(b"cabbage", b"bad", 2).unwrap();
        assert_eq!(t.vocab, b"abcdeg".to_vec());
        assert_eq!(t.test, vec![1, 0, 3]);
    }

    #[test]
    fn a_corpus_too_small_is_an_error() {
        assert!(tokenize(b"ab", b"cd", 8).unwrap_err().contains("too few"));
    }

    #[test]
    fn a_missing_directory_names_the_package() {
        let err = load_fortunes(Some(Path::new("/nonexistent/fortunes")), 8).unwrap_err();
        assert!(err.to_string().contains("apt-get install fortunes"), "{err}");
    }
}
