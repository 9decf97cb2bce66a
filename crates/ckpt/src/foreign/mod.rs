//! Where each tensor's bytes are in checkpoint files of any format Steadfast can alter:
//! its own checkpoints, plain safetensors, NumPy `.npz`, PyTorch `.pt`/`.pth` and (with
//! the `hdf5` feature) HDF5/Keras `.h5`.
//!
//! Every supported layout keeps a tensor as one contiguous run of little-endian elements
//! in one file, so [`locate`] answers with byte ranges ([`TensorLoc`]) and the caller can
//! read or patch the bytes in place with no framework in the loop. The run is row-major
//! except for NumPy arrays saved with `fortran_order` ([`Order`]); elements are always
//! numbered row-major, as the frameworks number them, and
//! [`TensorLoc::element_offset`] finds where each is stored. What a format keeps
//! *about* those bytes (a ZIP member's CRC-32, a Steadfast manifest's xxh3) is named in
//! [`Integrity`] so that a tool which changes bytes can bring it up to date, or leave it
//! stale on purpose.
//!
//! Nothing here executes code from a file: PyTorch's pickle is decoded symbolically
//! ([`pickle`]).
//!
//! [`idx`] reads the IDX arrays of MNIST-style data sets: not a checkpoint, but the same
//! kind of untrusted array file, under the same fuzzing.

pub mod idx;
pub mod npy;
pub mod pickle;
pub mod zip;

#[cfg(feature = "hdf5")]
mod h5;

use std::path::{Path, PathBuf};

use crate::{DType, Role};

/// A file format Steadfast can locate tensors in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// A Steadfast checkpoint directory (manifest plus safetensors shards).
    Steadfast,
    /// A single safetensors file.
    Safetensors,
    /// A PyTorch `torch.save` archive (ZIP with a pickle).
    PyTorch,
    /// A NumPy `.npz` archive of `.npy` members.
    Npz,
    /// An HDF5 file (Keras `.h5` included).
    Hdf5,
}

impl Format {
    /// The lower-case name used in logs.
    pub fn name(self) -> &'static str {
        match self {
            Format::Steadfast => "steadfast",
            Format::Safetensors => "safetensors",
            Format::PyTorch => "pytorch",
            Format::Npz => "npz",
            Format::Hdf5 => "hdf5",
        }
    }
}

/// What a format records about a tensor's bytes that must change when they change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Integrity {
    /// Nothing.
    None,
    /// The CRC-32 of the ZIP member holding the tensor (index into [`Located::members`]).
    ZipCrc(usize),
    /// The tensor's xxh3 in the Steadfast manifest.
    Manifest,
}

/// The order in which a tensor's elements are stored in its byte range.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Order {
    /// Row-major (C order): the last index varies fastest.
    #[default]
    RowMajor,
    /// Column-major (Fortran order): the first index varies fastest. NumPy writes it for
    /// Fortran-contiguous arrays (`fortran_order: True` in the `.npy` header).
    ColumnMajor,
}

/// One tensor's place in a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorLoc {
    /// Its name (registry name, state-dict path, archive member or HDF5 path).
    pub name: String,
    /// Model parameter or optimizer state (from the name where the format has no roles).
    pub role: Role,
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<u64>,
    /// The file that holds its bytes.
    pub file: PathBuf,
    /// Absolute offset of its first byte in that file.
    pub offset: u64,
    /// Length in bytes (elements times element size).
    pub len: u64,
    /// The order of its elements in those bytes.
    pub order: Order,
    /// What must be updated when its bytes change.
    pub integrity: Integrity,
}

impl TensorLoc {
    /// Number of elements.
    pub fn elements(&self) -> u64 {
        self.len / self.dtype.size() as u64
    }

