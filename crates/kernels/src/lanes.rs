//! Element-wise kernels compiled once per instruction set.
//!
//! A kernel written with [`per_isa!`] is plain Rust over slices, using only operations
//! that IEEE 754 rounds correctly (addition, subtraction, multiplication, division, square
//! root, comparisons, conversions and bit manipulation), never a fused multiply-add and
//! never the platform's maths library. The compiler vectorises such a loop for whichever
//! instruction set the copy is compiled for, and every lane performs exactly the scalar
//! code's operations: the vector width changes the speed, never the bits. The macro
//! compiles the body three times (baseline, AVX2, AVX-512) and picks the copy for the
//! [`Isa`](crate::Isa) the caller names.
//!
//! Rust never contracts a multiplication and an addition into a fused multiply-add on its
//! own, so enabling FMA for a copy cannot change its arithmetic.

/// Defines `$vis fn $name(isa: Isa, args...)` running `$body` compiled for `isa`.
///
/// The body must follow the rules in the [module documentation](self); it may panic (a
/// length check, say) like any function.
macro_rules! per_isa {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident : $ty:ty),* $(,)?) $body:block) => {
        $(#[$meta])*
        ///
        /// Panics if `isa` is not [available](crate::Isa::available) on this CPU.
        $vis fn $name(isa: $crate::Isa, $($arg: $ty),*) {
            #[inline(always)]
            fn body($($arg: $ty),*) $body

            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma")]
            fn avx2($($arg: $ty),*) {
                body($($arg),*)
            }

            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq")]
            fn avx512($($arg: $ty),*) {
                body($($arg),*)
            }

            assert!(isa.available(), "this CPU cannot run the {isa} path");
            match isa {
                $crate::Isa::Scalar => body($($arg),*),
                #[cfg(target_arch = "x86_64")]
                // SAFETY: the assertion above checked that this CPU has AVX2 and FMA.
                $crate::Isa::Avx2 => unsafe { avx2($($arg),*) },
                #[cfg(target_arch = "x86_64")]
                // SAFETY: the assertion above checked that this CPU has these AVX-512 parts.
                $crate::Isa::Avx512 => unsafe { avx512($($arg),*) },
                #[cfg(not(target_arch = "x86_64"))]
                _ => unreachable!("{isa} is never available off x86-64"),
            }
        }
    };
}

pub(crate) use per_isa;
