//! The collectives of a job on the system's MPI library (feature `mpi`): the engine for
//! static clusters, started by `mpirun` or `srun`.
//!
//! A job on MPI takes its rank and size from MPI and runs each collective of a step on
//! MPI's own collectives, whatever algorithm the library picks for its interconnect:
//!
//! - **`fast`**: the local sum of this rank's parts, then `MPI_Allreduce(MPI_FLOAT,
//!   MPI_SUM)`. The bits depend on the library's algorithm and on the world size.
//! - **`deterministic`**: every rank's local sum is gathered (`MPI_Allgather`) and added in
//!   rank order on every rank: the same bits run after run for a fixed world size, whatever
//!   algorithm the library picks (not the bits of Steadfast's own ring, which adds in
//!   another order).
//! - **`reproducible`**: the two phases of [`repro::batched`] on integers. The exponent of
//!   each element is the maximum over ranks (`MPI_MAX` on bytes), and the fixed-point terms
//!   are summed as 64-bit integers (`MPI_SUM`). Both operations are associative and
//!   commutative on integers, so however the library groups them the sum has the bits of
//!   single-process `train`, for every world size. When every rank holds one part, the
//!   terms go to their chunk's owner as floats instead, the owner sums them as
//!   `crate::owner_sum` describes, and the owners' sums are gathered: the same bits, the
//!   float sum's 4 bytes per element each way, and no pass for the scales before the sum.
//!   On one node the terms travel by `MPI_Alltoallv` and the sums by `MPI_Allgatherv`;
//!   across nodes as messages, one from each rank to each owner, all posted at once, and
//!   the sums round a ring of `MPI_Sendrecv` (on 4 hosts at 1 Gbit/s Open MPI's own
//!   schedules for those two collectives took up to 1.4x as long, docs/clusters.md).
//!   `STEADFAST_MPI_OWNERS=collectives` or `=messages` overrides the choice.
//!
//! MPI's collectives have no deadline: a rank that dies takes the job down with it (the
//! library's default error handler aborts every rank). That is the static-cluster mode:
//! the job is restarted from its last checkpoint (`steadfast launch --engine mpi`), and the
//! fault-tolerant path of recovery from live replicas stays on Steadfast's transport.

use mpi::Count;
use mpi::collective::SystemOperation;
use mpi::datatype::{Partition, PartitionMut};
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator, CommunicatorCollectives, Destination, Equivalence, Source};

use crate::ReduceMode;
use crate::transport::CommError;

/// How the terms of a reproducible sum of one part per rank reach their owners, and the
/// owners' sums every rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OwnersRoute {
    /// `MPI_Alltoallv`, then `MPI_Allgatherv`: the faster when every rank shares a node.
    Collectives,
    /// One message from each rank to each owner, all posted at once, then the sums round a
    /// ring (`MPI_Sendrecv`): the faster across nodes.
    Messages,
}

/// The tags of the owners' route's messages: the terms, and the owners' sums.
const TERMS: i32 = 1;
const SUMS: i32 = 2;

/// This process's place in an MPI job, and the buffers its collectives reuse.
pub struct MpiWorld {
    world: SimpleCommunicator,
    mine: Vec<f32>,
    exps: Vec<u8>,
    exps_all: Vec<u8>,
    acc: Vec<i64>,
    acc_all: Vec<i64>,
    gathered: Vec<f32>,
    /// How the reproducible sums of one part per rank reach the owners and back.
    owners_route: OwnersRoute,
    local: repro::batched::Scratch,
    // Declared last, so dropped last: finalizes MPI after the communicator is gone.
    _universe: mpi::environment::Universe,
}

impl MpiWorld {
    /// Initializes MPI (once per process). Only the calling thread makes MPI calls
    /// afterwards; the trainer's compute threads never do.
    pub fn init() -> Result<MpiWorld, CommError> {
        let (universe, _) = mpi::initialize_with_threading(mpi::Threading::Funneled)
            .ok_or_else(|| CommError::Setup("MPI is already initialized in this process".into()))?;
        let world = universe.world();
        let owners_route = match std::env::var("STEADFAST_MPI_OWNERS").as_deref() {
            Ok("collectives") => OwnersRoute::Collectives,
            Ok("messages") => OwnersRoute::Messages,
            Ok(other) => {
                return Err(CommError::Setup(format!(
                    "STEADFAST_MPI_OWNERS is {other:?}: say \"collectives\" (MPI_Alltoallv, MPI_Allgatherv) \
                     or \"messages\" (point to point, the sums round a ring), or leave it unset to choose by \
                     whether the ranks share a node"
                )));
            }
            Err(_) if world.split_shared(world.rank()).size() == world.size() => OwnersRoute::Collectives,
            Err(_) => OwnersRoute::Messages,
        };
        Ok(MpiWorld {
            world,
            mine: Vec::new(),
            exps: Vec::new(),
            exps_all: Vec::new(),
            acc: Vec::new(),
            acc_all: Vec::new(),
            gathered: Vec::new(),
            owners_route,
            local: repro::batched::Scratch::default(),
            _universe: universe,
        })
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.world.rank() as usize
    }

