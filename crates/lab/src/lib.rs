//! # lab: experiments built on the training runtime
//!
//! The training crate trains; this crate asks questions of training and writes down the
//! answers. It owns:
//!
//! - [`campaign`]: fault-injection campaigns: a golden run, then many trials, each resumed
//!   from the golden state in memory, injected, trained on over simulated data-parallel
//!   replicas that take the one step of [`train::step`], and judged; the detectors and
//!   their responses; their record (tables, summary, spec) is the `sdc` crate's, shared
//!   with the Python package's campaigns ([`campaign::output`]);
//! - [`report`]: a campaign's tables as one HTML page with plots;
//! - [`run_report`]: a training run's progress against time, with its failures and
//!   recoveries marked, from its `metrics.jsonl` and its job's record (`events.jsonl`);
//! - [`fpna`]: the floating-point non-associativity lab: sweeps of atomic, fixed-order and
//!   reproducible reductions, and training runs under atomic and reproducible gradient
//!   accumulation;
//! - [`bench`]: the measurements behind `docs/benchmarks.md` (checkpoint cost, all-reduce
//!   bandwidth, the training step's all-reduce in a job of processes);
//! - [`export`]: a run's starting weights and data order, for other systems to train on.
//!
//! The binary (`steadfast campaign`, `fpna`, `report`, `bench`) parses arguments, shows
//! progress and prints; every experiment's logic and outputs live here.
//!
//! ```no_run
//! let spec = lab::campaign::Spec::parse(&std::fs::read_to_string("examples/campaign-mlp.toml").unwrap()).unwrap();
//! let campaign = lab::campaign::Campaign::prepare(spec).unwrap();
//! let (goldens, results) = campaign.run(None, &|_| {}).unwrap();
//! lab::campaign::output::write("runs/sdc".as_ref(), &campaign, &goldens, &results, std::time::Duration::ZERO).unwrap();
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod bench;
pub mod campaign;
pub mod error;
pub mod export;
pub mod fpna;
pub mod report;
pub mod run_report;

pub use error::LabError;
pub use sdc::table;
