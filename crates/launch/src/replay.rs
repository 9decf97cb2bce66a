//! What `steadfast launch --recovery replay` adds to a pipeline job: the logs and the
//! checkpoints a lost stage is replayed from.
//!
//! A pipeline job under `--max-restarts` runs under the step protocol, as every elastic
//! job does ([`crate::elastic`]): a lost stage worker fetches its stage from a live
//! replica, and a stage lost in every replica is replayed from its checkpoint on the
//! tensors its neighbours logged, shared by `--replay-helpers` workers (see
//! `comm::protocol`'s pipelines). `--recovery replay` is that job with what a replay needs
//! set for the user: every stage boundary logged (unless the command chooses some with
//! `--log-boundaries` or `--log-budget`), and checkpoints every `--save-every` steps,
//! each stage its own, to `--save-dir` or to `OUT/checkpoints` under the workers' `--out`
//! (beside their metrics and boundary logs), which the launcher names as it starts. The
//! same command run again after the whole job was lost resumes from the newest step of
//! which every stage has a checkpoint, as `--resume latest` asks explicitly.
//!
//! With `--on-failure shrink` no replacement comes: each lost worker's micro-batches go
//! to a surviving worker of its stage. Nothing is replayed, so nothing is logged.

use std::path::PathBuf;
use std::time::Instant;

use crate::command::{flag_value, pipeline_stages};
use crate::{LaunchError, say};

/// Where the job's checkpoints go: `--save-dir`, or `OUT/checkpoints` under the workers'
/// `--out` (`train`'s default when the command gives none), beside the job's metrics and
/// boundary logs, so that the same command run again finds them and nothing is left in a
/// temporary directory.
pub(crate) fn checkpoint_root(save_dir: Option<&PathBuf>, command: &[String]) -> PathBuf {
    save_dir.cloned().unwrap_or_else(|| {
        PathBuf::from(flag_value(command, "--out").unwrap_or(comm::job::DEFAULT_OUT)).join("checkpoints")
    })
}

/// Takes `--resume` out of the worker command: this launcher resumes the job from its
/// checkpoint root by itself. Returns what was asked (`latest`: there must be a step to
/// resume from; `auto`: as without the flag); any other value is refused with what to do.
fn take_resume(command: &mut Vec<String>) -> Result<Option<String>, LaunchError> {
    let mut asked = None;
    let mut i = 0;
    while i < command.len() {
        let value = if command[i] == "--resume" {
            command.remove(i);
            if i < command.len() { command.remove(i) } else { String::new() }
        } else if let Some(value) = command[i].strip_prefix("--resume=") {
            let value = value.to_owned();
            command.remove(i);
            value
        } else {
            i += 1;
            continue;
        };
        if value != "latest" && value != "auto" {
            return Err(LaunchError::Config(format!(
                "--recovery replay resumes a job from the checkpoints in its --save-dir by itself: the same command \
                 run again goes on from the newest step of which every stage has a checkpoint (--resume latest insists \
                 on one, --resume auto does not). To go on from the checkpoints in {value:?}, give the launcher \
                 --save-dir with that job's checkpoint root (the directory that holds its stage-S-of-N directories)"
            )));
        }
        asked = Some(value);
    }
    Ok(asked)
}

/// The worker command of a `--recovery replay` job: `command` with its boundary logs, its
/// checkpoints every `save_every` steps under [`checkpoint_root`], and `--resume latest`
/// when that root holds a step of which every stage has one.
pub(crate) fn replay_command(
    command: &[String],
    save_dir: Option<&PathBuf>,
    save_every: u64,
    shrink: bool,
) -> Result<Vec<String>, LaunchError> {
    let bad = |text: &str| LaunchError::Config(text.to_owned());
    let stages = pipeline_stages(command);
    if stages < 2 {
        return Err(bad("--recovery replay replays the stages of a pipeline: the command needs --pipeline-stages S, \
             with S at least 2"));
    }
    let mut command = command.to_vec();
    let asked = take_resume(&mut command)?;
    crate::restart::refuse_checkpoint_flags(&command, "replay")?;
    // Every boundary is logged unless the command chooses (by a list or a budget).
    let chooses =
        |a: &String| ["--log-boundaries", "--log-budget"].iter().any(|f| a == f || a.starts_with(&format!("{f}=")));
    if shrink && command.iter().any(chooses) {
        return Err(bad("--on-failure shrink reroutes a lost stage's work and replays nothing: log no boundary"));
    }
    if shrink && flag_value(&command, "--reduce") != Some("reproducible") {
        return Err(bad("rerouting a lost stage's micro-batches to its other replicas sums them in another order: \
             the bits are kept only with --reduce reproducible"));
    }
    if !shrink && !command.iter().any(chooses) {
        command.extend(["--log-boundaries".into(), "all".into()]);
    }
    let started = Instant::now();
    let dir = checkpoint_root(save_dir, &command);
    let newest = ckpt::reader::common_step(&dir, stages)
        .map_err(|e| LaunchError::Failed(format!("cannot list the stages' checkpoints: {e}")))?;
    if newest.is_none() && asked.as_deref() == Some("latest") {
        return Err(LaunchError::Config(format!(
            "--resume latest: {} holds no step of which every one of the {stages} stages has a checkpoint; \
             leave --resume out to start the job from the beginning",
            dir.display()
        )));
    }
    std::fs::create_dir_all(&dir).map_err(LaunchError::io(format!("cannot create {}", dir.display())))?;
    match newest {
        Some(step) => {
            say!(started, "resuming from the checkpoints in {}: every stage has one of step {step}", dir.display());
            command.extend(["--resume".into(), "latest".into()]);
        }
        None => say!(
            started,
            "the checkpoints go to {} (every {save_every} steps, each stage its own): the same command resumes from them",
            dir.display(),
        ),
    }
    command.extend(["--checkpoint-dir".into(), dir.display().to_string()]);
    command.extend(["--checkpoint-every".into(), save_every.to_string(), "--keep-last".into(), "2".into()]);
    Ok(command)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn the_checkpoints_go_under_save_dir_or_the_workers_out() {
        let command = words("train --pipeline-stages 3 --out=runs/a --steps 9");
        assert_eq!(checkpoint_root(None, &command), PathBuf::from("runs/a/checkpoints"));
        let default = PathBuf::from(comm::job::DEFAULT_OUT).join("checkpoints");
        assert_eq!(checkpoint_root(None, &words("train --output-dir x")), default);
        assert_eq!(checkpoint_root(Some(&PathBuf::from("ck")), &command), PathBuf::from("ck"));
    }

    #[test]
    fn resume_latest_or_auto_is_taken_out_of_the_command_and_a_path_is_refused_with_advice() {
        let mut command = words("train --resume latest --steps 9");
        assert_eq!(take_resume(&mut command).unwrap().as_deref(), Some("latest"));
        assert_eq!(command, words("train --steps 9"));
        let mut command = words("train --resume=auto");
        assert_eq!(take_resume(&mut command).unwrap().as_deref(), Some("auto"));
        assert_eq!(command, words("train"));
        let mut command = words("train --steps 9");
        assert_eq!(take_resume(&mut command).unwrap(), None);
        let why = take_resume(&mut words("train --resume runs/ck")).unwrap_err().to_string();
        assert!(why.contains("give the launcher --save-dir"), "{why}");
    }
}
