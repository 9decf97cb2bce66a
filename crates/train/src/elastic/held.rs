//! The state an elastic worker holds, shared with the thread that serves it: the held
//! state and its fingerprint, the server of other workers' fetches, this worker's own
//! fetch from its sources, and the in-memory copy of the rollback baseline.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use comm::port::Port;
use comm::protocol::{Event, Worker, WorkerId};
use comm::transfer::Want;
use comm::transport::CommError;
use fault::crash::Phase;

use crate::error::TrainError;
use crate::failpoint::ProcessFaults;
use crate::step::{At, LiveFaults, TrainState};

/// The state this worker holds, shared with the thread that serves it to fetchers.
pub(super) struct SharedState {
    pub(super) state: TrainState,
    /// The state's fingerprint, once computed: an update leaves it unknown (a pass over
    /// the state that the protocol asks for only when it needs it), except where the
    /// job checks its state at rest (`--on-divergence repair`).
    pub(super) fingerprint: Option<u64>,
}

pub(super) fn lock_read(h: &RwLock<SharedState>) -> std::sync::RwLockReadGuard<'_, SharedState> {
    h.read().unwrap_or_else(|e| e.into_inner())
}

pub(super) fn lock_write(h: &RwLock<SharedState>) -> std::sync::RwLockWriteGuard<'_, SharedState> {
    h.write().unwrap_or_else(|e| e.into_inner())
}

impl SharedState {
    /// The state's fingerprint, computed when unknown.
    pub(super) fn fingerprint(&mut self) -> u64 {
        *self.fingerprint.get_or_insert_with(|| self.state.fingerprint())
    }

    /// The state's fingerprint as it is now (the one known may be what it was committed
    /// with, before a change at rest), which becomes the one known.
    pub(super) fn fingerprint_now(&mut self) -> u64 {
        *self.fingerprint.insert(self.state.fingerprint())
    }
}

/// A digest of the names and shapes of the state's tensors.
pub(super) fn layout_of(state: &TrainState) -> (u64, u64) {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    let mut elements = 0u64;
    for t in state.tensors() {
        h.update(t.name.as_bytes());
        h.update(&[0]);
        for d in &t.shape {
            h.update(&(*d as u64).to_le_bytes());
        }
        elements += t.data.len() as u64;
    }
    (h.digest(), elements)
}

/// Copies the elements `range` of the flat state out as little-endian bytes.
fn copy_out(state: &TrainState, range: Range<usize>, out: &mut Vec<u8>) {
    let mut offset = 0;
    for t in state.tensors() {
        let span = offset..offset + t.data.len();
        let (lo, hi) = (range.start.max(span.start), range.end.min(span.end));
        if lo < hi {
            out.extend_from_slice(bytemuck::cast_slice(&t.data[lo - offset..hi - offset]));
        }
        offset = span.end;
    }
}

/// Writes little-endian `bytes` into the elements `range` of the flat state.
fn copy_in(state: &mut TrainState, range: Range<usize>, bytes: &[u8]) {
    let mut offset = 0;
    let tensors = state.params.iter_mut().chain(state.optimizer.slots_mut());
    for t in tensors {
        let span = offset..offset + t.data.len();
        let (lo, hi) = (range.start.max(span.start), range.end.min(span.end));
        if lo < hi {
            let src = &bytes[4 * (lo - range.start)..4 * (hi - range.start)];
            for (d, s) in t.data[lo - offset..hi - offset].iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes(s.try_into().expect("4 bytes"));
            }
        }
        offset = span.end;
    }
}

/// Serves fetches of the state held, until the process ends. A fetch's first chunk hashes
/// the state: one changed since its commit is refused, and `changed` set for the shell.
pub(super) fn spawn_server(
    port: &mut Port,
    held: Arc<RwLock<SharedState>>,
    layout: (u64, u64),
    (faults, changed): (ProcessFaults, Arc<AtomicBool>),
    id: WorkerId,
) -> Result<(), TrainError> {
    let transfers = port.transfers().ok_or_else(|| CommError::Setup("the port's transfers are taken".into()))?;
    std::thread::spawn(move || {
        while let Ok((peer, stream)) = transfers.recv() {
            let (held, faults, changed) = (Arc::clone(&held), faults.clone(), Arc::clone(&changed));
            std::thread::spawn(move || {
                let mut served = 0u64;
                comm::transfer::serve(stream, Duration::from_secs(60), &mut |want, range, out| {
                    let h = lock_read(&held);
                    if (want.layout, want.elements) != layout {
                        return Err("the state's layout differs (another model or optimizer)".into());
                    }
                    // A source reported its fingerprint, so it is known; a state whose
                    // fingerprint is not (it moved on) is not the one asked for.
                    let Some(fingerprint) = h.fingerprint else {
                        return Err(format!("holds step {} whose fingerprint is not known yet", h.state.step));
                    };
                    if (h.state.step, fingerprint) != (want.step, want.fingerprint) {
                        return Err(format!(
                            "holds step {} ({}), not step {} ({})",
                            h.state.step,
                            repro::fingerprint::hex(fingerprint),
                            want.step,
                            repro::fingerprint::hex(want.fingerprint)
                        ));
                    }
                    if served == 0 && h.state.fingerprint() != fingerprint {
                        // The state changed at rest since its commit: it is not the one
                        // asked for, and this worker's protocol hears so.
                        changed.store(true, Ordering::Relaxed);
                        return Err(format!("the state of step {} changed since its commit", h.state.step));
                    }
                    if served == 1 {
                        // The `transfer` phase: after the first chunk went out.
                        faults.reach(At { step: want.step, rank: id as usize }, Phase::Transfer);
                    }
                    served += 1;
                    copy_out(&h.state, range, out);
                    Ok(h.state.optimizer.updates())
                });
                tracing::debug!(peer, chunks = served, "a fetch ended");
            });
        }
    });
    Ok(())
}

