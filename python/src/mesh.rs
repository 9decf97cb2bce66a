//! Steadfast's mesh under PyTorch's gradient hook (`steadfast.ddp.ReproducibleGradients(...,
//! transport="steadfast")`): a bucket's reproducible sum in one call, on the transport of
//! Steadfast's own jobs, instead of two gloo all-reduces with the conversions between them.
//!
//! The ranks meet through `torch.distributed` (each posts the address it listens on, rank 0
//! a secret), then connect as a job's ranks do: shared-memory rings between ranks of one
//! host, authenticated TCP between hosts. [`Mesh::mean`] then runs the ring all-reduce of
//! the trainer ([`comm::collective::Reducer::sum_fixed`]): the blocks' scales and the count
//! of terms in one round, the integers reduced and scattered with each rank's terms
//! converted as the chunks pass, each rank's chunk turned back into floats as it completes,
//! and the floats gathered. The integers and the scales are the hook's (its lanes and
//! headroom), so the bits are those of the gloo path: the same function, another transport.
#![forbid(unsafe_code)]

use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::time::Duration;

use comm::collective::{FixedPoint, Reducer};
use comm::transport::{TcpConfig, TcpMesh, Transport};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use crate::host::{host_bytes, host_bytes_mut};

/// A tensor's address and size in bytes.
type At = (usize, usize);

/// One rank's place in a mesh of the hook's ranks.
#[pyclass(module = "steadfast._steadfast")]
pub struct Mesh {
    /// Until [`Mesh::connect`]: the socket the other ranks will reach.
    listener: Option<TcpListener>,
    mesh: Option<TcpMesh>,
    reducer: Reducer,
    /// Terms that arrive in several pieces, laid end to end here (reused every call).
    laid: Vec<Vec<f32>>,
    timeout: Duration,
}

#[pymethods]
impl Mesh {
    /// Listens on `host` (an address of this machine that the other ranks reach) at a port
    /// the system picks.
    #[new]
    fn new(host: &str) -> PyResult<Self> {
        let listener = TcpListener::bind((host, 0))
            .map_err(|e| PyRuntimeError::new_err(format!("cannot listen on {host}: {e}")))?;
        Ok(Mesh {
            listener: Some(listener),
            mesh: None,
            reducer: Reducer::default(),
            laid: Vec::new(),
            timeout: Duration::ZERO,
        })
    }

    /// The address the other ranks connect to, `host:port`.
    fn address(&self) -> PyResult<String> {
        let listener = self.listener.as_ref().ok_or_else(|| PyRuntimeError::new_err("the mesh is connected"))?;
        let addr = listener.local_addr().map_err(|e| PyRuntimeError::new_err(format!("no local address: {e}")))?;
        Ok(addr.to_string())
    }

    /// Joins the mesh as `rank` of `addresses` (every rank's [`Mesh::address`], in rank
    /// order), the ranks proving to each other that they hold `secret`. Each collective
    /// afterwards fails within `timeout` seconds on every survivor if a rank is lost.
    fn connect(
        &mut self,
        py: Python<'_>,
        rank: usize,
        addresses: Vec<String>,
        secret: Vec<u8>,
        timeout: f64,
    ) -> PyResult<()> {
        if !(timeout.is_finite() && timeout > 0.0) {
            return Err(PyValueError::new_err(format!("timeout={timeout}: give a positive number of seconds")));
        }
        if rank >= addresses.len() {
            return Err(PyValueError::new_err(format!("rank {rank} of {} addresses", addresses.len())));
        }
        let addrs = addresses
            .iter()
            .map(|a| {
                a.to_socket_addrs()
                    .ok()
                    .and_then(|mut it| it.next())
                    .ok_or_else(|| PyValueError::new_err(format!("{a:?} is not an address (host:port)")))
            })
            .collect::<PyResult<Vec<SocketAddr>>>()?;
        let listener = self.listener.take().ok_or_else(|| PyRuntimeError::new_err("the mesh is already connected"))?;
        let timeout = Duration::from_secs_f64(timeout);
        let config = TcpConfig {
            secret,
            max_frame: comm::frame::DEFAULT_MAX_FRAME,
            connect_timeout: timeout,
            write_timeout: timeout,
            abort_grace: Duration::ZERO,
            shared_memory: comm::local::default_dir(),
        };
        let mesh = py
            .allow_threads(|| TcpMesh::connect(rank, listener, &addrs, &config))
            .map_err(|e| PyRuntimeError::new_err(format!("cannot join the hook's mesh: {e}")))?;
        self.mesh = Some(mesh);
        self.timeout = timeout;
        Ok(())
    }