    /// Where the element with row-major index `element` (its index in the flattened
    /// tensor, as NumPy's `a.flat` and PyTorch's `t.flatten()` number elements) is
    /// stored, counted in elements from the first; `None` past the last element.
    pub fn storage_index(&self, element: u64) -> Option<u64> {
        if element >= self.elements() {
            return None;
        }
        match self.order {
            Order::RowMajor => Some(element),
            Order::ColumnMajor => {
                // Row-major: the last coordinate is the remainder by the last dimension.
                let mut coords = vec![0u64; self.shape.len()];
                let mut rest = element;
                for (c, &d) in coords.iter_mut().zip(&self.shape).rev() {
                    *c = rest % d;
                    rest /= d;
                }
                // Column-major: the first coordinate varies fastest. Every partial value
                // is below the element count, so nothing overflows.
                Some(coords.iter().zip(&self.shape).rev().fold(0, |s, (&c, &d)| s * d + c))
            }
        }
    }

    /// Absolute file offset of the element with row-major index `element`; `None` past
    /// the last element.
    pub fn element_offset(&self, element: u64) -> Option<u64> {
        self.storage_index(element).map(|i| self.offset + i * self.dtype.size() as u64)
    }
}

/// The tensors of a file, and what is needed to keep its integrity data right.
#[derive(Clone, Debug)]
pub struct Located {
    /// The format found.
    pub format: Format,
    /// The tensors, in the file's order.
    pub tensors: Vec<TensorLoc>,
    /// ZIP members (ZIP formats only).
    pub members: Vec<zip::Member>,
    /// The archive file (ZIP formats only).
    pub archive: Option<PathBuf>,
    /// Arrays that exist but cannot be located as one byte range, with the reason.
    pub skipped: Vec<(String, String)>,
}

impl Located {
    /// Points every path at `to` instead of `from`: for a copy of the file (or of the
    /// checkpoint directory) at `from`, whose layout is the same.
    pub fn rebase(&mut self, from: &Path, to: &Path) {
        let moved = |p: &Path| match p.strip_prefix(from) {
            Ok(rest) if rest.as_os_str().is_empty() => to.to_owned(),
            Ok(rest) => to.join(rest),
            Err(_) => p.to_owned(),
        };
        for t in &mut self.tensors {
            t.file = moved(&t.file);
        }
        if let Some(a) = &mut self.archive {
            *a = moved(a);
        }
    }
}

/// A file that cannot be read as any supported format, or that lies about its layout.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct ForeignError {
    /// The file.
    pub path: PathBuf,
    /// What is wrong.
    pub reason: String,
}

fn err(path: &Path, reason: impl std::fmt::Display) -> ForeignError {
    ForeignError { path: path.to_owned(), reason: reason.to_string() }
}

/// The role a name suggests in formats without roles: optimizer state if any path
/// component mentions an optimizer (`optimizer.state.0.exp_avg`,
/// `optimizer_weights/...`) or starts with `optim`, else model.
pub fn role_from_name(name: &str) -> Role {
    let lower = name.to_ascii_lowercase();
    if lower.starts_with("optim") || lower.contains("optimizer") || lower.contains("/optim") {
        Role::Optim
    } else {
        Role::Model
    }
}

/// Recognises the format of `path` from its content (a directory is a Steadfast
/// checkpoint or a root of them).
pub fn detect(path: &Path) -> Result<Format, ForeignError> {
    sniff(path).map(|(format, _)| format)
}

