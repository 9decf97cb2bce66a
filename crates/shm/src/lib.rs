//! # shm: byte rings in shared memory between two processes of one host
//!
//! A [`Region`] is a file (normally in `/dev/shm`, a memory file system) that two
//! processes map into their memory. It holds two single-producer single-consumer byte
//! rings, one per direction: the process that created the region writes into ring 0 and
//! reads ring 1, the one that opened it the other way round. A byte written into a ring
//! is copied once into the shared pages and once out of them by the reader; no system
//! call is made on either side while data flows.
//!
//! Each ring is a data area of `capacity` bytes and two counters on cache lines of their
//! own: `head`, the bytes ever written (only the writer stores it), and `tail`, the bytes
//! ever read (only the reader stores it). The writer copies into the free part,
//! `[head, tail + capacity)`, then publishes the new head with release ordering; the
//! reader loads head with acquire ordering, copies out of `[tail, head)` and publishes
//! the new tail with release ordering. Counters are 64-bit and never wrap in practice
//! (2^64 bytes).
//!
//! This crate only moves bytes and never waits: [`Writer::write_some`] and
//! [`Reader::read_some`] copy what fits or what is there and return at once. How to wait
//! (spin, yield, sleep), how to notice a dead peer and how to frame messages belong to
//! the transport above it. For a reader that sleeps, each ring has a third word,
//! `waiting`: the reader sets it ([`Reader::set_waiting`]) and looks at the ring once
//! more before it sleeps; the writer looks at it after each write
//! ([`Writer::reader_waiting`]) and wakes the reader by whatever means the transport has.
//! Both sides order these with sequentially consistent fences, so that either the reader
//! sees the new bytes or the writer sees the reader waiting: a wake-up is never lost.
//!
//! ## Trust
//!
//! The region is created with mode 0600, by `O_EXCL` (it never reuses a file that already
//! exists), and holds a 32-byte token that the opener checks, so a process of another
//! user cannot attach and a leftover or planted file is refused. The peer is still a
//! separate process that could write anything into the shared pages: every counter read
//! from them is checked (a ring never claims more than `capacity` bytes written and not
//! yet read), and a bad one is an error, never an out-of-bounds copy.
//!
//! ## Why this crate uses `unsafe`
//!
//! Mapping a file into memory (`mmap`), viewing two words of that memory as atomics, and
//! copying between it and a slice are operations the compiler cannot check. They are
//! kept in this one small crate, each with a `// SAFETY:` comment, so that every other
//! crate of Steadfast stays `#![forbid(unsafe_code)]`.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

const MAGIC: [u8; 8] = *b"SFSHMv01";
/// Distance between the counters, so that the writer's and the reader's stores never
/// share a cache line (128: two lines, for CPUs that fetch lines in pairs).
const LINE: usize = 128;
/// Where the header ends and the first counter starts.
const COUNTERS: usize = LINE;
/// Where the data areas start (a page boundary).
const DATA: usize = 4096;

/// A region's secret token, which the opener must know.
pub type Token = [u8; 32];

/// What can go wrong with a region.
#[derive(Debug, thiserror::Error)]
pub enum ShmError {
    /// Creating, sizing, opening or mapping the file failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why it failed.
        source: io::Error,
    },
    /// The file is not the region expected: wrong magic, size or token.
    #[error("{path} is not the region expected: {reason}")]
    Mismatch {
        /// The file.
        path: PathBuf,
        /// What differs.
        reason: String,
    },
    /// The peer left a counter that no correct writer or reader could have written.
    #[error("the shared ring is corrupt: {0}")]
    Corrupt(String),
}

/// A mapped region holding two rings. Dropping the last handle unmaps it. The file is
/// removed by [`Region::unlink`], or when the creator's handle drops before that (it
/// stays only if the creating process dies first, until the next boot clears
/// `/dev/shm`).
pub struct Region {
    base: NonNull<u8>,
    len: usize,
    capacity: usize,
    path: PathBuf,
    /// Whether this handle created the file and has not removed it yet.
    owns_file: std::sync::atomic::AtomicBool,
}

