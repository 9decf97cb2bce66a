//! What the record needs to know of the campaign it came from ([`About`]), read from the
//! campaign's spec file.
//!
//! A spec is TOML with four tables. `[trials]`, `[detect]` and `[classify]` belong to
//! [`fault::campaign`] and mean the same to every runner. `[run]` says what is trained, in
//! the words of whoever trains it: Steadfast's lab reads its model, data and optimizer
//! there; a PyTorch campaign its script and interpreter. The record reads `[run]` loosely,
//! for what it shows and counts:
//!
//! | key | | |
//! |-----|-|-|
//! | `model` | required | a name, shown in titles |
//! | `data` | default `""` | a name, shown in titles |
//! | `replicas` | default 1 | replicas a fault may hit |
//! | `reduce` | default `["deterministic"]` | strategies every trial runs under |
//! | `framework` | optional | who trains: absent for Steadfast's own models, `"pytorch"` |
//!
//! and leaves the others to the runner. A spec is refused when it names no model or no
//! trial count, has a table of another name, or fails the checks of [`fault::campaign`].
//!
//! ```
//! let about = sdc::About::parse(r#"
//!     [run]
//!     model = "mlp-pytorch"
//!     framework = "pytorch"
//!     script = "train.py"
//!     [trials]
//!     count = 3
//!     inject_at = [5]
//!     steps_after = 4
//!     state = ["param"]
//! "#).unwrap();
//! assert!(about.is_pytorch());
//! assert_eq!(about.trials.last_step(), 9);
//! // Trial 2's fault is a pure function of the spec.
//! assert_eq!(about.trial(2), about.trial(2));
//! ```

use comm::ReduceMode;
use fault::campaign::{BadSpec, DetectSpec, Thresholds, Trial, TrialSpec};
use serde::{Deserialize, Serialize};

/// `[run] framework` of a campaign that trains a PyTorch model.
pub const PYTORCH: &str = "pytorch";

/// A campaign as its record describes it: what was trained, and the fault side of its spec.
#[derive(Clone, Debug, PartialEq)]
pub struct About {
    /// The model's name.
    pub model: String,
    /// The data set's name (empty: none given).
    pub data: String,
    /// Data-parallel replicas.
    pub replicas: usize,
    /// The gradient reductions every trial runs under.
    pub reduce: Vec<ReduceMode>,
    /// Who trains: `None` for Steadfast's own models, `Some("pytorch")` for a PyTorch
    /// campaign.
    pub framework: Option<String>,
    /// How many trials, where and what they inject.
    pub trials: TrialSpec,
    /// Detectors and what happens when one fires.
    pub detect: DetectSpec,
    /// Thresholds that separate the classes of outcome.
    pub classify: Thresholds,
}

/// The fields a spec must name, by table.
const REQUIRED: [(&str, &str); 2] = [("run", "model"), ("trials", "count")];

/// A spec file as the record reads it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Written {
    run: Run,
    trials: TrialSpec,
    #[serde(default)]
    detect: DetectSpec,
    #[serde(default)]
    classify: Thresholds,
}

/// `[run]`, read loosely: the keys the record shows; the runner's own are ignored.
#[derive(Deserialize)]
struct Run {
    model: String,
    #[serde(default)]
    data: String,
    #[serde(default = "one")]
    replicas: usize,
    #[serde(default = "deterministic")]
    reduce: Vec<ReduceMode>,
    #[serde(default)]
    framework: Option<String>,
}

/// Checks that a spec's text is TOML naming `run.model` and `trials.count`, which have no
/// default (every runner's spec, whatever else its `[run]` holds).
pub fn check_required(text: &str) -> Result<(), BadSpec> {
    let raw: toml::Table = toml::from_str(text).map_err(|e| BadSpec(e.to_string()))?;
    for (table, key) in REQUIRED {
        if raw.get(table).and_then(|t| t.get(key)).is_none() {
            return Err(BadSpec(format!("[{table}] needs `{key}`: it has no default")));
        }
    }
    Ok(())
}

fn one() -> usize {
    1
}

fn deterministic() -> Vec<ReduceMode> {
    vec![ReduceMode::Deterministic]
}

impl About {
    /// Parses a spec from TOML text and validates it.
    ///
    /// `run.model` and `trials.count` have no default: a campaign that names neither
    /// what it trains nor how many trials it runs is a mistake, not a request for the
    /// defaults.
    pub fn parse(text: &str) -> Result<About, BadSpec> {
        check_required(text)?;
        let w: Written = toml::from_str(text).map_err(|e| BadSpec(e.to_string()))?;
        let about = About {
            model: w.run.model,
            data: w.run.data,
            replicas: w.run.replicas,
            reduce: w.run.reduce,
            framework: w.run.framework,
            trials: w.trials,
            detect: w.detect,
            classify: w.classify,
        };
        about.validate()?;
        Ok(about)
    }

    /// Checks what TOML's types cannot.
    pub fn validate(&self) -> Result<(), BadSpec> {
        if self.replicas == 0 {
            return Err(BadSpec("run.replicas must be at least 1".into()));
        }
        if self.reduce.is_empty() {
            return Err(BadSpec("run.reduce names at least one strategy".into()));
        }
        self.trials.validate(self.replicas)?;
        self.detect.validate()?;
        self.classify.validate()
    }

    /// Whether the campaign trains a PyTorch model (from Python, not `steadfast campaign`).
    pub fn is_pytorch(&self) -> bool {
        self.framework.as_deref() == Some(PYTORCH)
    }

