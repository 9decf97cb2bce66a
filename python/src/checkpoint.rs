//! Steadfast checkpoints of a Python loop's state: the commit protocol, checksums,
//! retention, the one-writer lock and the fallback to the newest valid checkpoint are the
//! `ckpt` crate's; this module converts between its types and Python's.
//!
//! A tensor crosses in as `(name, role, dtype, shape, address, length)`: the registry
//! name, `model`, `optim` or `extra`, a safetensors dtype name (`F32`, `BF16`, `I64`,
//! ...), the shape, and where its little-endian bytes lie in host memory
//! ([`host_bytes`]): a save writes them from there, a snapshot copies them once into
//! buffers it reuses. Tensors cross out as a `bytearray` that `torch.frombuffer` wraps.

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use ckpt::{CkptError, DType, Meta, Owner, RawTensorRef, Retention, Role, SaveOptions};
use pyo3::prelude::*;
use pyo3::types::PyByteArray;

use crate::CheckpointError;
use crate::host::{host_bytes, host_bytes_mut, mapped_buffer};

/// A tensor as Python points at it: `(name, role, dtype, shape, address, length)`, the
/// address of `length` bytes of host memory that the caller keeps alive and unchanged
/// for the duration of the call.
pub(crate) type TensorAt = (String, String, String, Vec<usize>, usize, usize);

/// A tensor's description without its bytes, owned (for the background save).
pub(crate) type Described = (String, Role, DType, Vec<usize>);

/// What a background save gives back: the directory it committed, and the buffers that
/// held the snapshot, for the next one.
/// (A preparation commits nothing: `Ok(None)`.)
type Done = (Result<Option<PathBuf>, CkptError>, Vec<Vec<u8>>);

fn err(e: CkptError) -> PyErr {
    CheckpointError::new_err(e.to_string())
}

fn bad(reason: String) -> PyErr {
    pyo3::exceptions::PyValueError::new_err(reason)
}

/// The tensors' names, roles, dtypes and shapes, checked.
pub(crate) fn describe(tensors: &[TensorAt]) -> PyResult<Vec<Described>> {
    tensors
        .iter()
        .map(|(name, role, dtype, shape, _, _)| {
            let role: Role = role.parse().map_err(|e| bad(format!("tensor {name}: {e}")))?;
            let dtype =
                DType::from_name(dtype).ok_or_else(|| bad(format!("tensor {name}: unknown dtype {dtype:?}")))?;
            Ok((name.clone(), role, dtype, shape.clone()))
        })
        .collect()
}

/// The tensors described, over their bytes (`bytes[i]` of `described[i]`).
pub(crate) fn refs<'a>(described: &'a [Described], bytes: impl IntoIterator<Item = &'a [u8]>) -> Vec<RawTensorRef<'a>> {
    described
        .iter()
        .zip(bytes)
        .map(|((name, role, dtype, shape), bytes)| RawTensorRef { name, role: *role, dtype: *dtype, shape, bytes })
        .collect()
}

/// The metadata of a checkpoint of `step` holding `tree` (JSON text).
pub(crate) fn meta(step: u64, tree: &str) -> PyResult<Meta> {
    let tree: serde_json::Value = serde_json::from_str(tree).map_err(|e| {
        if e.to_string().contains("recursion limit") {
            bad("the state nests too deeply for a checkpoint (its tree is over 128 levels of JSON, about 40 levels \
                 of dicts): flatten it"
                .into())
        } else {
            bad(format!("the state tree is not valid JSON: {e}"))
        }
    })?;
    if tree.is_null() {
        return Err(bad("the state is None: there is nothing to save".into()));
    }
    Ok(Meta { step, world_size: 1, tree: Some(tree), ..Meta::default() })
}

fn options(keep_last: Option<usize>, shards: usize) -> SaveOptions {
    SaveOptions { shards: shards.max(1), retention: Retention { keep_last, keep_every: None } }
}

/// Takes the root's writer lock, clearing what dead writers left.
fn own(root: &Path) -> Result<Owner, CkptError> {
    let owner = Owner::acquire(root, 0).map_err(|e| match e {
        CkptError::Busy { dir, holder, .. } if holder.starts_with(&format!("pid {} ", std::process::id())) => {
            CkptError::Mismatch(format!(
                "{} is being written by this process already (an AsyncCheckpointer that is still open?): save \
                 through it, or close it first",
                dir.display()
            ))
        }
        other => other,
    })?;
    ckpt::store::remove_stale_temporaries(root)?;
    Ok(owner)
}

