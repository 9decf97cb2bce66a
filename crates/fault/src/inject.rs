//! Bit flips inside checkpoint files, in place or into a copy, with a log that can redo
//! and undo them exactly.
//!
//! The steps of [`inject`]:
//! 1. copy the input to `--out` if asked (a Steadfast checkpoint directory is copied
//!    whole), and work on the copy;
//! 2. locate every tensor ([`ckpt::foreign::locate`]) and draw the flips
//!    ([`plan`]);
//! 3. read every element to alter, and compute its new bytes; a tensor of a Steadfast
//!    checkpoint is read whole and checked against its checksum in the manifest first;
//! 4. refuse, before anything is copied or written, if a tensor to alter already fails
//!    its checksum, unless `allow_corrupt_input`;
//! 5. copy the input to `--out` if asked, write the new bytes, and record each element's
//!    bytes and value before and after;
//! 6. bring integrity data up to date: a ZIP member's CRC-32 always (so that NumPy and
//!    PyTorch load the file), a Steadfast manifest's checksums unless `keep_checksums`
//!    (rewriting them models corruption that struck before the checksum was taken, as
//!    checkpoint alteration does; keeping them lets `steadfast ckpt verify` catch it);
//! 7. fsync every file touched.
//! 8. with `--out`, every step above worked on a copy under a temporary name beside it
//!    (`.<name>.partial-<pid>`); the caller's log is saved ([`inject_logged`]), then the
//!    copy is renamed to `--out`. A process killed at any instant leaves at `--out` either
//!    nothing or the complete copy with its log; the next run removes a dead process's
//!    temporary. Failpoints (see [`ckpt::failpoint`]): `inject_after_copy`,
//!    `inject_before_log`, `inject_before_commit`.
//!
//! [`replay`] applies a log's flips to a file again, and [`undo`] restores the original
//! bytes; both first check that every element holds the bytes the log says it should, so
//! a log is never applied to the wrong file.
//!
//! Invariant: a checksum is only ever recomputed for a tensor whose bytes matched their
//! checksum before the change, so corruption already in the input is never laundered
//! into a checkpoint that verifies. A tensor altered although it was already corrupt
//! (with `allow_corrupt_input`) keeps its old checksum and is named in the log's
//! `corrupt_input`; undoing the log leaves that checksum alone too.
//!
//! Elements are numbered in row-major order (as NumPy's `a.flat` numbers them), also in
//! arrays stored column-major ([`ckpt::foreign::Order`]); `byte_offset` is where the
//! element is stored.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use ckpt::DType;
use ckpt::foreign::{Format, Integrity, Located, TensorLoc, locate};
use serde::{Deserialize, Serialize};

use crate::plan::{Candidate, FlipSpec, plan};
use crate::value::{BadHex, hex_bytes, parse_hex, value_text};

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
    /// Element index in row-major order (the index into the flattened tensor), whatever
    /// the order in which the file stores the elements.
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
    /// Tensors of a Steadfast checkpoint that already failed their checksums before the
    /// flips (altered only with `allow_corrupt_input`). Their checksums were left as they
    /// were, so verification still fails on them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub corrupt_input: Vec<String>,
    /// The altered elements, sorted by tensor and element.
    pub flips: Vec<FlipRecord>,
}

impl InjectionLog {
    /// Reads a log written by [`InjectionLog::save`].
    pub fn read(path: &Path) -> Result<InjectionLog, InjectError> {
        let text = std::fs::read_to_string(path).map_err(|source| InjectError::Io { path: path.to_owned(), source })?;
        serde_json::from_str(&text)
            .map_err(|e| InjectError::Mismatch(format!("{} is not an injection log: {e}", path.display())))
    }

    /// Writes the log to `path` durably: a temporary file, fsynced, renamed into place.
    pub fn save(&self, path: &Path) -> Result<(), InjectError> {
        let io = |source| InjectError::Io { path: path.to_owned(), source };
        let text = serde_json::to_string_pretty(self)
            .map_err(|e| InjectError::Mismatch(format!("cannot encode the log: {e}")))?;
        let name = path.file_name().map_or_else(|| "log".into(), |n| n.to_string_lossy().into_owned());
        let tmp = path.with_file_name(format!(".{name}.tmp-{}", std::process::id()));
        let mut f = std::fs::File::create(&tmp).map_err(io)?;
        std::io::Write::write_all(&mut f, text.as_bytes()).and_then(|()| f.sync_all()).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }

