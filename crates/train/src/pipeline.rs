//! A pipeline stage's side of a step, as the step driver's [`Runner`]: the boundary
//! tensors go to and come from the neighbouring stages over any [`Transport`] (one rank
//! a stage), and the stage's gradient sum is its own (one replica a stage).
//!
//! With a [`schedule::gpipe`](crate::schedule::gpipe) or
//! [`schedule::one_f_one_b`](crate::schedule::one_f_one_b) schedule and an engine
//! [`for_stage`](crate::step::Engine::for_stage), each stage steps its own parameters, and
//! the stages together compute the bits of the whole model in one process.

use std::time::{Duration, Instant};

use comm::transport::{CommError, Transport};

use crate::driver::Runner;
use crate::error::TrainError;
use crate::schedule::Boundary;
use crate::step::At;

/// The frame kind of an activation, and of a gradient.
const ACTIVATION: u8 = 0x50;
const GRADIENT: u8 = 0x51;

/// One stage's runner over `T`, whose rank `s` is stage `s`. A stage sums its own
/// micro-batches and refuses a non-finite gradient alone (the driver's defaults).
pub struct StageLink<T> {
    transport: T,
    timeout: Duration,
    bytes: Vec<u8>,
}

impl<T: Transport> StageLink<T> {
    /// The stage whose transport is `transport`; a boundary tensor not received within
    /// `timeout` fails the step.
    pub fn new(transport: T, timeout: Duration) -> Self {
        StageLink { transport, timeout, bytes: Vec::new() }
    }
}

fn kind(tensor: Boundary) -> u8 {
    match tensor {
        Boundary::Activation => ACTIVATION,
        Boundary::Gradient => GRADIENT,
    }
}

impl<T: Transport> Runner for StageLink<T> {
    fn send(&mut self, _at: At, peer: usize, _micro: usize, tensor: Boundary, data: &[f32]) -> Result<(), TrainError> {
        self.bytes.clear();
        self.bytes.extend(data.iter().flat_map(|v| v.to_le_bytes()));
        self.transport.send(peer, kind(tensor), &self.bytes)?;
        Ok(())
    }

    fn recv(
        &mut self,
        _at: At,
        peer: usize,
        micro: usize,
        tensor: Boundary,
        data: &mut Vec<f32>,
    ) -> Result<(), TrainError> {
        let got = self.transport.recv_into(peer, Instant::now() + self.timeout, &mut self.bytes)?;
        if got != kind(tensor) || !self.bytes.len().is_multiple_of(4) {
            return Err(CommError::Protocol {
                peer,
                reason: format!(
                    "expected the {tensor:?} of micro-batch {micro} (kind {:#x}), got kind {got:#x} of {} bytes",
                    kind(tensor),
                    self.bytes.len()
                ),
            }
            .into());
        }
        data.clear();
        data.extend(self.bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])));
        Ok(())
    }
}
