//! `manifest.json`: the description of a checkpoint, written last, and its own checksum.
//!
//! The manifest lists every file (with its length and the xxh3-64 of its header bytes) and
//! every tensor (name, role, dtype, shape, file, absolute byte offset, length, xxh3-64 of
//! its bytes), so that every byte of every shard is covered by a checksum. It also carries
//! the scalars training needs to resume exactly: step, epoch, world size, a hash of the
//! configuration, the RNG algorithm and seed, and the data cursor.
//!
//! The manifest checks itself in two ways: `manifest_xxh3` is the xxh3-64 of its canonical
//! serialisation with that field empty, and the file must be byte-for-byte the canonical
//! serialisation of what it parses to. Together these catch any change to any byte:
//! a change either breaks parsing, changes a value (the checksum no longer matches), or
//! changes only the layout (the bytes are no longer canonical).
//!
//! Versioning: `version` is an integer, bumped by every change to the format. A reader
//! refuses a manifest whose version is newer than the newest it knows, with an error that
//! says so; it never guesses at fields it does not know (unknown fields are errors).

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{CkptError, Result};

/// The value of the `format` field.
pub const FORMAT: &str = "steadfast-checkpoint";
/// The newest format version this build writes and reads. Version 2 added
/// `meta.kernels`; version 3 added `meta.tree` and the role `extra` (a framework's state
/// as it nests, written by the Python package). Older manifests still read.
pub const VERSION: u32 = 3;
/// Name of the manifest file inside a checkpoint directory.
pub const MANIFEST_FILE: &str = "manifest.json";

/// The description of one checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Always [`FORMAT`].
    pub format: String,
    /// Format version; see the module documentation.
    pub version: u32,
    /// Training metadata needed to resume.
    pub meta: Meta,
    /// Every file of the checkpoint other than the manifest.
    pub files: Vec<FileEntry>,
    /// Every tensor, in registry order.
    pub tensors: Vec<TensorEntry>,
    /// xxh3-64 (16 hex digits) of the canonical manifest with this field empty.
    pub manifest_xxh3: String,
}

/// Training metadata stored with a checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Meta {
    /// Optimizer steps completed.
    pub step: u64,
    /// Epoch of the next step.
    pub epoch: u64,
    /// Number of workers that trained the state.
    pub world_size: u32,
    /// Hash of the configuration that defines the run (16 hex digits).
    pub config_hash: String,
    /// The kernels that computed the state, e.g. `fixed/avx512` or `framework`: provenance,
    /// to explain why two states differ (the kernel set is also in the configuration
    /// hash; the instruction set never changes the fixed kernels' bits). Empty when not
    /// recorded (version 1, or a checkpoint not written by training).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kernels: String,
    /// Random number generator.
    pub rng: RngState,
    /// Position in the data.
    pub data_cursor: DataCursor,
    /// Further named integers (e.g. `optimizer.updates`).
    pub scalars: BTreeMap<String, u64>,
    /// The nesting of a framework's state (dictionaries, lists, numbers, strings) with its
    /// tensors in their places, each named by its registry name: how a loader rebuilds
    /// the state as it was given. Its numbers are integers only (the writer encodes
    /// floats as their bits), so the manifest stays canonical. Absent for Steadfast's own
    /// training state, whose layout the registry names fix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree: Option<serde_json::Value>,
}

/// The random number generator's state. Steadfast's generator is counter-based: every
/// stream is addressed by (seed, purpose, indices), so the seed is its whole state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RngState {
    /// Generator name, e.g. `philox4x32-10`.
    pub algorithm: String,
    /// The key.
    pub seed: u64,
}

/// Where the next step's data comes from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataCursor {
    /// Epoch of the next step.
    pub epoch: u64,
    /// Step within that epoch.
    pub step_in_epoch: u64,
    /// Examples per global batch.
    pub global_batch: u64,
}

/// One data file of a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    /// File name inside the checkpoint directory.
    pub file: String,
    /// Total length in bytes.
    pub length: u64,
    /// Length of the safetensors prefix (length word and JSON header).
    pub header_length: u64,
    /// xxh3-64 of the prefix bytes.
    pub header_xxh3: String,
}

/// One tensor of a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorEntry {
    /// Registry name.
    pub name: String,
    /// `model` or `optim`.
    pub role: String,
    /// safetensors dtype name.
    pub dtype: String,
    /// Shape.
    pub shape: Vec<u64>,
    /// File holding it.
    pub file: String,
    /// Absolute byte offset of its data in the file.
    pub offset: u64,
    /// Length in bytes.
    pub length: u64,
    /// xxh3-64 of its bytes.
    pub xxh3: String,
}

/// Formats a checksum as 16 lower-case hex digits.
pub fn hex64(x: u64) -> String {
    format!("{x:016x}")
}

impl Manifest {
    /// A manifest for `meta`, `files` and `tensors`, with its checksum filled in.
    pub fn new(meta: Meta, files: Vec<FileEntry>, tensors: Vec<TensorEntry>) -> Manifest {
        let mut m = Manifest {
            format: FORMAT.to_owned(),
            version: VERSION,
            meta,
            files,
            tensors,
            manifest_xxh3: String::new(),
        };
        m.manifest_xxh3 = hex64(m.own_checksum());
        m
    }

