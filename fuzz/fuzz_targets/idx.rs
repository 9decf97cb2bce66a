//! Any bytes given to the IDX parser produce an array or an error, never a panic; an
//! array that parses has the dimensions asked for and exactly the elements its header
//! promises. The first input byte picks the number of dimensions asked for.
#![no_main]

use ckpt::foreign::idx;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&ndim, raw)) = data.split_first() else { return };
    let ndim = usize::from(ndim % 5);
    let Ok(a) = idx::parse(raw.to_vec(), ndim) else { return };
    assert_eq!(a.dims.len(), ndim);
    assert_eq!(a.dims.iter().product::<usize>(), a.data.len());
    assert_eq!(4 + 4 * ndim + a.data.len(), raw.len());
});
