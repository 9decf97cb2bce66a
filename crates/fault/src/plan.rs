//! Choosing what to flip: which tensors (name glob, role), which elements and bits, how
//! many (a count, or a rate per bit), in bursts of adjacent bits, all drawn from one
//! seeded counter-based stream so that a plan is a pure function of its inputs.

use std::collections::BTreeMap;

use ckpt::{DType, Role};

use crate::bits::BitSpec;

/// Which tensors a fault may hit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Target {
    /// Shell-style name pattern (`*` any run of characters, `?` one); `None` for all.
    pub glob: Option<String>,
    /// Model parameters, optimizer state, or either (`None`).
    pub role: Option<Role>,
}

impl Target {
    /// Whether a tensor named `name` with `role` is a target.
    pub fn matches(&self, name: &str, role: Role) -> bool {
        self.role.is_none_or(|r| r == role) && self.glob.as_deref().is_none_or(|g| glob_match(g, name))
    }
}

/// How many bits to flip.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Amount {
    /// Exactly this many bursts.
    Count(u64),
    /// Each candidate bit with this probability (the number of bursts is the rate times
    /// the candidate bits, rounded stochastically from the seed).
    Rate(f64),
}

/// A bit-flip fault.
#[derive(Clone, Debug, PartialEq)]
pub struct FlipSpec {
    /// Which tensors.
    pub target: Target,
    /// Which bits of an element.
    pub bits: BitSpec,
    /// How many.
    pub amount: Amount,
    /// Adjacent bits flipped together from the drawn bit upward (1: single-bit upsets).
    pub burst: u32,
    /// Seed of every random choice.
    pub seed: u64,
}

/// What a planner needs to know about a tensor.
#[derive(Clone, Copy, Debug)]
pub struct Candidate<'a> {
    /// Name.
    pub name: &'a str,
    /// Role.
    pub role: Role,
    /// Element type.
    pub dtype: DType,
    /// Number of elements.
    pub elements: u64,
}

/// The bits to invert in one element.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ElementFlip {
    /// Index of the tensor among the candidates.
    pub tensor: usize,
    /// Element index in row-major order (the index into the flattened tensor).
    pub element: u64,
    /// Bit positions (0 = least significant), ascending.
    pub bits: Vec<u32>,
}

/// A plan that cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// No tensor matches.
    #[error("no tensor matches the target ({0})")]
    NoTarget(String),
    /// More flips than candidate bits.
    #[error("{wanted} flips asked for, but the targets have only {available} candidate bits")]
    TooMany {
        /// Asked.
        wanted: u64,
        /// Available.
        available: u64,
    },
    /// A bad knob.
    #[error("{0}")]
    Invalid(String),
}

