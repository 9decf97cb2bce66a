//! Bit flips in live training state: the faults of `train --inject`.
//!
//! A [`LiveFault`] names a step, a rank, the kind of state ([`StateKind`]: parameters,
//! their summed gradient, or optimizer slots) and a flip spec. The trainer calls
//! [`LiveFault::apply`] at the right moment of the step with the named f32 buffers of
//! that kind; the flips are drawn exactly as for files ([`plan`]), so
//! the same seed picks the same elements and bits whether the state is in memory or in a
//! checkpoint.
//!
//! The text form, as given on the command line (keys in any order, all but `step`
//! optional):
//! `step=S,rank=R,state=param|grad|optim|activation,target=GLOB,bits=exponent,count=K,burst=B,seed=N`
//! (or `rate=P` instead of `count`).

use std::str::FromStr;

use ckpt::{DType, Role};

use crate::bits::BitSpec;
use crate::plan::{Amount, Candidate, FlipSpec, PlanError, Target, plan};

/// Which part of the training state a live fault hits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StateKind {
    /// Parameters, at the start of the step (before the forward pass).
    Param,
    /// The summed gradient, after the reduction and before the update.
    Grad,
    /// Optimizer slots, before the update.
    Optim,
    /// The output of a layer (`act.<layer>`, e.g. `act.fc1`) during the forward pass of the
    /// first micro-batch that the rank computes in the step: a fault in the arithmetic,
    /// not in stored state. The corrupted value feeds the rest of the forward pass and the
    /// backward pass; no gradient flows through the corrupted element itself.
    Activation,
}

impl StateKind {
    /// The word used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            StateKind::Param => "param",
            StateKind::Grad => "grad",
            StateKind::Optim => "optim",
            StateKind::Activation => "activation",
        }
    }

    /// Every kind, in the order of their names in documentation.
    pub const ALL: [StateKind; 4] = [StateKind::Param, StateKind::Grad, StateKind::Optim, StateKind::Activation];
}

impl std::fmt::Display for StateKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

serde_as_text!(StateKind);

impl FromStr for StateKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        StateKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| format!("state {s:?} is not param, grad, optim or activation"))
    }
}

/// One fault injected into live state.
#[derive(Clone, Debug, PartialEq)]
pub struct LiveFault {
    /// The step (0-based: the step that turns state `step` into `step + 1`).
    pub step: u64,
    /// The rank whose state is hit.
    pub rank: usize,
    /// Which state.
    pub state: StateKind,
    /// Which tensors, bits, how many, with which seed.
    pub flips: FlipSpec,
}

/// One flipped element of live state.
#[derive(Clone, Debug, PartialEq)]
pub struct LiveFlip {
    /// Tensor name (a parameter's name for gradients).
    pub tensor: String,
    /// Element index.
    pub element: u64,
    /// Bits inverted.
    pub bits: Vec<u32>,
    /// Value before.
    pub old: f32,
    /// Value after.
    pub new: f32,
}

impl LiveFault {
    /// Flips bits in `tensors` (name, role, data) of this fault's state kind; returns
    /// what changed. `tensors` must be in registry order, so that a seed means the same
    /// flips on every run.
    pub fn apply(&self, tensors: &mut [(&str, Role, &mut [f32])]) -> Result<Vec<LiveFlip>, PlanError> {
        let candidates: Vec<Candidate<'_>> = tensors
            .iter()
            .map(|(name, role, data)| Candidate { name, role: *role, dtype: DType::F32, elements: data.len() as u64 })
            .collect();
        let flips = plan(&candidates, &self.flips)?;
        Ok(flips
            .into_iter()
            .map(|f| {
                let (name, _, data) = &mut tensors[f.tensor];
                let x = &mut data[f.element as usize];
                let old = *x;
                *x = crate::bits::flip_f32(old, &f.bits);
                LiveFlip { tensor: (*name).to_owned(), element: f.element, bits: f.bits, old, new: *x }
            })
            .collect())
    }
}