    /// Where the log of an injection into `altered` goes unless told otherwise:
    /// `<altered>.inject.json` beside it.
    pub fn default_path(altered: &Path) -> PathBuf {
        let name = altered.file_name().map_or_else(|| "checkpoint".into(), |n| n.to_string_lossy().into_owned());
        altered.with_file_name(format!("{name}.inject.json"))
    }
}

/// How to inject.
#[derive(Clone, Debug, Default)]
pub struct InjectOptions {
    /// Alter a copy here instead of the input.
    pub out: Option<PathBuf>,
    /// Leave a Steadfast manifest's checksums as they were (so verification fails).
    pub keep_checksums: bool,
    /// Alter a Steadfast checkpoint even where a tensor to alter already fails its
    /// checksum. Such a tensor keeps its old checksum and is named in the log's
    /// [`corrupt_input`](InjectionLog::corrupt_input).
    pub allow_corrupt_input: bool,
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
    /// The log holds bytes that are not hex.
    #[error("the log's element {element} of {tensor}: {source}")]
    BadLog {
        /// Tensor name.
        tensor: String,
        /// Element index.
        element: u64,
        /// What is wrong.
        source: BadHex,
    },
    /// Tensors to alter already fail their checksums: the input is corrupt.
    #[error(
        "{}: the input is already corrupt: the bytes of {} do not match the checksum in the manifest; \
         refusing to alter it, which would hide that (nothing was written)",
        path.display(),
        tensors.join(", ")
    )]
    CorruptInput {
        /// The checkpoint directory.
        path: PathBuf,
        /// The tensors that fail their checksums.
        tensors: Vec<String>,
    },
    /// Rewriting the manifest failed.
    #[error(transparent)]
    Checkpoint(#[from] ckpt::CkptError),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> InjectError + '_ {
    move |source| InjectError::Io { path: path.to_owned(), source }
}

/// The checkpoint directory of a Steadfast input, or the file itself.
fn source_of(input: &Path) -> Result<PathBuf, InjectError> {
    Ok(if input.is_dir() { ckpt::reader::resolve(input)? } else { input.to_owned() })
}

/// A copy of the input being altered under a temporary name beside `--out`: it is put in
/// place by [`Staging::commit`] (one rename), after the caller has made the log durable,
/// so that a process killed at any instant leaves at `--out` either nothing or a complete
/// altered copy whose log exists. Dropped uncommitted, it removes the temporary.
struct Staging {
    tmp: PathBuf,
    out: PathBuf,
    committed: bool,
}

/// The prefix of the temporary copies of `out`, each followed by its writer's pid.
fn partial_prefix(out: &Path) -> String {
    let name = out.file_name().map_or_else(|| "out".into(), |n| n.to_string_lossy().into_owned());
    format!(".{name}.partial-")
}

/// The writer's pid of a temporary copy named `.<name>.partial-<pid>`.
fn partial_pid(file_name: &str) -> Option<u32> {
    let (head, pid) = file_name.rsplit_once(".partial-")?;
    (head.starts_with('.') && head.len() > 1).then_some(())?;
    pid.parse().ok()
}

/// Removes from `dir` the temporary copies (of any output's name) whose writers are no
/// longer running (killed mid-copy: `kill -9` leaves no chance to clean up), each named
/// in a warning with its size, since they may be as large as a checkpoint. Copies of
/// running writers stay.
fn remove_stale_partials(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = partial_pid(&name) else { continue };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let path = entry.path();
        let bytes = if path.is_dir() {
            std::fs::read_dir(&path).map_or(0, |d| d.flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum())
        } else {
            entry.metadata().map_or(0, |m| m.len())
        };
        match std::fs::remove_dir_all(&path).or_else(|_| std::fs::remove_file(&path)) {
            Ok(()) => tracing::warn!(
                "removed {} ({bytes} bytes): the unfinished copy of an injection whose process (pid {pid}) is gone",
                path.display()
            ),
            Err(e) => tracing::warn!(
                "{} ({bytes} bytes) is the unfinished copy of an injection whose process (pid {pid}) is gone; \
                 it could not be removed: {e}",
                path.display()
            ),
        }
    }
}