    /// This rank's place: `(rank, world)`.
    fn place(&self) -> PyResult<(usize, usize)> {
        let mesh = self.mesh.as_ref().ok_or_else(|| PyRuntimeError::new_err("the mesh is not connected"))?;
        Ok((mesh.rank(), mesh.world()))
    }

    /// The reproducible sum over every rank of every rank's float32 `terms` (each a list of
    /// tensors laid end to end, as many elements as `out`), in integers of `lanes` bits
    /// (32 or 64) with `headroom` bits for the count of terms, into the float32 tensor
    /// `out`, each element then divided by `divisor` (the number of micro-batches, for a
    /// mean). Every rank calls it with the same lanes, headroom and length.
    #[pyo3(signature = (terms, out, lanes, headroom, divisor))]
    fn mean(
        &mut self,
        py: Python<'_>,
        terms: Vec<Vec<At>>,
        out: At,
        lanes: u32,
        headroom: u32,
        divisor: f32,
    ) -> PyResult<()> {
        let Mesh { mesh, reducer, laid, timeout, .. } = self;
        let mesh = mesh.as_ref().ok_or_else(|| PyRuntimeError::new_err("the mesh is not connected"))?;
        let wide = match lanes {
            64 => true,
            32 => false,
            other => {
                return Err(PyValueError::new_err(format!("lanes={other}: the integer sum has 32- or 64-bit lanes")));
            }
        };
        let out: &mut [f32] = bytemuck::try_cast_slice_mut(host_bytes_mut(out.0, out.1))
            .map_err(|e| PyValueError::new_err(format!("the output is not a whole, aligned float32 tensor: {e}")))?;
        let n = out.len();
        let mut pieces = Vec::with_capacity(terms.len());
        for term in &terms {
            let term = term
                .iter()
                .map(|&(addr, bytes)| {
                    bytemuck::try_cast_slice::<u8, f32>(host_bytes(addr, bytes)).map_err(|e| {
                        PyValueError::new_err(format!("a gradient is not a whole, aligned float32 tensor: {e}"))
                    })
                })
                .collect::<PyResult<Vec<&[f32]>>>()?;
            let len: usize = term.iter().map(|p| p.len()).sum();
            if len != n {
                return Err(PyValueError::new_err(format!("a gradient of {len} elements in a sum of {n}")));
            }
            pieces.push(term);
        }
        let timeout = *timeout;
        py.allow_threads(|| {
            // A term in one piece is read where it lies; one in several is laid end to end.
            let several = pieces.iter().filter(|t| t.len() > 1).count();
            laid.resize_with(several.max(laid.len()), Vec::new);
            let mut spare = laid.iter_mut();
            let mut owned = Vec::with_capacity(several);
            for term in pieces.iter().filter(|t| t.len() > 1) {
                let buf = spare.next().expect("one buffer per term in pieces");
                buf.clear();
                term.iter().for_each(|p| buf.extend_from_slice(p));
                owned.push(&buf[..]);
            }
            let mut owned = owned.into_iter();
            let parts: Vec<&[f32]> = pieces
                .iter()
                .map(|t| if t.len() == 1 { t[0] } else { owned.next().expect("laid out above") })
                .collect();
            reducer
                .sum_fixed(mesh, &parts, out, FixedPoint { wide, headroom }, timeout)
                .map_err(|e| PyRuntimeError::new_err(format!("the reproducible sum on the hook's mesh failed: {e}")))?;
            if divisor != 1.0 {
                out.iter_mut().for_each(|o| *o /= divisor);
            }
            Ok(())
        })
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Mesh>()
}
