//! A campaign's record in JSON: how a runner outside this workspace (the Python package's
//! `steadfast.lab`) hands over its golden runs and its trials' results.
//!
//! A record is `{"goldens": [G, ...], "results": [R, ...]}`. A golden run `G`
//! ([`GoldenRecord`]):
//!
//! | key | JSON |
//! |-----|------|
//! | `reduce` | the strategy's word (`"deterministic"`) |
//! | `losses`, `grad_norms` | one float per step from step 0 |
//! | `alarms` | one list of detector words per step (false alarms) |
//! | `evals` | `{"<step>": [loss, accuracy]}` where trials end |
//! | `tensors` | `[["model.fc1.weight", elements], ...]`, in the order of `tensor_differing` |
//! | `seconds` | its wall-clock time |
//!
//! A trial's result `R` ([`TrialResult`]): its fault (`trial`, `reduce`, `state`, `rank`,
//! `step`, `flip_seed`, `target` and `role` or null, `bits` as written in a spec, `flips` (and `rate` or null),
//! `burst`), `outcome`, `evidence` (`crashed`, `diverged`, `acted_on_alarm`,
//! `bitwise_golden`, `accuracy_drop`, `loss_rise`), `flips_done` (`[{"rank", "tensor",
//! "element", "bits": [...], "old", "new"}]`), `first_alarm` (`{"<detector>": step}`, a
//! detector left out or null did not fire), `losses`, `replica_differing`,
//! `tensor_differing`, `quality` (`[loss, accuracy]` or null), `rejoined` (a step or
//! null), `rollbacks`, `repairs`, `error` (text or null) and `seconds`.
//!
//! JSON has no NaN or infinity, which losses and flipped values may be: a float may also
//! be written `null` (NaN) or as the text `"NaN"`, `"inf"` or `"-inf"`. Every error names
//! its field, as `results[3].evidence.crashed`.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use fault::campaign::{Evidence, Trial};
use fault::live::{LiveFault, LiveFlip};
use fault::plan::{Amount, FlipSpec, Target};
use serde::de::{DeserializeOwned, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

use crate::error::bad;
use crate::record::check_result;
use crate::{Detector, GoldenRecord, SdcError, TrialResult};

/// The golden runs and the results of a record's JSON text.
pub fn record(text: &str) -> Result<(Vec<GoldenRecord>, Vec<TrialResult>), SdcError> {
    let doc = document(text)?;
    let top = Fields::of(&doc, String::new())?;
    let goldens = top.list("goldens")?.iter().map(golden).collect::<Result<_, _>>()?;
    let results = top.list("results")?.iter().map(result).collect::<Result<_, _>>()?;
    Ok((goldens, results))
}

/// One trial's result from its JSON text (an `R` of a record).
pub fn trial_result(text: &str) -> Result<TrialResult, SdcError> {
    let doc = document(text)?;
    result(&Fields::of(&doc, String::new())?)
}

fn document(text: &str) -> Result<Value, SdcError> {
    serde_json::from_str(text).map_err(|e| bad("(the document)", format!("not JSON: {e}")))
}

/// A JSON object being read, with the path that names its fields in errors.
struct Fields<'a> {
    map: &'a Map<String, Value>,
    path: String,
}

impl<'a> Fields<'a> {
    fn of(value: &'a Value, path: String) -> Result<Fields<'a>, SdcError> {
        match value.as_object() {
            Some(map) => Ok(Fields { map, path }),
            None => Err(bad(if path.is_empty() { "(the document)".into() } else { path }, "not a JSON object")),
        }
    }

    /// The name of field `key` in errors.
    fn at(&self, key: &str) -> String {
        if self.path.is_empty() { key.to_owned() } else { format!("{}.{key}", self.path) }
    }

    fn value(&self, key: &str) -> Result<&'a Value, SdcError> {
        self.map.get(key).ok_or_else(|| bad(self.at(key), "missing"))
    }