impl Staging {
    /// Copies `source` (a file or checkpoint directory) to a temporary beside `out`, after
    /// removing the temporaries of writers of `out` that are no longer running.
    fn copy(source: &Path, out: &Path) -> Result<Staging, InjectError> {
        if out.exists() {
            return Err(InjectError::Mismatch(format!("{} already exists; refusing to overwrite it", out.display())));
        }
        let parent = match out.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
            _ => PathBuf::from("."),
        };
        let prefix = partial_prefix(out);
        remove_stale_partials(&parent);
        let staging = Staging {
            tmp: parent.join(format!("{prefix}{}", std::process::id())),
            out: out.to_owned(),
            committed: false,
        };
        let tmp = &staging.tmp;
        if source.is_dir() {
            std::fs::create_dir(tmp).map_err(io(tmp))?;
            for entry in std::fs::read_dir(source).map_err(io(source))? {
                let entry = entry.map_err(io(source))?;
                let to = tmp.join(entry.file_name());
                std::fs::copy(entry.path(), &to).map_err(io(&entry.path()))?;
                File::open(&to).and_then(|f| f.sync_all()).map_err(io(&to))?;
            }
        } else {
            std::fs::copy(source, tmp).map_err(io(source))?;
        }
        ckpt::failpoint::hit("inject_after_copy")?;
        Ok(staging)
    }

    /// Puts the altered copy in place and makes the rename durable.
    fn commit(mut self) -> Result<(), InjectError> {
        File::open(&self.tmp).and_then(|f| f.sync_all()).map_err(io(&self.tmp))?;
        if self.out.exists() {
            return Err(InjectError::Mismatch(format!(
                "{} appeared while the copy was altered; refusing to overwrite it",
                self.out.display()
            )));
        }
        std::fs::rename(&self.tmp, &self.out).map_err(io(&self.out))?;
        let parent = self.out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        File::open(parent).and_then(|d| d.sync_all()).map_err(io(parent))?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_dir_all(&self.tmp).or_else(|_| std::fs::remove_file(&self.tmp));
        }
    }
}

/// Where the changes are written: the input itself, or a staged copy for `--out`.
fn prepare(source: &Path, out: Option<&Path>) -> Result<(PathBuf, Option<Staging>), InjectError> {
    match out {
        None => Ok((source.to_owned(), None)),
        Some(out) => {
            let staging = Staging::copy(source, out)?;
            Ok((staging.tmp.clone(), Some(staging)))
        }
    }
}

/// Hands `log` to `save_log`, then puts a staged copy in place.
fn finish(
    log: InjectionLog,
    staging: Option<Staging>,
    save_log: impl FnOnce(&InjectionLog) -> Result<(), InjectError>,
) -> Result<InjectionLog, InjectError> {
    ckpt::failpoint::hit("inject_before_log")?;
    save_log(&log)?;
    ckpt::failpoint::hit("inject_before_commit")?;
    if let Some(s) = staging {
        s.commit()?;
    }
    Ok(log)
}

/// The file a flip record names: a checkpoint directory's file by its name, or the file.
fn record_file(in_dir: bool, target: &Path, t: &TensorLoc) -> String {
    if in_dir {
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

fn open_cached<'a>(files: &'a mut Vec<(PathBuf, File)>, path: &Path, write: bool) -> Result<&'a mut File, InjectError> {
    if let Some(i) = files.iter().position(|(p, _)| p == path) {
        return Ok(&mut files[i].1);
    }
    let f = OpenOptions::new().read(true).write(write).open(path).map_err(io(path))?;
    files.push((path.to_owned(), f));
    Ok(&mut files.last_mut().expect("just pushed").1)
}

/// One element to change: (tensor index, row-major element index).
type Edit = (usize, u64);

