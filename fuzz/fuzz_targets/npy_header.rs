//! Any bytes given to the `.npy` header parser produce a header or an error, never a
//! panic; a header that parses ends inside the input, its byte length is its element
//! count times the element size, and its elements map one to one onto storage.
#![no_main]

use ckpt::Role;
use ckpt::foreign::{Integrity, TensorLoc, npy};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(h) = npy::parse_header(data) else { return };
    assert!(h.data_start <= data.len() as u64);
    let elements = h.shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d)).expect("checked by the parser");
    assert_eq!(h.data_len, elements * h.dtype.size() as u64);
    let t = TensorLoc {
        name: "fuzz".into(),
        role: Role::Model,
        dtype: h.dtype,
        shape: h.shape,
        file: "fuzz.npy".into(),
        offset: h.data_start,
        len: h.data_len,
        order: h.order,
        integrity: Integrity::None,
    };
    assert_eq!(t.elements(), elements);
    assert_eq!(t.storage_index(elements), None);
    if elements <= 4096 {
        let mut seen = vec![false; elements as usize];
        for i in 0..elements {
            let s = t.storage_index(i).expect("in range") as usize;
            assert!(!std::mem::replace(&mut seen[s], true), "element {i} shares storage {s}");
        }
    }
});
