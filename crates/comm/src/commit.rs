//! The per-step commit vote: nobody applies an update unless every member can.
//!
//! After the gradient all-reduce each rank casts a [`Ballot`]:
//! - `ok`: its own checks passed (the summed loss and gradient are finite);
//! - `digest`: a hash of the summed gradient it is about to apply. Every rank holds the
//!   same sum after a correct all-reduce, so a digest that differs from the others'
//!   exposes a corrupted buffer on that rank before the corruption reaches the weights;
//! - `durable`: the newest step whose checkpoint part this rank has made durable, which
//!   tells the checkpoint committer when every part of a checkpoint is on disk.
//!
//! The ballots are gathered on every rank ([`vote`]) and every rank reaches the same
//! [`Decision`] with the pure function [`decide`]: commit only if every ballot is ok and
//! all digests agree. If a rank cannot vote (it died, or the all-reduce failed), the
//! vote itself fails on every survivor within the timeout, and nobody commits.

use std::time::Duration;

use crate::collective::all_gather_words;
use crate::transport::{CommError, Transport};

/// One rank's vote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ballot {
    /// This rank's checks passed.
    pub ok: bool,
    /// Hash of the reduced gradient this rank would apply (0 in a job of one rank, which
    /// has nobody to compare it with).
    pub digest: u64,
    /// Newest step with this rank's checkpoint part durable (0: none).
    pub durable: u64,
}

/// What every rank does with the step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Apply the update.
    Commit,
    /// Nobody applies it.
    Abort {
        /// Ranks whose own checks failed.
        vetoed: Vec<usize>,
        /// Ranks outvoted on their digest by the [`majority`](crate::majority) rule (every
        /// rank when no digest is held by more than half).
        disagreeing: Vec<usize>,
    },
}

/// The decision for a full set of ballots, indexed by rank.
pub fn decide(ballots: &[Ballot]) -> Decision {
    decide_in_groups(ballots, &vec![0; ballots.len()])
}

/// The decision for a job whose ranks hold different sums by group (`group_of[rank]`; the
/// stages of a pipeline, each with its own parameters): every ballot must be ok, and the
/// digests are compared within each group only.
pub fn decide_in_groups(ballots: &[Ballot], group_of: &[usize]) -> Decision {
    let vetoed: Vec<usize> = (0..ballots.len()).filter(|&r| !ballots[r].ok).collect();
    let mut disagreeing = Vec::new();
    let mut groups: Vec<usize> = group_of.to_vec();
    groups.sort_unstable();
    groups.dedup();
    for g in groups {
        let members: Vec<usize> = (0..ballots.len()).filter(|&r| group_of.get(r) == Some(&g)).collect();
        let digests: Vec<u64> = members.iter().map(|&r| ballots[r].digest).collect();
        disagreeing.extend(crate::majority::suspects(&digests).into_iter().map(|i| members[i]));
    }
    disagreeing.sort_unstable();
    if vetoed.is_empty() && disagreeing.is_empty() { Decision::Commit } else { Decision::Abort { vetoed, disagreeing } }
}

/// The newest step that every rank has made durable.
pub fn durable_everywhere(ballots: &[Ballot]) -> u64 {
    ballots.iter().map(|b| b.durable).min().unwrap_or(0)
}

/// Gathers every rank's ballot and decides. Fails (on every survivor, within `timeout`
/// per ring step) if a rank cannot take part.
pub fn vote(t: &dyn Transport, ballot: Ballot, timeout: Duration) -> Result<(Decision, Vec<Ballot>), CommError> {
    Ok(tally(&all_gather_words(t, &ballot.words(), timeout)?))
}

impl Ballot {
    /// The ballot as the words a collective gathers.
    pub fn words(&self) -> [u64; 3] {
        [u64::from(self.ok), self.digest, self.durable]
    }
}

/// The ballots of every rank, gathered as [`Ballot::words`] by any collective, and the
/// decision.
pub fn tally(words: &[Vec<u64>]) -> (Decision, Vec<Ballot>) {
    tally_in_groups(words, &vec![0; words.len()])
}

/// [`tally`] by [`decide_in_groups`].
pub fn tally_in_groups(words: &[Vec<u64>], group_of: &[usize]) -> (Decision, Vec<Ballot>) {
    let ballots: Vec<Ballot> = words
        .iter()
        .map(|w| Ballot {
            ok: w.first() == Some(&1),
            digest: w.get(1).copied().unwrap_or(0),
            durable: w.get(2).copied().unwrap_or(0),
        })
        .collect();
    (decide_in_groups(&ballots, group_of), ballots)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(digest: u64) -> Ballot {
        Ballot { ok: true, digest, durable: 0 }
    }

    #[test]
    fn groups_compare_digests_among_themselves() {
        // Two stages of two replicas: ranks 0 and 2 hold one sum, 1 and 3 another.
        let groups = [0, 1, 0, 1];
        assert_eq!(decide_in_groups(&[ok(7), ok(9), ok(7), ok(9)], &groups), Decision::Commit);
        assert_eq!(
            decide(&[ok(7), ok(9), ok(7), ok(9)]),
            Decision::Abort { vetoed: vec![], disagreeing: vec![0, 1, 2, 3] }
        );
        // Three replicas of two stages: rank 3 is outvoted within its stage.
        let groups = [0, 1, 0, 1, 0, 1];
        let d = decide_in_groups(&[ok(7), ok(9), ok(7), ok(8), ok(7), ok(9)], &groups);
        assert_eq!(d, Decision::Abort { vetoed: vec![], disagreeing: vec![3] });
        let mut veto = ok(9);
        veto.ok = false;
        let d = decide_in_groups(&[ok(7), veto, ok(7), ok(9)], &[0, 1, 0, 1]);
        assert_eq!(d, Decision::Abort { vetoed: vec![1], disagreeing: vec![] });
    }

    #[test]
    fn unanimous_ballots_commit() {
        assert_eq!(decide(&[ok(7), ok(7), ok(7)]), Decision::Commit);
        assert_eq!(decide(&[ok(7)]), Decision::Commit);
    }

    #[test]
    fn one_veto_aborts_for_everyone() {
        let mut b = vec![ok(7); 4];
        b[2].ok = false;
        assert_eq!(decide(&b), Decision::Abort { vetoed: vec![2], disagreeing: vec![] });
    }

    #[test]
    fn a_different_digest_names_the_minority() {
        assert_eq!(decide(&[ok(7), ok(7), ok(9)]), Decision::Abort { vetoed: vec![], disagreeing: vec![2] });
        assert_eq!(decide(&[ok(9), ok(7), ok(7), ok(7)]), Decision::Abort { vetoed: vec![], disagreeing: vec![0] });
        // Without a strict majority nobody can be named: every rank is suspect.
        assert_eq!(decide(&[ok(1), ok(2)]), Decision::Abort { vetoed: vec![], disagreeing: vec![0, 1] });
    }

    #[test]
    fn durability_is_the_minimum_over_ranks() {
        let b = [Ballot { durable: 30, ..ok(1) }, Ballot { durable: 20, ..ok(1) }, Ballot { durable: 30, ..ok(1) }];
        assert_eq!(durable_everywhere(&b), 20);
        assert_eq!(durable_everywhere(&[]), 0);
    }
}
