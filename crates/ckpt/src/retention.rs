//! Which checkpoints to keep.
//!
//! `keep_last = K` keeps the K newest checkpoints; `keep_every = N` also keeps every
//! checkpoint whose step is a multiple of N (milestones). With neither, everything is
//! kept. The newest checkpoint is never deleted.

/// A retention policy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Retention {
    /// Keep this many of the newest checkpoints.
    pub keep_last: Option<usize>,
    /// Also keep checkpoints whose step is a multiple of this.
    pub keep_every: Option<u64>,
}

impl Retention {
    /// The steps among `steps` that the policy deletes, in ascending order.
    pub fn to_delete(&self, steps: &[u64]) -> Vec<u64> {
        let Some(keep_last) = self.keep_last else { return Vec::new() };
        let mut sorted = steps.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let keep_last = keep_last.max(1);
        let cut = sorted.len().saturating_sub(keep_last);
        sorted[..cut].iter().copied().filter(|s| !self.keep_every.is_some_and(|n| n > 0 && s % n == 0)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_newest_and_milestones() {
        let steps = [10, 20, 30, 40, 50, 60];
        assert_eq!(Retention::default().to_delete(&steps), Vec::<u64>::new());
        assert_eq!(Retention { keep_last: Some(2), keep_every: None }.to_delete(&steps), vec![10, 20, 30, 40]);
        assert_eq!(Retention { keep_last: Some(2), keep_every: Some(20) }.to_delete(&steps), vec![10, 30]);
        assert_eq!(Retention { keep_last: Some(0), keep_every: None }.to_delete(&[5]), Vec::<u64>::new());
    }
}
