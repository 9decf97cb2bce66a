//! A campaign spec as written in its TOML file: the training run that trials perturb
//! (`[run]`, in the training crate's words), then the fault side (`[trials]`, `[detect]`,
//! `[classify]`, owned by [`fault::campaign`]).
//!
//! ```
//! let spec = lab::campaign::Spec::parse(r#"
//!     [run]
//!     model = "mlp"
//!     data = "synthetic"
//!     replicas = 2
//!     reduce = ["deterministic", "reproducible"]
//!     [trials]
//!     count = 10
//!     inject_at = [20]
//!     steps_after = 5
//!     state = ["param", "grad"]
//! "#).unwrap();
//! assert_eq!(spec.run.model, train::model::ModelKind::Mlp);
//! // Trial 3's fault is a pure function of the spec: drawing it twice gives the same.
//! assert_eq!(spec.trial(3), spec.trial(3));
//! ```

use std::path::PathBuf;

use comm::ReduceMode;
use fault::campaign::{BadSpec, DetectSpec, Thresholds, Trial, TrialSpec};
use sdc::About;
use serde::{Deserialize, Serialize};
use train::data::DataKind;
use train::model::ModelKind;
use train::optim::OptimKind;

/// A campaign, as written in its TOML file.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    /// The training run that trials perturb.
    pub run: RunSpec,
    /// How many trials, where and what they inject.
    pub trials: TrialSpec,
    /// Detectors and what happens when one fires.
    #[serde(default)]
    pub detect: DetectSpec,
    /// Thresholds that separate the classes of outcome.
    #[serde(default)]
    pub classify: Thresholds,
}

/// The golden run's configuration.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RunSpec {
    /// The model (required in a spec file).
    pub model: ModelKind,
    /// The data set.
    pub data: DataKind,
    /// Overrides the data set's directory.
    pub data_dir: Option<PathBuf>,
    /// Global batch (examples per step).
    pub batch: usize,
    /// Examples per micro-batch [default: the batch divided by the replicas].
    pub micro_batch: Option<usize>,
    /// The optimizer.
    pub optimizer: OptimKind,
    /// Learning rate [default: the model's].
    pub lr: Option<f32>,
    /// Seed of initialisation and data order.
    pub seed: u64,
    /// Data-parallel replicas simulated in one process; micro-batch `i` is computed by
    /// replica `i mod replicas` from its own copy of the state.
    pub replicas: usize,
    /// Gradient reductions to compare: every trial runs under each (`deterministic`,
    /// `reproducible`).
    pub reduce: Vec<ReduceMode>,
    /// Held-out examples scored at the end of each trial (0: the whole test split).
    pub eval_examples: usize,
}

impl Default for RunSpec {
    fn default() -> Self {
        RunSpec {
            model: ModelKind::Mlp,
            data: DataKind::FashionMnist,
            data_dir: None,
            batch: 128,
            micro_batch: None,
            optimizer: OptimKind::AdamW,
            lr: None,
            seed: 0,
            replicas: 1,
            reduce: vec![ReduceMode::Deterministic],
            eval_examples: 2000,
        }
    }
}

impl Spec {
    /// Parses a spec from TOML text and validates it.
    ///
    /// `run.model` and `trials.count` have no default: a campaign that names neither
    /// what it trains nor how many trials it runs is a mistake, not a request for the
    /// defaults. The other fields default as [`RunSpec`] and [`TrialSpec`] say.
    pub fn parse(text: &str) -> Result<Spec, BadSpec> {
        sdc::about::check_required(text)?;
        let spec: Spec = toml::from_str(text).map_err(|e| BadSpec(e.to_string()))?;
        spec.validate()?;
        Ok(spec)
    }

    /// Checks what TOML's types cannot.
    pub fn validate(&self) -> Result<(), BadSpec> {
        let bad = |m: String| Err(BadSpec(m));
        let r = &self.run;
        if r.replicas == 0 {
            return bad("run.replicas must be at least 1".into());
        }
        if r.batch == 0 || !r.batch.is_multiple_of(r.replicas) {
            return bad(format!(
                "run.batch ({}) must be a positive multiple of run.replicas ({})",
                r.batch, r.replicas
            ));
        }
        if let Some(m) = r.micro_batch
            && (m == 0 || !r.batch.is_multiple_of(m) || !(r.batch / m).is_multiple_of(r.replicas))
        {
            return bad(format!(
                "run.micro_batch ({m}) must divide the batch ({}) into a multiple of {} micro-batches",
                r.batch, r.replicas
            ));
        }
        if r.reduce.is_empty() || r.reduce.len() > 2 {
            return bad("run.reduce names one or two strategies".into());
        }
        if r.reduce.contains(&ReduceMode::Fast) {
            return bad("run.reduce: `fast` promises no bits from run to run, so no trial could be judged against \
                 a golden run; use deterministic or reproducible"
                .into());
        }
        self.trials.validate(r.replicas)?;
        self.detect.validate()?;
        self.classify.validate()
    }