// SAFETY: the mapping stays valid for the Region's whole life and is only unmapped in
// Drop; all shared accesses through it go through atomics or through copies of ranges
// that the ring protocol hands to one side at a time (one writer, one reader per ring),
// so handles may move to and be used from any thread.
unsafe impl Send for Region {}
// SAFETY: as for Send; `&Region` only exposes the counters as atomics and the copies
// made by `Writer` and `Reader`, of which each ring has one of each.
unsafe impl Sync for Region {}

impl Region {
    /// The bytes of a region with rings of `capacity` bytes.
    pub fn size(capacity: usize) -> usize {
        DATA + 2 * capacity
    }

    /// Creates the file `dir/name` (it must not exist), reserves its memory (so that a
    /// full memory file system is an error now, not a crash on first touch) and maps it.
    pub fn create(dir: &Path, name: &str, capacity: usize, token: &Token) -> Result<Region, ShmError> {
        let path = dir.join(name);
        let io = |what, source| ShmError::Io { what, path: path.clone(), source };
        if capacity == 0 {
            return Err(io("size", io::Error::new(io::ErrorKind::InvalidInput, "a ring needs a capacity")));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| io("create", e))?;
        let len = Region::size(capacity);
        let reserved = rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::empty(), 0, len as u64)
            .map_err(io::Error::from)
            .or_else(|e| if e.kind() == io::ErrorKind::Unsupported { file.set_len(len as u64) } else { Err(e) });
        if let Err(e) = reserved {
            let _ = std::fs::remove_file(&path);
            return Err(io("reserve memory for", e));
        }
        let region = match map(&file, len) {
            Ok(base) => Region { base, len, capacity, path, owns_file: true.into() },
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                return Err(io("map", e));
            }
        };
        // The fresh file reads as zeros: both rings empty. The header goes in last.
        region.bytes_mut(8, 8).copy_from_slice(&(capacity as u64).to_le_bytes());
        region.bytes_mut(16, 32).copy_from_slice(token);
        region.bytes_mut(0, 8).copy_from_slice(&MAGIC);
        Ok(region)
    }

    /// Opens and maps the region `dir/name` that a peer created with the same `capacity`
    /// and `token`.
    pub fn open(dir: &Path, name: &str, capacity: usize, token: &Token) -> Result<Region, ShmError> {
        let path = dir.join(name);
        let io = |what, source| ShmError::Io { what, path: path.clone(), source };
        let mismatch = |reason: String| ShmError::Mismatch { path: path.clone(), reason };
        let file = OpenOptions::new().read(true).write(true).open(&path).map_err(|e| io("open", e))?;
        let len = Region::size(capacity);
        let actual = file.metadata().map_err(|e| io("read the size of", e))?.len();
        if actual != len as u64 {
            return Err(mismatch(format!("{actual} bytes, expected {len}")));
        }
        let base = map(&file, len).map_err(|e| io("map", e))?;
        let region = Region { base, len, capacity, path: path.clone(), owns_file: false.into() };
        if region.bytes(0, 8) != MAGIC {
            return Err(mismatch("no region header".into()));
        }
        if region.bytes(8, 8) != (capacity as u64).to_le_bytes() {
            return Err(mismatch("another ring capacity".into()));
        }
        if region.bytes(16, 32) != token {
            return Err(mismatch("another token".into()));
        }
        Ok(region)
    }

    /// Removes the file; the mapping lives on. Once both sides have mapped it, nothing
    /// else can attach, and nothing is left behind when they exit.
    pub fn unlink(&self) -> Result<(), ShmError> {
        self.owns_file.store(false, Ordering::Relaxed);
        std::fs::remove_file(&self.path).map_err(|source| ShmError::Io {
            what: "remove",
            path: self.path.clone(),
            source,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Each ring's capacity in bytes.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// This side's two ends: the creator writes ring 0 and reads ring 1, the opener the
    /// other way round. Each side must take its ends once.
    pub fn ends(self: &Arc<Self>, creator: bool) -> (Writer, Reader) {
        let (w, r) = if creator { (0, 1) } else { (1, 0) };
        (Writer { region: Arc::clone(self), ring: w }, Reader { region: Arc::clone(self), ring: r })
    }

    /// The word `which` (0: head, 1: tail, 2: waiting) of ring `ring`.
    fn counter(&self, ring: usize, which: usize) -> &AtomicU64 {
        let offset = COUNTERS + (3 * ring + which) * LINE;
        debug_assert!(offset + 8 <= DATA);
        // SAFETY: offset + 8 lies inside the mapping (below DATA); the mapping is page
        // aligned and `offset` a multiple of 128, so the pointer is aligned for u64; the
        // memory lives as long as `self`; and every access to these 8 bytes, in either
        // process, is atomic.
        unsafe { AtomicU64::from_ptr(self.base.as_ptr().add(offset).cast::<u64>()) }
    }

    /// Bytes of the header (only touched before the rings are in use).
    fn bytes(&self, offset: usize, len: usize) -> &[u8] {
        assert!(offset + len <= COUNTERS);
        // SAFETY: the range lies inside the mapping, which lives as long as `self`; the
        // header is written only by `create`, before the peer is told the region exists.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(offset), len) }
    }

    #[allow(clippy::mut_from_ref)]
    fn bytes_mut(&self, offset: usize, len: usize) -> &mut [u8] {
        assert!(offset + len <= COUNTERS);
        // SAFETY: as in `bytes`; only `create` calls this, while it holds the only handle.
        unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr().add(offset), len) }
    }

    /// Copies `src` into ring `ring`'s data at `at` (wrapping round the end).
    fn copy_in(&self, ring: usize, at: usize, src: &[u8]) {
        let first = src.len().min(self.capacity - at);
        let area = DATA + ring * self.capacity;
        // SAFETY: `at < capacity` and `first <= capacity - at`, and the rest (which
        // starts again at the area's beginning) is at most `capacity - first`, so both
        // copies stay inside this ring's data area of the mapping; `src` is a slice of
        // this process's own memory, which cannot overlap the mapping. By the ring
        // protocol the peer does not touch the free range being written.
        unsafe {
            let data = self.base.as_ptr().add(area);
            std::ptr::copy_nonoverlapping(src.as_ptr(), data.add(at), first);
            std::ptr::copy_nonoverlapping(src.as_ptr().add(first), data, src.len() - first);
        }
    }

    /// Copies ring `ring`'s data at `at` (wrapping round the end) into `dst`.
    fn copy_out(&self, ring: usize, at: usize, dst: &mut [u8]) {
        let first = dst.len().min(self.capacity - at);
        let area = DATA + ring * self.capacity;
        // SAFETY: as in `copy_in`, both ranges lie inside the ring's data area and `dst`
        // is this process's own memory; the writer does not touch the written range
        // until the tail that this read publishes has passed it.
        unsafe {
            let data = self.base.as_ptr().add(area);
            std::ptr::copy_nonoverlapping(data.add(at), dst.as_mut_ptr(), first);
            std::ptr::copy_nonoverlapping(data, dst.as_mut_ptr().add(first), dst.len() - first);
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // A region given up before both sides mapped it (the peer refused it, or the
        // setup failed) leaves no file behind.
        if *self.owns_file.get_mut() {
            let _ = std::fs::remove_file(&self.path);
        }
        // SAFETY: `base` and `len` are those of the mapping made in `map`, unmapped only
        // here, when the last handle (and so every borrow of its memory) is gone.
        let _ = unsafe { rustix::mm::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// Maps `len` bytes of `file`, shared and writable.
fn map(file: &File, len: usize) -> io::Result<NonNull<u8>> {
    use rustix::mm::{MapFlags, ProtFlags, mmap};
    // Populated: the page tables are filled now, so that the first laps round a ring do
    // not fault on every page.
    let flags = MapFlags::SHARED | MapFlags::POPULATE;
    // SAFETY: a fresh mapping at an address the kernel chooses aliases no Rust object;
    // the file is at least `len` bytes long (the callers set or check its size), so
    // every page of the mapping is backed.
    let ptr = unsafe { mmap(std::ptr::null_mut(), len, ProtFlags::READ | ProtFlags::WRITE, flags, file, 0) }
        .map_err(io::Error::from)?;
    NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))
}

/// The writing end of one ring.
pub struct Writer {
    region: Arc<Region>,
    ring: usize,
}

impl Writer {
    /// Copies as much of `src` as fits and publishes it; returns the number of bytes
    /// written (zero when the ring is full).
    pub fn write_some(&self, src: &[u8]) -> Result<usize, ShmError> {
        let r = &*self.region;
        let (head, free) = self.place()?;
        let n = src.len().min(free);
        if n > 0 {
            r.copy_in(self.ring, (head % r.capacity as u64) as usize, &src[..n]);
            r.counter(self.ring, 0).store(head + n as u64, Ordering::Release);
        }
        Ok(n)
    }

    /// Bytes that a write would take now.
    pub fn free(&self) -> Result<usize, ShmError> {
        Ok(self.place()?.1)
    }

    /// The head, and the free bytes after it, checking the tail the reader published.
    fn place(&self) -> Result<(u64, usize), ShmError> {
        let r = &*self.region;
        let head = r.counter(self.ring, 0).load(Ordering::Relaxed);
        let used = head.wrapping_sub(r.counter(self.ring, 1).load(Ordering::Acquire));
        if used > r.capacity as u64 {
            return Err(ShmError::Corrupt(format!(
                "the reader claims {used} bytes unread in a ring of {}",
                r.capacity
            )));
        }
        Ok((head, r.capacity - used as usize))
    }

    /// Whether the reader said it is going to sleep: call after a write, and wake it.
    pub fn reader_waiting(&self) -> bool {
        std::sync::atomic::fence(Ordering::SeqCst);
        self.region.counter(self.ring, 2).load(Ordering::Relaxed) != 0
    }
}

/// The reading end of one ring.
pub struct Reader {
    region: Arc<Region>,
    ring: usize,
}

impl Reader {
    /// Copies as many waiting bytes as fit in `dst` and frees their room; returns the
    /// number of bytes read (zero when the ring is empty).
    pub fn read_some(&self, dst: &mut [u8]) -> Result<usize, ShmError> {
        let r = &*self.region;
        let tail = r.counter(self.ring, 1).load(Ordering::Relaxed);
        let head = r.counter(self.ring, 0).load(Ordering::Acquire);
        let waiting = head.wrapping_sub(tail);
        if waiting > r.capacity as u64 {
            return Err(ShmError::Corrupt(format!("the writer claims {waiting} bytes in a ring of {}", r.capacity)));
        }
        let n = dst.len().min(waiting as usize);
        if n > 0 {
            r.copy_out(self.ring, (tail % r.capacity as u64) as usize, &mut dst[..n]);
            r.counter(self.ring, 1).store(tail + n as u64, Ordering::Release);
        }
        Ok(n)
    }

    /// Says whether this reader is going to sleep until woken. After setting it, look at
    /// the ring ([`Reader::ready`]) once more before sleeping.
    pub fn set_waiting(&self, waiting: bool) {
        self.region.counter(self.ring, 2).store(u64::from(waiting), Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::SeqCst);
    }

    /// Whether bytes are waiting to be read.
    pub fn ready(&self) -> bool {
        let r = &*self.region;
        r.counter(self.ring, 0).load(Ordering::Acquire) != r.counter(self.ring, 1).load(Ordering::Relaxed)
    }
}
