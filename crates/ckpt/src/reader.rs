//! Opening, loading and verifying committed checkpoints.
//!
//! Loading never trusts a byte it has not checked: the manifest checks itself, each shard
//! must have the listed length, its header must match its checksum and agree with the
//! manifest, and each tensor's bytes must match their checksum. [`Checkpoint::load`] stops
//! at the first problem; [`Checkpoint::verify`] reads everything and reports every problem.
//!
//! A pipeline job's checkpoint root holds no checkpoint of its own but one root per stage,
//! `stage-S-of-N/` ([`stage_roots`]): [`check_stages`] and [`stage_listing`] check and list
//! each, and asking such a root for a checkpoint fails with an error that names them.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::error::{CkptError, Result};
use crate::manifest::{FileEntry, MANIFEST_FILE, Manifest, TensorEntry, hex64};
use crate::safetensors::{header_len, parse_header};
use crate::store::{LATEST_FILE, list};
use crate::{DType, Role};

/// A committed checkpoint whose manifest has been read and checked.
#[derive(Clone, Debug)]
pub struct Checkpoint {
    /// The checkpoint directory.
    pub dir: PathBuf,
    /// Its manifest.
    pub manifest: Manifest,
}

/// The elements of a loaded tensor.
#[derive(Clone, Debug, PartialEq)]
pub enum TensorData {
    /// f32 elements.
    F32(Vec<f32>),
    /// Raw little-endian bytes of another dtype.
    Bytes(Vec<u8>),
}

/// A tensor read from a checkpoint, its checksum verified.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadedTensor {
    /// Registry name.
    pub name: String,
    /// Model or optimizer state.
    pub role: Role,
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<usize>,
    /// Elements.
    pub data: TensorData,
}

impl LoadedTensor {
    /// The bytes as stored.
    pub fn bytes(&self) -> &[u8] {
        match &self.data {
            TensorData::F32(v) => bytemuck::cast_slice(v),
            TensorData::Bytes(b) => b,
        }
    }
}

/// One problem found by [`Checkpoint::verify`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Problem {
    /// The file concerned.
    pub file: String,
    /// The tensor concerned, if any.
    pub tensor: Option<String>,
    /// What is wrong.
    pub reason: String,
}

/// Every problem of one checkpoint directory: its manifest's (one that cannot be opened),
/// or each file's and tensor's.
pub fn check(dir: &Path) -> Vec<Problem> {
    match open(dir) {
        Ok(c) => c.verify(),
        Err(e) => vec![Problem { file: MANIFEST_FILE.into(), tensor: None, reason: e.to_string() }],
    }
}

/// What `steadfast ckpt verify` prints of checkpoint directory `dir` and its `problems`:
/// one `OK` line, or a `CORRUPT` line a problem.
pub fn problem_lines(dir: &Path, problems: &[Problem]) -> Vec<String> {
    if problems.is_empty() {
        return vec![format!("OK {}: every checksum holds", dir.display())];
    }
    problems
        .iter()
        .map(|p| {
            let tensor = p.tensor.as_ref().map(|t| format!(" tensor {t}")).unwrap_or_default();
            format!("CORRUPT {} {}{tensor}: {}", dir.display(), p.file, p.reason)
        })
        .collect()
}

/// What [`check_root`] found in a checkpoint root.
#[derive(Clone, Debug)]
pub struct RootCheck {
    /// Every committed checkpoint, by ascending step: its step, directory and problems.
    pub checkpoints: Vec<(u64, PathBuf, Vec<Problem>)>,
    /// What is wrong with `LATEST`, if anything.
    pub latest: Option<String>,
    /// The configuration hashes of the checkpoints, each with its steps, in the order
    /// their first checkpoints come (more than one: the root mixes runs).
    pub configurations: Vec<(String, Vec<u64>)>,
}

impl RootCheck {
    /// How many checkpoints have problems.
    pub fn corrupt(&self) -> usize {
        self.checkpoints.iter().filter(|(_, _, p)| !p.is_empty()).count()
    }

    /// Whether every checkpoint and `LATEST` check out, and all are of one configuration.
    pub fn ok(&self) -> bool {
        self.corrupt() == 0 && self.latest.is_none() && !self.mixed()
    }

    /// The report as `steadfast ckpt verify --json` prints it for the root `root`.
    pub fn to_json(&self, root: &Path) -> serde_json::Value {
        use serde_json::json;
        let rows: Vec<_> = self
            .checkpoints
            .iter()
            .map(|(step, dir, p)| json!({"step": step, "dir": dir, "ok": p.is_empty(), "problems": p}))
            .collect();
        let configurations: Vec<_> =
            self.configurations.iter().map(|(h, s)| json!({"config_hash": h, "steps": s})).collect();
        json!({"root": root, "ok": self.ok(), "checkpoints": rows, "latest_problem": self.latest,
            "configurations": configurations})
    }

