//! The text form of the configuration's words, given once for every crate.
//!
//! Each kind of setting (the reduce mode, the model, the data set, the optimizer, the FPNA
//! lab's distributions, a campaign's detectors) is one enum, defined by the crate that owns
//! it, with one word per value. Such an enum implements [`Word`] and invokes
//! [`text_form!`](crate::text_form) to get parsing (`FromStr`, and serde for spec files
//! and tables) and printing (`Display`) through its words; the command line lists the
//! words with their help.
//!
//! ```
//! use repro::words::{UnknownWord, Word};
//!
//! #[derive(Clone, Copy, Debug, PartialEq)]
//! enum Colour { Red, Blue }
//!
//! impl Word for Colour {
//!     const KIND: &'static str = "colour";
//!     const ALL: &'static [Self] = &[Colour::Red, Colour::Blue];
//!     fn word(self) -> &'static str {
//!         match self { Colour::Red => "red", Colour::Blue => "blue" }
//!     }
//!     fn help(self) -> &'static str {
//!         "a colour"
//!     }
//! }
//!
//! assert_eq!(Colour::from_word("blue"), Ok(Colour::Blue));
//! let e: UnknownWord = Colour::from_word("green").unwrap_err();
//! assert_eq!(e.to_string(), "unknown colour \"green\": expected red, blue");
//! ```

use std::fmt;

/// A word that names none of a kind's values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownWord {
    /// What was being named (`model`, `data set`, ...).
    pub kind: &'static str,
    /// The word given.
    pub given: String,
    /// The words of the kind.
    pub expected: Vec<&'static str>,
}

impl fmt::Display for UnknownWord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown {} {:?}: expected {}", self.kind, self.given, self.expected.join(", "))
    }
}

impl std::error::Error for UnknownWord {}

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

/// `FromStr`, `Display` and serde for a [`Word`] type, all through its words. The crate
/// that invokes it needs `serde` as a dependency.
#[macro_export]
macro_rules! text_form {
    ($t:ty) => {
        impl ::std::str::FromStr for $t {
            type Err = $crate::words::UnknownWord;
            fn from_str(s: &str) -> ::std::result::Result<Self, $crate::words::UnknownWord> {
                <$t as $crate::words::Word>::from_word(s)
            }
        }

        impl ::std::fmt::Display for $t {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(<$t as $crate::words::Word>::word(*self))
            }
        }

        impl ::serde::Serialize for $t {
            fn serialize<S: ::serde::Serializer>(&self, s: S) -> ::std::result::Result<S::Ok, S::Error> {
                s.serialize_str(<$t as $crate::words::Word>::word(*self))
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $t {
            fn deserialize<D: ::serde::Deserializer<'de>>(d: D) -> ::std::result::Result<Self, D::Error> {
                let s = <::std::borrow::Cow<'de, str> as ::serde::Deserialize>::deserialize(d)?;
                <$t as $crate::words::Word>::from_word(&s).map_err(::serde::de::Error::custom)
            }
        }
    };
}
