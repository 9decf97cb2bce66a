//! The instruction sets a kernel can run on, which one this CPU has, and which one a
//! process uses (`STEADFAST_ISA`).

use std::sync::OnceLock;

/// An instruction set that every kernel has a path for. The paths give the same bits; they
/// differ only in speed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Plain Rust, no vector instructions assumed (any x86-64 or other CPU).
    Scalar,
    /// AVX2 with FMA (x86-64-v3: Haswell, Zen and later).
    Avx2,
    /// AVX-512 Foundation (x86-64-v4: Skylake-SP, Zen 4 and later).
    Avx512,
}

/// The environment variable that chooses a process's instruction set.
pub const ENV: &str = "STEADFAST_ISA";

/// Why `STEADFAST_ISA` cannot be honoured.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IsaError {
    /// The value names no instruction set.
    #[error("{ENV}={0:?} is not one of scalar, avx2, avx512, auto")]
    Unknown(String),
    /// The CPU lacks the named instruction set.
    #[error("{ENV}={0} asks for an instruction set this CPU does not have (it has: {1})")]
    Unavailable(&'static str, String),
}

impl Isa {
    /// Every instruction set, from the narrowest.
    pub const ALL: [Isa; 3] = [Isa::Scalar, Isa::Avx2, Isa::Avx512];

    /// The name used in `STEADFAST_ISA`, fingerprint lines and manifests.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    /// Whether this CPU can run the path.
    pub fn available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512vl")
                    && std::arch::is_x86_feature_detected!("avx512bw")
                    && std::arch::is_x86_feature_detected!("avx512dq")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The widest instruction set this CPU has.
    pub fn detect() -> Isa {
        Isa::ALL.into_iter().rev().find(|isa| isa.available()).unwrap_or(Isa::Scalar)
    }

    /// The instruction sets this CPU has, from the narrowest.
    pub fn all_available() -> Vec<Isa> {
        Isa::ALL.into_iter().filter(|isa| isa.available()).collect()
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Isa {
    type Err = IsaError;

    fn from_str(s: &str) -> Result<Isa, IsaError> {
        Isa::ALL.into_iter().find(|isa| isa.name() == s).ok_or_else(|| IsaError::Unknown(s.to_owned()))
    }
}

/// The instruction set that `value` (of `STEADFAST_ISA`; unset or `auto`: the best)
/// selects on this CPU.
pub fn parse_choice(value: Option<&str>) -> Result<Isa, IsaError> {
    match value.map(str::trim) {
        None | Some("") | Some("auto") => Ok(Isa::detect()),
        Some(name) => {
            let isa: Isa = name.parse()?;
            if isa.available() {
                Ok(isa)
            } else {
                let has = Isa::all_available().iter().map(|i| i.name()).collect::<Vec<_>>().join(", ");
                Err(IsaError::Unavailable(isa.name(), has))
            }
        }
    }
}

/// The instruction set that `STEADFAST_ISA` chooses for this process, or an error saying
/// why it cannot be used. A program calls it once at start to refuse a bad value.
pub fn from_env() -> Result<Isa, IsaError> {
    parse_choice(std::env::var(ENV).ok().as_deref())
}

/// The instruction set of this process's kernels: [`from_env`]'s choice, read once, or the
/// best this CPU has when the variable cannot be honoured (call [`from_env`] first to
/// refuse it instead).
pub fn selected() -> Isa {
    static SELECTED: OnceLock<Isa> = OnceLock::new();
    *SELECTED.get_or_init(|| from_env().unwrap_or_else(|_| Isa::detect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_bad_values_are_refused() {
        for isa in Isa::ALL {
            assert_eq!(isa.name().parse::<Isa>(), Ok(isa));
        }
        assert_eq!(parse_choice(Some("avx3")), Err(IsaError::Unknown("avx3".into())));
        assert_eq!(parse_choice(None), Ok(Isa::detect()));
        assert_eq!(parse_choice(Some("auto")), Ok(Isa::detect()));
        assert_eq!(parse_choice(Some("scalar")), Ok(Isa::Scalar));
        for isa in Isa::ALL {
            let chosen = parse_choice(Some(isa.name()));
            if isa.available() {
                assert_eq!(chosen, Ok(isa));
            } else {
                assert!(matches!(chosen, Err(IsaError::Unavailable(..))), "{chosen:?}");
            }
        }
    }
}