    /// The report as `steadfast ckpt verify` prints it for the root `root` (`label` follows
    /// its name in the last line): each checkpoint's [`problem_lines`], a bad `LATEST`,
    /// mixed configurations, and the counts.
    pub fn lines(&self, root: &Path, label: &str) -> Vec<String> {
        let mut out: Vec<String> = self.checkpoints.iter().flat_map(|(_, dir, p)| problem_lines(dir, p)).collect();
        if let Some(why) = &self.latest {
            out.push(format!("BAD {}: {why}", root.join(LATEST_FILE).display()));
        }
        if self.mixed() {
            let each: Vec<String> = self
                .configurations
                .iter()
                .map(|(h, s)| format!("{h} at {} step(s) from {} to {}", s.len(), s[0], s[s.len() - 1]))
                .collect();
            out.push(format!(
                "MIXED {}: checkpoints of {} configurations: {}",
                root.display(),
                each.len(),
                each.join("; ")
            ));
        }
        let (total, bad) = (self.checkpoints.len(), self.corrupt());
        out.push(format!(
            "{total} checkpoint(s) in {}{label}: {} valid, {bad} corrupt{}{}",
            root.display(),
            total - bad,
            if self.latest.is_some() { "; LATEST is bad" } else { "" },
            if self.mixed() { "; configurations mixed" } else { "" }
        ));
        out
    }

    /// Whether the root holds checkpoints of more than one configuration (of two runs:
    /// a resume of the older ones would be refused, and of the newer ones would skip
    /// steps).
    pub fn mixed(&self) -> bool {
        self.configurations.len() > 1
    }
}

/// Every committed checkpoint of `root` checked ([`check`]) and its `LATEST`; an error
/// when the root holds no committed checkpoint at all (naming the stage directories to
/// check instead when it is a pipeline job's root: see [`check_stages`]).
pub fn check_root(root: &Path) -> Result<RootCheck> {
    let listed = list(root)?;
    if listed.is_empty() {
        let reason = staged_root_advice(root).unwrap_or_else(|| "no step-* directory".into());
        return Err(CkptError::NotFound { path: root.to_owned(), reason });
    }
    let checkpoints = listed.into_iter().map(|(step, dir)| {
        let problems = check(&dir);
        (step, dir, problems)
    });
    let checkpoints: Vec<(u64, PathBuf, Vec<Problem>)> = checkpoints.collect();
    let mut configurations: Vec<(String, Vec<u64>)> = Vec::new();
    for (step, dir, _) in &checkpoints {
        let Some(hash) = crate::store::configuration_of(dir) else { continue };
        match configurations.iter_mut().find(|(h, _)| *h == hash) {
            Some((_, steps)) => steps.push(*step),
            None => configurations.push((hash, vec![*step])),
        }
    }
    Ok(RootCheck { checkpoints, latest: latest_target(root).err(), configurations })
}

/// One stage's checkpoint root inside a pipeline job's checkpoint root: the replicas of
/// each stage write its checkpoints, in parts, under `<root>/stage-S-of-N/`, an ordinary
/// checkpoint root.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct StageRoot {
    /// The stage, from 0.
    pub stage: usize,
    /// The stages of the job's pipeline.
    pub stages: usize,
    /// The stage's checkpoint root.
    pub dir: PathBuf,
}

/// The name of the checkpoint root of stage `stage` of a pipeline of `stages` stages.
pub fn stage_dir_name(stage: usize, stages: usize) -> String {
    format!("stage-{stage}-of-{stages}")
}

/// The newest step of which each of the `stages` stages of the pipeline job's checkpoint
/// root `root` has a committed checkpoint (`None`: some stage has none, or no directory).
/// Listed, not verified: a resume verifies each stage's as it restores, and the stages go
/// back together past one that does not ([`check_stages`] verifies them all).
pub fn common_step(root: &Path, stages: usize) -> Result<Option<u64>> {
    let mut common: Option<std::collections::BTreeSet<u64>> = None;
    for stage in 0..stages {
        let dir = root.join(stage_dir_name(stage, stages));
        if !dir.is_dir() {
            return Ok(None);
        }
        let steps: std::collections::BTreeSet<u64> = list(&dir)?.into_iter().map(|(step, _)| step).collect();
        common = Some(match common {
            None => steps,
            Some(c) => c.intersection(&steps).copied().collect(),
        });
    }
    Ok(common.and_then(|c| c.last().copied()))
}

/// The stage and the stages of a directory named by [`stage_dir_name`].
pub fn parse_stage_dir(name: &str) -> Option<(usize, usize)> {
    let (stage, stages) = name.strip_prefix("stage-")?.split_once("-of-")?;
    let number = |t: &str| -> Option<usize> {
        (!t.is_empty() && t.bytes().all(|b| b.is_ascii_digit())).then(|| t.parse().ok()).flatten()
    };
    let (stage, stages) = (number(stage)?, number(stages)?);
    (stage < stages).then_some((stage, stages))
}

