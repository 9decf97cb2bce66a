//! The integers of a reproducible sum: their width and headroom, shared by the ring
//! ([`crate::collective`]) and the owners' sum.

use crate::ReduceMode;
use crate::transport::CommError;

/// The integers of a reproducible sum: 64-bit lanes (`wide`) or 32-bit, and the headroom,
/// the bits kept above a block's largest term so that up to `2^headroom` terms add
/// without overflow (each term keeps `63 - headroom` or `31 - headroom` bits below its
/// block's largest exponent). Every choice is order- and grouping-independent; different
/// choices are different functions, with different bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FixedPoint {
    /// 64-bit lanes (otherwise 32-bit).
    pub wide: bool,
    /// Bits of headroom: at most `2^headroom` terms.
    pub headroom: u32,
}

impl FixedPoint {
    /// The integers of a reproducible mode (`None` for the float modes).
    pub fn of(mode: ReduceMode) -> Option<FixedPoint> {
        match mode {
            ReduceMode::Reproducible => Some(FixedPoint { wide: true, headroom: repro::batched::DEFAULT_HEADROOM }),
            ReduceMode::Reproducible32 => Some(FixedPoint { wide: false, headroom: repro::batched::NARROW_HEADROOM }),
            ReduceMode::Fast | ReduceMode::Deterministic => None,
        }
    }

    fn bits(self) -> u32 {
        if self.wide { 64 } else { 32 }
    }

    fn max_headroom(self) -> u32 {
        use repro::batched::Fixed;
        if self.wide { i64::MAX_HEADROOM } else { i32::MAX_HEADROOM }
    }

    pub(crate) fn valid(self) -> Result<(), CommError> {
        if self.headroom > self.max_headroom() {
            return Err(CommError::Setup(format!(
                "a headroom of {} bits in {}-bit lanes (at most {})",
                self.headroom,
                self.bits(),
                self.max_headroom()
            )));
        }
        Ok(())
    }

    pub(crate) fn check_parts(self, total: u64, world: usize) -> Result<(), CommError> {
        if total > 1u64 << self.headroom {
            return Err(CommError::Setup(format!(
                "{total} parts over {world} ranks exceed the {} that a reproducible sum in {}-bit lanes with {} bits \
                 of headroom holds",
                1u64 << self.headroom,
                self.bits(),
                self.headroom
            )));
        }
        Ok(())
    }
}
