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

/// A count of bytes: a whole number with an optional unit, `kB`, `MB`, `GB` (powers of
/// 1000) or `KiB`, `MiB`, `GiB` (powers of 1024), such as `4MB` or `512KiB`.
pub fn bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "kB" | "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        other => return Err(format!("{other:?} is not a unit of bytes: use B, kB, MB, GB, KiB, MiB or GiB")),
    };
    let n: u64 = number.parse().map_err(|_| format!("{text:?} is not a number of bytes such as 4MB"))?;
    n.checked_mul(scale).ok_or_else(|| format!("{text} is too many bytes"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes_take_decimal_and_binary_units() {
        assert_eq!(super::bytes("4MB"), Ok(4_000_000));
        assert_eq!(super::bytes("512KiB"), Ok(512 * 1024));
        assert_eq!(super::bytes("0"), Ok(0));
        assert_eq!(super::bytes("7 GiB"), Ok(7 << 30));
        assert!(super::bytes("4 mb").unwrap_err().contains("not a unit"));
        assert!(super::bytes("MB").unwrap_err().contains("not a number"));
        assert!(super::bytes("99999999999999GB").unwrap_err().contains("too many"));
    }
}