/// A `--inject` value that cannot be parsed.
#[derive(Debug, thiserror::Error)]
#[error("bad --inject {text:?}: {reason}")]
pub struct BadLiveFault {
    /// The text.
    pub text: String,
    /// What is wrong.
    pub reason: String,
}

impl FromStr for LiveFault {
    type Err = BadLiveFault;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = |reason: String| BadLiveFault { text: text.to_owned(), reason };
        let (mut step, mut rank, mut state) = (None, 0, StateKind::Param);
        let mut spec = FlipSpec {
            target: Target::default(),
            bits: BitSpec::Class(crate::BitClass::Any),
            amount: Amount::Count(1),
            burst: 1,
            seed: 0,
        };
        for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').ok_or_else(|| bad(format!("{pair:?} is not key=value")))?;
            let number = |v: &str| v.parse::<u64>().map_err(|_| bad(format!("{key}={v} is not a whole number")));
            match key {
                "step" => step = Some(number(value)?),
                "rank" => rank = number(value)? as usize,
                "state" => state = value.parse().map_err(bad)?,
                "target" => spec.target.glob = Some(value.to_owned()),
                "bits" => spec.bits = value.parse().map_err(|e: crate::bits::BadBitSpec| bad(e.to_string()))?,
                "count" => spec.amount = Amount::Count(number(value)?),
                "rate" => {
                    spec.amount = Amount::Rate(value.parse().map_err(|_| bad(format!("rate={value} is not a number")))?)
                }
                "burst" => spec.burst = number(value)? as u32,
                "seed" => spec.seed = number(value)?,
                other => return Err(bad(format!("unknown key {other:?}"))),
            }
        }
        let step = step.ok_or_else(|| bad("step= is required".into()))?;
        spec.target.role = Some(state.role());
        Ok(LiveFault { step, rank, state, flips: spec })
    }
}

impl StateKind {
    /// The role of the tensors this kind of state is made of (activations and gradients
    /// count as the model's).
    pub fn role(self) -> Role {
        if self == StateKind::Optim { Role::Optim } else { Role::Model }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_parse_from_their_text_form() {
        let f: LiveFault = "step=5,rank=1,state=grad,target=model.fc1.*,bits=30,count=2,seed=9".parse().unwrap();
        assert_eq!((f.step, f.rank, f.state), (5, 1, StateKind::Grad));
        assert_eq!(f.flips.bits, BitSpec::Positions(30, 31));
        assert_eq!(f.flips.amount, Amount::Count(2));
        assert_eq!(f.flips.target.glob.as_deref(), Some("model.fc1.*"));
        for bad in ["rank=1", "step=x", "step=1,state=weights", "step=1,bits=fraction", "step=1,colour=red", "step"] {
            assert!(bad.parse::<LiveFault>().is_err(), "{bad}");
        }
    }

    #[test]
    fn applying_flips_exactly_the_planned_bits_and_repeats_with_the_seed() {
        let mut a = vec![1.0f32; 100];
        let mut b = vec![-2.0f32; 50];
        let f: LiveFault = "step=0,bits=exponent,count=3,seed=4".parse().unwrap();
        let flips = f.apply(&mut [("model.a", Role::Model, &mut a), ("model.b", Role::Model, &mut b)]).unwrap();
        assert_eq!(flips.len(), 3);
        let changed = a.iter().filter(|&&x| x != 1.0).count() + b.iter().filter(|&&x| x != -2.0).count();
        assert_eq!(changed, 3);
        for fl in &flips {
            assert_eq!(fl.old.to_bits() ^ fl.new.to_bits(), 1 << fl.bits[0]);
            assert!((23..31).contains(&fl.bits[0]));
        }
        let (mut a2, mut b2) = (vec![1.0f32; 100], vec![-2.0f32; 50]);
        let again = f.apply(&mut [("model.a", Role::Model, &mut a2), ("model.b", Role::Model, &mut b2)]).unwrap();
        assert_eq!(flips, again);
    }
}