/// [`detect`], also returning the members of a ZIP archive (read once, used twice).
fn sniff(path: &Path) -> Result<(Format, Vec<zip::Member>), ForeignError> {
    if path.is_dir() {
        return Ok((Format::Steadfast, Vec::new()));
    }
    let mut head = [0u8; 8];
    let n = {
        use std::io::Read;
        let mut f = std::fs::File::open(path).map_err(|e| err(path, e))?;
        f.read(&mut head).map_err(|e| err(path, e))?
    };
    if n >= 4 && &head[..4] == b"PK\x03\x04" {
        let members = zip::members(path).map_err(|e| err(path, e))?;
        if members.iter().any(|m| m.name.ends_with("data.pkl")) {
            return Ok((Format::PyTorch, members));
        }
        if members.iter().any(|m| m.name.ends_with(".npy")) {
            return Ok((Format::Npz, members));
        }
        return Err(err(path, "a ZIP archive that is neither a PyTorch checkpoint nor an .npz"));
    }
    if n == 8 && head == *b"\x89HDF\r\n\x1a\n" {
        return Ok((Format::Hdf5, Vec::new()));
    }
    if n == 8 {
        let len = std::fs::metadata(path).map_err(|e| err(path, e))?.len();
        if crate::safetensors::header_len(&head, len).is_ok() {
            return Ok((Format::Safetensors, Vec::new()));
        }
    }
    if n >= 2 && head[0] == 0x80 && (2..=5).contains(&head[1]) {
        return Err(err(path, pickle_advice(path)));
    }
    Err(err(path, "unknown format (expected a Steadfast checkpoint, safetensors, .pt, .npz or .h5)"))
}

/// What to say of a file that is a bare pickle rather than one of the formats read here.
fn pickle_advice(path: &Path) -> String {
    // The legacy `torch.save` format (PyTorch before 1.6, or `_use_new_zipfile_serialization
    // =False`) opens with a pickled magic number: protocol 2, LONG1 of 10 bytes.
    const LEGACY: &[u8] = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19";
    let mut head = [0u8; 14];
    let legacy = std::fs::File::open(path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut head))
        .is_ok_and(|()| head == LEGACY);
    if legacy {
        "a PyTorch file in the legacy (non-zip) format, which is not read here: save it again with a current \
         torch.save (torch.save(torch.load(f), f2)), which writes the zip format"
            .into()
    } else {
        "a plain Python pickle, not a tensor file format read here (expected a Steadfast checkpoint, \
         safetensors, .pt, .npz or .h5)"
            .into()
    }
}

/// Finds every tensor of the file (or Steadfast checkpoint directory) at `path`.
pub fn locate(path: &Path) -> Result<Located, ForeignError> {
    let (format, members) = sniff(path)?;
    let mut located = Located { format, tensors: Vec::new(), members: Vec::new(), archive: None, skipped: Vec::new() };
    match format {
        Format::Steadfast => located.tensors = steadfast(path)?,
        Format::Safetensors => located.tensors = safetensors_file(path)?,
        Format::Npz | Format::PyTorch => {
            located.tensors = if format == Format::Npz { npz(path, &members)? } else { pytorch(path, &members)? };
            located.members = members;
            located.archive = Some(path.to_owned());
        }
        Format::Hdf5 => (located.tensors, located.skipped) = hdf5(path)?,
    }
    Ok(located)
}

type Hdf5Tensors = (Vec<TensorLoc>, Vec<(String, String)>);

#[cfg(feature = "hdf5")]
fn hdf5(path: &Path) -> Result<Hdf5Tensors, ForeignError> {
    h5::locate(path).map_err(|e| err(path, e))
}

#[cfg(not(feature = "hdf5"))]
fn hdf5(path: &Path) -> Result<Hdf5Tensors, ForeignError> {
    Err(err(path, "this build has no HDF5 support (build with the `hdf5` feature and libhdf5)"))
}

fn steadfast(path: &Path) -> Result<Vec<TensorLoc>, ForeignError> {
    let dir = crate::reader::resolve(path).map_err(|e| err(path, e))?;
    let c = crate::reader::open(&dir).map_err(|e| err(path, e))?;
    c.manifest
        .tensors
        .iter()
        .map(|t| {
            Ok(TensorLoc {
                name: t.name.clone(),
                role: t.role.parse().map_err(|e| err(&dir, e))?,
                dtype: DType::from_name(&t.dtype).ok_or_else(|| err(&dir, format!("unknown dtype {}", t.dtype)))?,
                shape: t.shape.clone(),
                file: dir.join(&t.file),
                offset: t.offset,
                len: t.length,
                order: Order::RowMajor,
                integrity: Integrity::Manifest,
            })
        })
        .collect()
}

