//! The safetensors container: encoding and strict parsing of its header, without I/O.
//!
//! A safetensors file is `N` (u64, little-endian), then `N` bytes of JSON, then the data
//! section. The JSON maps each tensor name to `{"dtype", "shape", "data_offsets": [begin,
//! end]}` (offsets relative to the data section) and may hold a `"__metadata__"` map of
//! strings. We write the header padded with spaces to a multiple of 8 bytes, as the
//! reference implementation does, so that tensor data is aligned.
//!
//! Parsing trusts nothing: the header length is bounded, every offset must lie inside the
//! file, each tensor's byte length must equal its shape times its element size, and the
//! tensors must tile the data section exactly (no gaps, no overlaps), which is also what
//! the reference reader demands.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::dtype::DType;

/// Largest header we accept (the reference implementation's limit).
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// Key of the free-form metadata map.
const METADATA_KEY: &str = "__metadata__";

/// One tensor of a safetensors header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Tensor name.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Shape, outermost first.
    pub shape: Vec<usize>,
    /// First byte, relative to the data section.
    pub begin: u64,
    /// One past the last byte, relative to the data section.
    pub end: u64,
}

impl Entry {
    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.end - self.begin
    }

    /// True for a tensor with no bytes.
    pub fn is_empty(&self) -> bool {
        self.end == self.begin
    }
}

/// A parsed header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// Tensors in data order.
    pub entries: Vec<Entry>,
    /// The `__metadata__` map (empty when absent).
    pub metadata: BTreeMap<String, String>,
    /// Absolute offset of the data section (8 + header length).
    pub data_start: u64,
}

/// A tensor to lay out in a new file: name, type, shape.
#[derive(Clone, Debug)]
pub struct TensorSpec<'a> {
    /// Tensor name.
    pub name: &'a str,
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: &'a [usize],
}