/// The stage roots in `root`, a pipeline job's checkpoint root, ordered by the pipeline's
/// length, then by stage; empty when `root` holds none (an ordinary root, or no
/// directory).
pub fn stage_roots(root: &Path) -> Result<Vec<StageRoot>> {
    if !root.is_dir() {
        return Ok(Vec::new());
    }
    let mut stages = Vec::new();
    for entry in std::fs::read_dir(root).map_err(CkptError::io("cannot list", root))? {
        let entry = entry.map_err(CkptError::io("cannot list", root))?;
        if let Some((stage, of)) = entry.file_name().to_str().and_then(parse_stage_dir)
            && entry.path().is_dir()
        {
            stages.push(StageRoot { stage, stages: of, dir: entry.path() });
        }
    }
    stages.sort_by_key(|s| (s.stages, s.stage));
    Ok(stages)
}

/// What is wrong with the stage directories of a pipeline job's root, each said in a
/// sentence: directories of pipelines of different lengths (two jobs wrote here), or a
/// stage without its directory.
pub fn stage_layout_problems(stages: &[StageRoot]) -> Vec<String> {
    let mut lengths: Vec<usize> = stages.iter().map(|s| s.stages).collect();
    lengths.sort_unstable();
    lengths.dedup();
    if lengths.len() > 1 {
        return vec![format!("stage directories of pipelines of {lengths:?} stages: two jobs wrote here")];
    }
    let Some(&of) = lengths.first() else { return Vec::new() };
    (0..of)
        .filter(|&s| !stages.iter().any(|r| r.stage == s))
        .map(|s| format!("{} is missing: stage {s} has no checkpoint", stage_dir_name(s, of)))
        .collect()
}

/// What to say of `root` when it is a pipeline job's checkpoint root, which holds no
/// checkpoint of its own: the stage directories to name instead. `None` otherwise.
fn staged_root_advice(root: &Path) -> Option<String> {
    let stages = stage_roots(root).ok().filter(|s| !s.is_empty())?;
    let names: Vec<String> = stages.iter().map(|s| s.dir.display().to_string()).collect();
    Some(format!(
        "it is a pipeline job's checkpoint root, in which each stage keeps its own checkpoints: name one \
         stage's directory ({}), or a step-* directory in one",
        names.join(", ")
    ))
}

/// What [`check_stages`] found in a pipeline job's checkpoint root.
#[derive(Clone, Debug)]
pub struct StagesCheck {
    /// Each stage's root, with what [`check_root`] found there (an error when it holds no
    /// committed checkpoint).
    pub stages: Vec<(StageRoot, std::result::Result<RootCheck, String>)>,
    /// What is wrong with the stage directories ([`stage_layout_problems`]).
    pub layout: Vec<String>,
    /// The newest step of which every stage has a checkpoint that verifies: the step a
    /// resume of the job goes to (`None`: there is none, and a resume starts afresh).
    pub common: Option<u64>,
}

impl StagesCheck {
    /// Whether every stage is there and every checkpoint and `LATEST` of each check out.
    pub fn ok(&self) -> bool {
        self.layout.is_empty() && self.stages.iter().all(|(_, c)| c.as_ref().is_ok_and(RootCheck::ok))
    }

    /// The report as `steadfast ckpt verify --json` prints it for the job's root `root`:
    /// each stage's as a root's, with its stage, and the step common to every stage.
    pub fn to_json(&self, root: &Path) -> serde_json::Value {
        use serde_json::json;
        let stages: Vec<_> = self
            .stages
            .iter()
            .map(|(stage, checked)| match checked {
                Ok(c) => {
                    let mut v = c.to_json(&stage.dir);
                    v["stage"] = json!(stage.stage);
                    v["stages"] = json!(stage.stages);
                    v
                }
                Err(e) => json!({"stage": stage.stage, "stages": stage.stages, "root": stage.dir,
                    "ok": false, "error": e}),
            })
            .collect();
        json!({"root": root, "ok": self.ok(), "stages": stages, "layout_problems": self.layout,
            "common_step": self.common})
    }

    /// The report as `steadfast ckpt verify` prints it for the job's root `root`: each
    /// stage's checkpoints as a root's are, what is wrong with the stages, and the step
    /// that a resume of the job goes to.
    pub fn text(&self, root: &Path) -> String {
        let mut out = Vec::new();
        for (stage, checked) in &self.stages {
            let c = match checked {
                Ok(c) => c,
                Err(e) => {
                    out.push(format!("BAD {e}"));
                    continue;
                }
            };
            out.extend(c.lines(&stage.dir, &format!(" (stage {} of {})", stage.stage, stage.stages)));
        }
        out.extend(self.layout.iter().map(|p| format!("BAD {}: {p}", root.display())));
        out.push(match self.common {
            Some(step) => format!(
                "{} stage(s) in {}: every stage has a valid checkpoint of step {step}, where a resume of the job goes",
                self.stages.len(),
                root.display()
            ),
            None => format!(
                "{} stage(s) in {}: no step of which every stage has a valid checkpoint (a resume starts afresh)",
                self.stages.len(),
                root.display()
            ),
        });
        out.join("\n")
    }
}