/// Saves `tensors` (read where they lie: the caller holds them, unchanged, until this
/// returns) and `tree` as the checkpoint of `step` under `root` and commits it atomically;
/// returns the committed directory. Fails if another process writes `root`.
#[pyfunction]
#[pyo3(signature = (root, step, tensors, tree, keep_last=None, shards=2, overwrite=false))]
#[allow(clippy::too_many_arguments)]
fn save(
    py: Python<'_>,
    root: PathBuf,
    step: u64,
    tensors: Vec<TensorAt>,
    tree: &str,
    keep_last: Option<usize>,
    shards: usize,
    overwrite: bool,
) -> PyResult<PathBuf> {
    let meta = meta(step, tree)?;
    let described = describe(&tensors)?;
    let refs = refs(&described, tensors.iter().map(|&(.., address, length)| host_bytes(address, length)));
    let (dir, way) = py
        .allow_threads(|| {
            let _owner = own(&root)?;
            let way = clear_way(&root, step, overwrite)?;
            let dir = ckpt::store::save_raw(&root, &meta, &refs, &options(keep_last, shards))?.dir;
            remove_later(&root, &way.later);
            Ok::<_, CkptError>((dir, way))
        })
        .map_err(err)?;
    warn_all(py, &way.said)?;
    Ok(dir)
}

/// What a save of a step must do about the checkpoints already in its root: what to
/// tell the user, and the later steps to remove once it has committed.
struct Way {
    said: Vec<String>,
    later: Vec<u64>,
}

/// Whether a save of `step` may go ahead in `root`, and what it must clear away.
///
/// A checkpoint of the same step that verifies is not replaced (saving a step twice is
/// more often than not a loop that resumed from an older checkpoint than it meant to),
/// nor are checkpoints of later steps that verify (a load of the root would take the
/// newest of them, not this one): both only with `overwrite`, which replaces the first
/// and removes the others once this save commits. Ones that do not verify, which a loop
/// that resumed past them reaches again, are replaced or removed, and said.
fn clear_way(root: &Path, step: u64, overwrite: bool) -> Result<Way, CkptError> {
    let mut way = Way { said: Vec::new(), later: Vec::new() };
    let committed = if root.is_dir() { ckpt::store::list(root)? } else { Vec::new() };
    let mut intact = Vec::new();
    for (s, dir) in committed.into_iter().filter(|(s, _)| *s >= step) {
        let problem = ckpt::reader::check(&dir).into_iter().next();
        match (s == step, problem) {
            (true, None) if !overwrite => intact.push(s),
            (true, Some(p)) => {
                way.said.push(format!("replaced {}, which did not verify ({}: {})", dir.display(), p.file, p.reason))
            }
            (false, None) if !overwrite => intact.push(s),
            (false, Some(p)) => {
                way.said.push(format!(
                    "removing {} once this save commits: it is of a later step than {step} and does not verify ({}: {})",
                    dir.display(),
                    p.file,
                    p.reason
                ));
                way.later.push(s);
            }
            (false, None) => {
                way.said.push(format!("removing {} once this save commits (overwrite=True)", dir.display()));
                way.later.push(s);
            }
            (true, None) => {}
        }
    }
    match intact.as_slice() {
        [] => Ok(way),
        [only] if *only == step => Err(CkptError::Mismatch(format!(
            "{} already holds a checkpoint of step {step} that verifies: pass overwrite=True to replace it, or save \
             another step",
            root.display()
        ))),
        later => {
            let steps: Vec<String> = later.iter().map(u64::to_string).collect();
            Err(CkptError::Mismatch(format!(
                "{} holds checkpoints of steps {} that verify, at or after step {step}: a load of the root would take \
                 the newest of them, not this one. Pass overwrite=True to replace them (those of later steps are \
                 removed once this save commits), or save into another directory",
                root.display(),
                steps.join(", ")
            )))
        }
    }
}

/// Removes the checkpoints of `steps` (later than the one just committed), as
/// [`clear_way`] decided; one that cannot be removed stays, and a load of the root
/// passes over it where it does not verify.
fn remove_later(root: &Path, steps: &[u64]) {
    for &s in steps {
        let _ = ckpt::store::remove_checkpoint(root, s);
    }
}

