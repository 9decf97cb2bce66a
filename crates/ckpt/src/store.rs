//! Writing a checkpoint directory and committing it atomically.
//!
//! Layout under a root directory:
//!
//! ```text
//! <root>/step-00001234/manifest.json               written last
//! <root>/step-00001234/shard-0000.safetensors ...  plain safetensors files
//! <root>/LATEST                                     "step-00001234\n"
//! ```
//!
//! The commit protocol, in order (failpoints in brackets):
//! 1. write every shard into a fresh `.tmp-*` directory, in parallel, and fsync each file
//!    [`after_shard_write`];
//! 2. write `manifest.json` and fsync it [`after_manifest_write`]; fsync the directory;
//! 3. [`before_rename`] rename the directory to `step-<step>`, then fsync the root
//!    [`after_rename`]. **This rename is the commit point**: a `step-*` directory always
//!    holds a complete checkpoint, and nothing else is ever named so;
//! 4. [`before_latest`] write `.LATEST.tmp`, fsync, rename it over `LATEST`, fsync the
//!    root [`after_latest`];
//! 5. apply the retention policy; a deleted checkpoint is first renamed out of the
//!    `step-*` namespace, then removed.
//!
//! A crash at any instant leaves only (a) committed `step-*` directories, each complete,
//! (b) a `LATEST` that names a committed checkpoint, or is one commit behind, and (c)
//! perhaps a `.tmp-*` directory that readers ignore and the next writer removes. A reader
//! asked for the newest checkpoint ([`resolve`](crate::reader::resolve)) takes the newest
//! `step-*` directory whose manifest checks out, using `LATEST` to skip older ones.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::{CkptError, Result};
use crate::failpoint;
use crate::manifest::{FileEntry, MANIFEST_FILE, Manifest, Meta, TensorEntry, hex64};
use crate::retention::Retention;
use crate::safetensors::{TensorSpec, encode_header};
use crate::{DType, Role};

#[cfg(target_endian = "big")]
compile_error!("Steadfast stores tensors little-endian and reinterprets f32 buffers in place");

/// Bytes hashed and written (or read and hashed) at a time: small enough to stay in the
/// cache between the two, large enough to keep system calls few.
pub(crate) const IO_CHUNK: usize = 1 << 22;

/// Name of the pointer file.
pub const LATEST_FILE: &str = "LATEST";
const TEMP_PREFIX: &str = ".tmp-";
const LATEST_TEMP: &str = ".LATEST.tmp";

/// A borrowed f32 tensor to save.
#[derive(Clone, Copy, Debug)]
pub struct TensorRef<'a> {
    /// Registry name.
    pub name: &'a str,
    /// Model parameter or optimizer state.
    pub role: Role,
    /// Shape.
    pub shape: &'a [usize],
    /// Elements, row-major.
    pub data: &'a [f32],
}

/// A borrowed tensor of any element type to save: its little-endian bytes. (A
/// [`TensorRef`] is the f32 case, the one training uses.)
#[derive(Clone, Copy, Debug)]
pub struct RawTensorRef<'a> {
    /// Registry name.
    pub name: &'a str,
    /// Model parameter, optimizer state or extra state.
    pub role: Role,
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: &'a [usize],
    /// Elements, row-major, little-endian.
    pub bytes: &'a [u8],
}

impl<'a> From<TensorRef<'a>> for RawTensorRef<'a> {
    fn from(t: TensorRef<'a>) -> Self {
        RawTensorRef {
            name: t.name,
            role: t.role,
            dtype: DType::F32,
            shape: t.shape,
            bytes: bytemuck::cast_slice(t.data),
        }
    }
}

/// How to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SaveOptions {
    /// Number of shard files, written in parallel (at most one per tensor).
    pub shards: usize,
    /// Which older checkpoints to delete after a commit.
    pub retention: Retention,
}

impl Default for SaveOptions {
    fn default() -> Self {
        SaveOptions { shards: 2, retention: Retention::default() }
    }
}