/// Every stage root of the pipeline job's checkpoint root `root` checked as
/// [`check_root`] checks a root; `None` when `root` holds no stage directory.
pub fn check_stages(root: &Path) -> Result<Option<StagesCheck>> {
    let roots = stage_roots(root)?;
    if roots.is_empty() {
        return Ok(None);
    }
    let layout = stage_layout_problems(&roots);
    let mut common: Option<Vec<u64>> = None;
    let mut stages = Vec::new();
    for stage in roots {
        let checked = check_root(&stage.dir).map_err(|e| e.to_string());
        let valid: Vec<u64> = match &checked {
            Ok(c) => c.checkpoints.iter().filter(|(_, _, p)| p.is_empty()).map(|(s, _, _)| *s).collect(),
            Err(_) => Vec::new(),
        };
        common = Some(match common {
            None => valid,
            Some(c) => c.into_iter().filter(|s| valid.contains(s)).collect(),
        });
        stages.push((stage, checked));
    }
    let common = if layout.is_empty() { common.and_then(|c| c.into_iter().max()) } else { None };
    Ok(Some(StagesCheck { stages, layout, common }))
}

/// One committed checkpoint of a root, as `steadfast ckpt ls` lists it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Listed {
    /// Its step.
    pub step: u64,
    /// Its directory's name.
    pub dir: String,
    /// Whether `LATEST` names it.
    pub latest: bool,
    /// Whether its manifest opens.
    pub valid_manifest: bool,
    /// Tensors in the manifest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tensors: Option<usize>,
    /// Files in the manifest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub files: Option<usize>,
    /// Bytes of those files.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// Why the manifest does not open.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The committed checkpoints of one stage of a pipeline job's root, as [`stage_listing`]
/// lists them.
#[derive(Clone, Debug, serde::Serialize)]
pub struct StageListing {
    /// The stage and its root.
    #[serde(flatten)]
    pub stage: StageRoot,
    /// Its committed checkpoints, as [`listing`] lists a root's.
    pub checkpoints: Vec<Listed>,
}

/// The committed checkpoints of each stage of the pipeline job's checkpoint root `root`,
/// stage by stage; empty when `root` holds no stage directory.
pub fn stage_listing(root: &Path) -> Result<Vec<StageListing>> {
    stage_roots(root)?
        .into_iter()
        .map(|stage| -> Result<StageListing> { Ok(StageListing { checkpoints: listing(&stage.dir)?, stage }) })
        .collect()
}

/// `rows` as `steadfast ckpt ls` prints them: a table under a header, a line each.
pub fn listing_table(rows: &[Listed]) -> String {
    let mut out = format!("{:<16} {:>10} {:>8} {:>14}  note\n", "checkpoint", "step", "tensors", "bytes");
    for r in rows {
        let note = match (&r.error, r.latest) {
            (Some(e), _) => format!("INVALID: {e}"),
            (None, true) => "LATEST".to_owned(),
            (None, false) => String::new(),
        };
        let number = |n: Option<u64>| n.map(|n| n.to_string()).unwrap_or_default();
        let (tensors, bytes) = (number(r.tensors.map(|n| n as u64)), number(r.bytes));
        out.push_str(&format!("{:<16} {:>10} {:>8} {:>14}  {note}\n", r.dir, r.step, tensors, bytes));
    }
    out
}

/// The committed checkpoints of `root`, oldest first, each opened (not verified).
pub fn listing(root: &Path) -> Result<Vec<Listed>> {
    let latest = std::fs::read_to_string(root.join(LATEST_FILE)).ok().map(|s| s.trim().to_owned());
    let mut rows = Vec::new();
    for (step, path) in list(root)? {
        let dir = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let latest = latest.as_deref() == Some(dir.as_str());
        let mut row =
            Listed { step, dir, latest, valid_manifest: false, tensors: None, files: None, bytes: None, error: None };
        match open(&path) {
            Ok(c) => {
                row.valid_manifest = true;
                row.tensors = Some(c.manifest.tensors.len());
                row.files = Some(c.manifest.files.len());
                row.bytes = Some(c.manifest.files.iter().map(|f| f.length).sum());
            }
            Err(e) => row.error = Some(e.to_string()),
        }
        rows.push(row);
    }
    Ok(rows)
}

/// What a path resolved to ([`resolve_reporting`]), and what was passed over on the way.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    /// The checkpoint directory.
    pub dir: PathBuf,
    /// Each thing that a reader asked for the newest checkpoint should have been able to
    /// use but could not, newest first, with the reason: a checkpoint whose manifest does
    /// not check out, or a `LATEST` that holds garbage or names a checkpoint that is
    /// missing. Empty in every state that a crash of the writer can leave.
    pub skipped: Vec<(PathBuf, String)>,
}

