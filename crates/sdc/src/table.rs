//! Tables as CSV files of typed rows.
//!
//! Every table a campaign (or the FPNA lab) writes has one row type, a serde struct whose
//! fields are its columns in order. The writer and every reader (`steadfast report`, the
//! tests, a notebook) go through that struct, so the schema is written down once: a column
//! that is renamed, dropped or given another type fails to read with the file, line and
//! field named, never as a silently misread number.
//!
//! An empty field is `None` for an `Option` column. A column holding a list (the bits a
//! trial flipped, the alarms of a golden step) is a [`List`]: its items joined by `;`.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::SdcError;

/// Writes `rows` to `path` as CSV with a header row. (A table without rows is an empty
/// file: the header comes from the first row.)
pub fn write<T: Serialize>(path: &Path, rows: &[T]) -> Result<(), SdcError> {
    let mut w = csv::Writer::from_writer(Vec::new());
    for r in rows {
        w.serialize(r).map_err(|e| SdcError::Output { path: path.to_owned(), source: std::io::Error::other(e) })?;
    }
    let bytes = w.into_inner().map_err(|e| SdcError::Output { path: path.to_owned(), source: e.into_error() })?;
    std::fs::write(path, bytes).map_err(SdcError::output(path))
}

/// Reads every row of the table at `path`.
pub fn read<T: DeserializeOwned>(path: &Path) -> Result<Vec<T>, SdcError> {
    let mut r = csv::Reader::from_path(path).map_err(|e| input_error(path, e))?;
    r.deserialize().collect::<Result<Vec<T>, _>>().map_err(|e| input_error(path, e))
}

/// The header and the fields of `rows` as the file holds them: for showing a table
/// whatever its type.
pub fn cells<T: Serialize>(rows: &[T]) -> Result<(Vec<String>, Vec<Vec<String>>), SdcError> {
    let here = Path::new("(in memory)");
    let mut w = csv::Writer::from_writer(Vec::new());
    for r in rows {
        w.serialize(r).map_err(|e| input_error(here, e))?;
    }
    let bytes = w.into_inner().map_err(|e| SdcError::Output { path: here.to_owned(), source: e.into_error() })?;
    let mut reader = csv::Reader::from_reader(bytes.as_slice());
    let header = reader.headers().map_err(|e| input_error(here, e))?.iter().map(str::to_owned).collect();
    let rows = reader
        .records()
        .map(|r| r.map(|r| r.iter().map(str::to_owned).collect()))
        .collect::<Result<_, _>>()
        .map_err(|e| input_error(here, e))?;
    Ok((header, rows))
}

fn input_error(path: &Path, e: csv::Error) -> SdcError {
    SdcError::Input { path: path.to_owned(), reason: e.to_string() }
}

/// A list in one field: its items joined by `;` (an empty field is an empty list).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct List<T>(pub Vec<T>);

impl<T: fmt::Display> Serialize for List<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let words: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        s.serialize_str(&words.join(";"))
    }
}

impl<'de, T: FromStr> Deserialize<'de> for List<T>
where
    T::Err: fmt::Display,
{
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str> as Deserialize>::deserialize(d)?;
        if s.is_empty() {
            return Ok(List(Vec::new()));
        }
        s.split(';').map(|w| w.parse().map_err(serde::de::Error::custom)).collect::<Result<_, _>>().map(List)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Row {
        name: String,
        count: u64,
        ratio: Option<f64>,
        bits: List<u32>,
    }

    #[test]
    fn rows_round_trip_through_a_file_with_awkward_text() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.csv");
        let rows = vec![
            Row { name: "a, \"quoted\"\nline".into(), count: 3, ratio: Some(0.1), bits: List(vec![1, 31]) },
            Row { name: String::new(), count: 0, ratio: None, bits: List(Vec::new()) },
        ];
        write(&path, &rows).unwrap();
        assert_eq!(read::<Row>(&path).unwrap(), rows);
        let (header, cells) = cells(&rows).unwrap();
        assert_eq!(header, ["name", "count", "ratio", "bits"]);
        assert_eq!(cells[0][3], "1;31");
        assert_eq!(cells[1][2], "");
    }

    #[test]
    fn a_table_of_another_shape_is_refused_with_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.csv");
        std::fs::write(&path, "name,count,ratio,bits\nx,1,,\ny,many,,\n").unwrap();
        let e = read::<Row>(&path).unwrap_err().to_string();
        assert!(e.contains("t.csv") && e.contains("line: 3") && e.contains("invalid digit"), "{e}");
        std::fs::write(&path, "name,count\nx,1\n").unwrap();
        let e = read::<Row>(&path).unwrap_err().to_string();
        assert!(e.contains("missing field"), "{e}");
        let e = read::<Row>(&dir.path().join("absent.csv")).unwrap_err().to_string();
        assert!(e.contains("absent.csv"), "{e}");
    }
}