/// The in-memory copy of the rollback baseline (`--copy-every`): what SWIFT's recovery
/// from live replicas does without, at the price of one more model-sized buffer and a
/// copy every few steps.
pub(super) struct MemoryCopy {
    every: Option<u64>,
    state: Option<SharedState>,
    /// Time spent copying.
    pub(super) spent: Duration,
}

impl MemoryCopy {
    pub(super) fn new(every: Option<u64>) -> MemoryCopy {
        MemoryCopy { every, state: None, spent: Duration::ZERO }
    }

    /// Copies `held`, which holds the state of `step`, when `step` is a multiple of the
    /// interval, and tells `worker`; locks `held` only then.
    pub(super) fn keep(&mut self, worker: &mut Worker, step: u64, held: &RwLock<SharedState>) {
        let Some(every) = self.every else { return };
        if !step.is_multiple_of(every) {
            return;
        }
        let held = &mut *lock_write(held);
        let started = Instant::now();
        let fingerprint = held.fingerprint();
        match &mut self.state {
            Some(c) => {
                c.state.clone_from(&held.state);
                c.fingerprint = held.fingerprint;
            }
            None => self.state = Some(SharedState { state: held.state.clone(), fingerprint: held.fingerprint }),
        }
        self.spent += started.elapsed();
        // (The answer is empty: a copy only changes what leaving an epoch does.)
        let _ = worker.step(Instant::now(), Event::Copied { step: held.state.step, fingerprint });
    }

    /// Puts the copy of `(step, fingerprint)` back into `held`.
    pub(super) fn restore(&self, held: &mut SharedState, want: (u64, u64)) -> Result<(), TrainError> {
        match &self.state {
            Some(c) if (c.state.step, c.fingerprint) == (want.0, Some(want.1)) => {
                held.state.clone_from(&c.state);
                held.fingerprint = c.fingerprint;
                Ok(())
            }
            _ => {
                Err(CommError::Setup(format!("the protocol restores a copy of step {} that is not kept", want.0))
                    .into())
            }
        }
    }
}

/// Fetches `want` from `sources` into the state held, checking it against the
/// fingerprint. A fetch that fails after writing part of the state says what the state
/// now is, `(step, fingerprint)`, with its error.
#[allow(clippy::too_many_arguments)]
pub(super) fn fetch(
    port: &Port,
    held: &RwLock<SharedState>,
    book: &BTreeMap<WorkerId, SocketAddr>,
    sources: &[WorkerId],
    want: Want,
    timeout: Duration,
    hooks: &LiveFaults,
    id: WorkerId,
) -> Result<comm::transfer::Fetched, (CommError, Option<(u64, u64)>)> {
    let sources = comm::member::addresses_of(sources, book);
    let deadline = Instant::now() + timeout;
    let dialer = port.dialer();
    let connect = |peer: WorkerId, addr: SocketAddr| dialer.transfer(peer, addr, deadline);
    let mut h = lock_write(held);
    let mut chunks = 0u64;
    let fetched = comm::transfer::fetch(&sources, &connect, &want, timeout, &mut |range, bytes| {
        copy_in(&mut h.state, range, bytes);
        chunks += 1;
        if chunks == 1 {
            hooks.process().reach(At { step: want.step, rank: id as usize }, Phase::Transfer);
        }
    });
    let fetched = match fetched {
        Ok(f) => f,
        Err(e) if chunks == 0 => return Err((e, None)),
        Err(e) => {
            h.fingerprint = None;
            return Err((e, Some((h.state.step, h.fingerprint()))));
        }
    };
    h.state.step = want.step;
    h.state.optimizer.set_updates(fetched.updates);
    h.fingerprint = None;
    let found = h.fingerprint();
    if found != want.fingerprint {
        let e = CommError::Setup(format!(
            "the fetched state has fingerprint {}, not the sources' {}",
            repro::fingerprint::hex(found),
            repro::fingerprint::hex(want.fingerprint)
        ));
        return Err((e, Some((h.state.step, found))));
    }
    Ok(fetched)
}