    fn own_checksum(&self) -> u64 {
        let mut unsigned = self.clone();
        unsigned.manifest_xxh3.clear();
        crate::checksum(&unsigned.to_bytes())
    }

    /// The canonical serialisation: pretty JSON with a final newline.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.to_bytes_sized(0)
    }

    /// [`to_bytes`](Self::to_bytes) into a buffer made for about `size` bytes.
    fn to_bytes_sized(&self, size: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(size + 1);
        serde_json::to_writer_pretty(&mut v, self).expect("a manifest always serialises");
        v.push(b'\n');
        v
    }

    /// Parses and checks a manifest read from `path`.
    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<Manifest> {
        let format_err = |reason: String| CkptError::Format { path: path.to_owned(), reason };
        // Look at the version first so that a newer format gets the right message, even
        // when its fields are unknown to us.
        // Only these two fields are read here: the rest is skipped without being built, so
        // that a manifest of many tensors is not held as a JSON tree beside the struct.
        #[derive(serde::Deserialize)]
        struct Head {
            format: Option<serde_json::Value>,
            version: Option<serde_json::Value>,
        }
        let head: Head = serde_json::from_slice(bytes).map_err(|e| format_err(format!("not valid JSON: {e}")))?;
        if head.format.as_ref().and_then(|f| f.as_str()) != Some(FORMAT) {
            return Err(format_err(format!("the \"format\" field is not {FORMAT:?}")));
        }
        match head.version.as_ref().and_then(|v| v.as_u64()) {
            Some(v) if v > u64::from(VERSION) => {
                return Err(CkptError::NewerVersion {
                    path: path.to_owned(),
                    found: u32::try_from(v).unwrap_or(u32::MAX),
                    supported: VERSION,
                });
            }
            Some(0) | None => return Err(format_err("missing or invalid \"version\"".into())),
            Some(_) => {}
        }
        let mut m: Manifest = serde_json::from_slice(bytes).map_err(|e| format_err(format!("{e}")))?;
        if m.version < 2 && !m.meta.kernels.is_empty() {
            return Err(format_err(format!("version {} has no \"meta.kernels\" field", m.version)));
        }
        if m.version < 3 && m.meta.tree.is_some() {
            return Err(format_err(format!("version {} has no \"meta.tree\" field", m.version)));
        }
        // The checksum covers the manifest with its own field empty (no clone of a manifest
        // that may list many thousands of tensors; one serialisation at a time).
        let sum = std::mem::take(&mut m.manifest_xxh3);
        let unsigned = crate::checksum(&m.to_bytes_sized(bytes.len()));
        m.manifest_xxh3 = sum;
        if hex64(unsigned) != m.manifest_xxh3 {
            return Err(CkptError::Corrupt {
                path: path.to_owned(),
                tensor: None,
                reason: "the manifest's checksum does not match its content".into(),
            });
        }
        if m.to_bytes_sized(bytes.len()) != bytes {
            return Err(CkptError::Corrupt {
                path: path.to_owned(),
                tensor: None,
                reason: "the manifest's bytes are not in canonical form (edited or damaged)".into(),
            });
        }
        m.check_consistency().map_err(format_err)?;
        Ok(m)
    }

    /// Checks that the tensor list is consistent with the file list.
    fn check_consistency(&self) -> std::result::Result<(), String> {
        if let Some(tree) = &self.meta.tree {
            check_tree(tree)?;
        }
        let mut names = std::collections::HashSet::new();
        for t in &self.tensors {
            if !names.insert(t.name.as_str()) {
                return Err(format!("tensor {:?} is listed twice", t.name));
            }
            let Some(f) = self.files.iter().find(|f| f.file == t.file) else {
                return Err(format!("tensor {:?} is in {:?}, which is not listed", t.name, t.file));
            };
            let in_bounds = t.offset.checked_add(t.length).is_some_and(|end| end <= f.length);
            if !in_bounds || t.offset < f.header_length {
                return Err(format!("tensor {:?} lies outside the data section of {:?}", t.name, t.file));
            }
            if crate::DType::from_name(&t.dtype).is_none() {
                return Err(format!("tensor {:?} has unknown dtype {:?}", t.name, t.dtype));
            }
            if t.role.parse::<crate::Role>().is_err() {
                return Err(format!("tensor {:?} has unknown role {:?}", t.name, t.role));
            }
        }
        for f in &self.files {
            if f.file.contains('/') || f.file.starts_with('.') || f.file == MANIFEST_FILE {
                return Err(format!("file name {:?} is not a plain file name", f.file));
            }
        }
        Ok(())
    }
}

