//! The trainer's behaviour, one module each, in one test binary (each binary of this crate
//! links the whole of burn: one for all builds and links it once). `no_alloc.rs` stays a
//! binary of its own: it counts the allocations of its process.

#[path = "../common/mod.rs"]
mod common;

mod data_errors;
mod determinism;
mod fixed_kernels;
mod initial;
mod models;
mod one_step;
mod pipeline;
mod quality;
mod replay;
mod resume;
mod undo;
