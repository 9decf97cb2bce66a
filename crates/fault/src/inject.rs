//! Bit flips inside checkpoint files, in place or into a copy, with a log that can redo
//! and undo them exactly.
//!
//! The steps of [`inject`]:
//! 1. copy the input to `--out` if asked (a Steadfast checkpoint directory is copied
//!    whole), and work on the copy;
//! 2. locate every tensor ([`ckpt::foreign::locate`]) and draw the flips
//!    ([`plan`](crate::plan::plan));
//! 3. for each element: read its bytes, invert the bits, write them back, and record the
//!    element's bytes and value before and after;
//! 4. bring integrity data up to date: a ZIP member's CRC-32 always (so that NumPy and
//!    PyTorch load the file), a Steadfast manifest's checksums unless `keep_checksums`
//!    (rewriting them models corruption that struck before the checksum was taken, as
//!    checkpoint alteration does; keeping them lets `steadfast ckpt verify` catch it);
//! 5. fsync every file touched.
//!
//! [`replay`] applies a log's flips to a file again, and [`undo`] restores the original
//! bytes; both first check that every element holds the bytes the log says it should, so
//! a log is never applied to the wrong file.

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use ckpt::DType;
use ckpt::foreign::{Format, Integrity, Located, TensorLoc, locate};
use serde::{Deserialize, Serialize};

use crate::plan::{Candidate, FlipSpec, plan};
use crate::value::{hex_bytes, parse_hex, value_text};

/// Version of the log format.
pub const LOG_VERSION: u32 = 1;

/// One altered element.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlipRecord {
    /// Tensor name.
    pub tensor: String,
    /// `model` or `optim`.
    pub role: String,
    /// Element type.
    pub dtype: String,
    /// Element index in storage order.
    pub element: u64,
    /// Bits inverted (0 = least significant).
    pub bits: Vec<u32>,
    /// The file holding the element, relative to the log's target for checkpoint
    /// directories (the file name of a shard), else the target itself.
    pub file: String,
    /// Absolute byte offset of the element in that file.
    pub byte_offset: u64,
    /// The element's little-endian bytes before, as hex.
    pub old_bytes: String,
    /// After.
    pub new_bytes: String,
    /// The value before, as text (`NaN` and `inf` included).
    pub old_value: String,
    /// After.
    pub new_value: String,
}

/// Everything needed to redo or undo an injection.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InjectionLog {
    /// [`LOG_VERSION`].
    pub version: u32,
    /// The file or checkpoint directory altered.
    pub target: String,
    /// Its format.
    pub format: String,
    /// The fault, as given.
    pub spec: String,
    /// The seed.
    pub seed: u64,
    /// `rewritten`, `kept` (stale on purpose) or `none` (the format has none).
    pub checksums: String,
    /// The altered elements, sorted by tensor and element.
    pub flips: Vec<FlipRecord>,
}

/// How to inject.
#[derive(Clone, Debug, Default)]
pub struct InjectOptions {
    /// Alter a copy here instead of the input.
    pub out: Option<PathBuf>,
    /// Leave a Steadfast manifest's checksums as they were (so verification fails).
    pub keep_checksums: bool,
}

