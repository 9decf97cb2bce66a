//! Process faults for testing recovery: a worker crashes, hangs or loses its links at a
//! named phase of a given step, or at random moments.
//!
//! The text form is what `steadfast train --fault` takes:
//!
//! ```
//! use fault::crash::{Kind, Phase, ProcessFault, When};
//!
//! let f: ProcessFault = "crash:rank=1,step=5,phase=vote".parse().unwrap();
//! assert_eq!(f.kind, Kind::Crash);
//! assert_eq!(f.when, When::At { rank: 1, step: 5, phase: Phase::Vote });
//! // Random crashes: each rank draws its moment from an exponential distribution.
//! let r: ProcessFault = "crash:mtbf=30,seed=7".parse().unwrap();
//! assert!(r.deadline(0).is_some());
//! ```
//!
//! - `crash`: the process ends at once, with no cleanup, as a SIGKILL would end it;
//! - `hang`: the process stops itself (SIGSTOP): alive, but silent;
//! - `cut`: every link of the process (to its peers and to the coordinator) closes, and
//!   the process stays alive and silent.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// A named point in a training step where a process fault can fire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    /// Before the forward pass of the rank's first micro-batch.
    Forward,
    /// After the rank's first micro-batch's gradients are written, while the rest of
    /// the backward work of the step is under way.
    Backward,
    /// Before the gradients are all-reduced (the peers are already waiting in it).
    Allreduce,
    /// Before the commit vote.
    Vote,
    /// After the vote, before the update is applied.
    Update,
    /// Before the snapshot of the checkpoint taken after the step's update (only at steps
    /// that checkpoint).
    Checkpoint,
    /// During a state transfer to a worker that joins. No transfer happens yet: jobs stop
    /// on a lost worker, and this phase is never reached until they recover from one.
    Transfer,
}

impl Phase {
    /// Every phase, in the order of a step.
    pub const ALL: [Phase; 7] = [
        Phase::Forward,
        Phase::Backward,
        Phase::Allreduce,
        Phase::Vote,
        Phase::Update,
        Phase::Checkpoint,
        Phase::Transfer,
    ];

    /// The phase's word.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::Allreduce => "allreduce",
            Phase::Vote => "vote",
            Phase::Update => "update",
            Phase::Checkpoint => "checkpoint",
            Phase::Transfer => "transfer",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Phase {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Phase::ALL.into_iter().find(|p| p.name() == s).ok_or_else(|| {
            let names: Vec<&str> = Phase::ALL.iter().map(|p| p.name()).collect();
            format!("unknown phase {s:?}: expected {}", names.join(", "))
        })
    }
}

/// What happens to the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// It ends at once.
    Crash,
    /// It stops itself (SIGSTOP).
    Hang,
    /// Its links close; it stays alive and silent.
    Cut,
}

impl Kind {
    /// The kind's word.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Crash => "crash",
            Kind::Hang => "hang",
            Kind::Cut => "cut",
        }
    }
}

/// When it happens.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum When {
    /// At a phase of a step, on one rank.
    At {
        /// The rank.
        rank: usize,
        /// The step (0-based: the step that turns state `step` into `step + 1`).
        step: u64,
        /// The phase.
        phase: Phase,
    },
    /// At the first phase reached after a random moment, drawn for each rank from an
    /// exponential distribution of mean `mtbf` seconds (from the start of training) with
    /// the seed and the rank.
    Random {
        /// Mean time between failures, seconds.
        mtbf: f64,
        /// The seed.
        seed: u64,
    },
}

/// A process fault: what and when.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProcessFault {
    /// What.
    pub kind: Kind,
    /// When.
    pub when: When,
}

/// A process fault that cannot be parsed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad fault {text:?}: {reason} (e.g. 'crash:rank=1,step=5,phase=vote' or 'crash:mtbf=60,seed=1')")]
pub struct BadProcessFault {
    /// The text given.
    pub text: String,
    /// What is wrong.
    pub reason: String,
}