/// Draws the flips of `spec` over `tensors`. Tensors are chosen with probability
/// proportional to their element count, elements and bits uniformly; no (element, bit)
/// is drawn twice. The result is sorted by tensor and element.
pub fn plan(tensors: &[Candidate<'_>], spec: &FlipSpec) -> Result<Vec<ElementFlip>, PlanError> {
    if spec.burst == 0 {
        return Err(PlanError::Invalid("--burst must be at least 1".into()));
    }
    let chosen: Vec<(usize, std::ops::Range<u32>)> = tensors
        .iter()
        .enumerate()
        .filter(|(_, t)| t.elements > 0 && spec.target.matches(t.name, t.role))
        .filter_map(|(i, t)| spec.bits.positions(t.dtype).map(|r| (i, r)))
        .collect();
    if chosen.is_empty() {
        return Err(PlanError::NoTarget(format!(
            "pattern {:?}, role {}, bits {}",
            spec.target.glob.as_deref().unwrap_or("*"),
            spec.target.role.map_or("any", |r| r.as_str()),
            spec.bits
        )));
    }
    let total_elements: u64 = chosen.iter().map(|(i, _)| tensors[*i].elements).sum();
    let available: u64 = chosen.iter().map(|(i, r)| tensors[*i].elements * u64::from(r.end - r.start)).sum();
    let mut rng = repro::rng::Stream::for_purpose(spec.seed, "fault.flip", &[]);
    let wanted = match spec.amount {
        Amount::Count(k) => k,
        Amount::Rate(p) if (0.0..=1.0).contains(&p) => {
            let expected = p * available as f64;
            let u = f64::from(rng.next_u32()) / 4_294_967_296.0;
            (expected + u).floor() as u64
        }
        Amount::Rate(p) => return Err(PlanError::Invalid(format!("--rate {p} is not a probability"))),
    };
    if wanted > available {
        return Err(PlanError::TooMany { wanted, available });
    }
    // Dense draws would take long to finish by rejection; refuse more than half the bits.
    if wanted > available / 2 + 1 {
        return Err(PlanError::Invalid(format!("{wanted} flips would alter most of the {available} candidate bits")));
    }
    let mut flips: BTreeMap<(usize, u64), Vec<u32>> = BTreeMap::new();
    let mut drawn = 0;
    while drawn < wanted {
        let mut e = rng.below(total_elements);
        let (tensor, range) = chosen
            .iter()
            .find(|(i, _)| {
                let n = tensors[*i].elements;
                if e < n {
                    true
                } else {
                    e -= n;
                    false
                }
            })
            .expect("an element below the total lies in some tensor");
        let start = range.start + rng.below(u64::from(range.end - range.start)) as u32;
        let width = if tensors[*tensor].dtype == DType::Bool { 1 } else { tensors[*tensor].dtype.size() as u32 * 8 };
        let bits = flips.entry((*tensor, e)).or_default();
        if bits.contains(&start) {
            continue;
        }
        for b in start..(start + spec.burst).min(width) {
            if !bits.contains(&b) {
                bits.push(b);
            }
        }
        drawn += 1;
    }
    Ok(flips
        .into_iter()
        .map(|((tensor, element), mut bits)| {
            bits.sort_unstable();
            ElementFlip { tensor, element, bits }
        })
        .collect())
}

/// Shell-style matching: `*` matches any run of characters (dots included), `?` one.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ni));
            pi += 1;
        } else if let Some((sp, sn)) = star {
            pi = sp + 1;
            ni = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bits::BitClass;

    fn cands() -> Vec<Candidate<'static>> {
        vec![
            Candidate { name: "model.fc1.weight", role: Role::Model, dtype: DType::F32, elements: 1000 },
            Candidate { name: "model.fc1.bias", role: Role::Model, dtype: DType::F32, elements: 10 },
            Candidate { name: "optim.model.fc1.weight.exp_avg", role: Role::Optim, dtype: DType::F32, elements: 1000 },
            Candidate { name: "step", role: Role::Model, dtype: DType::I64, elements: 1 },
        ]
    }

    fn spec(amount: Amount) -> FlipSpec {
        FlipSpec { target: Target::default(), bits: BitSpec::Class(BitClass::Any), amount, burst: 1, seed: 7 }
    }

    #[test]
    fn globs_match_like_a_shell() {
        assert!(glob_match("model.*", "model.fc1.weight"));
        assert!(glob_match("*.weight", "model.fc1.weight"));
        assert!(glob_match("model.fc?.bias", "model.fc1.bias"));
        assert!(!glob_match("model.*.bias", "model.fc1.weight"));
        assert!(glob_match("*", ""));
        assert!(!glob_match("a*b", "a"));
    }

    #[test]
    fn a_plan_is_a_function_of_its_seed_and_respects_the_target() {
        let c = cands();
        let mut s = spec(Amount::Count(50));
        s.target.role = Some(Role::Optim);
        s.bits = BitSpec::Class(BitClass::Exponent);
        let a = plan(&c, &s).unwrap();
        assert_eq!(a, plan(&c, &s).unwrap());
        assert_eq!(a.iter().map(|f| f.bits.len()).sum::<usize>(), 50);
        assert!(a.iter().all(|f| f.tensor == 2 && f.bits.iter().all(|b| (23..31).contains(b))));
        s.seed = 8;
        assert_ne!(a, plan(&c, &s).unwrap());
    }

    #[test]
    fn classes_skip_tensors_that_lack_them_and_bursts_stay_in_the_element() {
        let c = cands();
        let mut s = spec(Amount::Count(200));
        s.bits = BitSpec::Class(BitClass::Mantissa);
        s.burst = 4;
        let flips = plan(&c, &s).unwrap();
        assert!(flips.iter().all(|f| f.tensor != 3), "an integer has no mantissa");
        assert!(flips.iter().all(|f| f.bits.iter().all(|&b| b < 32)));
        s.target.glob = Some("step".into());
        assert!(matches!(plan(&c, &s), Err(PlanError::NoTarget(_))));
    }

    #[test]
    fn rates_scale_with_the_candidate_bits() {
        let c = cands();
        let flips = plan(&c, &spec(Amount::Rate(1e-3))).unwrap();
        let n: usize = flips.iter().map(|f| f.bits.len()).sum();
        // 2011 elements of 32 or 64 bits: about 64 flips.
        assert!((60..=70).contains(&n), "{n}");
        assert!(plan(&c, &spec(Amount::Rate(2.0))).is_err());
        assert!(matches!(plan(&c, &spec(Amount::Count(1 << 40))), Err(PlanError::TooMany { .. })));
    }
}
