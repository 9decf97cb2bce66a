//! The one majority rule of the project: who is outvoted when replicas disagree.
//!
//! The commit vote (gradient digests), the replica check (state fingerprints) and a
//! campaign's detectors all ask the same question of a list of values, one per replica:
//! which replicas hold something other than what most hold? The answer is defined here
//! once, with one tie rule:
//!
//! - a value held by **more than half** of the replicas is the majority, and the replicas
//!   that hold anything else are its dissenters;
//! - without such a value (a tie, as between two replicas, or a scatter) nobody can be
//!   named: every replica is suspect, and [`dissenters`] returns `None`.
//!
//! A strict majority is what repair needs: copying the majority's state onto a dissenter
//! is only safe when the majority cannot be the corrupted side, which a plurality (say two
//! of four) does not guarantee.

/// The indices of the values that differ from a strict majority, in order (empty when
/// all agree), or `None` when no value is held by more than half.
///
/// ```
/// use comm::majority::dissenters;
///
/// assert_eq!(dissenters(&[7, 7, 9]), Some(vec![2]));
/// assert_eq!(dissenters(&[7, 7, 7]), Some(vec![]));
/// assert_eq!(dissenters(&[1, 2]), None, "two replicas that disagree cannot say which is wrong");
/// ```
pub fn dissenters<T: PartialEq>(values: &[T]) -> Option<Vec<usize>> {
    let n = values.len();
    let majority = (0..n).find(|&i| 2 * values.iter().filter(|v| **v == values[i]).count() > n)?;
    Some((0..n).filter(|&i| values[i] != values[majority]).collect())
}

/// What comparing the replicas' states (their fingerprints, one per replica) found: the
/// one replica comparison of every runner (a static job's check, an elastic job's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Comparison {
    /// Every replica holds the same state.
    Agree,
    /// The replicas `outvoted` hold another state than the others; `majority` says whether
    /// the others are a strict majority (otherwise nobody can tell who is right, and every
    /// replica is in `outvoted`).
    Diverged {
        /// The replicas to distrust, by index.
        outvoted: Vec<usize>,
        /// Whether the rest are a strict majority (so that repair is safe).
        majority: bool,
    },
}

/// Compares the replicas' `fingerprints` with the majority rule.
///
/// ```
/// use comm::majority::{Comparison, compare};
///
/// assert_eq!(compare(&[3, 3, 3]), Comparison::Agree);
/// assert_eq!(compare(&[3, 5, 3]), Comparison::Diverged { outvoted: vec![1], majority: true });
/// assert_eq!(compare(&[3, 5]), Comparison::Diverged { outvoted: vec![0, 1], majority: false });
/// ```
pub fn compare<T: PartialEq>(fingerprints: &[T]) -> Comparison {
    match dissenters(fingerprints) {
        Some(d) if d.is_empty() => Comparison::Agree,
        Some(outvoted) => Comparison::Diverged { outvoted, majority: true },
        None => Comparison::Diverged { outvoted: (0..fingerprints.len()).collect(), majority: false },
    }
}

/// [`compare`] within each group of replicas (a pipeline's stages: replicas of different
/// stages hold different states): `group_of[i]` is replica `i`'s group. The replicas
/// outvoted in every group, by index; a majority only if every group that diverged has one.
///
/// ```
/// use comm::majority::{Comparison, compare_in_groups};
///
/// // Stage 0 on replicas 0, 2 and 4; stage 1 on replicas 1 and 3.
/// let stages = [0, 1, 0, 1, 0];
/// assert_eq!(compare_in_groups(&[3, 8, 3, 8, 3], &stages), Comparison::Agree);
/// let one_off = Comparison::Diverged { outvoted: vec![2], majority: true };
/// assert_eq!(compare_in_groups(&[3, 8, 5, 8, 3], &stages), one_off);
/// let no_majority = Comparison::Diverged { outvoted: vec![1, 3], majority: false };
/// assert_eq!(compare_in_groups(&[3, 8, 3, 9, 3], &stages), no_majority);
/// ```
pub fn compare_in_groups<T: PartialEq>(fingerprints: &[T], group_of: &[usize]) -> Comparison {
    let mut groups: Vec<usize> = group_of.to_vec();
    groups.sort_unstable();
    groups.dedup();
    let (mut outvoted, mut majority) = (Vec::new(), true);
    for g in groups {
        let members: Vec<usize> = (0..fingerprints.len()).filter(|&i| group_of.get(i) == Some(&g)).collect();
        let values: Vec<&T> = members.iter().map(|&i| &fingerprints[i]).collect();
        if let Comparison::Diverged { outvoted: o, majority: m } = compare(&values) {
            outvoted.extend(o.into_iter().map(|i| members[i]));
            majority &= m;
        }
    }
    outvoted.sort_unstable();
    if outvoted.is_empty() { Comparison::Agree } else { Comparison::Diverged { outvoted, majority } }
}

/// [`dissenters`], with every index when there is no majority: the replicas to distrust.
pub fn suspects<T: PartialEq>(values: &[T]) -> Vec<usize> {
    dissenters(values).unwrap_or_else(|| (0..values.len()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_strict_majority_names_everyone_else() {
        assert_eq!(dissenters(&[9, 7, 7, 7]), Some(vec![0]));
        assert_eq!(dissenters(&[1, 1, 1, 2, 3]), Some(vec![3, 4]));
        assert_eq!(dissenters(&[5]), Some(vec![]));
        assert_eq!(dissenters::<u64>(&[]), None);
    }

    #[test]
    fn half_is_not_a_majority() {
        assert_eq!(dissenters(&[1, 1, 2, 2]), None);
        assert_eq!(dissenters(&[1, 1, 2, 3]), None, "a plurality of two in four names nobody");
        assert_eq!(dissenters(&[1, 2, 3]), None);
        assert_eq!(suspects(&[1, 2]), vec![0, 1]);
        assert_eq!(suspects(&[4, 4, 5]), vec![2]);
    }
}
