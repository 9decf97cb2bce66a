//! Exporting a checkpoint as one plain safetensors file for other tools.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::Path;

use crate::error::{CkptError, Result};
use crate::reader::Checkpoint;
use crate::safetensors::{Layout, encode_header};

/// Writes every tensor of `ckpt` (verified while read) into the safetensors file `out`,
/// atomically (temporary file, fsync, rename). The file's `__metadata__` records the step
/// and configuration hash. Returns the bytes written.
pub fn export(ckpt: &Checkpoint, out: &Path) -> Result<u64> {
    let tensors = ckpt.load()?;
    let layouts: Vec<Layout<'_>> =
        tensors.iter().map(|t| Layout { name: &t.name, dtype: t.dtype, shape: &t.shape }).collect();
    let meta = &ckpt.manifest.meta;
    let metadata = BTreeMap::from([
        ("steadfast.step".to_string(), meta.step.to_string()),
        ("steadfast.config_hash".to_string(), meta.config_hash.clone()),
    ]);
    let (prefix, _) = encode_header(&layouts, &metadata);
    let file_name = out.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "export".into());
    let tmp = out.with_file_name(format!(".{file_name}.tmp"));
    let mut f = File::create(&tmp).map_err(CkptError::io("cannot write", &tmp))?;
    f.write_all(&prefix).map_err(CkptError::io("cannot write", &tmp))?;
    let mut bytes = prefix.len() as u64;
    for t in &tensors {
        f.write_all(t.bytes()).map_err(CkptError::io("cannot write", &tmp))?;
        bytes += t.bytes().len() as u64;
    }
    f.sync_all().map_err(CkptError::io("cannot fsync", &tmp))?;
    std::fs::rename(&tmp, out).map_err(CkptError::io("cannot rename", &tmp))?;
    Ok(bytes)
}
