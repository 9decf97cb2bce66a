//! Tensor-by-tensor comparison of two checkpoints: which tensors differ, in how many
//! elements, by how much, and in which bit positions.

use crate::DType;
use crate::reader::{LoadedTensor, TensorData};

/// How one tensor compares.
#[derive(Clone, Debug, PartialEq)]
pub enum DiffStatus {
    /// Only the first checkpoint has it.
    OnlyInA,
    /// Only the second checkpoint has it.
    OnlyInB,
    /// Both have it, with different dtypes or shapes.
    Incompatible {
        /// dtype and shape in A.
        a: String,
        /// dtype and shape in B.
        b: String,
    },
    /// Bit-identical.
    Equal,
    /// Same dtype and shape, different bits.
    Differs(ElementDiff),
}

/// Statistics of the differing elements of one tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct ElementDiff {
    /// Elements whose bits differ.
    pub elements: u64,
    /// Elements in the tensor.
    pub total: u64,
    /// Largest |a - b| over differing elements (floats only; infinite when a value is
    /// NaN or infinite on one side only).
    pub max_abs: Option<f64>,
    /// Largest |a - b| / max(|a|, |b|) over differing elements (floats only).
    pub max_rel: Option<f64>,
    /// For each bit position (0 = least significant), how many elements differ there.
    pub bit_counts: Vec<u64>,
}

/// The comparison of one tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorDiff {
    /// Tensor name.
    pub name: String,
    /// Outcome.
    pub status: DiffStatus,
}

impl TensorDiff {
    /// The comparison as a JSON row (`steadfast ckpt diff --json`): the tensor, its
    /// status word, and for differing elements their count, the largest differences
    /// (`"inf"` where infinite) and the bit positions that differ, with their counts.
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::json;
        let finite = |x: Option<f64>| x.map(|v| if v.is_finite() { json!(v) } else { json!("inf") });
        let name = &self.name;
        match &self.status {
            DiffStatus::OnlyInA => json!({"tensor": name, "status": "only_in_a"}),
            DiffStatus::OnlyInB => json!({"tensor": name, "status": "only_in_b"}),
            DiffStatus::Incompatible { a, b } => json!({"tensor": name, "status": "incompatible", "a": a, "b": b}),
            DiffStatus::Equal => json!({"tensor": name, "status": "equal"}),
            DiffStatus::Differs(e) => json!({
                "tensor": name, "status": "differs", "elements": e.elements, "total": e.total,
                "max_abs": finite(e.max_abs), "max_rel": finite(e.max_rel),
                "bits": e.bit_counts.iter().enumerate().filter(|(_, c)| **c > 0)
                    .map(|(b, c)| json!({"bit": b, "count": c})).collect::<Vec<_>>(),
            }),
        }
    }
}

/// Compares two lists of tensors by name: A's order first, then B's extras.
pub fn diff(a: &[LoadedTensor], b: &[LoadedTensor]) -> Vec<TensorDiff> {
    let mut out = Vec::new();
    for ta in a {
        let status = match b.iter().find(|tb| tb.name == ta.name) {
            None => DiffStatus::OnlyInA,
            Some(tb) if tb.dtype != ta.dtype || tb.shape != ta.shape => DiffStatus::Incompatible {
                a: format!("{} {:?}", ta.dtype, ta.shape),
                b: format!("{} {:?}", tb.dtype, tb.shape),
            },
            Some(tb) => compare(ta, tb),
        };
        out.push(TensorDiff { name: ta.name.clone(), status });
    }
    for tb in b.iter().filter(|tb| !a.iter().any(|ta| ta.name == tb.name)) {
        out.push(TensorDiff { name: tb.name.clone(), status: DiffStatus::OnlyInB });
    }
    out
}

