//! Training data: Fashion-MNIST, fortunes text, and synthetic stand-ins for tests.
//!
//! Every loader is our own code, reads files once into memory, and answers a missing,
//! truncated or malformed file with a [`DataError`] naming it. A [`Dataset`] only hands out
//! examples by index; which indices form a batch is the [`sampler`]'s business, so that the
//! data order is a pure function of `(seed, epoch, step, micro-batch index)`.

pub mod fashion_mnist;
pub mod idx;
pub mod sampler;
pub mod synthetic;
pub mod text;

use std::path::PathBuf;

pub use crate::error::DataError;

/// Which data set to train on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataKind {
    /// Fashion-MNIST images (Debian package `dataset-fashion-mnist`).
    FashionMnist,
    /// Character-level text from the `fortunes` package.
    Fortunes,
    /// Generated in memory from the seed; needs no files.
    Synthetic,
}

/// What a model consumes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Modality {
    /// Greyscale images with a class label.
    Images,
    /// Token sequences for next-token prediction.
    Text,
}

/// Where and what to load.
#[derive(Clone, Debug)]
pub struct DataSpec {
    /// The data set.
    pub kind: DataKind,
    /// Overrides the default directory of the data set.
    pub dir: Option<PathBuf>,
    /// What the model needs; synthetic data is generated in this form.
    pub modality: Modality,
    /// Context length for text (tokens per example, targets are shifted by one).
    pub context: usize,
    /// Seed for synthetic data.
    pub seed: u64,
}

/// The held-out or training part of a data set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// Examples that training draws from.
    Train,
    /// Examples used only for evaluation.
    Test,
}

/// Labelled greyscale images, stored as raw bytes.
#[derive(Clone, Debug)]
pub struct ImageSet {
    /// Image height.
    pub rows: usize,
    /// Image width.
    pub cols: usize,
    /// Number of classes.
    pub classes: usize,
    /// Training pixels, `n_train * rows * cols` bytes.
    pub train_pixels: Vec<u8>,
    /// Training labels.
    pub train_labels: Vec<u8>,
    /// Test pixels.
    pub test_pixels: Vec<u8>,
    /// Test labels.
    pub test_labels: Vec<u8>,
}

/// A tokenised text corpus with a byte-level vocabulary.
#[derive(Clone, Debug)]
pub struct TextSet {
    /// Token id to byte.
    pub vocab: Vec<u8>,
    /// Tokens per example.
    pub context: usize,
    /// Training tokens.
    pub train: Vec<u16>,
    /// Held-out tokens.
    pub test: Vec<u16>,
}

/// A loaded data set.
#[derive(Clone, Debug)]
pub enum Dataset {
    /// An image classification set.
    Images(ImageSet),
    /// A text corpus.
    Text(TextSet),
}

/// A batch in the plain form that models turn into tensors.
#[derive(Clone, Debug, PartialEq)]
pub enum Batch {
    /// `x` is `n * rows * cols` normalised pixels, `y` the labels.
    Images {
        /// Number of examples.
        n: usize,
        /// Normalised pixels.
        x: Vec<f32>,
        /// Class labels.
        y: Vec<i64>,
    },
    /// `x` and `y` are `n * context` token ids; `y` is `x` shifted by one.
    Tokens {
        /// Number of sequences.
        n: usize,
        /// Input tokens.
        x: Vec<i64>,
        /// Target tokens.
        y: Vec<i64>,
    },
}

impl Batch {
    /// Number of examples in the batch.
    pub fn len(&self) -> usize {
        match self {
            Batch::Images { n, .. } | Batch::Tokens { n, .. } => *n,
        }
    }

    /// True when the batch holds no example.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Mean and standard deviation of Fashion-MNIST pixels scaled to `[0, 1]`; used for every
/// image set so that inputs are roughly centred.
const PIXEL_MEAN: f32 = 0.2860;
const PIXEL_STD: f32 = 0.3530;

impl Dataset {
    /// Loads the data set that `spec` names.
    pub fn load(spec: &DataSpec) -> Result<Dataset, DataError> {
        match (spec.kind, spec.modality) {
            (DataKind::FashionMnist, Modality::Images) => {
                Ok(Dataset::Images(fashion_mnist::load(spec.dir.as_deref())?))
            }
            (DataKind::Fortunes, Modality::Text) => {
                Ok(Dataset::Text(text::load_fortunes(spec.dir.as_deref(), spec.context)?))
            }
            (DataKind::Synthetic, Modality::Images) => Ok(Dataset::Images(synthetic::images(spec.seed))),
            (DataKind::Synthetic, Modality::Text) => Ok(Dataset::Text(synthetic::text(spec.seed, spec.context))),
            (kind, modality) => {
                Err(DataError::Mismatch { data: format!("{kind:?}"), modality: format!("{modality:?}") })
            }
        }
    }

    /// Number of examples in a split (for text: non-overlapping windows of `context + 1`
    /// tokens, stepping by `context`).
    pub fn len(&self, split: Split) -> usize {
        match self {
            Dataset::Images(s) => match split {
                Split::Train => s.train_labels.len(),
                Split::Test => s.test_labels.len(),
            },
            Dataset::Text(t) => {
                let tokens = match split {
                    Split::Train => &t.train,
                    Split::Test => &t.test,
                };
                tokens.len().saturating_sub(1) / t.context
            }
        }
    }

    /// Gathers the examples at `indices` of `split` into a batch. Indices must be below
    /// [`Dataset::len`]; the sampler guarantees that.
    pub fn batch(&self, split: Split, indices: &[u32]) -> Batch {
        match self {
            Dataset::Images(s) => {
                let (pixels, labels) = match split {
                    Split::Train => (&s.train_pixels, &s.train_labels),
                    Split::Test => (&s.test_pixels, &s.test_labels),
                };
                let size = s.rows * s.cols;
                let mut x = Vec::with_capacity(indices.len() * size);
                let mut y = Vec::with_capacity(indices.len());
                for &i in indices {
                    let i = i as usize;
                    x.extend(
                        pixels[i * size..(i + 1) * size]
                            .iter()
                            .map(|&p| (f32::from(p) / 255.0 - PIXEL_MEAN) / PIXEL_STD),
                    );
                    y.push(i64::from(labels[i]));
                }
                Batch::Images { n: indices.len(), x, y }
            }
            Dataset::Text(t) => {
                let tokens = match split {
                    Split::Train => &t.train,
                    Split::Test => &t.test,
                };
                let c = t.context;
                let mut x = Vec::with_capacity(indices.len() * c);
                let mut y = Vec::with_capacity(indices.len() * c);
                for &i in indices {
                    let start = i as usize * c;
                    x.extend(tokens[start..start + c].iter().map(|&v| i64::from(v)));
                    y.extend(tokens[start + 1..start + c + 1].iter().map(|&v| i64::from(v)));
                }
                Batch::Tokens { n: indices.len(), x, y }
            }
        }
    }
}
