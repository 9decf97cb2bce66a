//! Buffers that a pass hands back when it is done, for the next step to reuse.
//!
//! A GPT step needs dozens of activation and gradient buffers, some of tens of megabytes
//! (attention's probabilities at context 256). Allocated fresh each step, the large ones
//! come from the system as new pages that the kernel zeroes on first touch, and the small
//! ones are zeroed again by the allocator: a sixth of a step on one thread went there.
//! A [`Scratch`] buffer goes back to the process's free list when dropped, and the next
//! request takes the smallest free buffer that is long enough, so once warm a step asks the
//! allocator for nothing large. The list is one for the process, not one per thread: a
//! step runs on whichever thread of the pool picks it up, and lists per thread would each
//! fill up with a step's worth of buffers.
//!
//! Reuse never reaches a result: [`Scratch::zeros`] is zero, and [`Scratch::output`] is
//! for a kernel's output that the kernel writes in full before anything reads it (a matrix
//! product's `c`, a layer norm's outputs). In builds with debug assertions `output` is
//! filled with NaN, so that a kernel that leaves an element unwritten shows up in the tests.

use std::ops::{Deref, DerefMut};
use std::sync::{Mutex, MutexGuard};

/// Most buffers the list keeps; beyond it the smallest is released.
const KEPT: usize = 512;

static FREE: Mutex<Vec<Vec<f32>>> = Mutex::new(Vec::new());

/// The free list. A panic while it was held left it a plain list of buffers, still whole.
fn free() -> MutexGuard<'static, Vec<Vec<f32>>> {
    FREE.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// An `f32` buffer borrowed from the process's free list and given back when dropped.
pub(in crate::model) struct Scratch(Vec<f32>);

impl Scratch {
    /// `len` zeros.
    pub(in crate::model) fn zeros(len: usize) -> Scratch {
        let mut buf = take(len);
        buf.clear();
        buf.resize(len, 0.0);
        Scratch(buf)
    }

    /// `len` values of no particular content, for an output written in full before it is
    /// read (see the module documentation).
    pub(in crate::model) fn output(len: usize) -> Scratch {
        let mut buf = take(len);
        if cfg!(debug_assertions) {
            buf.clear();
            buf.resize(len, f32::NAN);
        } else {
            buf.truncate(len);
            buf.resize(len, 0.0);
        }
        Scratch(buf)
    }

    /// Takes `v` in, so that it goes to the free list when dropped.
    pub(in crate::model) fn adopt(v: Vec<f32>) -> Scratch {
        Scratch(v)
    }

    /// The values as a vector of their own, which leaves the free list for good.
    pub(in crate::model) fn into_vec(mut self) -> Vec<f32> {
        std::mem::take(&mut self.0)
    }
}

/// The smallest free buffer of at least `len` values, or a new one.
fn take(len: usize) -> Vec<f32> {
    let mut free = free();
    let best = free.iter().enumerate().filter(|(_, b)| b.capacity() >= len).min_by_key(|(_, b)| b.capacity());
    match best {
        Some((i, _)) => free.swap_remove(i),
        None => Vec::with_capacity(len),
    }
}

/// Fills every free buffer, to its capacity, with NaN: a pass run after this that read a
/// value its kernel had not written would show it.
#[cfg(test)]
pub(in crate::model) fn poison() {
    for buf in free().iter_mut() {
        buf.clear();
        buf.resize(buf.capacity(), f32::NAN);
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.0);
        if buf.capacity() == 0 {
            return;
        }
        let mut free = free();
        free.push(buf);
        if free.len() > KEPT {
            let smallest = (0..free.len()).min_by_key(|&i| free[i].capacity()).expect("the list is not empty");
            free.swap_remove(smallest);
        }
    }
}

impl Deref for Scratch {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        &self.0
    }
}

impl DerefMut for Scratch {
    fn deref_mut(&mut self) -> &mut [f32] {
        &mut self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeros_are_zero_and_outputs_have_their_length_whatever_was_freed() {
        let mut a = Scratch::output(1000);
        a.fill(7.0);
        drop(a);
        poison();
        let b = Scratch::zeros(900);
        assert!(b.len() == 900 && b.iter().all(|&v| v == 0.0));
        assert_eq!(Scratch::output(1200).len(), 1200);
    }

    #[test]
    fn a_vector_taken_out_keeps_its_values() {
        let mut s = Scratch::zeros(10);
        s[3] = 2.0;
        let v = s.into_vec();
        assert_eq!(v.len(), 10);
        assert_eq!(v[3], 2.0);
    }
}
