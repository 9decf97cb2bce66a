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
/// `steadfast.torch.load` passes the tensors it reads a checkpoint into (ones it
/// allocated, or the caller's own, dense and in host memory), which the native side
/// checks are pairwise disjoint before taking a slice of each, and only writes before it
/// reads them.
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

/// An empty buffer with room for `length` bytes whose memory is already mapped in, so
/// that filling it costs a copy and no page faults (`AsyncCheckpointer.prepare` makes
/// the first snapshot's buffers so, on a thread of its own). Where the kernel refuses to
/// fault the pages in at once (before Linux 5.14), one byte a page is written instead.
pub(crate) fn mapped_buffer(length: usize) -> Vec<u8> {
    let mut buffer: Vec<u8> = Vec::with_capacity(length);
    let page = rustix::param::page_size();
    let start = buffer.as_mut_ptr() as usize;
    let (first, end) = (start.next_multiple_of(page), (start + length) / page * page);
    let populated = end > first && {
        // SAFETY: `[first, end)` lies inside the allocation of `buffer`'s capacity, which
        // this function owns and nothing else refers to; the advice only asks the kernel
        // to fault those pages in now, and changes no byte the program can observe (the
        // spare capacity is uninitialised, and written before it is ever read).
        unsafe {
            rustix::mm::madvise(first as *mut std::ffi::c_void, end - first, rustix::mm::Advice::LinuxPopulateWrite)
        }
        .is_ok()
    };
    if !populated {
        for offset in (0..length).step_by(page) {
            // SAFETY: `offset < length <= capacity`: a byte of this buffer's own spare
            // capacity, written (not read) while nothing else refers to it.
            unsafe { buffer.as_mut_ptr().add(offset).write(0) };
        }
    }
    buffer
}
