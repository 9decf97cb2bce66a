//! The detectors whose alarms a campaign records. How each one looks is the runner's
//! business (the lab's, or the Python package's); the record names them, in one order, in
//! its tables and texts.

use repro::words::Word;

/// One detector (a [`Word`]: its word names it in tables).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Detector {
    /// Per-tensor checksums of stored state.
    Checksum,
    /// Digests of the summed gradient compared across replicas.
    Vote,
    /// State fingerprints compared across replicas.
    Fingerprint,
    /// NaN or Inf in the gradient or the loss.
    NonFinite,
    /// The gradient norm far above its running average.
    GradNorm,
    /// The loss far above its running average.
    LossSpike,
}

impl Word for Detector {
    const KIND: &'static str = "detector";
    const ALL: &'static [Self] = &Detector::ALL;
    fn word(self) -> &'static str {
        match self {
            Detector::Checksum => "checksum",
            Detector::Vote => "vote",
            Detector::Fingerprint => "fingerprint",
            Detector::NonFinite => "nonfinite",
            Detector::GradNorm => "grad_norm",
            Detector::LossSpike => "loss_spike",
        }
    }
    fn help(self) -> &'static str {
        match self {
            Detector::Checksum => "per-tensor checksums of stored state",
            Detector::Vote => "digests of the summed gradient compared across replicas",
            Detector::Fingerprint => "state fingerprints compared across replicas",
            Detector::NonFinite => "NaN or Inf in the gradient or the loss",
            Detector::GradNorm => "the gradient norm far above its running average",
            Detector::LossSpike => "the loss far above its running average",
        }
    }
}
repro::text_form!(Detector);

impl Detector {
    /// Every detector, in report order.
    pub const ALL: [Detector; 6] = [
        Detector::Checksum,
        Detector::Vote,
        Detector::Fingerprint,
        Detector::NonFinite,
        Detector::GradNorm,
        Detector::LossSpike,
    ];

    /// Position in [`Detector::ALL`].
    pub fn index(self) -> usize {
        Detector::ALL.iter().position(|&d| d == self).expect("listed")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_detector_reads_back_from_its_word() {
        for d in Detector::ALL {
            assert_eq!(d.to_string().parse::<Detector>().unwrap(), d);
            assert_eq!(Detector::ALL[d.index()], d);
        }
        assert!("smoke".parse::<Detector>().unwrap_err().to_string().contains("smoke"));
    }
}
