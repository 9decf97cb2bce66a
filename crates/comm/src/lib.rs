//! # comm: who the workers are, and how a job decides
//!
//! This crate is the control plane of data-parallel training; the transport and the
//! collectives it runs on are the `net` crate's, re-exported here ([`transport`],
//! [`collective`], [`ReduceMode`], ...) so that a worker names one crate. From the bottom
//! up:
//! - [`rendezvous`]: how workers find each other through the coordinator; [`etcd`]: or
//!   in etcd, whose leases and watch then keep the membership (feature `etcd`), and where
//!   an elastic job elects its coordinator and keeps its workers' leases;
//! - [`membership`] (the protocol, no I/O) and [`supervisor`] (its socket shell):
//!   heartbeats, and the coordinator's reports of lost members;
//! - [`commit`]: the per-step vote that decides whether anyone applies an update, by the
//!   one [`majority`] rule that every comparison of replicas uses;
//! - [`protocol`]: the step protocol of an elastic job (quorums, the phases of a step,
//!   join, leave, rolling forward, fetching state, the checks and the checkpoints'
//!   agreement) as two state machines without I/O, and [`sim`], a seeded simulated
//!   network that runs them under kills, hangs, cut links, lost messages, coordinator
//!   restarts and corruption;
//! - the protocol's socket shells: [`control`] (the coordinator, and a worker's link to
//!   it, which dials the coordinator its [`directory`] names and judges its silence with a
//!   [`watch`]), [`port`] (a worker's listening port: the mesh of each epoch, and transfers) and
//!   [`transfer`] (chunked, checksummed state transfer from several replicas at once);
//! - [`job`]: a worker's place in its job, as a launcher hands it over, and [`record`]:
//!   the job's record of what happened to its workers.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod awake;
pub mod commit;
pub mod control;
pub mod directory;
pub mod etcd;
pub mod job;
pub mod majority;
pub mod member;
pub mod membership;
pub mod port;
pub mod protocol;
pub mod record;
pub mod rendezvous;
pub mod sim;
pub mod supervisor;
pub mod transfer;
pub mod watch;

#[cfg(feature = "mpi")]
pub use net::mpi;
pub use net::{
    ReduceMode, collective, frame, gate, group, handshake, local, reduce_in_order, sum_parts, sum_parts_into, transport,
};