/// Refuses a state tree holding a number that is not an integer of 64 bits: parsing such
/// a number back may not give the same bits, so the manifest would not be canonical.
pub fn check_tree(tree: &serde_json::Value) -> std::result::Result<(), String> {
    use serde_json::Value;
    match tree {
        Value::Number(n) if !(n.is_i64() || n.is_u64()) => {
            Err(format!("meta.tree holds the number {n}, which is not an integer (encode a float as its bits)"))
        }
        Value::Array(items) => items.iter().try_for_each(check_tree),
        Value::Object(fields) => fields.values().try_for_each(check_tree),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample() -> Manifest {
        Manifest::new(
            Meta {
                step: 12,
                epoch: 1,
                world_size: 1,
                config_hash: hex64(7),
                kernels: "fixed/avx2".into(),
                rng: RngState { algorithm: "philox4x32-10".into(), seed: 3 },
                data_cursor: DataCursor { epoch: 1, step_in_epoch: 2, global_batch: 32 },
                scalars: BTreeMap::from([("optimizer.updates".into(), 12)]),
                tree: None,
            },
            vec![FileEntry {
                file: "shard-0000.safetensors".into(),
                length: 120,
                header_length: 88,
                header_xxh3: hex64(1),
            }],
            vec![TensorEntry {
                name: "model.w".into(),
                role: "model".into(),
                dtype: "F32".into(),
                shape: vec![8],
                file: "shard-0000.safetensors".into(),
                offset: 88,
                length: 32,
                xxh3: hex64(2),
            }],
        )
    }

    #[test]
    fn round_trips_and_detects_every_single_bit_flip() {
        let m = sample();
        let bytes = m.to_bytes();
        let p = Path::new("manifest.json");
        assert_eq!(Manifest::from_bytes(&bytes, p).unwrap(), m);
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut b = bytes.clone();
                b[i] ^= 1 << bit;
                assert!(Manifest::from_bytes(&b, p).is_err(), "flip of bit {bit} of byte {i} went unnoticed");
            }
        }
    }

    #[test]
    fn newer_versions_are_refused_with_a_clear_error() {
        let mut v: serde_json::Value = serde_json::from_slice(&sample().to_bytes()).unwrap();
        v["version"] = (VERSION + 1).into();
        v["future_field"] = true.into();
        let err = Manifest::from_bytes(&serde_json::to_vec(&v).unwrap(), Path::new("m.json")).unwrap_err();
        assert!(
            matches!(err, CkptError::NewerVersion { found, supported: VERSION, .. } if found == VERSION + 1),
            "{err}"
        );
    }

    /// A manifest as version 1 wrote it: no `meta.kernels`.
    fn version_1(mut m: Manifest) -> Manifest {
        m.version = 1;
        m.manifest_xxh3 = hex64(m.own_checksum());
        m
    }

    #[test]
    fn version_1_manifests_still_read_and_may_not_name_kernels() {
        let mut old = sample();
        old.meta.kernels.clear();
        let old = version_1(old);
        let bytes = old.to_bytes();
        assert!(!String::from_utf8_lossy(&bytes).contains("kernels"));
        assert_eq!(Manifest::from_bytes(&bytes, Path::new("m.json")).unwrap(), old);

        let forged = version_1(sample());
        let err = Manifest::from_bytes(&forged.to_bytes(), Path::new("m.json")).unwrap_err();
        assert!(err.to_string().contains("version 1 has no \"meta.kernels\""), "{err}");
    }

    #[test]
    fn a_state_tree_round_trips_needs_version_3_and_holds_no_floats() {
        let mut m = sample();
        m.meta.tree = Some(
            serde_json::json!({"dict": [[{"str": "model"}, {"tensor": "model.w"}], [{"str": "lr"}, {"float": "3f50624dd2f1a9fc"}]]}),
        );
        let m = Manifest::new(m.meta, m.files, m.tensors);
        assert_eq!(Manifest::from_bytes(&m.to_bytes(), Path::new("m.json")).unwrap(), m);

        let mut older = m.clone();
        older.version = 2;
        older.manifest_xxh3 = hex64(older.own_checksum());
        let err = Manifest::from_bytes(&older.to_bytes(), Path::new("m.json")).unwrap_err();
        assert!(err.to_string().contains("version 2 has no \"meta.tree\""), "{err}");

        let mut floats = m;
        floats.meta.tree = Some(serde_json::json!({"list": [1, 0.1]}));
        let floats = Manifest::new(floats.meta, floats.files, floats.tensors);
        let err = Manifest::from_bytes(&floats.to_bytes(), Path::new("m.json")).unwrap_err();
        assert!(err.to_string().contains("not an integer"), "{err}");
    }

    #[test]
    fn wrong_types_and_inconsistencies_are_format_errors() {
        let mut v: serde_json::Value = serde_json::from_slice(&sample().to_bytes()).unwrap();
        v["meta"]["step"] = "twelve".into();
        let err = Manifest::from_bytes(&serde_json::to_vec(&v).unwrap(), Path::new("m.json")).unwrap_err();
        assert!(matches!(err, CkptError::Format { .. }), "{err}");

        let mut m = sample();
        m.tensors[0].offset = 100;
        let m = Manifest::new(m.meta, m.files, m.tensors);
        let err = Manifest::from_bytes(&m.to_bytes(), Path::new("m.json")).unwrap_err();
        assert!(err.to_string().contains("outside the data section"), "{err}");
    }
}