fn compare(a: &LoadedTensor, b: &LoadedTensor) -> DiffStatus {
    if a.bytes() == b.bytes() {
        return DiffStatus::Equal;
    }
    let size = a.dtype.size();
    let mut d = ElementDiff {
        elements: 0,
        total: (a.bytes().len() / size) as u64,
        max_abs: None,
        max_rel: None,
        bit_counts: vec![0; size * 8],
    };
    let values = |t: &LoadedTensor, i: usize| -> Option<f64> {
        match (&t.data, t.dtype) {
            (TensorData::F32(v), _) => Some(f64::from(v[i])),
            (TensorData::Bytes(v), DType::F64) => {
                Some(f64::from_le_bytes(v[i * 8..i * 8 + 8].try_into().expect("8 bytes")))
            }
            _ => None,
        }
    };
    for (i, (ea, eb)) in a.bytes().chunks_exact(size).zip(b.bytes().chunks_exact(size)).enumerate() {
        if ea == eb {
            continue;
        }
        d.elements += 1;
        for (byte, (x, y)) in ea.iter().zip(eb).enumerate() {
            let mut x = x ^ y;
            while x != 0 {
                let bit = x.trailing_zeros() as usize;
                d.bit_counts[byte * 8 + bit] += 1;
                x &= x - 1;
            }
        }
        if let (Some(x), Some(y)) = (values(a, i), values(b, i)) {
            let abs = if (x - y).is_nan() { f64::INFINITY } else { (x - y).abs() };
            let scale = x.abs().max(y.abs());
            let rel = if scale > 0.0 && abs.is_finite() { abs / scale } else { f64::INFINITY };
            d.max_abs = Some(d.max_abs.map_or(abs, |m: f64| m.max(abs)));
            d.max_rel = Some(d.max_rel.map_or(rel, |m: f64| m.max(rel)));
        }
    }
    DiffStatus::Differs(d)
}

/// The comparison as `steadfast ckpt diff` prints it, `a` and `b` naming the two sides: a
/// line for each tensor that is not equal (where its elements differ: how many, by how
/// much, and in which bits), then the verdict.
pub fn text(diffs: &[TensorDiff], a: &std::path::Path, b: &std::path::Path) -> String {
    let mut out = Vec::new();
    for d in diffs {
        match &d.status {
            DiffStatus::Equal => {}
            DiffStatus::OnlyInA => out.push(format!("{:<48} only in {}", d.name, a.display())),
            DiffStatus::OnlyInB => out.push(format!("{:<48} only in {}", d.name, b.display())),
            DiffStatus::Incompatible { a, b } => out.push(format!("{:<48} incompatible: {a} vs {b}", d.name)),
            DiffStatus::Differs(e) => {
                let bits: Vec<String> = e
                    .bit_counts
                    .iter()
                    .enumerate()
                    .rev()
                    .filter(|(_, c)| **c > 0)
                    .map(|(b, c)| format!("{b}:{c}"))
                    .collect();
                let fmt = |x: Option<f64>| x.map(|v| format!("{v:.3e}")).unwrap_or_else(|| "-".into());
                out.push(format!(
                    "{:<48} {}/{} elements differ, max abs {}, max rel {}, bits {}",
                    d.name,
                    e.elements,
                    e.total,
                    fmt(e.max_abs),
                    fmt(e.max_rel),
                    bits.join(" ")
                ));
            }
        }
    }
    let differing = diffs.iter().filter(|d| d.status != DiffStatus::Equal).count();
    out.push(match differing {
        0 => "identical".to_owned(),
        n => format!("{n} of {} tensors differ", diffs.len()),
    });
    out.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Role;

    fn t(name: &str, v: Vec<f32>) -> LoadedTensor {
        LoadedTensor {
            name: name.into(),
            role: Role::Model,
            dtype: DType::F32,
            shape: vec![v.len()],
            data: TensorData::F32(v),
        }
    }

    #[test]
    fn reports_elements_magnitudes_and_bits() {
        let a = [t("w", vec![1.0, 2.0, 3.0]), t("only_a", vec![0.0])];
        let b = [t("w", vec![1.0, -2.0, 3.5]), t("only_b", vec![0.0])];
        let d = diff(&a, &b);
        assert_eq!(d.len(), 3);
        let DiffStatus::Differs(e) = &d[0].status else { panic!("{:?}", d[0]) };
        assert_eq!((e.elements, e.total), (2, 3));
        assert_eq!(e.max_abs, Some(4.0));
        assert_eq!(e.max_rel, Some(2.0)); // |2 - (-2)| / 2
        assert_eq!(e.bit_counts[31], 1); // the sign flip of 2.0
        assert_eq!(e.bit_counts.iter().sum::<u64>(), 1 + (3.0f32.to_bits() ^ 3.5f32.to_bits()).count_ones() as u64);
        assert_eq!(d[1].status, DiffStatus::OnlyInA);
        assert_eq!(d[2].status, DiffStatus::OnlyInB);
        assert_eq!(diff(&a[..1], &a[..1])[0].status, DiffStatus::Equal);
    }
}