/// What can go wrong.
#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    /// The file cannot be read as a supported format.
    #[error(transparent)]
    Format(#[from] ckpt::foreign::ForeignError),
    /// The fault cannot be planned.
    #[error(transparent)]
    Plan(#[from] crate::plan::PlanError),
    /// Reading or writing failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The file does not hold what the log says it should.
    #[error("{0}")]
    Mismatch(String),
    /// Rewriting the manifest failed.
    #[error(transparent)]
    Checkpoint(#[from] ckpt::CkptError),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> InjectError + '_ {
    move |source| InjectError::Io { path: path.to_owned(), source }
}

/// The working target: `out` (a copy of `input`) or `input` itself. For a Steadfast
/// checkpoint the target is its `step-*` directory.
fn prepare(input: &Path, out: Option<&Path>) -> Result<PathBuf, InjectError> {
    let input = if input.is_dir() { ckpt::reader::resolve(input)? } else { input.to_owned() };
    let Some(out) = out else { return Ok(input) };
    if out.exists() {
        return Err(InjectError::Mismatch(format!("{} already exists; refusing to overwrite it", out.display())));
    }
    if input.is_dir() {
        std::fs::create_dir_all(out).map_err(io(out))?;
        for entry in std::fs::read_dir(&input).map_err(io(&input))? {
            let entry = entry.map_err(io(&input))?;
            std::fs::copy(entry.path(), out.join(entry.file_name())).map_err(io(&entry.path()))?;
        }
    } else {
        std::fs::copy(&input, out).map_err(io(&input))?;
    }
    Ok(out.to_owned())
}

fn record_file(target: &Path, t: &TensorLoc) -> String {
    if target.is_dir() {
        t.file.file_name().map_or_else(|| t.file.display().to_string(), |n| n.to_string_lossy().into_owned())
    } else {
        target.display().to_string()
    }
}

/// Reads `len` bytes at `offset` of `f`.
fn read_at(f: &mut File, path: &Path, offset: u64, len: usize) -> Result<Vec<u8>, InjectError> {
    let mut b = vec![0u8; len];
    f.seek(SeekFrom::Start(offset)).map_err(io(path))?;
    f.read_exact(&mut b).map_err(io(path))?;
    Ok(b)
}

fn write_at(f: &mut File, path: &Path, offset: u64, bytes: &[u8]) -> Result<(), InjectError> {
    f.seek(SeekFrom::Start(offset)).map_err(io(path))?;
    f.write_all(bytes).map_err(io(path))
}

/// Flips bits in `input` as `spec` says; returns the log (the caller saves it).
pub fn inject(input: &Path, spec: &FlipSpec, options: &InjectOptions) -> Result<InjectionLog, InjectError> {
    // Plan on the input, so that a fault that cannot be planned leaves no copy behind; a
    // copy has the same layout, so only the paths change.
    let source = if input.is_dir() { ckpt::reader::resolve(input)? } else { input.to_owned() };
    let mut located = locate(&source)?;
    let candidates: Vec<Candidate<'_>> = located
        .tensors
        .iter()
        .map(|t| Candidate { name: &t.name, role: t.role, dtype: t.dtype, elements: t.elements() })
        .collect();
    let flips = plan(&candidates, spec)?;
    let target = prepare(&source, options.out.as_deref())?;
    located.rebase(&source, &target);
    let mut records = Vec::with_capacity(flips.len());
    let mut touched = BTreeSet::new();
    let mut files: Vec<(PathBuf, File)> = Vec::new();
    for f in &flips {
        let t = &located.tensors[f.tensor];
        let size = t.dtype.size();
        let offset = t.offset + f.element * size as u64;
        let file = open_cached(&mut files, &t.file)?;
        let old = read_at(file, &t.file, offset, size)?;
        let mut new = old.clone();
        for &b in &f.bits {
            new[(b / 8) as usize] ^= 1 << (b % 8);
        }
        write_at(file, &t.file, offset, &new)?;
        touched.insert(f.tensor);
        records.push(FlipRecord {
            tensor: t.name.clone(),
            role: t.role.as_str().to_owned(),
            dtype: t.dtype.name().to_owned(),
            element: f.element,
            bits: f.bits.clone(),
            file: record_file(&target, t),
            byte_offset: offset,
            old_value: value_text(t.dtype, &old),
            new_value: value_text(t.dtype, &new),
            old_bytes: hex_bytes(&old),
            new_bytes: hex_bytes(&new),
        });
    }
    for (path, f) in &files {
        f.sync_all().map_err(io(path))?;
    }
    drop(files);
    let checksums = fix_integrity(&target, &located, &touched, options.keep_checksums)?;
    Ok(InjectionLog {
        version: LOG_VERSION,
        target: target.display().to_string(),
        format: located.format.name().to_owned(),
        spec: describe(spec),
        seed: spec.seed,
        checksums,
        flips: records,
    })
}

fn describe(spec: &FlipSpec) -> String {
    let amount = match spec.amount {
        crate::plan::Amount::Count(k) => format!("count={k}"),
        crate::plan::Amount::Rate(p) => format!("rate={p}"),
    };
    format!(
        "target={} role={} bits={} {amount} burst={}",
        spec.target.glob.as_deref().unwrap_or("*"),
        spec.target.role.map_or("any", |r| r.as_str()),
        spec.bits,
        spec.burst
    )
}

fn open_cached<'a>(files: &'a mut Vec<(PathBuf, File)>, path: &Path) -> Result<&'a mut File, InjectError> {
    if let Some(i) = files.iter().position(|(p, _)| p == path) {
        return Ok(&mut files[i].1);
    }
    let f = OpenOptions::new().read(true).write(true).open(path).map_err(io(path))?;
    files.push((path.to_owned(), f));
    Ok(&mut files.last_mut().expect("just pushed").1)
}