    /// The number of ranks.
    pub fn world(&self) -> usize {
        self.world.size() as usize
    }

    /// The element-wise sum over every rank of every rank's `parts`, into `out` (whose
    /// length is that of every part), in `mode` (see the module's documentation).
    pub fn sum_parts<P: AsRef<[f32]> + Sync>(
        &mut self,
        parts: &[P],
        out: &mut [f32],
        mode: ReduceMode,
    ) -> Result<(), CommError> {
        if parts.iter().any(|p| p.as_ref().len() != out.len()) {
            return Err(CommError::Setup("parts of different lengths".into()));
        }
        let n = out.len();
        match mode {
            ReduceMode::Fast => {
                self.mine.resize(n, 0.0);
                crate::sum_parts_into(mode, parts, &mut self.mine, &mut self.local);
                self.world.all_reduce_into(&self.mine[..], out, SystemOperation::sum());
            }
            ReduceMode::Deterministic => {
                crate::sum_parts_into(mode, parts, out, &mut self.local);
                self.gathered.resize(n * self.world(), 0.0);
                self.world.all_gather_into(&*out, &mut self.gathered[..]);
                out.copy_from_slice(&self.gathered[..n]);
                for rank in self.gathered.chunks_exact(n).skip(1) {
                    for (o, x) in out.iter_mut().zip(rank) {
                        *o += x;
                    }
                }
            }
            ReduceMode::Reproducible | ReduceMode::Reproducible32 => {
                // Every rank learns the total count of parts, and refuses, alike, a sum that
                // its integers cannot hold; and whether every rank holds exactly one.
                let mut counts = [0u64; 2];
                let mine = [parts.len() as u64, u64::from(parts.len() != 1)];
                self.world.all_reduce_into(&mine[..], &mut counts[..], SystemOperation::sum());
                mode.check_parts(counts[0], self.world())?;
                // MPI counts elements in C ints.
                let one_each = counts[1] == 0 && n as u64 + 64 * self.world() as u64 <= Count::MAX as u64;
                match (mode, one_each) {
                    (ReduceMode::Reproducible32, true) => {
                        self.at_owners::<i32>(parts[0].as_ref(), out, repro::batched::NARROW_HEADROOM)
                    }
                    (_, true) => self.at_owners::<i64>(parts[0].as_ref(), out, repro::batched::DEFAULT_HEADROOM),
                    (ReduceMode::Reproducible32, false) => {
                        self.reproducible::<i32, P>(parts, out, repro::batched::NARROW_HEADROOM)
                    }
                    (_, false) => self.reproducible::<i64, P>(parts, out, repro::batched::DEFAULT_HEADROOM),
                }
            }
        }
        Ok(())
    }

    /// The reproducible modes: the blocks' scales (their exponents' maximum), then the sum
    /// of `A` integers.
    fn reproducible<A, P>(&mut self, parts: &[P], out: &mut [f32], headroom: u32)
    where
        A: repro::batched::Fixed + Equivalence,
        P: AsRef<[f32]>,
    {
        let (n, nb) = (out.len(), repro::batched::blocks_of(out.len()));
        self.exps.clear();
        self.exps.resize(nb, 0);
        repro::batched::max_exponents_of(&mut self.exps, parts, 0..n);
        self.exps_all.resize(nb, 0);
        self.world.all_reduce_into(&self.exps[..], &mut self.exps_all[..], SystemOperation::max());
        let acc = repro::batched::words_as::<A>(&mut self.acc, n);
        repro::batched::write_fixed_of(acc, parts, 0..n, &self.exps_all, headroom);
        let acc_all = repro::batched::words_as::<A>(&mut self.acc_all, n);
        self.world.all_reduce_into(&*acc, &mut *acc_all, SystemOperation::sum());
        repro::batched::finish_into(acc_all, &self.exps_all, 0, headroom, out);
    }