/// Tells the user each of `said`, as a Python warning.
fn warn_all(py: Python<'_>, said: &[String]) -> PyResult<()> {
    for text in said {
        let text = std::ffi::CString::new(text.replace('\0', " ")).expect("NUL bytes were replaced");
        PyErr::warn(py, &py.get_type::<pyo3::exceptions::PyUserWarning>(), &text, 2)?;
    }
    Ok(())
}

/// A tensor in `torch.nn`'s name and layout: `(name, dtype, shape, bytes)`.
type LaidOut<'py> = (String, &'static str, Vec<usize>, Bound<'py, PyByteArray>);

/// A checkpoint whose manifest has been read and checked, its tensors not yet read:
/// the first half of a load that reads into memory the caller allocated.
#[pyclass(module = "steadfast._steadfast", frozen)]
struct Opened {
    /// The checkpoint, its state tree taken out (as text, in `tree`): a parsed tree of many
    /// thousands of tensors would take more memory than the text, for as long as the load.
    checkpoint: ckpt::reader::Checkpoint,
    /// The state tree, as JSON text, or None for a checkpoint without one (`steadfast train`'s).
    #[pyo3(get)]
    tree: Option<String>,
    /// Whether it was found in a root (so an older one may be tried if it fails).
    #[pyo3(get)]
    in_root: bool,
    /// Newer checkpoints passed over on the way, with why.
    #[pyo3(get)]
    skipped: Vec<(PathBuf, String)>,
}

#[pymethods]
impl Opened {
    #[getter]
    fn dir(&self) -> PathBuf {
        self.checkpoint.dir.clone()
    }

    #[getter]
    fn step(&self) -> u64 {
        self.checkpoint.manifest.meta.step
    }

    /// The tensors in the manifest's order: `(name, role, dtype, shape, length)`.
    #[getter]
    fn tensors(&self) -> Vec<(String, String, String, Vec<u64>, u64)> {
        let m = &self.checkpoint.manifest;
        m.tensors.iter().map(|t| (t.name.clone(), t.role.clone(), t.dtype.clone(), t.shape.clone(), t.length)).collect()
    }

    /// The model's tensors of a checkpoint `steadfast train` wrote, read and verified,
    /// named and laid out as `torch.nn` modules hold them (`ckpt::torch_layout`): a list
    /// of `(name, dtype, shape, bytearray)`. A checkpoint saved from Python (one with a
    /// state tree) is in its framework's layout already, and refused.
    fn torch_layout<'py>(&self, py: Python<'py>) -> PyResult<Vec<LaidOut<'py>>> {
        if self.tree.is_some() {
            return Err(CheckpointError::new_err(format!(
                "{} holds a framework's state (it was saved from Python), already in that framework's layout: load \
                 it with layout='steadfast'",
                self.checkpoint.dir.display()
            )));
        }
        let model = py
            .allow_threads(|| ckpt::export::model_tensors(&self.checkpoint).map(ckpt::torch_layout::to_torch))
            .map_err(err)?;
        Ok(model.into_iter().map(|t| (t.name, t.dtype.name(), t.shape, PyByteArray::new(py, &t.bytes))).collect())
    }

    /// Reads every tensor into the memory at `buffers[i] = (address, length)` (the
    /// manifest's tensor `i`, of exactly its length), verifying every checksum as it reads.
    /// The caller allocated that memory (dense, in host memory, pairwise disjoint) and
    /// keeps it alive and untouched until this returns.
    fn read_into(&self, py: Python<'_>, buffers: Vec<(usize, usize)>) -> PyResult<()> {
        disjoint(&buffers)?;
        py.allow_threads(|| {
            let mut slices: Vec<&mut [u8]> = buffers.iter().map(|&(a, n)| host_bytes_mut(a, n)).collect();
            self.checkpoint.read_into(&mut slices)
        })
        .map_err(err)
    }
}

/// Refuses buffers that overlap: each must be written through one slice alone.
fn disjoint(buffers: &[(usize, usize)]) -> PyResult<()> {
    let mut spans: Vec<(usize, usize)> = buffers.iter().copied().filter(|&(a, n)| a != 0 && n != 0).collect();
    spans.sort_unstable();
    for pair in spans.windows(2) {
        let ((a, n), (b, _)) = (pair[0], pair[1]);
        if a.checked_add(n).is_none_or(|end| end > b) {
            return Err(bad(format!("buffers at {a:#x} (+{n}) and {b:#x} overlap")));
        }
    }
    Ok(())
}