/// Updates what the format records about the `touched` tensors' bytes; returns what
/// happened to checksums (`rewritten`, `kept` or `none`).
fn fix_integrity(
    target: &Path,
    located: &Located,
    touched: &BTreeSet<usize>,
    keep_checksums: bool,
) -> Result<String, InjectError> {
    let mut members = BTreeSet::new();
    let mut in_manifest = BTreeSet::new();
    for &i in touched {
        match located.tensors[i].integrity {
            Integrity::ZipCrc(m) => {
                members.insert(m);
            }
            Integrity::Manifest => {
                in_manifest.insert(located.tensors[i].name.as_str());
            }
            Integrity::None => {}
        }
    }
    if let Some(archive) = &located.archive {
        for m in members {
            ckpt::foreign::zip::fix_crc(archive, &located.members[m])
                .map_err(|e| InjectError::Mismatch(format!("{}: {e}", archive.display())))?;
        }
    }
    Ok(match located.format {
        Format::Steadfast if keep_checksums => "kept".into(),
        Format::Steadfast => {
            if !in_manifest.is_empty() {
                rewrite_manifest(target, &in_manifest)?;
            }
            "rewritten".into()
        }
        Format::PyTorch | Format::Npz => "rewritten".into(),
        Format::Safetensors | Format::Hdf5 => "none".into(),
    })
}

/// Recomputes the checksums of the `altered` tensors of the checkpoint in `dir` from the
/// bytes on disk and replaces its manifest atomically.
fn rewrite_manifest(dir: &Path, altered: &BTreeSet<&str>) -> Result<(), InjectError> {
    let c = ckpt::reader::open(dir)?;
    let m = &c.manifest;
    let mut tensors = m.tensors.clone();
    let mut files: Vec<(PathBuf, File)> = Vec::new();
    for t in tensors.iter_mut().filter(|t| altered.contains(t.name.as_str())) {
        let path = dir.join(&t.file);
        let f = open_cached(&mut files, &path)?;
        let bytes = read_at(f, &path, t.offset, t.length as usize)?;
        t.xxh3 = ckpt::manifest::hex64(ckpt::checksum(&bytes));
    }
    let fresh = ckpt::Manifest::new(m.meta.clone(), m.files.clone(), tensors);
    let tmp = dir.join("manifest.json.tmp");
    let mut f = File::create(&tmp).map_err(io(&tmp))?;
    f.write_all(&fresh.to_bytes()).map_err(io(&tmp))?;
    f.sync_all().map_err(io(&tmp))?;
    std::fs::rename(&tmp, dir.join(ckpt::manifest::MANIFEST_FILE)).map_err(io(&tmp))?;
    ckpt::store::fsync_dir(dir)?;
    Ok(())
}

