//! Some of a job's ranks seen as a job of their own: a [`Group`] is a [`Transport`] whose
//! rank `i` is the `i`-th member of the job's transport, so that every collective runs
//! on it unchanged. The data-parallel replicas of one pipeline stage sum their gradients
//! on such a group while the other stages sum theirs on their own groups.
//!
//! Errors name the job's ranks, not the group's: the peer that was lost is the one a
//! person can find.

use std::time::Instant;

use crate::frame::Frame;
use crate::transport::{CommError, Transport};

/// The ranks `members` of the job `inner`, this rank among them.
pub struct Group<'a> {
    inner: &'a dyn Transport,
    members: Vec<usize>,
    me: usize,
}

impl<'a> Group<'a> {
    /// The group of `members` (job ranks, each once) of `inner`, whose rank must be one of
    /// them.
    pub fn new(inner: &'a dyn Transport, members: Vec<usize>) -> Result<Group<'a>, CommError> {
        let world = inner.world();
        let mut seen = vec![false; world];
        for &m in &members {
            if m >= world || std::mem::replace(&mut seen[m], true) {
                return Err(CommError::Setup(format!("the group {members:?} is not a set of the {world} ranks")));
            }
        }
        let me = members
            .iter()
            .position(|&m| m == inner.rank())
            .ok_or_else(|| CommError::Setup(format!("rank {} is not in the group {members:?}", inner.rank())))?;
        Ok(Group { inner, members, me })
    }

    /// The job rank of the group's rank `i`.
    fn member(&self, i: usize) -> Result<usize, CommError> {
        self.members.get(i).copied().ok_or_else(|| CommError::Protocol {
            peer: i,
            reason: format!("no rank {i} in a group of {}", self.members.len()),
        })
    }
}

impl Transport for Group<'_> {
    fn rank(&self) -> usize {
        self.me
    }

    fn world(&self) -> usize {
        self.members.len()
    }

    fn send(&self, to: usize, kind: u8, payload: &[u8]) -> Result<(), CommError> {
        self.inner.send(self.member(to)?, kind, payload)
    }

    fn recv(&self, from: usize, deadline: Instant) -> Result<Frame, CommError> {
        self.inner.recv(self.member(from)?, deadline)
    }

    fn recv_into(&self, from: usize, deadline: Instant, payload: &mut Vec<u8>) -> Result<u8, CommError> {
        self.inner.recv_into(self.member(from)?, deadline, payload)
    }

    fn recv_exact(&self, from: usize, deadline: Instant, payload: &mut [u8]) -> Result<u8, CommError> {
        self.inner.recv_exact(self.member(from)?, deadline, payload)
    }

    fn room(&self, to: usize) -> usize {
        self.member(to).map_or(0, |m| self.inner.room(m))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::ReduceMode;
    use crate::collective::Reducer;
    use crate::transport::mem_network;

    #[test]
    fn two_groups_of_a_job_sum_apart_at_the_same_time() {
        // Ranks 0 and 2 form one group, 1 and 3 the other; each rank holds its rank + 1.
        let net = mem_network(4);
        let sums: Vec<f32> = std::thread::scope(|s| {
            let handles: Vec<_> = net
                .iter()
                .map(|t| {
                    s.spawn(move || {
                        let members = if t.rank() % 2 == 0 { vec![0, 2] } else { vec![1, 3] };
                        let g = Group::new(t, members).unwrap();
                        let mut out = [0.0f32; 3];
                        let part = [t.rank() as f32 + 1.0; 3];
                        Reducer::default()
                            .sum_parts(&g, &[part], &mut out, ReduceMode::Reproducible, Duration::from_secs(5))
                            .unwrap();
                        out[0]
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(sums, [4.0, 6.0, 4.0, 6.0]);
    }

    #[test]
    fn a_group_must_hold_this_rank_once() {
        let net = mem_network(3);
        assert!(Group::new(&net[0], vec![1, 2]).is_err());
        assert!(Group::new(&net[0], vec![0, 0]).is_err());
        assert!(Group::new(&net[0], vec![0, 3]).is_err());
        let g = Group::new(&net[2], vec![2, 0]).unwrap();
        assert_eq!((g.rank(), g.world()), (0, 2));
        assert!(matches!(g.send(2, 1, &[]), Err(CommError::Protocol { .. })));
    }
}
