//! # sdc: a fault campaign's record
//!
//! A fault-injection campaign (silent data corruption, bit by bit) ends as a directory:
//! its trials' results as typed CSV tables, a Markdown summary, and the spec of the
//! campaign they came from. This crate owns that record, whoever ran the campaign:
//! `steadfast campaign` (the lab, which trains Steadfast's own models) and `steadfast.lab`
//! in Python (which trains the user's PyTorch model) both hand it their golden runs and
//! trials' results, and `steadfast report` reads what it wrote. It trains nothing.
//!
//! - [`About`]: what the record needs of a spec: the model's and data's names, replicas
//!   and strategies, and the fault side (`[trials]`, `[detect]`, `[classify]` of
//!   [`fault::campaign`]), read from any runner's spec file;
//! - [`GoldenRecord`] and [`TrialResult`]: what a runner hands over, per strategy and per
//!   trial; [`json`] reads them from the JSON a runner in another language writes;
//! - [`rows`]: the tables, one row type per CSV file, computed from those ([`rows::Tables`]);
//! - [`output`]: the directory (tables, `summary.md`, `spec.toml`) and the texts that
//!   describe a campaign and one trial;
//! - [`table`]: CSV files of typed rows, which every reader goes through;
//! - [`Detector`]: the detectors whose alarms the tables count;
//! - [`replay`]: the command that replays a PyTorch campaign's trials in Python.
//!
//! ```
//! use std::collections::BTreeMap;
//! use std::time::Duration;
//!
//! use fault::campaign::{Evidence, Outcome};
//! use sdc::{About, GoldenRecord, TrialResult, rows::Tables};
//!
//! let about = About::parse(r#"
//!     [run]
//!     model = "mlp-pytorch"
//!     framework = "pytorch"
//!     [trials]
//!     count = 1
//!     inject_at = [2]
//!     steps_after = 1
//! "#).unwrap();
//! let golden = GoldenRecord {
//!     reduce: about.reduce[0],
//!     losses: vec![2.0, 1.5, 1.25],
//!     grad_norms: vec![1.0; 3],
//!     alarms: vec![Vec::new(); 3],
//!     evals: BTreeMap::from([(3, (1.2, 0.6))]),
//!     tensors: vec![("model.fc.weight".into(), 12)],
//!     time: Duration::ZERO,
//! };
//! let trial = TrialResult {
//!     trial: about.trial(0),
//!     reduce: golden.reduce,
//!     outcome: Outcome::Masked,
//!     evidence: Evidence { bitwise_golden: true, ..Evidence::default() },
//!     flips: Vec::new(),
//!     first_alarm: [None; 6],
//!     losses: vec![1.25],
//!     replica_differing: vec![vec![0]],
//!     tensor_differing: vec![vec![0]],
//!     quality: Some((1.2, 0.6)),
//!     rejoined: None,
//!     rollbacks: 0,
//!     repairs: 0,
//!     error: None,
//!     time: Duration::ZERO,
//! };
//! sdc::check(&about, &[golden.clone()], &[trial.clone()]).unwrap();
//! let tables = Tables::of(&about, &[golden], &[trial]);
//! assert_eq!(tables.by_state[0].masked, 1);
//! assert!(sdc::output::headline(&about).starts_with("Campaign: mlp-pytorch (PyTorch), 1 replica(s)"));
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod about;
mod detector;
pub mod error;
pub mod json;
pub mod output;
mod record;
pub mod replay;
pub mod rows;
pub mod table;

pub use about::About;
pub use detector::Detector;
pub use error::SdcError;
pub use record::{GoldenRecord, TrialResult, check};