/// Which way to apply a log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Direction {
    Redo,
    Undo,
}

/// Applies the flips of `log` to `target` (the log's own target if `None`) again. Every
/// element must hold the log's `old_bytes` first.
pub fn replay(log: &InjectionLog, target: Option<&Path>, options: &InjectOptions) -> Result<InjectionLog, InjectError> {
    let target = target.map_or_else(|| PathBuf::from(&log.target), Path::to_owned);
    let target = prepare(&target, options.out.as_deref())?;
    apply(log, &target, Direction::Redo, options.keep_checksums || log.checksums == "kept")?;
    Ok(InjectionLog { target: target.display().to_string(), ..log.clone() })
}

/// Restores the bytes `log` altered in `target` (the log's own target if `None`). Every
/// element must hold the log's `new_bytes` first.
pub fn undo(log: &InjectionLog, target: Option<&Path>) -> Result<(), InjectError> {
    let target = target.map_or_else(|| PathBuf::from(&log.target), Path::to_owned);
    let target = prepare(&target, None)?;
    apply(log, &target, Direction::Undo, log.checksums == "kept")
}

fn apply(log: &InjectionLog, target: &Path, direction: Direction, keep_checksums: bool) -> Result<(), InjectError> {
    if log.version != LOG_VERSION {
        return Err(InjectError::Mismatch(format!("log version {} is not {LOG_VERSION}", log.version)));
    }
    let located = locate(target)?;
    if located.format.name() != log.format {
        return Err(InjectError::Mismatch(format!(
            "{} is {}, the log is for {}",
            target.display(),
            located.format.name(),
            log.format
        )));
    }
    // Check everything before changing anything.
    let mut plan = Vec::new();
    let mut files: Vec<(PathBuf, File)> = Vec::new();
    let mut touched = BTreeSet::new();
    let by_name: std::collections::HashMap<&str, usize> =
        located.tensors.iter().enumerate().map(|(i, t)| (t.name.as_str(), i)).collect();
    for r in &log.flips {
        let i = *by_name
            .get(r.tensor.as_str())
            .ok_or_else(|| InjectError::Mismatch(format!("{} has no tensor {}", target.display(), r.tensor)))?;
        let t = &located.tensors[i];
        let dtype = DType::from_name(&r.dtype).filter(|d| *d == t.dtype).ok_or_else(|| {
            InjectError::Mismatch(format!("tensor {} is {}, the log says {}", r.tensor, t.dtype.name(), r.dtype))
        })?;
        if r.element >= t.elements() {
            return Err(InjectError::Mismatch(format!("tensor {} has no element {}", r.tensor, r.element)));
        }
        let offset = t.offset + r.element * dtype.size() as u64;
        let (expect, write) = match direction {
            Direction::Redo => (&r.old_bytes, &r.new_bytes),
            Direction::Undo => (&r.new_bytes, &r.old_bytes),
        };
        let (expect, write) = (parse_hex(expect)?, parse_hex(write)?);
        let f = open_cached(&mut files, &t.file)?;
        let now = read_at(f, &t.file, offset, dtype.size())?;
        if now != expect {
            return Err(InjectError::Mismatch(format!(
                "element {} of {} holds {}, the log expects {}: this is not the file the log was made on \
                 (or it was already {})",
                r.element,
                r.tensor,
                hex_bytes(&now),
                hex_bytes(&expect),
                if direction == Direction::Redo { "altered" } else { "restored" }
            )));
        }
        plan.push((t.file.clone(), offset, write));
        touched.insert(i);
    }
    for (path, offset, bytes) in &plan {
        let f = open_cached(&mut files, path)?;
        write_at(f, path, *offset, bytes)?;
    }
    for (path, f) in &files {
        f.sync_all().map_err(io(path))?;
    }
    drop(files);
    fix_integrity(target, &located, &touched, keep_checksums)?;
    Ok(())
}