/// Opens the checkpoint `path` names, as `load` does, without reading its tensors; with
/// `below`, the newest one in the root `path` older than that step (where the data of
/// the one opened before did not verify).
#[pyfunction]
#[pyo3(signature = (path, below=None))]
fn open_checkpoint(py: Python<'_>, path: PathBuf, below: Option<u64>) -> PyResult<Opened> {
    py.allow_threads(|| {
        let in_root = !path.join(ckpt::manifest::MANIFEST_FILE).exists();
        let resolved = match below {
            Some(step) if in_root => ckpt::reader::resolve_older(&path, step)?,
            Some(_) => {
                return Err(CkptError::Mismatch(format!(
                    "{} is one checkpoint: there is none older in it",
                    path.display()
                )));
            }
            None => ckpt::reader::resolve_reporting(&path)?,
        };
        let mut checkpoint = ckpt::reader::open(&resolved.dir)?;
        let tree = checkpoint.manifest.meta.tree.take().map(|t| t.to_string());
        Ok(Opened { checkpoint, tree, in_root, skipped: resolved.skipped })
    })
    .map_err(err)
}

/// Every problem of what `path` names, as `(file, tensor or None, reason)`; empty when
/// every byte checks out. As `steadfast ckpt verify` does: a checkpoint directory is
/// checked alone; a root, every committed checkpoint in it (files named
/// `step-<N>/<file>`) and its `LATEST`; a root with no checkpoint is one problem.
#[pyfunction]
fn verify(py: Python<'_>, path: PathBuf) -> Vec<(String, Option<String>, String)> {
    py.allow_threads(|| {
        let flat = |p: ckpt::Problem, prefix: &str| (format!("{prefix}{}", p.file), p.tensor, p.reason);
        if path.join(ckpt::manifest::MANIFEST_FILE).exists() || !path.is_dir() {
            return ckpt::reader::check(&path).into_iter().map(|p| flat(p, "")).collect();
        }
        let report = match ckpt::reader::check_root(&path) {
            Ok(report) => report,
            Err(e) => return vec![(path.display().to_string(), None, e.to_string())],
        };
        let mut problems = Vec::new();
        for (step, _, found) in report.checkpoints {
            let prefix = format!("{}/", ckpt::store::step_dir_name(step));
            problems.extend(found.into_iter().map(|p| flat(p, &prefix)));
        }
        problems.extend(report.latest.map(|why| (ckpt::store::LATEST_FILE.to_owned(), None, why)));
        problems
    })
}

/// The committed steps under `root`, ascending (none if it does not exist).
#[pyfunction]
fn steps(root: PathBuf) -> PyResult<Vec<u64>> {
    if !root.exists() {
        return Ok(Vec::new());
    }
    let committed = ckpt::store::list(&root).map_err(err)?;
    Ok(committed
        .into_iter()
        .filter(|(_, dir)| dir.join(ckpt::manifest::MANIFEST_FILE).is_file())
        .map(|(s, _)| s)
        .collect())
}

/// Writes checkpoints in the background: `snapshot` returns once the tensors are copied,
/// and the next `snapshot` (or `wait`) first waits for the save in flight. It holds the root's
/// writer lock for as long as it lives, so a second run on the same root is refused.
#[pyclass(module = "steadfast._steadfast")]
struct Saver {
    root: PathBuf,
    options: SaveOptions,
    _owner: Owner,
    /// Whether a save may replace a checkpoint of its step that verifies.
    overwrite: bool,
    pending: Option<JoinHandle<Done>>,
    /// The buffers of the last snapshot, in tensor order, reused by the next one: after
    /// the first save a snapshot writes into memory that is already mapped.
    spare: Vec<Vec<u8>>,
}

impl Saver {
    /// Waits for the save in flight, if any; returns the directory it committed.
    fn join(&mut self, py: Python<'_>) -> PyResult<Option<PathBuf>> {
        let Some(handle) = self.pending.take() else { return Ok(None) };
        let done = py.allow_threads(|| handle.join());
        match done {
            Ok((result, buffers)) => {
                self.spare = buffers;
                result.map_err(err)
            }
            Err(_) => Err(CheckpointError::new_err("the background save panicked")),
        }
    }
}