/// Resolves what a user named to one checkpoint directory, as [`resolve_reporting`] does,
/// logging each thing it skipped as a warning.
pub fn resolve(path: &Path) -> Result<PathBuf> {
    let resolved = resolve_reporting(path)?;
    for (skipped, reason) in &resolved.skipped {
        tracing::warn!("skipped {}: {reason}; using {}", skipped.display(), resolved.dir.display());
    }
    Ok(resolved.dir)
}

/// Resolves what a user named to one checkpoint directory: a directory holding a
/// `manifest.json` is taken as is; a checkpoint root resolves to its newest committed
/// checkpoint whose manifest checks out. `LATEST` is the fast path: only directories
/// newer than the one it names are examined (there is one when a writer died between
/// its commit and the `LATEST` update), and if `LATEST` is missing or does not name a
/// valid checkpoint every directory is, newest first. Everything passed over that a crash
/// cannot explain is listed in [`Resolved::skipped`], for the caller to tell the user.
pub fn resolve_reporting(path: &Path) -> Result<Resolved> {
    if path.join(MANIFEST_FILE).exists() {
        return Ok(Resolved { dir: path.to_owned(), skipped: Vec::new() });
    }
    if !path.is_dir() {
        let reason = if path.exists() { "not a directory" } else { "no such directory" };
        return Err(CkptError::NotFound { path: path.to_owned(), reason: reason.into() });
    }
    let mut skipped = Vec::new();
    let latest = match latest_target(path) {
        Ok(None) => None,
        Ok(Some((step, dir))) => match open(&dir) {
            Ok(_) => Some((step, dir)),
            Err(e) => {
                skipped.push((dir, e.to_string()));
                None
            }
        },
        Err(reason) => {
            skipped.push((path.join(LATEST_FILE), reason));
            None
        }
    };
    let newer_than = latest.as_ref().map(|(step, _)| *step);
    for (step, dir) in list(path)?.into_iter().rev() {
        if newer_than.is_some_and(|l| step <= l) {
            break;
        }
        if skipped.iter().any(|(p, _)| *p == dir) {
            continue;
        }
        match open(&dir) {
            Ok(_) => return Ok(Resolved { dir, skipped }),
            Err(e) => skipped.push((dir, e.to_string())),
        }
    }
    match latest {
        Some((_, dir)) => Ok(Resolved { dir, skipped }),
        None => {
            if let Some(advice) = staged_root_advice(path).filter(|_| skipped.is_empty()) {
                return Err(CkptError::NotFound { path: path.to_owned(), reason: advice });
            }
            let mut reason = "neither a checkpoint (no manifest.json) nor a root with a valid checkpoint".to_owned();
            for (p, why) in &skipped {
                reason.push_str(&format!("; {}: {why}", p.display()));
            }
            Err(CkptError::NotFound { path: path.to_owned(), reason })
        }
    }
}

/// The newest committed checkpoint under `root` older than step `below` whose manifest
/// checks out: where a reader goes when the data of the one it resolved to does not
/// verify. Those passed over on the way are in [`Resolved::skipped`]; none at all is
/// [`CkptError::NotFound`].
pub fn resolve_older(root: &Path, below: u64) -> Result<Resolved> {
    let mut skipped = Vec::new();
    for (step, dir) in list(root)?.into_iter().rev() {
        if step >= below {
            continue;
        }
        match open(&dir) {
            Ok(_) => return Ok(Resolved { dir, skipped }),
            Err(e) => skipped.push((dir, e.to_string())),
        }
    }
    let mut reason = format!("no checkpoint older than step {below} checks out");
    for (p, why) in &skipped {
        reason.push_str(&format!("; {}: {why}", p.display()));
    }
    Err(CkptError::NotFound { path: root.to_owned(), reason })
}

/// The checkpoint that `root`'s `LATEST` names: `None` when there is no `LATEST` (no
/// commit has reached it yet), an error saying what is wrong with it when it cannot be
/// read, holds something other than a checkpoint's name, or names one that is missing.
pub fn latest_target(root: &Path) -> std::result::Result<Option<(u64, PathBuf)>, String> {
    let bytes = match std::fs::read(root.join(LATEST_FILE)) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {LATEST_FILE}: {e}")),
    };
    let text = String::from_utf8_lossy(&bytes);
    let name = text.trim();
    let Some(step) = crate::store::parse_step_dir(name) else {
        let shown: String = name.chars().take(40).collect();
        return Err(format!("{LATEST_FILE} holds {shown:?}, not the name of a checkpoint"));
    };
    let dir = root.join(name);
    if !dir.is_dir() {
        return Err(format!("{LATEST_FILE} names {name}, which does not exist"));
    }
    Ok(Some((step, dir)))
}

