//! Which of a job's worker slots each node runs (`--place`).
//!
//! A worker's slot is its id in the job, and a pipeline job's worker `id` holds stage
//! `id mod S` of replica `id / S` (see `comm::protocol`). How the slots are laid on the
//! nodes decides what a lost node takes with it:
//!
//! - `replicas` (the default): node `I` runs slots `I*N .. I*N+N-1` of `N` per node. With
//!   `N = S` a node is a whole replica: a lost node's stages are fetched again from the
//!   other replicas, and the replicas' sums cross the network while the boundary tensors
//!   stay on the node.
//! - `stages`: the slots are taken stage by stage (every replica's stage 0, then every
//!   replica's stage 1, ...), `N` to a node. With `N = R` replicas a node holds one stage of
//!   every replica: a stage's sum stays on its node and the boundary tensors cross the
//!   network, as large pipelines are laid out; a lost node's stage is lost in every
//!   replica and is replayed on its neighbours' boundary logs.
//!
//! ```
//! use launch::slots::{Placement, SlotMap};
//! // Two nodes of two workers, a pipeline of two stages (two replicas).
//! let by_replica = SlotMap::new(Placement::Replicas, 2, 2, 2);
//! assert_eq!(by_replica.of_node(1), vec![2, 3]);
//! let by_stage = SlotMap::new(Placement::Stages, 2, 2, 2);
//! assert_eq!(by_stage.of_node(0), vec![0, 2]); // stage 0 of replicas 0 and 1
//! assert_eq!(by_stage.of_node(1), vec![1, 3]); // stage 1 of replicas 0 and 1
//! assert_eq!(by_stage.node_of(3), 1);
//! ```

/// How a job's slots are laid on its nodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Placement {
    /// Node `I` runs slots `I*N ..`: whole replicas of a pipeline together.
    #[default]
    Replicas,
    /// Slots taken stage by stage: the same stage of several replicas together.
    Stages,
}

impl repro::words::Word for Placement {
    const KIND: &'static str = "placement";
    const ALL: &'static [Self] = &[Placement::Replicas, Placement::Stages];

    fn word(self) -> &'static str {
        match self {
            Placement::Replicas => "replicas",
            Placement::Stages => "stages",
        }
    }

    fn help(self) -> &'static str {
        match self {
            Placement::Replicas => "node I runs slots I*N to I*N+N-1: a pipeline's replicas whole on a node",
            Placement::Stages => "slots taken stage by stage: one stage of several replicas on a node",
        }
    }
}

repro::text_form!(Placement);

/// The slots of every node of a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotMap {
    placement: Placement,
    /// Workers per node.
    per_node: usize,
    /// Pipeline stages (1: data-parallel).
    stages: usize,
    /// Replicas of the pipeline under [`Placement::Stages`] (the job's workers over its
    /// stages).
    replicas: usize,
}

impl SlotMap {
    /// The slots of `nnodes` nodes of `per_node` workers each, for a job of `stages`
    /// pipeline stages. Under [`Placement::Stages`] the job's workers are whole
    /// pipelines (the launcher checks it first); a job of one stage is laid by replica
    /// whatever was asked, which is the same.
    pub fn new(placement: Placement, per_node: usize, nnodes: usize, stages: usize) -> SlotMap {
        let stages = stages.max(1);
        let world = per_node * nnodes;
        let placement = if stages == 1 || !world.is_multiple_of(stages) { Placement::Replicas } else { placement };
        SlotMap { placement, per_node: per_node.max(1), stages, replicas: (world / stages).max(1) }
    }

    /// The slots node `node` runs, in the order of its local ranks.
    pub fn of_node(&self, node: usize) -> Vec<usize> {
        let first = node * self.per_node;
        (first..first + self.per_node).map(|k| self.slot_at(k)).collect()
    }

    /// The node that runs `slot`.
    pub fn node_of(&self, slot: usize) -> usize {
        self.position_of(slot) / self.per_node
    }

    /// The slot at position `k` of the placement's order.
    fn slot_at(&self, k: usize) -> usize {
        match self.placement {
            Placement::Replicas => k,
            Placement::Stages => (k % self.replicas) * self.stages + k / self.replicas,
        }
    }

    /// The position of `slot` in the placement's order.
    fn position_of(&self, slot: usize) -> usize {
        match self.placement {
            Placement::Replicas => slot,
            Placement::Stages => (slot % self.stages) * self.replicas + slot / self.stages,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_slot_is_on_exactly_one_node_and_node_of_finds_it() {
        for placement in [Placement::Replicas, Placement::Stages] {
            for (per_node, nnodes, stages) in [(2, 2, 2), (3, 2, 3), (4, 3, 2), (2, 3, 3), (1, 4, 2), (6, 1, 3)] {
                let map = SlotMap::new(placement, per_node, nnodes, stages);
                let mut all: Vec<usize> = (0..nnodes).flat_map(|n| map.of_node(n)).collect();
                for n in 0..nnodes {
                    assert!(map.of_node(n).iter().all(|&s| map.node_of(s) == n), "{map:?}");
                }
                all.sort_unstable();
                assert_eq!(all, (0..per_node * nnodes).collect::<Vec<_>>(), "{map:?}");
            }
        }
    }

    #[test]
    fn by_stage_a_node_of_as_many_workers_as_replicas_holds_one_stage() {
        // 3 stages, 2 replicas, 3 nodes of 2: node I holds stage I of both replicas.
        let map = SlotMap::new(Placement::Stages, 2, 3, 3);
        for node in 0..3 {
            let slots = map.of_node(node);
            assert!(slots.iter().all(|s| s % 3 == node), "node {node}: {slots:?}");
            assert_eq!(slots.iter().map(|s| s / 3).collect::<Vec<_>>(), vec![0, 1]);
        }
    }

    #[test]
    fn one_stage_or_a_world_of_broken_pipelines_is_laid_by_replica() {
        assert_eq!(SlotMap::new(Placement::Stages, 2, 2, 1).of_node(1), vec![2, 3]);
        assert_eq!(SlotMap::new(Placement::Stages, 3, 1, 2).of_node(0), vec![0, 1, 2]);
    }
}