    /// The reproducible modes when every rank holds one part, `part`: each rank receives
    /// every rank's terms of its chunk (whole blocks), sums them, and the sums are gathered.
    fn at_owners<A: repro::batched::Fixed>(&mut self, part: &[f32], out: &mut [f32], headroom: u32) {
        let (world, rank, n) = (self.world(), self.rank(), out.len());
        let chunks: Vec<_> = (0..world).map(|c| crate::owner_sum::block_chunk(n, world, c)).collect();
        let len = chunks[rank].len();
        match self.owners_route {
            OwnersRoute::Collectives => {
                let lens: Vec<Count> = chunks.iter().map(|c| c.len() as Count).collect();
                let starts: Vec<Count> = chunks.iter().map(|c| c.start as Count).collect();
                // Every rank's terms of this rank's chunk, one rank after another.
                self.gathered.resize(world * len, 0.0);
                let (from_each, at): (Vec<Count>, Vec<Count>) =
                    (0..world).map(|r| (len as Count, (r * len) as Count)).unzip();
                self.world.all_to_all_varcount_into(
                    &Partition::new(part, &lens[..], &starts[..]),
                    &mut PartitionMut::new(&mut self.gathered[..], &from_each[..], &at[..]),
                );
                self.mine.clear();
                self.mine.resize(len, 0.0);
                sum_gathered::<A>(&self.gathered, &mut self.mine, headroom, &mut self.acc);
                self.world
                    .all_gather_varcount_into(&self.mine[..], &mut PartitionMut::new(out, &lens[..], &starts[..]));
            }
            OwnersRoute::Messages => {
                self.exchange_terms(part, &chunks);
                sum_gathered::<A>(&self.gathered, &mut out[chunks[rank].clone()], headroom, &mut self.acc);
                self.ring_gather(&chunks, out);
            }
        }
    }

    /// [`Self::at_owners`] across nodes: every rank's terms of this rank's chunk arrive as
    /// one message from each rank (all posted at once), and the owners' sums travel round
    /// a ring, a chunk a step. Across 4 hosts at 1 Gbit/s this took 0.86x `fast` where
    /// Open MPI's `MPI_Alltoallv` and `MPI_Allgatherv` took 1.18x (16 MB; docs/clusters.md).
    fn exchange_terms(&mut self, part: &[f32], chunks: &[std::ops::Range<usize>]) {
        let (world, rank) = (self.world(), self.rank());
        let len = chunks[rank].len();
        self.gathered.resize(world * len, 0.0);
        self.gathered[rank * len..][..len].copy_from_slice(&part[chunks[rank].clone()]);
        let (comm, mut slots) = (&self.world, &mut self.gathered[..]);
        mpi::request::scope(|scope| {
            let mut pending = Vec::with_capacity(2 * world);
            for from in 0..world {
                let (slot, rest) = std::mem::take(&mut slots).split_at_mut(len);
                slots = rest;
                if from != rank {
                    pending.push(comm.process_at_rank(from as i32).immediate_receive_into_with_tag(scope, slot, TERMS));
                }
            }
            // Each rank sends first to the rank after it, so that no owner is every
            // rank's first destination.
            for step in 1..world {
                let to = (rank + step) % world;
                let piece = &part[chunks[to].clone()];
                pending.push(comm.process_at_rank(to as i32).immediate_send_with_tag(scope, piece, TERMS));
            }
            for request in pending {
                request.wait();
            }
        });
    }

    /// The owners' sums, `out[chunks[rank]]` on each rank, gathered into every rank's `out`
    /// round a ring: at each step a rank passes on the chunk it last received.
    fn ring_gather(&self, chunks: &[std::ops::Range<usize>], out: &mut [f32]) {
        let (world, rank) = (self.world(), self.rank());
        let (next, previous) = ((rank + 1) % world, (rank + world - 1) % world);
        let (to, from) = (self.world.process_at_rank(next as i32), self.world.process_at_rank(previous as i32));
        for step in 0..world - 1 {
            let sent = &chunks[(rank + world - step) % world];
            let received = &chunks[(rank + world - step - 1) % world];
            let (piece, slot) = apart(out, sent.clone(), received.clone());
            mpi::point_to_point::send_receive_into_with_tags(piece, &to, SUMS, slot, &from, SUMS);
        }
    }

    /// Every rank's `words` (the same count on every rank), indexed by rank.
    pub fn all_gather_words(&self, words: &[u64]) -> Vec<Vec<u64>> {
        let mut all = vec![0u64; words.len() * self.world()];
        self.world.all_gather_into(words, &mut all[..]);
        all.chunks_exact(words.len().max(1)).map(<[u64]>::to_vec).collect()
    }

    /// Waits until every rank has called it.
    pub fn barrier(&self) {
        self.world.barrier();
    }
}

/// The sum of the terms in `gathered` (one after another, each as long as `into`) into
/// `into`.
fn sum_gathered<A: repro::batched::Fixed>(gathered: &[f32], into: &mut [f32], headroom: u32, acc: &mut Vec<i64>) {
    if !into.is_empty() {
        let terms: Vec<&[f32]> = gathered.chunks_exact(into.len()).collect();
        crate::owner_sum::sum_terms::<A>(&terms, into, headroom, acc);
    }
}

/// `out[sent]` to read and `out[received]` to write, two ranges that do not overlap.
fn apart(out: &mut [f32], sent: std::ops::Range<usize>, received: std::ops::Range<usize>) -> (&[f32], &mut [f32]) {
    if sent.start < received.start {
        let (low, high) = out.split_at_mut(received.start);
        (&low[sent], &mut high[..received.len()])
    } else {
        let (low, high) = out.split_at_mut(sent.start);
        (&high[..sent.len()], &mut low[received])
    }
}