/// Opens a checkpoint directory: reads and checks its manifest. A directory without a
/// valid manifest is not a checkpoint.
pub fn open(dir: &Path) -> Result<Checkpoint> {
    let path = dir.join(MANIFEST_FILE);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(CkptError::NotFound {
                path: dir.to_owned(),
                reason: "no manifest.json (never committed, or not a checkpoint)".into(),
            });
        }
        Err(e) => return Err(CkptError::io("cannot read", &path)(e)),
    };
    let manifest = Manifest::from_bytes(&bytes, &path)?;
    let named = dir.file_name().and_then(|n| n.to_str()).and_then(crate::store::parse_step_dir);
    if let Some(named) = named.filter(|&n| n != manifest.meta.step) {
        return Err(CkptError::Format {
            path,
            reason: format!(
                "the directory is named for step {named} but holds the checkpoint of step {}",
                manifest.meta.step
            ),
        });
    }
    Ok(Checkpoint { dir: dir.to_owned(), manifest })
}

impl Checkpoint {
    /// The checkpoint as `steadfast ckpt inspect` prints it: its metadata, a line a
    /// tensor, and the totals by role.
    pub fn describe(&self) -> String {
        use std::fmt::Write;
        let (m, mut out) = (&self.manifest, String::new());
        let meta = &m.meta;
        let _ = writeln!(out, "checkpoint:  {}", self.dir.display());
        let _ = writeln!(out, "format:      {} version {}", m.format, m.version);
        let _ = writeln!(
            out,
            "step:        {} (epoch {}, next step {} of the epoch)",
            meta.step, meta.epoch, meta.data_cursor.step_in_epoch
        );
        let _ = writeln!(out, "world size:  {}", meta.world_size);
        let _ = writeln!(out, "config hash: {}", meta.config_hash);
        if !meta.kernels.is_empty() {
            let _ = writeln!(out, "kernels:     {}", meta.kernels);
        }
        let _ = writeln!(out, "rng:         {} seed {}", meta.rng.algorithm, meta.rng.seed);
        for (k, v) in &meta.scalars {
            let _ = writeln!(out, "{:<12} {v}", format!("{k}:"));
        }
        let mut by_role = std::collections::BTreeMap::<&str, (usize, u64)>::new();
        let _ = writeln!(out, "\n{:<48} {:<6} {:<5} {:<16} {:>12}  file", "tensor", "role", "dtype", "shape", "bytes");
        for t in &m.tensors {
            let e = by_role.entry(t.role.as_str()).or_default();
            (e.0, e.1) = (e.0 + 1, e.1 + t.length);
            let shape = format!("{:?}", t.shape);
            let _ =
                writeln!(out, "{:<48} {:<6} {:<5} {shape:<16} {:>12}  {}", t.name, t.role, t.dtype, t.length, t.file);
        }
        let _ = writeln!(out);
        for (role, (n, bytes)) in by_role {
            let _ = writeln!(out, "{role}: {n} tensors, {bytes} bytes");
        }
        out
    }

    /// Reads every tensor, verifying every checksum; fails at the first problem. Files are
    /// read in parallel.
    pub fn load(&self) -> Result<Vec<LoadedTensor>> {
        let per_file: Vec<Result<Vec<(usize, LoadedTensor)>>> = std::thread::scope(|s| {
            let handles: Vec<_> = self.manifest.files.iter().map(|f| s.spawn(move || self.load_file(f))).collect();
            handles.into_iter().map(|h| h.join().expect("checkpoint reader panicked")).collect()
        });
        let mut all = Vec::with_capacity(self.manifest.tensors.len());
        for r in per_file {
            all.extend(r?);
        }
        all.sort_by_key(|(i, _)| *i);
        Ok(all.into_iter().map(|(_, t)| t).collect())
    }

    /// Checks every byte of the checkpoint; returns every problem found (empty: valid).
    pub fn verify(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        for f in &self.manifest.files {
            let file_problem = |reason: String| Problem { file: f.file.clone(), tensor: None, reason };
            let handle = match self.open_checked(f) {
                Ok(h) => h,
                Err(e) => {
                    problems.push(file_problem(e.to_string()));
                    continue;
                }
            };
            for t in self.manifest.tensors.iter().filter(|t| t.file == f.file) {
                let mut buf = vec![0u8; t.length as usize];
                let outcome = handle
                    .read_exact_at(&mut buf, t.offset)
                    .map_err(|e| format!("cannot read: {e}"))
                    .and_then(|()| check_sum(t, &buf));
                if let Err(reason) = outcome {
                    problems.push(Problem { file: f.file.clone(), tensor: Some(t.name.clone()), reason });
                }
            }
        }
        problems
    }