fn safetensors_file(path: &Path) -> Result<Vec<TensorLoc>, ForeignError> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).map_err(|e| err(path, e))?;
    let file_len = f.metadata().map_err(|e| err(path, e))?.len();
    let mut first8 = [0u8; 8];
    f.read_exact(&mut first8).map_err(|e| err(path, e))?;
    let n = crate::safetensors::header_len(&first8, file_len).map_err(|e| err(path, e))?;
    let mut json = vec![0u8; n as usize];
    f.read_exact(&mut json).map_err(|e| err(path, e))?;
    let header = crate::safetensors::parse_header(&json, file_len).map_err(|e| err(path, e))?;
    Ok(header
        .entries
        .iter()
        .map(|e| TensorLoc {
            name: e.name.clone(),
            role: Role::of_name(&e.name).unwrap_or_else(|| role_from_name(&e.name)),
            dtype: e.dtype,
            shape: e.shape.iter().map(|&d| d as u64).collect(),
            file: path.to_owned(),
            offset: header.data_start + e.begin,
            len: e.len(),
            order: Order::RowMajor,
            integrity: Integrity::None,
        })
        .collect())
}

fn npz(path: &Path, members: &[zip::Member]) -> Result<Vec<TensorLoc>, ForeignError> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path).map_err(|e| err(path, e))?;
    let mut out = Vec::new();
    for (i, m) in members.iter().enumerate().filter(|(_, m)| m.name.ends_with(".npy")) {
        if m.method != 0 {
            return Err(err(
                path,
                format!(
                    "member {} is compressed (np.savez_compressed); only stored members can be altered in place",
                    m.name
                ),
            ));
        }
        let mut head = vec![0u8; m.size.min(65_536 + 12) as usize];
        f.seek(SeekFrom::Start(m.data_offset)).map_err(|e| err(path, e))?;
        f.read_exact(&mut head).map_err(|e| err(path, e))?;
        let h = npy::parse_header(&head).map_err(|e| err(path, format!("member {}: {e}", m.name)))?;
        if h.data_start.checked_add(h.data_len) != Some(m.size) {
            return Err(err(
                path,
                format!(
                    "member {}: {} bytes of data, its header implies {}",
                    m.name,
                    m.size.saturating_sub(h.data_start),
                    h.data_len
                ),
            ));
        }
        let name = m.name.trim_end_matches(".npy").to_owned();
        out.push(TensorLoc {
            role: role_from_name(&name),
            name,
            dtype: h.dtype,
            shape: h.shape,
            file: path.to_owned(),
            offset: m.data_offset + h.data_start,
            len: h.data_len,
            order: h.order,
            integrity: Integrity::ZipCrc(i),
        });
    }
    Ok(out)
}

fn storage_dtype(class: &str) -> Option<DType> {
    Some(match class {
        "FloatStorage" => DType::F32,
        "DoubleStorage" => DType::F64,
        "HalfStorage" => DType::F16,
        "BFloat16Storage" => DType::BF16,
        "LongStorage" => DType::I64,
        "IntStorage" => DType::I32,
        "ShortStorage" => DType::I16,
        "CharStorage" => DType::I8,
        "ByteStorage" => DType::U8,
        "BoolStorage" => DType::Bool,
        _ => return None,
    })
}