    /// The last step any trial trains.
    pub fn last_step(&self) -> u64 {
        self.trials.last_step()
    }

    /// Trial `index`'s fault, drawn from the campaign seed alone.
    pub fn trial(&self, index: u64) -> Trial {
        self.trials.trial(index, self.run.replicas)
    }

    /// What the campaign's record says of it (its model and data by name).
    pub fn about(&self) -> About {
        About {
            model: self.run.model.to_string(),
            data: self.run.data.to_string(),
            replicas: self.run.replicas,
            reduce: self.run.reduce.clone(),
            framework: None,
            trials: self.trials.clone(),
            detect: self.detect.clone(),
            classify: self.classify.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use fault::campaign::Response;

    use super::*;

    fn spec(text: &str) -> Result<Spec, BadSpec> {
        Spec::parse(&format!(
            "[run]\nmodel = \"mlp\"\ndata = \"synthetic\"\nreplicas = 2\n[trials]\ncount = 10\ninject_at = [5, 9]\n{text}"
        ))
    }

    #[test]
    fn defaults_fill_what_a_spec_leaves_out() {
        let s = spec("").unwrap();
        assert_eq!(s.run.model, ModelKind::Mlp);
        assert_eq!(s.run.reduce, vec![ReduceMode::Deterministic]);
        assert_eq!(s.trials.steps_after, 50);
        assert_eq!(s.detect.response, Response::Observe);
        assert_eq!(s.last_step(), 59);
    }

    #[test]
    fn malformed_specs_are_refused_with_the_reason() {
        for (text, needle) in [("colour = 1", "colour"), ("state = [\"weights\"]", "weights"), ("ranks = [2]", "ranks")]
        {
            let err = spec(text).unwrap_err().to_string();
            assert!(err.contains(needle), "{text}: {err}");
        }
        assert!(
            Spec::parse("[run]\nmodel = \"mlp\"\nreplicas = 3\nbatch = 128\n[trials]\ncount = 1")
                .unwrap_err()
                .to_string()
                .contains("multiple")
        );
        assert!(
            Spec::parse("[run]\nmodel = \"resnet\"\n[trials]\ncount = 1")
                .unwrap_err()
                .to_string()
                .contains("unknown model")
        );
        assert!(
            Spec::parse("[run]\nmodel = \"mlp\"\nreduce = [\"fast\"]\n[trials]\ncount = 1")
                .unwrap_err()
                .to_string()
                .contains("golden")
        );
        assert!(Spec::parse("not toml at all").is_err());
        assert!(Spec::parse("[trials]\n").unwrap_err().to_string().contains("run"));
    }

    #[test]
    fn a_spec_without_its_model_or_its_count_is_refused() {
        let err = Spec::parse("[run]\ndata = \"synthetic\"\n[trials]\ncount = 3").unwrap_err().to_string();
        assert!(err.contains("[run] needs `model`"), "{err}");
        let err = Spec::parse("[run]\nmodel = \"cnn\"\n[trials]\nseed = 3").unwrap_err().to_string();
        assert!(err.contains("[trials] needs `count`"), "{err}");
        assert!(Spec::parse("[run]\nmodel = \"cnn\"\n[trials]\ncount = 3").is_ok());
    }

    #[test]
    fn the_record_reads_a_written_spec_as_the_lab_describes_it() {
        let s = spec("state = [\"grad\"]").unwrap();
        assert_eq!(About::parse(&toml::to_string(&s).unwrap()).unwrap(), s.about());
        assert_eq!((s.about().model.as_str(), s.about().data.as_str()), ("mlp", "synthetic"));
    }

    #[test]
    fn a_spec_round_trips_through_its_text() {
        let s = spec("state = [\"grad\", \"activation\"]\nbits = \"23-30\"").unwrap();
        let text = toml::to_string(&s).unwrap();
        assert_eq!(Spec::parse(&text).unwrap(), s);
        assert!(text.contains("model = \"mlp\"") && text.contains("bits = \"23-30\""), "{text}");
    }
}