    /// Opens a shard and checks its length, header checksum and header contents against
    /// the manifest.
    fn open_checked(&self, f: &FileEntry) -> Result<File> {
        let path = self.dir.join(&f.file);
        let corrupt = |reason: String| CkptError::Corrupt { path: path.clone(), tensor: None, reason };
        let file = File::open(&path).map_err(CkptError::io("cannot open", &path))?;
        let len = file.metadata().map_err(CkptError::io("cannot stat", &path))?.len();
        if len != f.length {
            return Err(corrupt(format!("the file has {len} bytes, the manifest says {}", f.length)));
        }
        if f.header_length < 8 || f.header_length > len {
            return Err(corrupt(format!("header length {} is impossible", f.header_length)));
        }
        let mut prefix = vec![0u8; f.header_length as usize];
        file.read_exact_at(&mut prefix, 0).map_err(CkptError::io("cannot read", &path))?;
        if hex64(crate::checksum(&prefix)) != f.header_xxh3 {
            return Err(corrupt("the safetensors header does not match its checksum".into()));
        }
        let first8: [u8; 8] = prefix[..8].try_into().expect("length checked above");
        let n = header_len(&first8, len).map_err(&corrupt)?;
        if 8 + n != f.header_length {
            return Err(corrupt(format!("header says {n} bytes of JSON, manifest says {}", f.header_length - 8)));
        }
        let header = parse_header(&prefix[8..], len).map_err(&corrupt)?;
        let listed: Vec<&TensorEntry> = self.manifest.tensors.iter().filter(|t| t.file == f.file).collect();
        if listed.len() != header.entries.len() {
            return Err(corrupt(format!(
                "the file holds {} tensors, the manifest lists {}",
                header.entries.len(),
                listed.len()
            )));
        }
        for e in &header.entries {
            let agrees = listed.iter().any(|t| {
                t.name == e.name
                    && t.dtype == e.dtype.name()
                    && t.shape.iter().map(|&d| d as usize).eq(e.shape.iter().copied())
                    && t.offset == header.data_start + e.begin
                    && t.length == e.len()
            });
            if !agrees {
                return Err(corrupt(format!("tensor {:?} in the file disagrees with the manifest", e.name)));
            }
        }
        Ok(file)
    }

    /// Reads every tensor into memory the caller provides, verifying every checksum as
    /// it goes: `into[i]` receives the manifest's tensor `i` and must have exactly its
    /// length. Fails at the first problem, leaving the memory of that tensor and of any
    /// not yet read partly written. Files are read in parallel. This is [`load`](Self::load)
    /// without the allocations, for a caller that has its own buffers (a framework's
    /// tensors, or a model's parameters where they lie).
    pub fn read_into(&self, into: &mut [&mut [u8]]) -> Result<()> {
        let tensors = &self.manifest.tensors;
        if into.len() != tensors.len() {
            return Err(CkptError::Mismatch(format!(
                "{} buffers for the {} tensors of {}",
                into.len(),
                tensors.len(),
                self.dir.display()
            )));
        }
        if let Some((t, b)) = tensors.iter().zip(into.iter()).find(|(t, b)| b.len() as u64 != t.length) {
            return Err(CkptError::Mismatch(format!(
                "a buffer of {} bytes for tensor {} of {} bytes",
                b.len(),
                t.name,
                t.length
            )));
        }
        let mut per_file: Vec<(&FileEntry, FileReads<'_, '_>)> =
            self.manifest.files.iter().map(|f| (f, Vec::new())).collect();
        for (t, buf) in tensors.iter().zip(into.iter_mut()) {
            if let Some((_, list)) = per_file.iter_mut().find(|(f, _)| f.file == t.file) {
                list.push((t, &mut **buf));
            }
        }
        let outcomes: Vec<Result<()>> = std::thread::scope(|s| {
            let handles: Vec<_> =
                per_file.into_iter().map(|(f, list)| s.spawn(move || self.read_file_into(f, list))).collect();
            handles.into_iter().map(|h| h.join().expect("checkpoint reader panicked")).collect()
        });
        outcomes.into_iter().collect()
    }

    fn read_file_into(&self, f: &FileEntry, list: FileReads<'_, '_>) -> Result<()> {
        let file = self.open_checked(f)?;
        // Ask the kernel to read the whole file ahead while we copy and hash; a hint only.
        let _ = rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::WillNeed);
        let path = self.dir.join(&f.file);
        for (t, buf) in list {
            read_checked(&file, &path, t, buf)?;
        }
        Ok(())
    }

    fn load_file(&self, f: &FileEntry) -> Result<Vec<(usize, LoadedTensor)>> {
        let file = self.open_checked(f)?;
        let _ = rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::WillNeed);
        let path = self.dir.join(&f.file);
        let mut out = Vec::new();
        for (index, t) in self.manifest.tensors.iter().enumerate().filter(|(_, t)| t.file == f.file) {
            let dtype = DType::from_name(&t.dtype).expect("checked when the manifest was parsed");
            let role: Role = t.role.parse().expect("checked when the manifest was parsed");
            let shape: Vec<usize> = t.shape.iter().map(|&d| d as usize).collect();
            let mut data = if dtype == DType::F32 {
                TensorData::F32(vec![0f32; (t.length / 4) as usize])
            } else {
                TensorData::Bytes(vec![0u8; t.length as usize])
            };
            let buf: &mut [u8] = match &mut data {
                TensorData::F32(v) => bytemuck::cast_slice_mut(v),
                TensorData::Bytes(v) => v,
            };
            read_checked(&file, &path, t, buf)?;
            let tensor = LoadedTensor { name: t.name.clone(), role, dtype, shape, data };
            out.push((index, tensor));
        }
        Ok(out)
    }
}

