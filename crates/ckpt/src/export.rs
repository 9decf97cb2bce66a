//! Exporting tensors as one plain safetensors file for other tools: a Steadfast
//! checkpoint ([`export`]), or any file [`foreign`](crate::foreign) can read, such as a
//! PyTorch `.pt`, a NumPy `.npz` or an HDF5/Keras `.h5` ([`export_foreign`]).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use crate::DType;
use crate::error::{CkptError, Result};
use crate::foreign::{self, Order};
use crate::reader::Checkpoint;
use crate::safetensors::{TensorSpec, encode_header};

/// One tensor to write: its name, element type, shape and row-major bytes.
pub struct Plain<'a> {
    /// Tensor name.
    pub name: &'a str,
    /// Element type.
    pub dtype: DType,
    /// Shape, outermost first.
    pub shape: &'a [usize],
    /// Row-major little-endian elements.
    pub bytes: &'a [u8],
}

/// Writes `tensors` into the safetensors file `out`, atomically (temporary file, fsync,
/// rename), with `metadata` as its `__metadata__`. Returns the bytes written.
pub fn write_plain(out: &Path, tensors: &[Plain<'_>], metadata: &BTreeMap<String, String>) -> Result<u64> {
    let layouts: Vec<TensorSpec<'_>> =
        tensors.iter().map(|t| TensorSpec { name: t.name, dtype: t.dtype, shape: t.shape }).collect();
    let (prefix, _) = encode_header(&layouts, metadata);
    let file_name = out.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "export".into());
    let tmp = out.with_file_name(format!(".{file_name}.tmp"));
    let mut f = File::create(&tmp).map_err(CkptError::io("cannot write", &tmp))?;
    f.write_all(&prefix).map_err(CkptError::io("cannot write", &tmp))?;
    let mut bytes = prefix.len() as u64;
    for t in tensors {
        f.write_all(t.bytes).map_err(CkptError::io("cannot write", &tmp))?;
        bytes += t.bytes.len() as u64;
    }
    f.sync_all().map_err(CkptError::io("cannot fsync", &tmp))?;
    std::fs::rename(&tmp, out).map_err(CkptError::io("cannot rename", &tmp))?;
    Ok(bytes)
}

/// Writes every tensor of `ckpt` (verified while read) into the safetensors file `out`.
/// The file's `__metadata__` records the step and configuration hash. Returns the bytes
/// written.
pub fn export(ckpt: &Checkpoint, out: &Path) -> Result<u64> {
    let tensors = ckpt.load()?;
    let plain: Vec<Plain<'_>> =
        tensors.iter().map(|t| Plain { name: &t.name, dtype: t.dtype, shape: &t.shape, bytes: t.bytes() }).collect();
    let meta = &ckpt.manifest.meta;
    let metadata = BTreeMap::from([
        ("steadfast.step".to_string(), meta.step.to_string()),
        ("steadfast.config_hash".to_string(), meta.config_hash.clone()),
    ]);
    write_plain(out, &plain, &metadata)
}

/// Writes the model tensors of `ckpt` (verified while read) into the safetensors file
/// `out` under the names and layouts of `torch.nn` modules ([`crate::torch_layout`]), so
/// that a module with the same layer names loads the file as it is. Returns the tensors
/// and bytes written.
pub fn export_torch(ckpt: &Checkpoint, out: &Path) -> Result<(usize, u64)> {
    let torch = crate::torch_layout::to_torch(model_tensors(ckpt)?);
    let plain: Vec<Plain<'_>> =
        torch.iter().map(|t| Plain { name: &t.name, dtype: t.dtype, shape: &t.shape, bytes: &t.bytes }).collect();
    let meta = &ckpt.manifest.meta;
    let metadata = BTreeMap::from([
        ("steadfast.step".to_string(), meta.step.to_string()),
        ("steadfast.config_hash".to_string(), meta.config_hash.clone()),
        ("steadfast.layout".to_string(), "torch".to_string()),
    ]);
    Ok((plain.len(), write_plain(out, &plain, &metadata)?))
}