/// The changes to make, worked out from the bytes before anything is written.
#[derive(Default)]
struct Staged {
    /// (tensor index, absolute offset, new bytes) of each element.
    writes: Vec<(usize, u64, Vec<u8>)>,
    /// The old bytes of each element, in the order of the edits.
    old: Vec<Vec<u8>>,
    /// The tensors changed.
    touched: BTreeSet<usize>,
    /// Checksums of the changed tensors of a Steadfast checkpoint after the change.
    sums: BTreeMap<String, u64>,
    /// Changed tensors whose bytes did not match their checksum before the change.
    corrupt: Vec<String>,
}

/// The manifest's checksum of each tensor (hex), for a Steadfast checkpoint `dir`.
fn manifest_sums(located: &Located, dir: &Path) -> Result<Option<HashMap<String, String>>, InjectError> {
    if located.format != Format::Steadfast {
        return Ok(None);
    }
    let c = ckpt::reader::open(dir)?;
    Ok(Some(c.manifest.tensors.into_iter().map(|t| (t.name, t.xxh3)).collect()))
}

/// Reads the elements of `edits` (grouped by tensor, no element twice) and asks `change`
/// for each one's new bytes, given its position in `edits` and its old bytes. A tensor
/// with a manifest checksum in `sums` is read whole, checked against it as it is read,
/// changed in memory and checksummed again. Writes nothing.
fn stage(
    located: &Located,
    sums: Option<&HashMap<String, String>>,
    edits: &[Edit],
    mut change: impl FnMut(usize, &[u8]) -> Result<Vec<u8>, InjectError>,
) -> Result<Staged, InjectError> {
    let mut files: Vec<(PathBuf, File)> = Vec::new();
    let mut staged = Staged::default();
    let mut k = 0;
    while k < edits.len() {
        let i = edits[k].0;
        let end = k + edits[k..].iter().take_while(|e| e.0 == i).count();
        let t = &located.tensors[i];
        if !staged.touched.insert(i) {
            return Err(InjectError::Mismatch(format!("the flips of tensor {} are not grouped", t.name)));
        }
        let size = t.dtype.size();
        let f = open_cached(&mut files, &t.file, false)?;
        let expected = match (&t.integrity, sums) {
            (Integrity::Manifest, Some(sums)) => Some(
                sums.get(&t.name)
                    .ok_or_else(|| InjectError::Mismatch(format!("tensor {} is missing from the manifest", t.name)))?,
            ),
            _ => None,
        };
        let mut whole = match expected {
            Some(expected) => {
                let file_len = f.metadata().map_err(io(&t.file))?.len();
                let len = usize::try_from(t.len).ok().filter(|_| t.offset.saturating_add(t.len) <= file_len);
                let len = len.ok_or_else(|| {
                    InjectError::Mismatch(format!(
                        "tensor {}: {} bytes at {} lie outside {} ({file_len} bytes)",
                        t.name,
                        t.len,
                        t.offset,
                        t.file.display()
                    ))
                })?;
                let bytes = read_at(f, &t.file, t.offset, len)?;
                if ckpt::manifest::hex64(ckpt::checksum(&bytes)) != *expected {
                    staged.corrupt.push(t.name.clone());
                }
                Some(bytes)
            }
            None => None,
        };
        let mut seen = BTreeSet::new();
        for (j, &(_, element)) in edits.iter().enumerate().take(end).skip(k) {
            let stored = t
                .storage_index(element)
                .ok_or_else(|| InjectError::Mismatch(format!("tensor {} has no element {element}", t.name)))?;
            if !seen.insert(element) {
                return Err(InjectError::Mismatch(format!("element {element} of {} is listed twice", t.name)));
            }
            let at = stored * size as u64;
            let offset = t.offset + at;
            // Where the element lies in `whole`, when the tensor was read whole (then its
            // length fits in memory, and so does `at`).
            let at = at as usize;
            let old = match &whole {
                Some(b) => b[at..at + size].to_vec(),
                None => read_at(f, &t.file, offset, size)?,
            };
            let new = change(j, &old)?;
            if new.len() != size {
                return Err(InjectError::Mismatch(format!(
                    "element {element} of {} is {size} bytes, not {}",
                    t.name,
                    new.len()
                )));
            }
            if let Some(b) = &mut whole {
                b[at..at + size].copy_from_slice(&new);
            }
            staged.old.push(old);
            staged.writes.push((i, offset, new));
        }
        if let Some(b) = whole {
            staged.sums.insert(t.name.clone(), ckpt::checksum(&b));
        }
        k = end;
    }
    Ok(staged)
}