/// The tensors of one file, each with the memory it is read into.
type FileReads<'m, 'b> = Vec<(&'m TensorEntry, &'b mut [u8])>;

/// Reads tensor `t`'s bytes from `file` into `buf` (of its length) and checks them
/// against its checksum; chunk by chunk, so each chunk is hashed while in cache.
fn read_checked(file: &File, path: &Path, t: &TensorEntry, buf: &mut [u8]) -> Result<()> {
    let mut hasher = crate::checksummer();
    let mut offset = t.offset;
    for chunk in buf.chunks_mut(crate::store::IO_CHUNK) {
        file.read_exact_at(chunk, offset).map_err(CkptError::io("cannot read", path))?;
        hasher.update(chunk);
        offset += chunk.len() as u64;
    }
    compare_sum(t, hasher.digest()).map_err(|reason| CkptError::Corrupt {
        path: path.to_owned(),
        tensor: Some(t.name.clone()),
        reason,
    })
}

fn check_sum(t: &TensorEntry, bytes: &[u8]) -> std::result::Result<(), String> {
    compare_sum(t, crate::checksum(bytes))
}

fn compare_sum(t: &TensorEntry, digest: u64) -> std::result::Result<(), String> {
    let actual = hex64(digest);
    if actual == t.xxh3 { Ok(()) } else { Err(format!("checksum {actual} does not match the manifest's {}", t.xxh3)) }
}

/// The step of the newest checkpoint committed under `root` (`None`: none, or no
/// directory). A pipeline job's root holds one directory of checkpoints per stage
/// (`stage-S-of-N`): its newest checkpoint is the newest step that every stage has.
pub fn newest_step(root: &Path) -> std::io::Result<Option<u64>> {
    if !root.is_dir() {
        return Ok(None);
    }
    let stages = stage_roots(root).map_err(std::io::Error::other)?;
    match stages.first() {
        None => Ok(crate::store::list(root).map_err(std::io::Error::other)?.last().map(|(step, _)| *step)),
        Some(s) => common_step(root, s.stages).map_err(std::io::Error::other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_directory_names_round_trip_and_nothing_else_is_one() {
        assert_eq!(stage_dir_name(1, 3), "stage-1-of-3");
        assert_eq!(parse_stage_dir("stage-1-of-3"), Some((1, 3)));
        for name in ["stage-3-of-3", "stage--of-2", "stage-1-of-", "stage-a-of-2", "step-00000001", "stage-1-of-2x"] {
            assert_eq!(parse_stage_dir(name), None, "{name}");
        }
    }

    #[test]
    fn a_missing_stage_and_two_pipelines_in_one_root_are_said() {
        let root = |stage, stages| StageRoot { stage, stages, dir: PathBuf::from(stage_dir_name(stage, stages)) };
        assert!(stage_layout_problems(&[root(0, 2), root(1, 2)]).is_empty());
        let missing = stage_layout_problems(&[root(0, 3), root(2, 3)]);
        assert_eq!(missing, ["stage-1-of-3 is missing: stage 1 has no checkpoint"]);
        let two = stage_layout_problems(&[root(0, 2), root(1, 2), root(0, 3)]);
        assert!(two.len() == 1 && two[0].contains("two jobs wrote here"), "{two:?}");
    }

    #[test]
    fn a_pipeline_job_s_root_is_named_with_its_stage_directories_when_a_checkpoint_is_asked_of_it() {
        let tmp = tempfile::tempdir().unwrap();
        for stage in 0..2 {
            std::fs::create_dir(tmp.path().join(stage_dir_name(stage, 2))).unwrap();
        }
        let err = resolve_reporting(tmp.path()).unwrap_err().to_string();
        assert!(err.contains("pipeline job's checkpoint root") && err.contains("stage-1-of-2"), "{err}");
        let err = check_root(tmp.path()).unwrap_err().to_string();
        assert!(err.contains("stage-0-of-2"), "{err}");
        // Neither stage holds a checkpoint: each says so, and no step is common.
        let check = check_stages(tmp.path()).unwrap().unwrap();
        assert!(!check.ok() && check.common.is_none() && check.stages.iter().all(|(_, c)| c.is_err()));
        assert!(check_stages(&tmp.path().join("stage-0-of-2")).unwrap().is_none());
    }
}