    /// Trial `index`'s fault, drawn from the campaign seed alone.
    pub fn trial(&self, index: u64) -> Trial {
        self.trials.trial(index, self.replicas)
    }
}

/// The spec `text` with every default of `[trials]`, `[detect]` and `[classify]` written
/// out, and its `[run]` table as given (every key, the runner's included; in the order of
/// their names): what a campaign's `spec.toml` holds.
pub fn complete(text: &str) -> Result<String, BadSpec> {
    #[derive(Serialize)]
    struct Complete<'a> {
        run: &'a toml::Table,
        trials: &'a TrialSpec,
        detect: &'a DetectSpec,
        classify: &'a Thresholds,
    }
    let about = About::parse(text)?;
    let raw: toml::Table = toml::from_str(text).map_err(|e| BadSpec(e.to_string()))?;
    let run = raw.get("run").and_then(toml::Value::as_table).ok_or_else(|| BadSpec("[run] is not a table".into()))?;
    let complete = Complete { run, trials: &about.trials, detect: &about.detect, classify: &about.classify };
    toml::to_string(&complete).map_err(|e| BadSpec(format!("cannot write the spec: {e}")))
}

/// The string `key` of the `[run]` table of a spec's text, if the text is TOML and has
/// one (`framework`, or a runner's own key such as `python`): for choosing the runner
/// of a spec before reading it as that runner's.
pub fn run_string(text: &str, key: &str) -> Option<String> {
    let raw: toml::Table = toml::from_str(text).ok()?;
    raw.get("run")?.get(key)?.as_str().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use fault::campaign::Response;
    use fault::live::StateKind;

    use super::*;

    const TORCH: &str = "[run]\nmodel = \"mlp-pytorch\"\nframework = \"pytorch\"\n[trials]\ncount = 3\ninject_at=[5]\n\
                         steps_after=4\nstate=[\"param\"]";

    #[test]
    fn a_minimal_pytorch_spec_takes_the_defaults() {
        let a = About::parse(TORCH).unwrap();
        assert_eq!((a.model.as_str(), a.data.as_str(), a.replicas), ("mlp-pytorch", "", 1));
        assert_eq!(a.reduce, vec![ReduceMode::Deterministic]);
        assert_eq!(a.framework.as_deref(), Some("pytorch"));
        assert!(a.is_pytorch());
        assert_eq!((a.trials.count, a.trials.inject_at.as_slice(), a.trials.steps_after), (3, &[5][..], 4));
        assert_eq!(a.trials.state, vec![StateKind::Param]);
        assert_eq!(a.detect, DetectSpec::default());
        assert_eq!(a.classify, Thresholds::default());
        assert_eq!(a.trial(1).fault.rank, 0, "one replica");
    }

    #[test]
    fn a_spec_without_its_count_or_with_another_table_is_refused() {
        let err = About::parse("[run]\nmodel = \"m\"\n[trials]\ninject_at = [5]").unwrap_err().to_string();
        assert!(err.contains("[trials] needs `count`"), "{err}");
        let err = About::parse("[run]\nmodel = \"m\"\n").unwrap_err().to_string();
        assert!(err.contains("[trials] needs `count`"), "{err}");
        let err = About::parse("[trials]\ncount = 1").unwrap_err().to_string();
        assert!(err.contains("[run] needs `model`"), "{err}");
        let err = About::parse(&format!("{TORCH}\n[model]\nwidth = 3")).unwrap_err().to_string();
        assert!(err.contains("unknown field `model`"), "{err}");
        for (extra, needle) in [
            ("\n[detect]\nloss_factor = 0.5", "factors"),
            ("\ncolour = 1", "colour"),
            ("\nranks = [1]", "ranks"),
            ("\n[classify]\ndiverged_loss = 1.0", "diverged_loss"),
        ] {
            let err = About::parse(&format!("{TORCH}{extra}")).unwrap_err().to_string();
            assert!(err.contains(needle), "{extra}: {err}");
        }
        let err = About::parse(&TORCH.replace("model = \"mlp-pytorch\"", "model = 3")).unwrap_err().to_string();
        assert!(err.contains("string"), "{err}");
        assert!(About::parse("not toml").is_err());
    }

    #[test]
    fn the_runners_own_run_keys_are_kept_in_the_completed_spec() {
        let text = TORCH.replace("[trials]", "python = \"/usr/bin/python3\"\nscript = \"t.py\"\n[trials]");
        assert_eq!(About::parse(&text).unwrap(), About::parse(TORCH).unwrap(), "the runner's keys mean nothing here");
        let complete = complete(&text).unwrap();
        for line in [
            "python = \"/usr/bin/python3\"",
            "script = \"t.py\"",
            "steps_after = 4",
            "[detect]",
            "response = \"observe\"",
        ] {
            assert!(complete.contains(line), "{line}\n{complete}");
        }
        let again = About::parse(&complete).unwrap();
        assert_eq!(again, About::parse(&text).unwrap());
        assert_eq!(again.detect.response, Response::Observe);
        assert_eq!(run_string(&complete, "python").as_deref(), Some("/usr/bin/python3"));
        assert_eq!(run_string(&complete, "framework").as_deref(), Some("pytorch"));
        assert_eq!(run_string(&complete, "absent"), None);
        assert_eq!(run_string("not toml", "framework"), None);
    }
}