/// Builds the prefix of a safetensors file (length word and padded JSON header) for
/// tensors stored back to back in the given order. Returns the prefix and each tensor's
/// entry.
pub fn encode_header(tensors: &[TensorSpec<'_>], metadata: &BTreeMap<String, String>) -> (Vec<u8>, Vec<Entry>) {
    let mut map = Map::new();
    if !metadata.is_empty() {
        let m: Map<String, Value> = metadata.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect();
        map.insert(METADATA_KEY.to_owned(), Value::Object(m));
    }
    let mut entries = Vec::with_capacity(tensors.len());
    let mut offset = 0u64;
    for t in tensors {
        let len = (t.shape.iter().product::<usize>() * t.dtype.size()) as u64;
        let entry = Entry {
            name: t.name.to_owned(),
            dtype: t.dtype,
            shape: t.shape.to_vec(),
            begin: offset,
            end: offset + len,
        };
        offset += len;
        map.insert(
            t.name.to_owned(),
            serde_json::json!({"dtype": t.dtype.name(), "shape": t.shape, "data_offsets": [entry.begin, entry.end]}),
        );
        entries.push(entry);
    }
    let mut json = serde_json::to_vec(&Value::Object(map)).expect("a JSON map always serialises");
    while !json.len().is_multiple_of(8) {
        json.push(b' ');
    }
    let mut prefix = Vec::with_capacity(8 + json.len());
    prefix.extend_from_slice(&(json.len() as u64).to_le_bytes());
    prefix.extend_from_slice(&json);
    (prefix, entries)
}

/// Reads the header length from the first 8 bytes of a file of `file_len` bytes and checks
/// that it is plausible. Returns the JSON length.
pub fn header_len(first8: &[u8; 8], file_len: u64) -> Result<u64, String> {
    let n = u64::from_le_bytes(*first8);
    if n > MAX_HEADER_BYTES {
        return Err(format!("header length {n} exceeds the limit of {MAX_HEADER_BYTES} bytes"));
    }
    if 8 + n > file_len {
        return Err(format!("header length {n} runs past the end of the {file_len}-byte file"));
    }
    Ok(n)
}

/// Parses the JSON header `json` of a file of `file_len` bytes.
pub fn parse_header(json: &[u8], file_len: u64) -> Result<Header, String> {
    let data_start = 8 + json.len() as u64;
    let data_len = file_len.checked_sub(data_start).ok_or("the file is shorter than its header")?;
    let value: Value = serde_json::from_slice(json).map_err(|e| format!("header is not valid JSON: {e}"))?;
    let Value::Object(map) = value else { return Err("header is not a JSON object".into()) };
    let mut metadata = BTreeMap::new();
    let mut entries = Vec::with_capacity(map.len());
    for (name, v) in map {
        if name == METADATA_KEY {
            let Value::Object(m) = v else { return Err("__metadata__ is not an object".into()) };
            for (k, v) in m {
                let Value::String(s) = v else { return Err(format!("__metadata__ value of {k:?} is not a string")) };
                metadata.insert(k, s);
            }
            continue;
        }
        entries.push(parse_entry(name, v)?);
    }
    entries.sort_by_key(|e| (e.begin, e.end));
    let mut expected = 0u64;
    for e in &entries {
        if e.begin != expected {
            return Err(format!(
                "tensor {:?} starts at byte {} of the data section, expected {expected} (gap or overlap)",
                e.name, e.begin
            ));
        }
        expected = e.end;
    }
    if expected != data_len {
        return Err(format!("tensors cover {expected} bytes but the data section holds {data_len}"));
    }
    Ok(Header { entries, metadata, data_start })
}

fn parse_entry(name: String, v: Value) -> Result<Entry, String> {
    let Value::Object(fields) = v else { return Err(format!("entry {name:?} is not an object")) };
    for k in fields.keys() {
        if !matches!(k.as_str(), "dtype" | "shape" | "data_offsets") {
            return Err(format!("entry {name:?} has an unknown field {k:?}"));
        }
    }
    let dtype = match fields.get("dtype") {
        Some(Value::String(s)) => DType::from_name(s).ok_or_else(|| format!("tensor {name:?}: unknown dtype {s:?}"))?,
        _ => return Err(format!("tensor {name:?}: dtype missing or not a string")),
    };
    let shape: Vec<usize> = match fields.get("shape") {
        Some(Value::Array(dims)) => dims
            .iter()
            .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
            .collect::<Option<_>>()
            .ok_or_else(|| format!("tensor {name:?}: shape must be non-negative integers"))?,
        _ => return Err(format!("tensor {name:?}: shape missing or not an array")),
    };
    let (begin, end) = match fields.get("data_offsets") {
        Some(Value::Array(o)) if o.len() == 2 => match (o[0].as_u64(), o[1].as_u64()) {
            (Some(b), Some(e)) if b <= e => (b, e),
            _ => return Err(format!("tensor {name:?}: data_offsets must be two ordered integers")),
        },
        _ => return Err(format!("tensor {name:?}: data_offsets missing or not a pair")),
    };
    let elements = shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d as u64));
    let bytes = elements.and_then(|n| n.checked_mul(dtype.size() as u64));
    if bytes != Some(end - begin) {
        return Err(format!(
            "tensor {name:?}: shape {shape:?} of {dtype} needs {} bytes but data_offsets span {}",
            bytes.map_or("too many".to_string(), |b| b.to_string()),
            end - begin
        ));
    }
    Ok(Entry { name, dtype, shape, begin, end })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(tensors: &[TensorSpec<'_>], meta: &BTreeMap<String, String>) -> (Vec<u8>, Vec<Entry>) {
        let (mut bytes, entries) = encode_header(tensors, meta);
        let data_len: u64 = entries.iter().map(Entry::len).sum();
        bytes.extend(std::iter::repeat_n(7u8, data_len as usize));
        (bytes, entries)
    }

    fn parse(bytes: &[u8]) -> Result<Header, String> {
        let n = header_len(bytes[..8].try_into().unwrap(), bytes.len() as u64)?;
        parse_header(&bytes[8..8 + n as usize], bytes.len() as u64)
    }

    #[test]
    fn encode_then_parse_round_trips() {
        let meta = BTreeMap::from([("step".to_string(), "12".to_string())]);
        let (bytes, entries) = file(
            &[
                TensorSpec { name: "b", dtype: DType::F32, shape: &[2, 3] },
                TensorSpec { name: "a", dtype: DType::BF16, shape: &[5] },
                TensorSpec { name: "s", dtype: DType::I64, shape: &[] },
            ],
            &meta,
        );
        let h = parse(&bytes).unwrap();
        assert_eq!(h.entries, entries);
        assert_eq!(h.metadata, meta);
        assert_eq!(h.data_start % 8, 0);
    }

    #[test]
    fn lies_about_offsets_are_rejected() {
        let ok = br#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
        assert!(parse_header(ok, 8 + ok.len() as u64 + 8).is_ok());
        let cases: [(&[u8], &str); 7] = [
            (br#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#, "needs 12 bytes"),
            (br#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#, "gap or overlap"),
            (br#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}}"#, "ordered"),
            (br#"{"a":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}}"#, "unknown dtype"),
            (br#"{"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}"#, "non-negative"),
            (br#"{"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]}}"#, "too many"),
            (br#"[1,2]"#, "not a JSON object"),
        ];
        for (json, needle) in cases {
            let err = parse_header(json, 8 + json.len() as u64 + 8).unwrap_err();
            assert!(err.contains(needle), "{}: {err}", String::from_utf8_lossy(json));
        }
        let short = parse_header(ok, 8 + ok.len() as u64 + 4).unwrap_err();
        assert!(short.contains("cover 8 bytes"), "{short}");
        assert!(header_len(&u64::MAX.to_le_bytes(), 100).unwrap_err().contains("limit"));
        assert!(header_len(&50u64.to_le_bytes(), 20).unwrap_err().contains("past the end"));
    }
}