impl FromStr for ProcessFault {
    type Err = BadProcessFault;
    fn from_str(text: &str) -> Result<Self, BadProcessFault> {
        let bad = |reason: String| BadProcessFault { text: text.to_owned(), reason };
        let (kind, rest) = text.split_once(':').ok_or_else(|| bad("expected KIND:KEY=VALUE,...".into()))?;
        let kind = match kind.trim() {
            "crash" => Kind::Crash,
            "hang" => Kind::Hang,
            "cut" => Kind::Cut,
            other => return Err(bad(format!("unknown kind {other:?}: expected crash, hang or cut"))),
        };
        let (mut rank, mut step, mut phase, mut mtbf, mut seed) = (None, None, Phase::Forward, None, 0);
        for pair in rest.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').ok_or_else(|| bad(format!("{pair:?} is not key=value")))?;
            let number = |v: &str| v.parse::<u64>().map_err(|_| bad(format!("{key}={v} is not a whole number")));
            match key {
                "rank" => rank = Some(number(value)? as usize),
                "step" => step = Some(number(value)?),
                "phase" => phase = value.parse().map_err(bad)?,
                "mtbf" => {
                    let m: f64 = value.parse().map_err(|_| bad(format!("mtbf={value} is not a number of seconds")))?;
                    if !(m.is_finite() && m > 0.0) {
                        return Err(bad(format!("mtbf={value} must be a positive number of seconds")));
                    }
                    mtbf = Some(m);
                }
                "seed" => seed = number(value)?,
                other => return Err(bad(format!("unknown key {other:?}"))),
            }
        }
        let when = match (rank, step, mtbf) {
            (Some(rank), Some(step), None) => When::At { rank, step, phase },
            (None, None, Some(mtbf)) => When::Random { mtbf, seed },
            (_, _, Some(_)) => return Err(bad("mtbf= does not go with rank= or step=".into())),
            _ => return Err(bad("give rank= and step= (and phase=), or mtbf=".into())),
        };
        Ok(ProcessFault { kind, when })
    }
}

impl ProcessFault {
    /// For a random fault, the moment (after the start of training) at which `rank`
    /// fails.
    pub fn deadline(&self, rank: usize) -> Option<Duration> {
        let When::Random { mtbf, seed } = self.when else { return None };
        let mut s = repro::rng::Stream::for_purpose(seed, "fault.crash", &[rank as u64]);
        // Inverse transform: -mtbf * ln(1 - u), u uniform in [0, 1).
        let u = f64::from(s.next_u32()) / 4_294_967_296.0;
        Some(Duration::from_secs_f64(-mtbf * (1.0 - u).ln()))
    }

    /// Whether the fault fires on `rank` at `phase` of `step`, `elapsed` after the start
    /// of training.
    pub fn fires(&self, rank: usize, step: u64, phase: Phase, elapsed: Duration) -> bool {
        match self.when {
            When::At { rank: r, step: s, phase: p } => (r, s, p) == (rank, step, phase),
            When::Random { .. } => self.deadline(rank).is_some_and(|d| elapsed >= d),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_phase_and_kind_parses_and_bad_text_is_named() {
        for p in Phase::ALL {
            for k in ["crash", "hang", "cut"] {
                let f: ProcessFault = format!("{k}:rank=2,step=9,phase={p}").parse().unwrap();
                assert_eq!(f.kind.name(), k);
                assert_eq!(f.when, When::At { rank: 2, step: 9, phase: p });
            }
        }
        let f: ProcessFault = "hang:rank=0,step=3".parse().unwrap();
        assert_eq!(f.when, When::At { rank: 0, step: 3, phase: Phase::Forward }, "forward by default");
        for (text, needle) in [
            ("crash", "KIND:"),
            ("explode:rank=1,step=2", "unknown kind"),
            ("crash:rank=1", "give rank= and step="),
            ("crash:rank=1,step=2,phase=lunch", "unknown phase \"lunch\""),
            ("crash:rank=x,step=2", "rank=x"),
            ("crash:mtbf=-3", "positive"),
            ("crash:mtbf=30,rank=1", "does not go with"),
            ("crash:rank=1,step=2,colour=red", "unknown key"),
        ] {
            let e = text.parse::<ProcessFault>().unwrap_err().to_string();
            assert!(e.contains(needle), "{text}: {e}");
        }
    }

    #[test]
    fn a_fault_fires_only_at_its_rank_step_and_phase() {
        let f: ProcessFault = "crash:rank=1,step=5,phase=vote".parse().unwrap();
        assert!(f.fires(1, 5, Phase::Vote, Duration::ZERO));
        assert!(!f.fires(0, 5, Phase::Vote, Duration::ZERO));
        assert!(!f.fires(1, 4, Phase::Vote, Duration::ZERO));
        assert!(!f.fires(1, 5, Phase::Update, Duration::ZERO));
    }

    #[test]
    fn random_faults_are_drawn_per_rank_from_the_seed_with_the_given_mean() {
        let f: ProcessFault = "crash:mtbf=10,seed=3".parse().unwrap();
        assert_eq!(f.deadline(4), f.deadline(4), "a function of the seed and rank");
        assert_ne!(f.deadline(4), f.deadline(5));
        let d = f.deadline(2).unwrap();
        assert!(!f.fires(2, 0, Phase::Forward, d.saturating_sub(Duration::from_nanos(1))));
        assert!(f.fires(2, 0, Phase::Forward, d));
        let mean = (0..4000).map(|r| f.deadline(r).unwrap().as_secs_f64()).sum::<f64>() / 4000.0;
        assert!((mean - 10.0).abs() < 0.6, "mean {mean}");
    }
}
