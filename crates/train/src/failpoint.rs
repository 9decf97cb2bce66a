//! Process faults at the named phases of a step (`--fault`): the crash, hang or cut of
//! [`fault::crash`], carried out on this process.

use std::sync::Arc;
use std::time::Instant;

use fault::crash::{Kind, Phase, ProcessFault, When};

/// Which step and which rank (or simulated replica) a hook is called for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct At {
    /// The step (0-based: the one that turns state `step` into `step + 1`).
    pub step: u64,
    /// The rank.
    pub rank: usize,
}

/// The process faults of this run, and how to cut this process's links.
#[derive(Clone, Default)]
pub struct ProcessFaults {
    faults: Vec<ProcessFault>,
    started: Option<Instant>,
    cut: Option<Arc<dyn Fn() + Send + Sync>>,
}

impl std::fmt::Debug for ProcessFaults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessFaults").field("faults", &self.faults).field("started", &self.started).finish()
    }
}

impl ProcessFaults {
    /// `faults`, with random ones timed from `started`.
    pub fn new(faults: Vec<ProcessFault>, started: Instant) -> Self {
        ProcessFaults { faults, started: Some(started), cut: None }
    }

    /// The faults of process `incarnation` of a worker's slot (the launcher's count of
    /// the processes it started there): faults at a named step and phase strike only the
    /// first process, so that a replacement that runs the same step again does not die the
    /// same death; random faults draw another moment for each process.
    pub fn for_incarnation(mut self, incarnation: u64) -> Self {
        if incarnation > 0 {
            self.faults.retain(|f| matches!(f.when, When::Random { .. }));
            for f in &mut self.faults {
                if let When::Random { seed, .. } = &mut f.when {
                    *seed = repro::rng::Stream::for_purpose(*seed, "fault.incarnation", &[incarnation]).next_u64();
                }
            }
        }
        self
    }

    /// How a `cut` fault closes this process's links (a data-parallel rank's mesh and
    /// coordinator connection); without it, a cut only silences the process.
    pub fn on_cut(&mut self, cut: Arc<dyn Fn() + Send + Sync>) {
        self.cut = Some(cut);
    }

    /// This process reached `phase` of step `at`: a fault that fires there is carried out
    /// (and a crash, hang or cut never returns while it lasts).
    pub fn reach(&self, at: At, phase: Phase) {
        if self.faults.is_empty() {
            return;
        }
        let elapsed = self.started.map_or(std::time::Duration::ZERO, |s| s.elapsed());
        let Some(f) = self.faults.iter().find(|f| f.fires(at.rank, at.step, phase, elapsed)) else { return };
        tracing::error!(rank = at.rank, step = at.step, %phase, "fault injection: {} of this process", f.kind.name());
        match f.kind {
            Kind::Crash => std::process::abort(),
            Kind::Hang => stop_this_process(),
            Kind::Cut => {
                if let Some(cut) = &self.cut {
                    cut();
                }
                loop {
                    std::thread::sleep(std::time::Duration::from_secs(3600));
                }
            }
        }
    }
}

/// Stops this process with SIGSTOP: alive, silent, until someone continues or kills it.
fn stop_this_process() {
    let pid = std::process::id().to_string();
    if let Err(e) = std::process::Command::new("kill").args(["-STOP", &pid]).status() {
        tracing::error!("cannot stop this process: {e}");
    }
}