    /// A required field, read through `T`'s serde form.
    fn get<T: DeserializeOwned>(&self, key: &str) -> Result<T, SdcError> {
        T::deserialize(self.value(key)?).map_err(|e| bad(self.at(key), e))
    }

    /// An optional field: absent or null is `None`.
    fn opt<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, SdcError> {
        match self.map.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => T::deserialize(v).map(Some).map_err(|e| bad(self.at(key), e)),
        }
    }

    /// A float that may be NaN or infinite.
    fn float(&self, key: &str) -> Result<f64, SdcError> {
        Ok(self.get::<Float>(key)?.0)
    }

    /// A list of floats that may be NaN or infinite.
    fn floats(&self, key: &str) -> Result<Vec<f64>, SdcError> {
        Ok(self.get::<Vec<Float>>(key)?.into_iter().map(|f| f.0).collect())
    }

    fn seconds(&self, key: &str) -> Result<Duration, SdcError> {
        let s: f64 = self.get(key)?;
        Duration::try_from_secs_f64(s).map_err(|e| bad(self.at(key), format!("{s} seconds: {e}")))
    }

    fn object(&self, key: &str) -> Result<Fields<'a>, SdcError> {
        Fields::of(self.value(key)?, self.at(key))
    }

    /// A list of objects.
    fn list(&self, key: &str) -> Result<Vec<Fields<'a>>, SdcError> {
        let Some(items) = self.value(key)?.as_array() else {
            return Err(bad(self.at(key), "not a list"));
        };
        items.iter().enumerate().map(|(i, v)| Fields::of(v, format!("{}[{i}]", self.at(key)))).collect()
    }
}

/// A float as JSON can carry it: a number; `null` for NaN; or text (`"NaN"`, `"inf"`,
/// `"-inf"`), for the values JSON has no numbers for.
#[derive(Clone, Copy)]
struct Float(f64);

impl<'de> Deserialize<'de> for Float {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Floats;
        impl Visitor<'_> for Floats {
            type Value = Float;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number, null, \"NaN\", \"inf\" or \"-inf\"")
            }
            fn visit_f64<E: serde::de::Error>(self, x: f64) -> Result<Float, E> {
                Ok(Float(x))
            }
            fn visit_u64<E: serde::de::Error>(self, x: u64) -> Result<Float, E> {
                Ok(Float(x as f64))
            }
            fn visit_i64<E: serde::de::Error>(self, x: i64) -> Result<Float, E> {
                Ok(Float(x as f64))
            }
            fn visit_unit<E: serde::de::Error>(self) -> Result<Float, E> {
                Ok(Float(f64::NAN))
            }
            fn visit_none<E: serde::de::Error>(self) -> Result<Float, E> {
                Ok(Float(f64::NAN))
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Float, E> {
                f64::from_str(s.trim()).map(Float).map_err(|_| E::custom(format!("{s:?} is not a number")))
            }
        }
        d.deserialize_any(Floats)
    }
}

/// A float written for an `f32` value (exact: an `f32` widened to `f64` and back).
fn narrow(x: f64) -> f32 {
    x as f32
}

fn golden(g: &Fields<'_>) -> Result<GoldenRecord, SdcError> {
    let mut evals = BTreeMap::new();
    for (step, (loss, accuracy)) in g.get::<BTreeMap<String, (Float, Float)>>("evals")? {
        let at = || g.at(&format!("evals.{step}"));
        let n: u64 = step.parse().map_err(|_| bad(at(), "the key is not a step"))?;
        evals.insert(n, (loss.0, accuracy.0));
    }
    Ok(GoldenRecord {
        reduce: g.get("reduce")?,
        losses: g.floats("losses")?.into_iter().map(narrow).collect(),
        grad_norms: g.floats("grad_norms")?,
        alarms: g.get::<Vec<Vec<Detector>>>("alarms")?,
        evals,
        tensors: g.get("tensors")?,
        time: g.seconds("seconds")?,
    })
}

