//! The detectors a campaign measures, and the running averages of the numeric ones.
//!
//! | detector      | looks at                                   | names the replica? |
//! |---------------|--------------------------------------------|--------------------|
//! | `checksum`    | each tensor's xxh3, taken after the update and checked before the state is next used | yes |
//! | `vote`        | the digest of each replica's summed gradient (the commit vote) | with a majority |
//! | `fingerprint` | each replica's state fingerprint after the update (its list of per-tensor checksums), every k steps | with a majority |
//! | `nonfinite`   | NaN/Inf in a replica's summed gradient or loss | yes |
//! | `grad_norm`   | the gradient norm against its running average | no |
//! | `loss_spike`  | the loss against its running average       | no |
//!
//! The first three are exact: they fire only when bits differ from what they should be,
//! so their false-positive rate is zero by construction (and the campaign measures it on
//! the golden run anyway). The numeric ones are heuristics with thresholds in the spec.

use fault::campaign::DetectSpec;

pub use sdc::Detector;

/// A detector that fired, and the replicas it blames (empty: it cannot tell).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Alarm {
    /// Which detector.
    pub detector: Detector,
    /// Replicas whose state or gradient is wrong, when the detector can tell.
    pub faulty: Vec<usize>,
}

/// Running averages of the gradient norm and the loss, for the spike detectors. Part of
/// the training state as far as a campaign is concerned: trials start from golden's.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Monitors {
    grad_norm: Option<f64>,
    loss: Option<f64>,
}

impl Monitors {
    /// Checks this step's loss and gradient norm against the running averages; returns
    /// which spike detectors fire. The averages take in only values that raised no alarm,
    /// so that one spike does not hide the next.
    pub fn check(&mut self, loss: f64, grad_norm: f64, spec: &DetectSpec) -> (bool, bool) {
        // NaN compares as nothing: a NaN value fires.
        let fires = |avg: Option<f64>, x: f64, factor: f64| avg.is_some_and(|a| x.is_nan() || x > factor * a);
        let norm_fires = fires(self.grad_norm, grad_norm, spec.grad_norm_factor);
        let loss_fires = fires(self.loss, loss, spec.loss_factor);
        let blend = |avg: &mut Option<f64>, x: f64| {
            *avg = Some(avg.map_or(x, |a| spec.smoothing * a + (1.0 - spec.smoothing) * x));
        };
        if !norm_fires && grad_norm.is_finite() {
            blend(&mut self.grad_norm, grad_norm);
        }
        if !loss_fires && loss.is_finite() {
            blend(&mut self.loss, loss);
        }
        (norm_fires, loss_fires)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spikes_fire_against_the_running_average_and_are_kept_out_of_it() {
        let spec = DetectSpec::default();
        let mut m = Monitors::default();
        assert_eq!(m.check(2.0, 1.0, &spec), (false, false), "nothing to compare with yet");
        assert_eq!(m.check(2.1, 1.1, &spec), (false, false));
        assert_eq!(m.check(2.0, 50.0, &spec), (true, false));
        assert_eq!(m.check(100.0, 1.0, &spec), (false, true));
        assert_eq!(m.check(f64::NAN, f64::INFINITY, &spec), (true, true), "non-finite values are spikes");
        let calm = m.clone();
        assert_eq!(m.check(2.0, 1.0, &spec), (false, false), "the spikes did not raise the averages");
        assert_ne!(m, calm);
    }
}
