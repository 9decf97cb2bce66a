//! The record of an elastic job's epochs in `metrics.jsonl`, and who writes it.

use comm::protocol::{Worker, WorkerId, WorkerState};
use serde_json::json;

use crate::error::TrainError;
use crate::metrics::MetricsFile;

/// The job's record of its epochs in `metrics.jsonl`, for `steadfast report`: the epochs
/// its writer leaves (a failure seen, and why, when this worker knows), the quorums it
/// joins (who, from which step, who holds the state), the workers each quorum lost or
/// gained against the one before, and each epoch's first step (the end of a recovery).
/// Every worker also says the changes of membership in a line.
///
/// The record is written by the lowest-ranked member of each epoch (worker 0 while it is
/// a member; in a pipeline job, of the last stage, which holds the loss): each worker takes it over, or hands it on, when it joins a quorum, so that
/// the record (its steps, its summary) goes on when worker 0 or its node is lost. The
/// launcher that serves the coordinator keeps the job's own record of losses and
/// replacements beside it, in `events.jsonl`.
pub(super) struct Timeline {
    epoch: u64,
    phase: WorkerState,
    /// The members of the last quorum this worker joined.
    members: Vec<WorkerId>,
    /// Why the current epoch is ending, as the shell saw it.
    pub(super) why: Option<String>,
}

impl Timeline {
    pub(super) fn new(worker: &Worker) -> Timeline {
        let s = worker.status();
        Timeline { epoch: s.epoch, phase: s.phase, members: Vec::new(), why: None }
    }

    /// Writes what changed since the last call; returns the line that says a change of
    /// membership, if there was one.
    pub(super) fn observe(&mut self, worker: &Worker, metrics: &mut MetricsFile) -> Result<Option<String>, TrainError> {
        let s = worker.status();
        if (s.epoch, s.phase) == (self.epoch, self.phase) {
            return Ok(None);
        }
        let mut note = None;
        let member = |p: WorkerState| matches!(p, WorkerState::Syncing | WorkerState::Synced | WorkerState::Stepping);
        // Leaving the epoch for `Done` (the last step applied) or `Finished` is no failure.
        if member(self.phase) && !member(s.phase) && matches!(s.phase, WorkerState::Idle | WorkerState::Stopped) {
            let why = self.why.take();
            metrics.write(json!({"kind": "epoch_ended", "epoch": self.epoch, "step": s.step, "why": why}))?;
        }
        if let Some(q) = worker.quorum().filter(|q| q.epoch == s.epoch && s.epoch != self.epoch) {
            self.why = None;
            // The lowest-ranked member of the last stage holds the loss (members are in rank
            // order; in a data-parallel job every member is of the one stage).
            let last = q.stages.len() - 1;
            metrics.hold(q.members.iter().find(|&&m| q.stage_of(m) == last) == Some(&worker.id()))?;
            metrics.write(json!({
                "kind": "quorum", "epoch": q.epoch, "members": q.members, "step": q.step,
                "sources": q.state_of(worker.id()).sources, "synced": s.phase == WorkerState::Synced,
            }))?;
            let left: Vec<WorkerId> = self.members.iter().copied().filter(|m| !q.members.contains(m)).collect();
            let joined: Vec<WorkerId> = q.members.iter().copied().filter(|m| !self.members.contains(m)).collect();
            let mut said = Vec::new();
            if !self.members.is_empty() {
                for (kind, workers, verb) in [("members_left", &left, "left"), ("members_joined", &joined, "joined")] {
                    if !workers.is_empty() {
                        metrics.write(json!({"kind": kind, "workers": workers, "epoch": q.epoch, "step": q.step}))?;
                        said.push(format!("workers {workers:?} {verb}"));
                    }
                }
            }
            if !said.is_empty() {
                let n = q.members.len();
                let epoch = comm::control::epoch_text(q.epoch);
                note = Some(format!("{} at step {} (epoch {epoch}: {n} workers)", said.join(", "), q.step));
            }
            self.members.clone_from(&q.members);
        }
        if s.phase == WorkerState::Stepping && self.phase != WorkerState::Stepping {
            metrics.write(json!({"kind": "epoch_started", "epoch": s.epoch, "step": s.step}))?;
        }
        (self.epoch, self.phase) = (s.epoch, s.phase);
        Ok(note)
    }
}