fn result(r: &Fields<'_>) -> Result<TrialResult, SdcError> {
    let state = r.get("state")?;
    let role = match r.opt::<String>("role")? {
        None => None,
        Some(word) => Some(word.parse::<ckpt::Role>().map_err(|e| bad(r.at("role"), e))?),
    };
    let flips = FlipSpec {
        target: Target { glob: r.opt("target")?, role },
        bits: r.get("bits")?,
        amount: match r.opt::<f64>("rate")? {
            Some(rate) => Amount::Rate(rate),
            None => Amount::Count(r.get("flips")?),
        },
        burst: r.get("burst")?,
        seed: r.get("flip_seed")?,
    };
    let fault = LiveFault { step: r.get("step")?, rank: r.get("rank")?, state, flips };
    let e = r.object("evidence")?;
    let evidence = Evidence {
        crashed: e.get("crashed")?,
        diverged: e.get("diverged")?,
        acted_on_alarm: e.get("acted_on_alarm")?,
        bitwise_golden: e.get("bitwise_golden")?,
        accuracy_drop: e.float("accuracy_drop")?,
        loss_rise: e.float("loss_rise")?,
    };
    let flips_done = r.list("flips_done")?.iter().map(flip).collect::<Result<_, _>>()?;
    let quality = r.opt::<(Float, Float)>("quality")?.map(|(l, a)| (l.0, a.0));
    let out = TrialResult {
        trial: Trial { index: r.get("trial")?, fault },
        reduce: r.get("reduce")?,
        outcome: r.get("outcome")?,
        evidence,
        flips: flips_done,
        first_alarm: first_alarm(&r.object("first_alarm")?)?,
        losses: r.floats("losses")?.into_iter().map(narrow).collect(),
        replica_differing: r.get("replica_differing")?,
        tensor_differing: r.get("tensor_differing")?,
        quality,
        rejoined: r.opt("rejoined")?,
        rollbacks: r.get("rollbacks")?,
        repairs: r.get("repairs")?,
        error: r.opt("error")?,
        time: r.seconds("seconds")?,
    };
    check_result(&out, &|field| r.at(field))?;
    Ok(out)
}

fn flip(f: &Fields<'_>) -> Result<(usize, LiveFlip), SdcError> {
    let flip = LiveFlip {
        tensor: f.get("tensor")?,
        element: f.get("element")?,
        bits: f.get("bits")?,
        old: narrow(f.float("old")?),
        new: narrow(f.float("new")?),
    };
    Ok((f.get("rank")?, flip))
}

/// `{"<detector>": step or null}`: every key a detector's word.
fn first_alarm(a: &Fields<'_>) -> Result<[Option<u64>; 6], SdcError> {
    let mut first = [None; 6];
    for key in a.map.keys() {
        let d = Detector::from_str(key).map_err(|e| bad(a.at(key), e))?;
        first[d.index()] = a.opt(key)?;
    }
    Ok(first)
}

#[cfg(test)]
mod tests {
    use fault::campaign::Outcome;
    use fault::live::StateKind;

    use super::*;

