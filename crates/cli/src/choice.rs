//! Command-line values from the library's vocabulary: a flag takes the words of a type
//! (listed with their help in `--help`) and parses them with the type's own `FromStr`, so
//! the binary mirrors no enum of the libraries.

use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use train::Word;

/// The value parser of a flag that takes one of `values` (word, help), parsed into `T`.
pub fn words<T>(values: impl IntoIterator<Item = (&'static str, &'static str)>) -> impl TypedValueParser<Value = T>
where
    T: std::str::FromStr + Clone + Send + Sync + 'static,
    T::Err: std::error::Error + Send + Sync + 'static,
{
    let possible = values.into_iter().map(|(word, help)| PossibleValue::new(word).help(help));
    PossibleValuesParser::new(possible).try_map(|s: String| s.parse::<T>())
}

/// [`words`] for a [`Word`] type (every setting of the libraries is one).
pub fn of<T>() -> impl TypedValueParser<Value = T>
where
    T: Word + std::str::FromStr + Clone + Send + Sync,
    T::Err: std::error::Error + Send + Sync + 'static,
{
    words(T::ALL.iter().map(|v| (v.word(), v.help())))
}