fn pytorch(path: &Path, members: &[zip::Member]) -> Result<Vec<TensorLoc>, ForeignError> {
    use pickle::Value;
    use std::io::{Read, Seek, SeekFrom};
    let pkl = members.iter().find(|m| m.name.ends_with("data.pkl")).ok_or_else(|| err(path, "no data.pkl"))?;
    if pkl.method != 0 || pkl.size > 1 << 30 {
        return Err(err(path, "data.pkl is compressed or too large"));
    }
    let prefix = pkl.name.trim_end_matches("data.pkl").to_owned();
    let mut f = std::fs::File::open(path).map_err(|e| err(path, e))?;
    let mut bytes = vec![0u8; pkl.size as usize];
    f.seek(SeekFrom::Start(pkl.data_offset)).map_err(|e| err(path, e))?;
    f.read_exact(&mut bytes).map_err(|e| err(path, e))?;
    let root = pickle::parse(&bytes).map_err(|e| err(path, format!("data.pkl: {e}")))?;

    let mut out = Vec::new();
    // Depth-first over dicts, lists and tuples, naming tensors by their key path.
    let mut todo: Vec<(String, &Value, usize)> = vec![(String::new(), &root, 0)];
    while let Some((name, v, depth)) = todo.pop() {
        if depth > 64 {
            return Err(err(path, "data.pkl nests deeper than 64 levels"));
        }
        let join = |k: &str| if name.is_empty() { k.to_owned() } else { format!("{name}.{k}") };
        match v {
            Value::Dict(items) => {
                for (k, v) in items.iter().rev() {
                    let key = match k {
                        Value::Str(s) => s.clone(),
                        Value::Int(i) => i.to_string(),
                        _ => continue,
                    };
                    todo.push((join(&key), v, depth + 1));
                }
            }
            Value::List(items) | Value::Tuple(items) => {
                for (i, v) in items.iter().enumerate().rev() {
                    todo.push((join(&i.to_string()), v, depth + 1));
                }
            }
            Value::Call(func, args) => {
                let (Value::Global(module, fname), Value::Tuple(args)) = (&**func, &**args) else { continue };
                match (module.as_str(), fname.as_str()) {
                    ("torch._utils", "_rebuild_parameter") | ("torch._utils", "_rebuild_parameter_with_state") => {
                        if let Some(t) = args.first() {
                            todo.push((name.clone(), t, depth + 1));
                        }
                    }
                    ("torch._utils", "_rebuild_tensor_v2") | ("torch._utils", "_rebuild_tensor") => {
                        out.push(pytorch_tensor(path, &name, args, &prefix, members)?);
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }
    let stores_tensors = members.iter().any(|m| m.name.starts_with(&format!("{prefix}data/")));
    if out.is_empty() && stores_tensors {
        // `torch.save(model)` pickles the object: its tensors sit in the state that BUILD
        // gives it, which no key path names.
        let what = match &root {
            Value::Call(func, _) => match &**func {
                Value::Global(module, name) => format!("a pickled {module}.{name} object"),
                _ => "a pickled object".to_owned(),
            },
            _ => "tensors in objects".to_owned(),
        };
        return Err(err(
            path,
            format!(
                "holds {what} (torch.save of a whole module?), whose tensors no key path names: save its \
                 state_dict() instead"
            ),
        ));
    }
    Ok(out)
}

fn pytorch_tensor(
    path: &Path,
    name: &str,
    args: &[pickle::Value],
    prefix: &str,
    members: &[zip::Member],
) -> Result<TensorLoc, ForeignError> {
    use pickle::Value;
    let bad = |why: &str| err(path, format!("tensor {name}: {why}"));
    let ints = |v: &Value| -> Option<Vec<u64>> {
        match v {
            Value::Tuple(t) => {
                t.iter().map(|d| if let Value::Int(i) = d { u64::try_from(*i).ok() } else { None }).collect()
            }
            _ => None,
        }
    };
    let [Value::PersId(id), Value::Int(offset), size, stride, ..] = args else {
        return Err(bad("unexpected arguments to _rebuild_tensor_v2"));
    };
    let Value::Tuple(id) = &**id else { return Err(bad("unexpected storage id")) };
    let [_, Value::Global(_, class), Value::Str(key), ..] = id.as_slice() else {
        return Err(bad("unexpected storage id"));
    };
    let dtype = storage_dtype(class).ok_or_else(|| bad(&format!("unsupported storage type {class}")))?;
    let shape = ints(size).ok_or_else(|| bad("malformed size"))?;
    let stride = ints(stride).ok_or_else(|| bad("malformed stride"))?;
    if shape.len() != stride.len() {
        return Err(bad(&format!("{} dimensions but {} strides", shape.len(), stride.len())));
    }
    // Row-major contiguity (dimensions of length 1 may have any stride).
    let mut expect = 1u64;
    for (d, s) in shape.iter().zip(&stride).rev() {
        if *d != 1 && *s != expect {
            return Err(bad("not contiguous (a strided view); only contiguous tensors can be located"));
        }
        expect = expect.checked_mul(*d).ok_or_else(|| bad("its size overflows"))?;
    }
    let storage = format!("{prefix}data/{key}");
    let (i, m) = members
        .iter()
        .enumerate()
        .find(|(_, m)| m.name == storage)
        .ok_or_else(|| bad(&format!("its storage {storage} is missing from the archive")))?;
    if m.method != 0 {
        return Err(bad("its storage is compressed"));
    }
    let size = dtype.size() as u64;
    let begin = u64::try_from(*offset).map_err(|_| bad("negative storage offset"))?;
    let begin = begin.checked_mul(size).ok_or_else(|| bad("its storage offset overflows"))?;
    let len = expect.checked_mul(size).ok_or_else(|| bad("its size overflows"))?;
    if begin.checked_add(len).is_none_or(|end| end > m.size) {
        return Err(bad(&format!("{len} bytes at {begin} lie outside its storage of {} bytes", m.size)));
    }
    Ok(TensorLoc {
        name: name.to_owned(),
        role: role_from_name(name),
        dtype,
        shape,
        file: path.to_owned(),
        offset: m.data_offset + begin,
        len,
        order: Order::RowMajor,
        integrity: Integrity::ZipCrc(i),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loc(shape: &[u64], order: Order) -> TensorLoc {
        TensorLoc {
            name: "a".into(),
            role: Role::Model,
            dtype: DType::F32,
            shape: shape.to_vec(),
            file: PathBuf::from("a.npz"),
            offset: 100,
            len: shape.iter().product::<u64>() * 4,
            order,
            integrity: Integrity::None,
        }
    }

    #[test]
    fn column_major_elements_are_found_by_their_row_major_index() {
        // a = [[a00 a01 a02] [a10 a11 a12]] is stored a00 a10 a01 a11 a02 a12.
        let a = loc(&[2, 3], Order::ColumnMajor);
        let stored: Vec<_> = (0..6).map(|i| a.storage_index(i).unwrap()).collect();
        assert_eq!(stored, [0, 2, 4, 1, 3, 5]);
        assert_eq!(a.element_offset(1), Some(108));
        assert_eq!(a.storage_index(6), None);
        // Shape (2, 3, 4): element [i][j][k] is row-major i*12 + j*4 + k, stored at i + 2j + 6k.
        let b = loc(&[2, 3, 4], Order::ColumnMajor);
        for (i, j, k) in (0..2).flat_map(|i| (0..3).flat_map(move |j| (0..4).map(move |k| (i, j, k)))) {
            assert_eq!(b.storage_index(i * 12 + j * 4 + k), Some(i + 2 * j + 6 * k));
        }
        let c = loc(&[2, 3], Order::RowMajor);
        assert_eq!((0..6).map(|i| c.storage_index(i).unwrap()).collect::<Vec<_>>(), [0, 1, 2, 3, 4, 5]);
        assert_eq!(loc(&[], Order::ColumnMajor).storage_index(0), Some(0), "a scalar");
        assert_eq!(loc(&[0, 3], Order::ColumnMajor).storage_index(0), None, "no elements");
    }
}
