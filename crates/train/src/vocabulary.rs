//! The words of the configuration: each kind (model, data set, optimizer) is one enum,
//! defined by the module that owns it, with one name per value. This module gives them
//! their text form once: parsing (`FromStr`, and serde for spec files), printing
//! (`Display`) and the list of words with a line of help each, which the command line
//! shows. The reduce mode, owned by `comm`, follows the same pattern there.

use std::fmt;

use crate::data::DataKind;
use crate::model::ModelKind;
use crate::optim::OptimKind;

/// A word that names none of a kind's values.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown {kind} {given:?}: expected {}", expected.join(", "))]
pub struct UnknownWord {
    /// What was being named (`model`, `data set`, ...).
    pub kind: &'static str,
    /// The word given.
    pub given: String,
    /// The words of the kind.
    pub expected: Vec<&'static str>,
}

/// A configuration kind with one word per value.
pub trait Word: Copy + Sized + 'static {
    /// What the kind is called in messages.
    const KIND: &'static str;
    /// Every value, in the order of documentation.
    const ALL: &'static [Self];
    /// The value's word.
    fn word(self) -> &'static str;
    /// One line of help.
    fn help(self) -> &'static str;

    /// The value a word names.
    fn from_word(s: &str) -> Result<Self, UnknownWord> {
        Self::ALL.iter().copied().find(|v| v.word() == s).ok_or_else(|| UnknownWord {
            kind: Self::KIND,
            given: s.to_owned(),
            expected: Self::ALL.iter().map(|v| v.word()).collect(),
        })
    }
}

/// `FromStr`, `Display` and serde for a [`Word`] type, all through its words.
macro_rules! text_form {
    ($t:ty) => {
        impl std::str::FromStr for $t {
            type Err = UnknownWord;
            fn from_str(s: &str) -> Result<Self, UnknownWord> {
                <$t as Word>::from_word(s)
            }
        }

        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.word())
            }
        }

        impl serde::Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.word())
            }
        }

        impl<'de> serde::Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <std::borrow::Cow<'de, str> as serde::Deserialize>::deserialize(d)?;
                <$t as Word>::from_word(&s).map_err(serde::de::Error::custom)
            }
        }
    };
}

impl Word for ModelKind {
    const KIND: &'static str = "model";
    const ALL: &'static [Self] = &[ModelKind::Mlp, ModelKind::Cnn, ModelKind::Gpt];
    fn word(self) -> &'static str {
        match self {
            ModelKind::Mlp => "mlp",
            ModelKind::Cnn => "cnn",
            ModelKind::Gpt => "gpt",
        }
    }
    fn help(self) -> &'static str {
        match self {
            ModelKind::Mlp => "784-256-128-10 perceptron",
            ModelKind::Cnn => "LeNet-5",
            ModelKind::Gpt => "character-level transformer",
        }
    }
}
text_form!(ModelKind);

impl Word for DataKind {
    const KIND: &'static str = "data set";
    const ALL: &'static [Self] = &[DataKind::FashionMnist, DataKind::Fortunes, DataKind::Synthetic];
    fn word(self) -> &'static str {
        match self {
            DataKind::FashionMnist => "fashion-mnist",
            DataKind::Fortunes => "fortunes",
            DataKind::Synthetic => "synthetic",
        }
    }
    fn help(self) -> &'static str {
        match self {
            DataKind::FashionMnist => "Fashion-MNIST images",
            DataKind::Fortunes => "character-level text from fortunes",
            DataKind::Synthetic => "generated in memory from the seed",
        }
    }
}
text_form!(DataKind);

impl Word for OptimKind {
    const KIND: &'static str = "optimizer";
    const ALL: &'static [Self] = &[OptimKind::Sgd, OptimKind::AdamW];
    fn word(self) -> &'static str {
        match self {
            OptimKind::Sgd => "sgd",
            OptimKind::AdamW => "adamw",
        }
    }
    fn help(self) -> &'static str {
        match self {
            OptimKind::Sgd => "SGD with momentum and L2 weight decay",
            OptimKind::AdamW => "Adam with decoupled weight decay",
        }
    }
}
text_form!(OptimKind);

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trips<T: Word + std::str::FromStr + fmt::Display + PartialEq + fmt::Debug>() {
        for &v in T::ALL {
            assert_eq!(v.to_string().parse::<T>().ok(), Some(v));
        }
    }

    #[test]
    fn every_word_round_trips_and_a_stranger_is_named() {
        round_trips::<ModelKind>();
        round_trips::<DataKind>();
        round_trips::<OptimKind>();
        let e = "resnet".parse::<ModelKind>().unwrap_err();
        assert_eq!(e.to_string(), "unknown model \"resnet\": expected mlp, cnn, gpt");
    }

    #[test]
    fn spec_files_use_the_same_words() {
        #[derive(serde::Deserialize)]
        struct Run {
            model: ModelKind,
            data: DataKind,
            optimizer: OptimKind,
        }
        let r: Run = serde_json::from_str(r#"{"model": "cnn", "data": "fashion-mnist", "optimizer": "sgd"}"#).unwrap();
        assert_eq!((r.model, r.data, r.optimizer), (ModelKind::Cnn, DataKind::FashionMnist, OptimKind::Sgd));
        let e = serde_json::from_str::<Run>(r#"{"model": "cnn", "data": "mnist", "optimizer": "sgd"}"#).err().unwrap();
        assert!(e.to_string().contains("unknown data set \"mnist\""), "{e}");
    }
}