#[pymethods]
impl Saver {
    #[new]
    #[pyo3(signature = (root, keep_last=None, shards=2, overwrite=false))]
    fn new(py: Python<'_>, root: PathBuf, keep_last: Option<usize>, shards: usize, overwrite: bool) -> PyResult<Self> {
        let owner = py.allow_threads(|| own(&root)).map_err(err)?;
        let options = options(keep_last, shards);
        Ok(Saver { root, options, _owner: owner, overwrite, pending: None, spare: Vec::new() })
    }

    /// Starts saving `tensors` as the checkpoint of `step`, after the save in flight has
    /// finished: reads each tensor's bytes where they lie (`address`, `length`) into this
    /// saver's own buffers, reused from the previous snapshot, and returns once they are
    /// copied (the caller keeps the memory alive and unchanged until then). Returns the
    /// directory that the previous save committed, if there was one.
    fn snapshot(&mut self, py: Python<'_>, step: u64, tensors: Vec<TensorAt>, tree: &str) -> PyResult<Option<PathBuf>> {
        let meta = meta(step, tree)?;
        let described = describe(&tensors)?;
        let previous = self.join(py)?;
        let (root, overwrite) = (self.root.clone(), self.overwrite);
        let way = py.allow_threads(|| clear_way(&root, step, overwrite)).map_err(err)?;
        warn_all(py, &way.said)?;
        let later = way.later;
        let mut buffers = std::mem::take(&mut self.spare);
        buffers.resize_with(tensors.len(), Vec::new);
        for (buffer, &(.., address, length)) in buffers.iter_mut().zip(&tensors) {
            buffer.clear();
            buffer.extend_from_slice(host_bytes(address, length));
        }
        let (root, options) = (self.root.clone(), self.options);
        let handle = std::thread::Builder::new()
            .name("steadfast-saver".into())
            .spawn(move || {
                let refs = refs(&described, buffers.iter().map(Vec::as_slice));
                let result = ckpt::store::save_raw(&root, &meta, &refs, &options).map(|r| Some(r.dir));
                if result.is_ok() {
                    remove_later(&root, &later);
                }
                (result, buffers)
            })
            .map_err(|e| CheckpointError::new_err(format!("cannot start the background save: {e}")))?;
        self.pending = Some(handle);
        Ok(previous)
    }

    /// Prepares, in the background, the buffers of snapshots whose tensors have these
    /// byte lengths (in the order the next `snapshot` gives them): maps their memory in
    /// on another thread while the loop goes on, so that the first snapshot copies at
    /// the speed of the later ones instead of paying a page fault per 4 KiB. Waits for
    /// the save in flight first, like `snapshot`.
    fn prepare(&mut self, py: Python<'_>, lengths: Vec<usize>) -> PyResult<Option<PathBuf>> {
        let previous = self.join(py)?;
        let mut buffers = std::mem::take(&mut self.spare);
        buffers.resize_with(lengths.len(), Vec::new);
        let handle = std::thread::Builder::new()
            .name("steadfast-prepare".into())
            .spawn(move || {
                for (buffer, length) in buffers.iter_mut().zip(lengths) {
                    if buffer.capacity() < length {
                        *buffer = mapped_buffer(length);
                    }
                }
                (Ok(None), buffers)
            })
            .map_err(|e| CheckpointError::new_err(format!("cannot start preparing the buffers: {e}")))?;
        self.pending = Some(handle);
        Ok(previous)
    }

    /// Waits for the save in flight; returns the directory it committed (None if none
    /// was in flight). Raises its error if it failed.
    fn wait(&mut self, py: Python<'_>) -> PyResult<Option<PathBuf>> {
        self.join(py)
    }

    /// Whether a save is in flight.
    fn busy(&self) -> bool {
        self.pending.as_ref().is_some_and(|h| !h.is_finished())
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(save, m)?)?;
    m.add_function(wrap_pyfunction!(open_checkpoint, m)?)?;
    m.add_class::<Opened>()?;
    m.add_function(wrap_pyfunction!(verify, m)?)?;
    m.add_function(wrap_pyfunction!(steps, m)?)?;
    m.add_class::<Saver>()
}