/// Writes `staged` into the files of `located` and fsyncs them.
fn write_staged(located: &Located, staged: &Staged) -> Result<(), InjectError> {
    let mut files: Vec<(PathBuf, File)> = Vec::new();
    for (i, offset, bytes) in &staged.writes {
        let path = &located.tensors[*i].file;
        let f = open_cached(&mut files, path, true)?;
        write_at(f, path, *offset, bytes)?;
    }
    for (path, f) in &files {
        f.sync_all().map_err(io(path))?;
    }
    Ok(())
}

/// Refuses `staged` if it alters tensors that already failed their checksums (other than
/// `expected`), unless `allow`.
fn refuse_corrupt(dir: &Path, staged: &Staged, expected: &[String], allow: bool) -> Result<(), InjectError> {
    let new: Vec<String> = staged.corrupt.iter().filter(|t| !expected.contains(t)).cloned().collect();
    if new.is_empty() || allow {
        return Ok(());
    }
    Err(InjectError::CorruptInput { path: dir.to_owned(), tensors: new })
}

/// Flips bits in `input` as `spec` says; returns the log (the caller saves it). With
/// `options.out`, the altered copy appears there only once complete; a caller that must
/// not leave a copy without its log uses [`inject_logged`].
pub fn inject(input: &Path, spec: &FlipSpec, options: &InjectOptions) -> Result<InjectionLog, InjectError> {
    inject_logged(input, spec, options, |_| Ok(()))
}

/// [`inject`], calling `save_log` with the log before an altered copy at `options.out`
/// is put in place: a process killed at any instant leaves at `out` either nothing or a
/// complete copy whose log is saved. An error from `save_log` leaves no copy.
pub fn inject_logged(
    input: &Path,
    spec: &FlipSpec,
    options: &InjectOptions,
    save_log: impl FnOnce(&InjectionLog) -> Result<(), InjectError>,
) -> Result<InjectionLog, InjectError> {
    // Plan and read on the input, so that a fault that cannot be planned, or an input
    // that is already corrupt, leaves no copy behind; a copy has the same layout, so only
    // the paths change.
    let source = source_of(input)?;
    let mut located = locate(&source)?;
    let candidates: Vec<Candidate<'_>> = located
        .tensors
        .iter()
        .map(|t| Candidate { name: &t.name, role: t.role, dtype: t.dtype, elements: t.elements() })
        .collect();
    let flips = plan(&candidates, spec)?;
    let edits: Vec<Edit> = flips.iter().map(|f| (f.tensor, f.element)).collect();
    let sums = manifest_sums(&located, &source)?;
    let staged = stage(&located, sums.as_ref(), &edits, |j, old| {
        let mut new = old.to_vec();
        crate::bits::flip_le(&mut new, &flips[j].bits);
        Ok(new)
    })?;
    refuse_corrupt(&source, &staged, &[], options.allow_corrupt_input)?;

    let (work, staging) = prepare(&source, options.out.as_deref())?;
    located.rebase(&source, &work);
    write_staged(&located, &staged)?;
    let checksums = fix_integrity(&work, &located, &staged, options.keep_checksums)?;
    // The log names the path the user will find the altered bytes at.
    let in_dir = work.is_dir();
    let target = options.out.clone().unwrap_or(work);
    let records = flips
        .iter()
        .zip(&staged.writes)
        .zip(&staged.old)
        .map(|((f, (_, offset, new)), old)| {
            let t = &located.tensors[f.tensor];
            FlipRecord {
                tensor: t.name.clone(),
                role: t.role.as_str().to_owned(),
                dtype: t.dtype.name().to_owned(),
                element: f.element,
                bits: f.bits.clone(),
                file: record_file(in_dir, &target, t),
                byte_offset: *offset,
                old_value: value_text(t.dtype, old),
                new_value: value_text(t.dtype, new),
                old_bytes: hex_bytes(old),
                new_bytes: hex_bytes(new),
            }
        })
        .collect();
    let log = InjectionLog {
        version: LOG_VERSION,
        target: target.display().to_string(),
        format: located.format.name().to_owned(),
        spec: describe(spec),
        seed: spec.seed,
        checksums,
        corrupt_input: staged.corrupt,
        flips: records,
    };
    finish(log, staging, save_log)
}