/// What a save did.
#[derive(Clone, Debug)]
pub struct SaveReport {
    /// The committed step.
    pub step: u64,
    /// The committed directory.
    pub dir: PathBuf,
    /// Bytes written, manifest included.
    pub bytes: u64,
    /// Time from the first write to the `LATEST` update.
    pub duration: Duration,
    /// Steps deleted by the retention policy.
    pub deleted: Vec<u64>,
}

/// The directory name of the checkpoint of `step`.
pub fn step_dir_name(step: u64) -> String {
    format!("step-{step:08}")
}

/// The step of a directory name produced by [`step_dir_name`].
pub fn parse_step_dir(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("step-")?;
    if digits.len() < 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Committed checkpoint directories under `root`, by ascending step.
pub fn list(root: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(root).map_err(CkptError::io("cannot list", root))? {
        let entry = entry.map_err(CkptError::io("cannot list", root))?;
        if let Some(step) = entry.file_name().to_str().and_then(parse_step_dir)
            && entry.path().is_dir()
        {
            out.push((step, entry.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// The configuration hash that the manifest of checkpoint directory `dir` names (`None`:
/// none, or the manifest does not open: a damaged checkpoint is the reader's to report).
pub fn configuration_of(dir: &Path) -> Option<String> {
    let path = dir.join(MANIFEST_FILE);
    let bytes = std::fs::read(&path).ok()?;
    let manifest = Manifest::from_bytes(&bytes, &path).ok()?;
    Some(manifest.meta.config_hash).filter(|h| !h.is_empty())
}

/// Fails with [`CkptError::OtherConfiguration`] if the newest committed checkpoint under
/// `root`, or the checkpoint of `step` there (one that a commit of `step` would replace),
/// was written by another configuration than `ours`. A run that names no configuration
/// (an empty hash: the Python package's saves) is never refused, and never refuses.
///
/// Every commit asks this before it renames, so a root never comes to mix two runs'
/// checkpoints, and asking about its newest one covers the rest; runs also ask it before
/// their first step, to refuse at once.
pub fn check_configuration(root: &Path, ours: &str, step: Option<u64>) -> Result<()> {
    if ours.is_empty() || !root.is_dir() {
        return Ok(());
    }
    let newest = list(root)?.pop();
    let replaced = step.map(|s| (s, root.join(step_dir_name(s)))).filter(|(_, d)| d.is_dir());
    for (step, dir) in newest.into_iter().chain(replaced) {
        if let Some(theirs) = configuration_of(&dir).filter(|h| h != ours) {
            return Err(CkptError::OtherConfiguration { dir: root.to_owned(), step, theirs, ours: ours.to_owned() });
        }
    }
    Ok(())
}

/// fsyncs a directory so that renames and creations inside it are durable.
pub fn fsync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(CkptError::io("cannot fsync", dir))
}

/// Removes temporary directories left by writers that crashed. Only the owner of part 0
/// ([`Owner`](crate::Owner)) may call it: then no other writer is alive to own them.
pub fn remove_stale_temporaries(root: &Path) -> Result<()> {
    remove_temporaries_but(root, None)
}

/// Removes the temporaries in `root` except the parts of writers' group `keep` (whose
/// other writers may be writing now). A temporary of another group that a writer of it
/// still writes makes that writer fail, never a checkpoint commit: only the holder of
/// the root's lock commits.
fn remove_temporaries_but(root: &Path, keep: Option<u64>) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(root) else { return Ok(()) };
    let kept = keep.map(group_suffix);
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if kept.as_ref().is_some_and(|k| name.starts_with(TEMP_PREFIX) && name.ends_with(k.as_str())) {
            continue;
        }
        if name == LATEST_TEMP {
            std::fs::remove_file(entry.path()).map_err(CkptError::io("cannot remove", entry.path()))?;
        } else if name.starts_with(TEMP_PREFIX) {
            // (Another group's writer may finish and remove it first.)
            match std::fs::remove_dir_all(entry.path()) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(CkptError::io("cannot remove", entry.path())(e));
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// Removes the temporaries that writer 0 of `part`'s group may remove when it starts: all
/// of them for a fixed group, all but the group's own parts for an elastic one.
pub(crate) fn remove_stale_temporaries_for(root: &Path, part: Part) -> Result<()> {
    remove_temporaries_but(root, (part.group != 0).then_some(part.group))
}

fn group_suffix(group: u64) -> String {
    format!("-parts-g{group}")
}

/// Splits tensors into at most `shards` contiguous groups of roughly equal byte size,
/// keeping registry order. Returns the index ranges.
fn plan_shards(sizes: &[u64], shards: usize) -> Vec<std::ops::Range<usize>> {
    let shards = shards.clamp(1, sizes.len().max(1));
    let total: u64 = sizes.iter().sum();
    let mut ranges = Vec::with_capacity(shards);
    let (mut start, mut acc) = (0usize, 0u64);
    for (i, &s) in sizes.iter().enumerate() {
        acc += s;
        let k = ranges.len() as u64 + 1;
        // Close the current shard once it holds its share of the bytes.
        if ranges.len() + 1 < shards && acc * (shards as u64) >= k * total {
            ranges.push(start..i + 1);
            start = i + 1;
        }
    }
    ranges.push(start..sizes.len());
    ranges.retain(|r| !r.is_empty());
    ranges
}

/// Writes one shard file and fsyncs it; returns its file entry and tensor entries.
fn write_shard(
    path: &Path,
    file_name: &str,
    tensors: &[RawTensorRef<'_>],
    meta: &Meta,
) -> Result<(FileEntry, Vec<TensorEntry>)> {
    let layouts: Vec<TensorSpec<'_>> =
        tensors.iter().map(|t| TensorSpec { name: t.name, dtype: t.dtype, shape: t.shape }).collect();
    let metadata = BTreeMap::from([("steadfast.step".to_string(), meta.step.to_string())]);
    let (prefix, entries) = encode_header(&layouts, &metadata);
    let err = CkptError::io("cannot write", path);
    let mut file = File::create_new(path).map_err(err)?;
    file.write_all(&prefix).map_err(CkptError::io("cannot write", path))?;
    let mut out = Vec::with_capacity(tensors.len());
    for (t, e) in tensors.iter().zip(&entries) {
        let bytes = t.bytes;
        // Hash each chunk just before writing it, while it is in cache: one pass over
        // memory instead of two.
        let mut hasher = crate::checksummer();
        for chunk in bytes.chunks(IO_CHUNK) {
            hasher.update(chunk);
            file.write_all(chunk).map_err(CkptError::io("cannot write", path))?;
        }
        out.push(TensorEntry {
            name: t.name.to_owned(),
            role: t.role.as_str().to_owned(),
            dtype: t.dtype.name().to_owned(),
            shape: t.shape.iter().map(|&d| d as u64).collect(),
            file: file_name.to_owned(),
            offset: prefix.len() as u64 + e.begin,
            length: e.len(),
            xxh3: hex64(hasher.digest()),
        });
    }
    file.sync_all().map_err(CkptError::io("cannot fsync", path))?;
    let length = prefix.len() as u64 + entries.last().map_or(0, |e| e.end);
    let entry = FileEntry {
        file: file_name.to_owned(),
        length,
        header_length: prefix.len() as u64,
        header_xxh3: hex64(crate::checksum(&prefix)),
    };
    Ok((entry, out))
}

fn check_shapes(tensors: &[RawTensorRef<'_>]) -> Result<()> {
    for t in tensors {
        let elements = t.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        if elements.and_then(|n| n.checked_mul(t.dtype.size())) != Some(t.bytes.len()) {
            return Err(CkptError::Mismatch(format!(
                "tensor {}: shape {:?} of {} but {} bytes",
                t.name,
                t.shape,
                t.dtype.name(),
                t.bytes.len()
            )));
        }
    }
    Ok(())
}

/// The f32 tensors as raw ones, their shapes checked.
fn raw<'a>(tensors: &[TensorRef<'a>]) -> Result<Vec<RawTensorRef<'a>>> {
    let raw: Vec<RawTensorRef<'a>> = tensors.iter().map(|&t| t.into()).collect();
    check_shapes(&raw)?;
    Ok(raw)
}

/// The file name of shard `i`.
fn shard_name(i: usize) -> String {
    format!("shard-{i:04}.safetensors")
}

/// Writes the shards `(index, tensors)` into `dir` in parallel, each fsynced; returns
/// their entries in the order given.
fn write_shards(
    dir: &Path,
    meta: &Meta,
    shards: &[(usize, Vec<RawTensorRef<'_>>)],
) -> Result<(Vec<FileEntry>, Vec<TensorEntry>)> {
    let results: Vec<Result<(FileEntry, Vec<TensorEntry>)>> = std::thread::scope(|s| {
        let handles: Vec<_> = shards
            .iter()
            .map(|(i, part)| {
                let name = shard_name(*i);
                let path = dir.join(&name);
                s.spawn(move || write_shard(&path, &name, part, meta))
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("shard writer panicked")).collect()
    });
    let mut files = Vec::new();
    let mut entries = Vec::new();
    for r in results {
        let (f, t) = r?;
        files.push(f);
        entries.extend(t);
    }
    Ok((files, entries))
}

/// Saves `tensors` with `meta` as the checkpoint of `meta.step` under `root`, following
/// the commit protocol above. Blocks until the checkpoint is durable. Where another
/// process may write the same root, hold its [`Owner`](crate::Owner) first, as
/// [`AsyncWriter`](crate::AsyncWriter) does.
pub fn save(root: &Path, meta: &Meta, tensors: &[TensorRef<'_>], options: &SaveOptions) -> Result<SaveReport> {
    save_raw(root, meta, &raw(tensors)?, options)
}

/// [`save`] for tensors of any element type (a framework's state: integer step counters,
/// random generators' byte states, half-precision weights), with a state tree in
/// `meta.tree` if the caller has one.
pub fn save_raw(root: &Path, meta: &Meta, tensors: &[RawTensorRef<'_>], options: &SaveOptions) -> Result<SaveReport> {
    let started = Instant::now();
    check_shapes(tensors)?;
    if let Some(tree) = &meta.tree {
        crate::manifest::check_tree(tree).map_err(CkptError::Mismatch)?;
    }
    std::fs::create_dir_all(root).map_err(CkptError::io("cannot create", root))?;
    let nonce = format!(
        "{}{}-{}-{}",
        TEMP_PREFIX,
        step_dir_name(meta.step),
        std::process::id(),
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
    );
    let tmp = root.join(nonce);
    std::fs::create_dir(&tmp).map_err(CkptError::io("cannot create", &tmp))?;

    let sizes: Vec<u64> = tensors.iter().map(|t| t.bytes.len() as u64).collect();
    let shards: Vec<(usize, Vec<RawTensorRef<'_>>)> =
        plan_shards(&sizes, options.shards).into_iter().enumerate().map(|(i, r)| (i, tensors[r].to_vec())).collect();
    let (files, entries) = write_shards(&tmp, meta, &shards)?;
    failpoint::hit("after_shard_write")?;
    commit_dir(root, &tmp, Manifest::new(meta.clone(), files, entries), options.retention, started)
}

/// Steps 2 to 5 of the commit protocol: the manifest, the rename, `LATEST`, retention.
fn commit_dir(
    root: &Path,
    tmp: &Path,
    manifest: Manifest,
    retention: Retention,
    started: Instant,
) -> Result<SaveReport> {
    let step = manifest.meta.step;
    let manifest_bytes = manifest.to_bytes();
    let manifest_path = tmp.join(MANIFEST_FILE);
    let mut f = File::create_new(&manifest_path).map_err(CkptError::io("cannot write", &manifest_path))?;
    f.write_all(&manifest_bytes).map_err(CkptError::io("cannot write", &manifest_path))?;
    f.sync_all().map_err(CkptError::io("cannot fsync", &manifest_path))?;
    drop(f);
    failpoint::hit("after_manifest_write")?;
    fsync_dir(tmp)?;

    if let Err(e) = check_configuration(root, &manifest.meta.config_hash, Some(step)) {
        let _ = std::fs::remove_dir_all(tmp);
        return Err(e);
    }
    let name = step_dir_name(step);
    let dir = root.join(&name);
    failpoint::hit("before_rename")?;
    if dir.exists() {
        // Re-saving a step (after a resume from an older checkpoint): move the old copy
        // aside first; a crash in between leaves no `step-N`, and readers of LATEST fall
        // back to the newest valid checkpoint.
        let aside = root.join(format!("{TEMP_PREFIX}old-{name}-{}", std::process::id()));
        std::fs::rename(&dir, &aside).map_err(CkptError::io("cannot rename", &dir))?;
        std::fs::rename(tmp, &dir).map_err(CkptError::io("cannot rename", tmp))?;
        fsync_dir(root)?;
        std::fs::remove_dir_all(&aside).map_err(CkptError::io("cannot remove", &aside))?;
    } else {
        std::fs::rename(tmp, &dir).map_err(CkptError::io("cannot rename", tmp))?;
        fsync_dir(root)?;
    }
    failpoint::hit("after_rename")?;

    failpoint::hit("before_latest")?;
    write_latest(root, &name)?;
    failpoint::hit("after_latest")?;

    // The checkpoint is committed: a retention that cannot remove an old one is said, and
    // does not fail the save (the next save tries again).
    let steps: Vec<u64> = list(root)?.into_iter().map(|(s, _)| s).collect();
    let mut deleted = Vec::new();
    for old in retention.to_delete(&steps).into_iter().filter(|&old| old != step) {
        match remove_checkpoint(root, old) {
            Ok(()) => deleted.push(old),
            Err(e) => tracing::warn!(step = old, "keeping an old checkpoint that cannot be removed: {e}"),
        }
    }
    let bytes = manifest_bytes.len() as u64 + manifest.files.iter().map(|f| f.length).sum::<u64>();
    Ok(SaveReport { step, dir, bytes, duration: started.elapsed(), deleted })
}

/// One of `count` writers of a checkpoint whose state they all hold (the replicas of a
/// data-parallel job): writer `index` writes the shards `i` with `i % count == index`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Part {
    /// This writer.
    pub index: usize,
    /// Number of writers.
    pub count: usize,
    /// The writers' group: 0 for a job whose writers never change; otherwise the epoch of
    /// an elastic job's membership. A group's parts go into a directory of their own, so
    /// the writers of two memberships never write into one, and only writer 0 of a group
    /// takes the root's lock (see [`AsyncWriter::for_part`](crate::AsyncWriter::for_part)).
    pub group: u64,
}

impl Part {
    /// The only writer: the whole checkpoint.
    pub const WHOLE: Part = Part { index: 0, count: 1, group: 0 };

    /// Writer `index` of `count`, in a job whose writers never change.
    pub const fn of(index: usize, count: usize) -> Part {
        Part { index, count, group: 0 }
    }

    /// The shards this writer writes, as `(shard index, tensor index range)`, when every
    /// writer splits `sizes` (bytes per tensor, in registry order) into
    /// `shards_per_writer * count` shards.
    pub fn shards(&self, sizes: &[u64], shards_per_writer: usize) -> Vec<(usize, std::ops::Range<usize>)> {
        let total = shards_per_writer.max(1) * self.count.max(1);
        plan_shards(sizes, total).into_iter().enumerate().filter(|(i, _)| i % self.count.max(1) == self.index).collect()
    }
}

/// What one writer recorded about the shards it made durable, in `part-<index>.json`
/// inside the shared temporary directory.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PartRecord {
    step: u64,
    index: usize,
    count: usize,
    shards: Vec<usize>,
    files: Vec<FileEntry>,
    tensors: Vec<TensorEntry>,
}

/// The temporary directory that all writers of a parted checkpoint share (of one group).
fn parts_dir(root: &Path, step: u64, group: u64) -> PathBuf {
    match group {
        0 => root.join(format!("{TEMP_PREFIX}{}-parts", step_dir_name(step))),
        g => root.join(format!("{TEMP_PREFIX}{}{}", step_dir_name(step), group_suffix(g))),
    }
}

fn part_record_path(dir: &Path, index: usize) -> PathBuf {
    dir.join(format!("part-{index:04}.json"))
}

/// A parted checkpoint, phase one, run by every writer: writes this writer's `shards`
/// (from [`Part::shards`]) into the shared temporary directory, fsyncs them, then records
/// their entries in `part-<index>.json`, fsynced. Returns the bytes written. Nothing is
/// committed: [`commit_parts`] does that once every part is durable.
pub fn save_part(root: &Path, meta: &Meta, part: Part, shards: &[(usize, Vec<TensorRef<'_>>)]) -> Result<u64> {
    let shards: Vec<(usize, Vec<RawTensorRef<'_>>)> =
        shards.iter().map(|(i, tensors)| Ok((*i, raw(tensors)?))).collect::<Result<_>>()?;
    save_part_raw(root, meta, part, &shards)
}

/// [`save_part`] of tensors of any element type.
pub fn save_part_raw(root: &Path, meta: &Meta, part: Part, shards: &[(usize, Vec<RawTensorRef<'_>>)]) -> Result<u64> {
    for (_, tensors) in shards {
        check_shapes(tensors)?;
    }
    let dir = parts_dir(root, meta.step, part.group);
    std::fs::create_dir_all(&dir).map_err(CkptError::io("cannot create", &dir))?;
    // A record or shard of this part already here is left by an abandoned attempt at this
    // step (the job went back to an older step and reached this one again, before any
    // commit of it): it is replaced, the record first, so that no record names a shard
    // being written again.
    let path = part_record_path(&dir, part.index);
    remove_if_present(&path)?;
    for (i, _) in shards {
        remove_if_present(&dir.join(shard_name(*i)))?;
    }
    let (files, tensors) = write_shards(&dir, meta, shards)?;
    failpoint::hit("after_shard_write")?;
    let record = PartRecord {
        step: meta.step,
        index: part.index,
        count: part.count,
        shards: shards.iter().map(|(i, _)| *i).collect(),
        files,
        tensors,
    };
    let bytes = record.files.iter().map(|f| f.length).sum();
    let json =
        serde_json::to_vec(&record).map_err(|e| CkptError::Mismatch(format!("cannot encode a part record: {e}")))?;
    let mut f = File::create_new(&path).map_err(CkptError::io("cannot write", &path))?;
    f.write_all(&json).map_err(CkptError::io("cannot write", &path))?;
    f.sync_all().map_err(CkptError::io("cannot fsync", &path))?;
    fsync_dir(&dir)?;
    Ok(bytes)
}

/// Removes the file `path` if there is one.
fn remove_if_present(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(CkptError::io("cannot remove", path)(e)),
        _ => Ok(()),
    }
}

/// A parted checkpoint, phase two, run by writer 0 once every writer reported its part
/// durable: gathers the `count` part records, checks that they cover every shard exactly
/// once, and commits the checkpoint of `meta.step` with steps 2 to 5 of the protocol.
/// Until this returns, the checkpoint does not exist for readers.
pub fn commit_parts(root: &Path, meta: &Meta, parts: Part, retention: Retention) -> Result<SaveReport> {
    let started = Instant::now();
    let count = parts.count;
    let dir = parts_dir(root, meta.step, parts.group);
    let mut shards: Vec<(usize, FileEntry, Vec<TensorEntry>)> = Vec::new();
    for index in 0..count {
        let path = part_record_path(&dir, index);
        let bytes = std::fs::read(&path).map_err(CkptError::io("cannot read the part record", &path))?;
        let record: PartRecord = serde_json::from_slice(&bytes)
            .map_err(|e| CkptError::Format { path: path.clone(), reason: format!("malformed part record: {e}") })?;
        if record.step != meta.step || record.index != index || record.count != count {
            return Err(CkptError::Format {
                path,
                reason: format!(
                    "part record of step {} part {}/{}, expected step {} part {index}/{count}",
                    record.step, record.index, record.count, meta.step
                ),
            });
        }
        let mut tensors = record.tensors.into_iter().peekable();
        for (i, file) in record.shards.into_iter().zip(record.files) {
            let mut mine = Vec::new();
            while let Some(t) = tensors.next_if(|t| t.file == file.file) {
                mine.push(t);
            }
            shards.push((i, file, mine));
        }
    }
    shards.sort_by_key(|(i, _, _)| *i);
    if shards.iter().enumerate().any(|(k, (i, _, _))| k != *i) {
        return Err(CkptError::Mismatch(format!(
            "the parts of step {} do not cover shards 0..{} exactly once",
            meta.step,
            shards.len()
        )));
    }
    let mut files = Vec::new();
    let mut entries = Vec::new();
    for (_, f, t) in shards {
        files.push(f);
        entries.extend(t);
    }
    // The records are not part of the checkpoint format.
    for index in 0..count {
        let path = part_record_path(&dir, index);
        std::fs::remove_file(&path).map_err(CkptError::io("cannot remove", &path))?;
    }
    commit_dir(root, &dir, Manifest::new(meta.clone(), files, entries), retention, started)
}

/// Deletes the checkpoint of `step`: first renames it out of the `step-*` namespace (one
/// atomic operation), then removes the files, so that a crash midway never leaves a
/// half-deleted directory that looks committed.
pub fn remove_checkpoint(root: &Path, step: u64) -> Result<()> {
    let dir = root.join(step_dir_name(step));
    let doomed = root.join(format!("{TEMP_PREFIX}del-{}-{}", step_dir_name(step), std::process::id()));
    std::fs::rename(&dir, &doomed).map_err(CkptError::io("cannot rename", &dir))?;
    fsync_dir(root)?;
    std::fs::remove_dir_all(&doomed).map_err(CkptError::io("cannot remove", &doomed))
}

/// Points `LATEST` at `name` atomically.
pub fn write_latest(root: &Path, name: &str) -> Result<()> {
    let tmp = root.join(LATEST_TEMP);
    let mut f = File::create(&tmp).map_err(CkptError::io("cannot write", &tmp))?;
    f.write_all(format!("{name}\n").as_bytes()).map_err(CkptError::io("cannot write", &tmp))?;
    f.sync_all().map_err(CkptError::io("cannot fsync", &tmp))?;
    std::fs::rename(&tmp, root.join(LATEST_FILE)).map_err(CkptError::io("cannot rename", &tmp))?;
    fsync_dir(root)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_contiguous_balanced_and_never_empty() {
        assert_eq!(plan_shards(&[10, 10, 10, 10], 2), vec![0..2, 2..4]);
        assert_eq!(plan_shards(&[100, 1, 1, 1], 2), vec![0..1, 1..4]);
        assert_eq!(plan_shards(&[5], 4), vec![0..1]);
        assert_eq!(plan_shards(&[], 3), Vec::<std::ops::Range<usize>>::new());
        let r = plan_shards(&[1; 10], 3);
        assert_eq!(r.len(), 3);
        assert_eq!(r.iter().map(|r| r.len()).sum::<usize>(), 10);
    }

    #[test]
    fn step_names_round_trip() {
        assert_eq!(step_dir_name(1234), "step-00001234");
        assert_eq!(parse_step_dir("step-00001234"), Some(1234));
        assert_eq!(parse_step_dir("step-123456789"), Some(123456789));
        assert_eq!(parse_step_dir(".tmp-step-00000001-4-5"), None);
        assert_eq!(parse_step_dir("step-12"), None);
    }
}