    const GOLDEN: &str = r#"{"reduce": "deterministic", "losses": [2.5, 2.25, "NaN"], "grad_norms": [1, 0.5, null],
        "alarms": [[], ["loss_spike"], []], "evals": {"3": [0.75, "inf"]},
        "tensors": [["model.fc.weight", 12]], "seconds": 1.5}"#;

    fn result_text(first_alarm: &str) -> String {
        format!(
            r#"{{"trial": 4, "reduce": "reproducible", "state": "optim", "rank": 1, "step": 2, "flip_seed": 99,
            "target": "optim.*", "role": "optim", "bits": "23-30", "flips": 2, "burst": 1, "outcome": "degraded",
            "evidence": {{"crashed": false, "diverged": false, "acted_on_alarm": false, "bitwise_golden": false,
                         "accuracy_drop": 0.25, "loss_rise": "-inf"}},
            "flips_done": [{{"rank": 1, "tensor": "optim.fc.m", "element": 7, "bits": [30], "old": 1.0, "new": "inf"}}],
            "first_alarm": {first_alarm}, "losses": [2.0, null], "replica_differing": [[0, 3], [0, 5]],
            "tensor_differing": [[3], [5]], "quality": [0.5, "NaN"], "rejoined": null, "rollbacks": 0,
            "repairs": 0, "error": null, "seconds": 0.25}}"#
        )
    }

    #[test]
    fn a_record_reads_with_its_non_finite_values() {
        let text = format!(r#"{{"goldens": [{GOLDEN}], "results": [{}]}}"#, result_text(r#"{"checksum": 2}"#));
        let (goldens, results) = record(&text).unwrap();
        let g = &goldens[0];
        assert_eq!(g.losses[..2], [2.5, 2.25]);
        assert!(g.losses[2].is_nan() && g.grad_norms[2].is_nan());
        assert_eq!(g.alarms[1], [Detector::LossSpike]);
        assert_eq!(g.evals[&3].1, f64::INFINITY);
        assert_eq!(g.tensors, [("model.fc.weight".to_owned(), 12)]);
        assert_eq!(g.time, Duration::from_millis(1500));
        let r = &results[0];
        assert_eq!((r.trial.index, r.trial.fault.step, r.trial.fault.rank), (4, 2, 1));
        assert_eq!(r.trial.fault.state, StateKind::Optim);
        assert_eq!(r.trial.fault.flips.target.role, Some(ckpt::Role::Optim));
        assert_eq!(r.trial.fault.flips.bits.to_string(), "23-30");
        assert_eq!(r.trial.fault.flips.amount, Amount::Count(2));
        assert_eq!(r.outcome, Outcome::Degraded);
        assert_eq!(r.evidence.loss_rise, f64::NEG_INFINITY);
        assert_eq!(r.flips[0].1.new, f32::INFINITY);
        assert_eq!(r.first_alarm, [Some(2), None, None, None, None, None]);
        assert!(r.losses[1].is_nan() && r.quality.unwrap().1.is_nan());
    }

    #[test]
    fn a_wrong_field_is_named() {
        for (from, to, needle) in [
            (r#""state": "optim""#, r#""state": "weights""#, "results[0].state"),
            (r#""flips": 2,"#, "", "results[0].flips: missing"),
            (r#""crashed": false"#, r#""crashed": 1"#, "results[0].evidence.crashed"),
            (r#""bits": "23-30""#, r#""bits": "fraction""#, "results[0].bits"),
            (r#""role": "optim""#, r#""role": "weights""#, "results[0].role"),
            (r#""old": 1.0"#, r#""old": "one""#, "results[0].flips_done[0].old"),
        ] {
            let r = result_text("{}");
            assert!(r.contains(from), "{from}");
            let text = format!(r#"{{"goldens": [{GOLDEN}], "results": [{}]}}"#, r.replace(from, to));
            let err = record(&text).unwrap_err().to_string();
            assert!(err.contains(needle), "{to}: {err}");
        }
        let err = trial_result(&result_text(r#"{"smoke": 3}"#)).unwrap_err().to_string();
        assert!(err.contains("first_alarm.smoke"), "{err}");
        let err = trial_result(&result_text(r#"{"vote": 1}"#)).unwrap_err().to_string();
        assert!(err.contains("first_alarm.vote: step 1, before the fault"), "{err}");
        let err = record(&format!(r#"{{"goldens": [{}], "results": []}}"#, GOLDEN.replace("\"3\"", "\"end\"")))
            .unwrap_err()
            .to_string();
        assert!(err.contains("goldens[0].evals.end"), "{err}");
        assert!(record("{\"goldens\": []").unwrap_err().to_string().contains("not JSON"));
        assert!(record("[]").unwrap_err().to_string().contains("not a JSON object"));
    }
}