pub(crate) fn describe(spec: &FlipSpec) -> String {
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

/// Updates what the format records about the staged tensors' bytes; returns what
/// happened to checksums (`rewritten`, `kept` or `none`). A tensor that failed its
/// checksum before the change keeps it.
fn fix_integrity(
    target: &Path,
    located: &Located,
    staged: &Staged,
    keep_checksums: bool,
) -> Result<String, InjectError> {
    let mut members = BTreeSet::new();
    for &i in &staged.touched {
        if let Integrity::ZipCrc(m) = located.tensors[i].integrity {
            members.insert(m);
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
            let fresh: BTreeMap<&str, u64> = staged
                .sums
                .iter()
                .filter(|(name, _)| !staged.corrupt.contains(name))
                .map(|(name, sum)| (name.as_str(), *sum))
                .collect();
            if !fresh.is_empty() {
                rewrite_manifest(target, &fresh)?;
            }
            "rewritten".into()
        }
        Format::PyTorch | Format::Npz => "rewritten".into(),
        Format::Safetensors | Format::Hdf5 => "none".into(),
    })
}

/// Sets the checksums of the tensors in `fresh` in the manifest of the checkpoint in
/// `dir`, and replaces the manifest atomically.
fn rewrite_manifest(dir: &Path, fresh: &BTreeMap<&str, u64>) -> Result<(), InjectError> {
    let c = ckpt::reader::open(dir)?;
    let m = &c.manifest;
    let mut tensors = m.tensors.clone();
    for t in &mut tensors {
        if let Some(sum) = fresh.get(t.name.as_str()) {
            t.xxh3 = ckpt::manifest::hex64(*sum);
        }
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

/// Applies the flips of `log` to `target` (the log's own target if `None`) again, or to
/// a copy of it at `options.out`. Every element must hold the log's `old_bytes` first.
pub fn replay(log: &InjectionLog, target: Option<&Path>, options: &InjectOptions) -> Result<InjectionLog, InjectError> {
    replay_logged(log, target, options, |_| Ok(()))
}

/// [`replay`], calling `save_log` with the new log before a copy at `options.out` is put
/// in place (as [`inject_logged`] does).
pub fn replay_logged(
    log: &InjectionLog,
    target: Option<&Path>,
    options: &InjectOptions,
    save_log: impl FnOnce(&InjectionLog) -> Result<(), InjectError>,
) -> Result<InjectionLog, InjectError> {
    let target = target.map_or_else(|| PathBuf::from(&log.target), Path::to_owned);
    let keep = options.keep_checksums || log.checksums == "kept";
    let (work, staging, corrupt) = apply(log, &target, Direction::Redo, keep, options)?;
    let target = options.out.clone().unwrap_or(work);
    let log = InjectionLog { target: target.display().to_string(), corrupt_input: corrupt, ..log.clone() };
    finish(log, staging, save_log)
}

/// Restores the bytes `log` altered in `target` (the log's own target if `None`), or in
/// a copy of it at `options.out` (which appears there only once complete). Every element
/// must hold the log's `new_bytes` first.
pub fn undo(log: &InjectionLog, target: Option<&Path>, options: &InjectOptions) -> Result<(), InjectError> {
    let target = target.map_or_else(|| PathBuf::from(&log.target), Path::to_owned);
    let (_, staging, _) = apply(log, &target, Direction::Undo, log.checksums == "kept", options)?;
    if let Some(s) = staging {
        s.commit()?;
    }
    Ok(())
}

/// Applies `log` to `target` in `direction`; returns the path altered (a staged copy
/// when `options.out` is set, with its staging) and the tensors that failed their
/// checksums before the change.
fn apply(
    log: &InjectionLog,
    target: &Path,
    direction: Direction,
    keep_checksums: bool,
    options: &InjectOptions,
) -> Result<(PathBuf, Option<Staging>, Vec<String>), InjectError> {
    if log.version != LOG_VERSION {
        return Err(InjectError::Mismatch(format!("log version {} is not {LOG_VERSION}", log.version)));
    }
    let source = source_of(target)?;
    let mut located = locate(&source)?;
    if located.format.name() != log.format {
        return Err(InjectError::Mismatch(format!(
            "{} is {}, the log is for {}",
            source.display(),
            located.format.name(),
            log.format
        )));
    }
    let by_name: HashMap<&str, usize> = located.tensors.iter().enumerate().map(|(i, t)| (t.name.as_str(), i)).collect();
    let mut edits = Vec::with_capacity(log.flips.len());
    for r in &log.flips {
        let i = *by_name
            .get(r.tensor.as_str())
            .ok_or_else(|| InjectError::Mismatch(format!("{} has no tensor {}", source.display(), r.tensor)))?;
        let t = &located.tensors[i];
        if DType::from_name(&r.dtype) != Some(t.dtype) {
            return Err(InjectError::Mismatch(format!(
                "tensor {} is {}, the log says {}",
                r.tensor,
                t.dtype.name(),
                r.dtype
            )));
        }
        edits.push((i, r.element));
    }
    // The log lists flips by tensor; group them so that each tensor is read once.
    let mut order: Vec<usize> = (0..edits.len()).collect();
    order.sort_by_key(|&k| edits[k]);
    let edits: Vec<Edit> = order.iter().map(|&k| edits[k]).collect();
    // A log whose checksums were kept leaves the altered tensors failing on purpose:
    // there is nothing to check before undoing it.
    let sums = match direction {
        Direction::Undo if keep_checksums => None,
        _ => manifest_sums(&located, &source)?,
    };
    let staged = stage(&located, sums.as_ref(), &edits, |j, now| {
        let r = &log.flips[order[j]];
        let hex = |text: &str| {
            parse_hex(text).map_err(|source| InjectError::BadLog {
                tensor: r.tensor.clone(),
                element: r.element,
                source,
            })
        };
        let (expect, write) = match direction {
            Direction::Redo => (hex(&r.old_bytes)?, hex(&r.new_bytes)?),
            Direction::Undo => (hex(&r.new_bytes)?, hex(&r.old_bytes)?),
        };
        if now != expect {
            return Err(InjectError::Mismatch(format!(
                "element {} of {} holds {}, the log expects {}: this is not the file the log was made on \
                 (or it was already {})",
                r.element,
                r.tensor,
                hex_bytes(now),
                hex_bytes(&expect),
                if direction == Direction::Redo { "altered" } else { "restored" }
            )));
        }
        Ok(write)
    })?;
    // Undoing: the tensors the log says were corrupt before it still are, as expected.
    let expected = if direction == Direction::Undo { log.corrupt_input.as_slice() } else { &[] };
    refuse_corrupt(&source, &staged, expected, options.allow_corrupt_input)?;

    let (work, staging) = prepare(&source, options.out.as_deref())?;
    located.rebase(&source, &work);
    write_staged(&located, &staged)?;
    fix_integrity(&work, &located, &staged, keep_checksums)?;
    Ok((work, staging, staged.corrupt))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unfinished_copies_of_dead_injections_go_whatever_their_name_and_live_ones_stay() {
        assert_eq!(partial_pid(".ckpt.partial-123"), Some(123));
        assert_eq!(partial_pid(".a.b.partial-7"), Some(7));
        assert_eq!(partial_pid("ckpt.partial-123"), None, "not hidden: not ours");
        assert_eq!(partial_pid(".ckpt.partial-x"), None);
        let dir = tempfile::tempdir().unwrap();
        // pid_max is at most 2^22: no process has a pid above it.
        let dead = dir.path().join(".other.safetensors.partial-4194305");
        std::fs::write(&dead, vec![0u8; 1000]).unwrap();
        let dead_dir = dir.path().join(".ckpt.partial-4194306");
        std::fs::create_dir(&dead_dir).unwrap();
        std::fs::write(dead_dir.join("shard"), b"x").unwrap();
        let live = dir.path().join(format!(".mine.partial-{}", std::process::id()));
        std::fs::write(&live, b"y").unwrap();
        let user = dir.path().join("notes.partial-4194305");
        std::fs::write(&user, b"z").unwrap();
        remove_stale_partials(dir.path());
        assert!(!dead.exists() && !dead_dir.exists());
        assert!(live.exists() && user.exists());
    }
}
