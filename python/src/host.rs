//! Reading and writing a tensor's bytes in host memory at the address its framework
//! reports.
#![allow(unsafe_code)]

/// The `length` bytes at `address`.
///
/// The Python side (`steadfast.torch.save`, `AsyncCheckpointer.save` and the reproducible
/// gradient hook) passes the address of a dense, contiguous tensor in host memory
/// (`Tensor.data_ptr()`, or a C-contiguous array's `ctypes.data`) and its size in bytes
/// (`numel() * element_size()`, or `nbytes`), and holds a reference to that tensor until
/// the call that reads them returns; a length of zero comes with address 0 and reads
/// nothing.
pub(crate) fn host_bytes<'a>(address: usize, length: usize) -> &'a [u8] {
    if length == 0 || address == 0 {
        return &[];
    }
    // SAFETY: `address` is the start of `length` initialised bytes of one allocation that
    // the caller keeps alive, and does not write, until the call that reads the slice
    // returns (a snapshot copies it out at once; a save writes it to its files before it
    // returns); a tensor's storage is never more than isize::MAX bytes.
    unsafe { std::slice::from_raw_parts(address as *const u8, length) }
}

/// The `length` bytes at `address`, to be written.
///
/// The gradient hook (`steadfast.ddp`) passes an output tensor that it allocated itself
/// (contiguous, in host memory, of exactly `length` bytes), that no other tensor views
/// while the call runs, and that it holds until the call returns; the inputs passed
/// beside it are other tensors, so the slice never overlaps one that `host_bytes` gave.
pub(crate) fn host_bytes_mut<'a>(address: usize, length: usize) -> &'a mut [u8] {
    if length == 0 || address == 0 {
        return &mut [];
    }
    // SAFETY: `address` is the start of `length` initialised bytes of one allocation that
    // the caller keeps alive and lets no one else read or write until the call returns;
    // no other live slice covers these bytes (see above); a tensor's storage is never more
    // than isize::MAX bytes.
    unsafe { std::slice::from_raw_parts_mut(address as *mut u8, length) }
}
