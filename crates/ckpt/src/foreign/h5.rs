//! HDF5 (and Keras `.h5`) through the system libhdf5: every dataset of a numeric type
//! whose data is one contiguous, unfiltered block of the file, named by its full path.
//! Chunked, compressed and compact datasets have no single byte range; they are listed
//! in [`Located::skipped`](super::Located::skipped) with the reason.

use std::path::Path;

use hdf5::types::{FloatSize, IntSize, TypeDescriptor};

use super::{Integrity, Order, TensorLoc, role_from_name};
use crate::DType;

fn dtype_of(d: &TypeDescriptor) -> Option<DType> {
    Some(match d {
        TypeDescriptor::Float(FloatSize::U8) => DType::F64,
        TypeDescriptor::Float(FloatSize::U4) => DType::F32,
        TypeDescriptor::Float(FloatSize::U2) => DType::F16,
        TypeDescriptor::Integer(IntSize::U8) => DType::I64,
        TypeDescriptor::Integer(IntSize::U4) => DType::I32,
        TypeDescriptor::Integer(IntSize::U2) => DType::I16,
        TypeDescriptor::Integer(IntSize::U1) => DType::I8,
        TypeDescriptor::Unsigned(IntSize::U8) => DType::U64,
        TypeDescriptor::Unsigned(IntSize::U4) => DType::U32,
        TypeDescriptor::Unsigned(IntSize::U2) => DType::U16,
        TypeDescriptor::Unsigned(IntSize::U1) => DType::U8,
        TypeDescriptor::Boolean => DType::Bool,
        _ => return None,
    })
}

/// Every numeric dataset of the file at `path`, depth-first in name order, and the
/// datasets that cannot be located with the reason.
pub fn locate(path: &Path) -> Result<super::Hdf5Tensors, String> {
    let file = hdf5::File::open(path).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let mut skipped = Vec::new();
    let mut groups = vec![file.as_group().map_err(|e| e.to_string())?];
    while let Some(g) = groups.pop() {
        let mut datasets = g.datasets().map_err(|e| e.to_string())?;
        datasets.sort_by_key(|d| d.name());
        for d in datasets {
            let name = d.name().trim_start_matches('/').to_owned();
            let dt = d.dtype().map_err(|e| format!("{name}: {e}"))?;
            let Some(dtype) = dt.to_descriptor().ok().as_ref().and_then(dtype_of) else { continue };
            if dtype.size() > 1 && dt.byte_order() != hdf5::datatype::ByteOrder::LittleEndian {
                return Err(format!("dataset {name} is not little-endian"));
            }
            let shape: Vec<u64> = d.shape().iter().map(|&n| n as u64).collect();
            let len = shape.iter().product::<u64>() * dtype.size() as u64;
            if len == 0 {
                continue;
            }
            let offset = match (d.offset(), d.is_chunked() || !d.filters().is_empty()) {
                (Some(o), false) => o,
                _ => {
                    skipped.push((name, "chunked, compressed or compact: not one byte range of the file".to_owned()));
                    continue;
                }
            };
            out.push(TensorLoc {
                role: role_from_name(&name),
                name,
                dtype,
                shape,
                file: path.to_owned(),
                offset,
                len,
                order: Order::RowMajor,
                integrity: Integrity::None,
            });
        }
        let mut subgroups = g.groups().map_err(|e| e.to_string())?;
        subgroups.sort_by_key(|s| std::cmp::Reverse(s.name()));
        groups.extend(subgroups);
    }
    Ok((out, skipped))
}