/// The model tensors of `ckpt` (role `model`), verified, as [`crate::torch_layout`] takes
/// them. An error if it holds none, or if it holds a framework's state (a checkpoint with
/// a state tree, written from Python), whose tensors are in their framework's layout
/// already.
pub fn model_tensors(ckpt: &Checkpoint) -> Result<Vec<crate::torch_layout::Named>> {
    if ckpt.manifest.meta.tree.is_some() {
        return Err(CkptError::Mismatch(format!(
            "{} holds a framework's state (it was saved from Python), already in that framework's layout: \
             load or export it as it is",
            ckpt.dir.display()
        )));
    }
    let model: Vec<_> = ckpt
        .load()?
        .into_iter()
        .filter(|t| t.role == crate::Role::Model)
        .map(|t| crate::torch_layout::Named { bytes: t.bytes().to_vec(), name: t.name, dtype: t.dtype, shape: t.shape })
        .collect();
    if model.is_empty() {
        return Err(CkptError::Mismatch(format!(
            "{} holds no model tensors to lay out for torch.nn",
            ckpt.dir.display()
        )));
    }
    Ok(model)
}

/// What [`export_foreign`] wrote.
#[derive(Clone, Debug)]
pub struct ForeignExport {
    /// The format read.
    pub format: foreign::Format,
    /// Tensors written.
    pub tensors: usize,
    /// Arrays found but not exported, with the reason (for example an HDF5 dataset
    /// stored in chunks).
    pub skipped: Vec<(String, String)>,
    /// Bytes written.
    pub bytes: u64,
}

/// Writes every tensor that [`foreign::locate`] finds in `path` (a PyTorch `.pt`, NumPy
/// `.npz`, HDF5 `.h5` or safetensors file) into the safetensors file `out`, under the
/// names the format gives them, in row-major order (column-major NumPy arrays are
/// reordered). The bytes are copied as stored: a format with no checksums (all of these
/// but ZIP's CRC-32, which is not checked here) gives no guarantee they are intact.
pub fn export_foreign(path: &Path, out: &Path) -> Result<ForeignExport> {
    let located = foreign::locate(path).map_err(|e| CkptError::Format { path: path.to_owned(), reason: e.reason })?;
    let mut data = Vec::with_capacity(located.tensors.len());
    for t in &located.tensors {
        let mut bytes = vec![0u8; usize::try_from(t.len).map_err(|_| too_large(&t.file, &t.name))?];
        let mut f = File::open(&t.file).map_err(CkptError::io("cannot open", &t.file))?;
        f.seek(SeekFrom::Start(t.offset)).map_err(CkptError::io("cannot seek in", &t.file))?;
        f.read_exact(&mut bytes).map_err(|_| CkptError::Format {
            path: t.file.clone(),
            reason: format!("tensor {} runs past the end of the file", t.name),
        })?;
        if t.order == Order::ColumnMajor {
            bytes = row_major(t, &bytes);
        }
        let shape: Vec<usize> = t.shape.iter().map(|&d| d as usize).collect();
        data.push((shape, bytes));
    }
    let plain: Vec<Plain<'_>> = located
        .tensors
        .iter()
        .zip(&data)
        .map(|(t, (shape, bytes))| Plain { name: &t.name, dtype: t.dtype, shape, bytes })
        .collect();
    let metadata = BTreeMap::from([("steadfast.exported_from".to_string(), located.format.name().to_string())]);
    let bytes = write_plain(out, &plain, &metadata)?;
    Ok(ForeignExport { format: located.format, tensors: plain.len(), skipped: located.skipped, bytes })
}

fn too_large(path: &Path, name: &str) -> CkptError {
    CkptError::Format { path: path.to_owned(), reason: format!("tensor {name} is too large for this machine") }
}

/// The elements of a column-major tensor's `stored` bytes, in row-major order.
fn row_major(t: &foreign::TensorLoc, stored: &[u8]) -> Vec<u8> {
    let size = t.dtype.size();
    let mut out = vec![0u8; stored.len()];
    for (element, dst) in out.chunks_exact_mut(size).enumerate() {
        let src = t.storage_index(element as u64).expect("every element of the tensor has a place") as usize * size;
        dst.copy_from_slice(&stored[src..src + size]);
    }
    out
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::Role;
    use crate::foreign::{Integrity, TensorLoc};

    #[test]
    fn column_major_elements_come_out_row_major() {
        // A 2x3 matrix [[0,1,2],[3,4,5]] stored column-major: 0 3 1 4 2 5.
        let t = TensorLoc {
            name: "m".into(),
            role: Role::Model,
            dtype: DType::U8,
            shape: vec![2, 3],
            file: PathBuf::new(),
            offset: 0,
            len: 6,
            order: Order::ColumnMajor,
            integrity: Integrity::None,
        };
        assert_eq!(row_major(&t, &[0, 3, 1, 4, 2, 5]), vec![0, 1, 2, 3, 4, 5]);
    }
}
