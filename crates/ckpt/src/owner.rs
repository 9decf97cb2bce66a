//! Who writes a checkpoint directory: one owner per part, held by an advisory lock.
//!
//! Two runs that write into one checkpoint root would destroy each other's checkpoints:
//! each one's retention deletes the other's, each one's start-up cleanup removes the
//! other's temporaries mid-write, and `LATEST` flips between them. So every writer first
//! takes the lock of its part, `<root>/.writer-<part>.lock`, with `flock(2)` (through
//! [`File::try_lock`]):
//!
//! - the kernel releases the lock when the process dies, however it dies, so a `kill -9`
//!   never leaves a stale lock behind, and a replacement of a dead writer takes its part;
//! - a second writer of the same part is refused at once with [`CkptError::Busy`], which
//!   names the holder's pid and host (the holder writes them into the lock file);
//! - the writers of a parted checkpoint (the replicas of a data-parallel job) each own a
//!   different part, so they do not exclude one another, while two jobs on one root
//!   collide on part 0 at least.
//!
//! The owner of part 0 is the writer that commits, and it alone removes temporaries left
//! in the root: holding that lock proves that no other committer is alive, and any other
//! writer of this job has not begun to write (writers are created before the job's first
//! step), so every temporary present then belongs to a dead process.
//!
//! Readers (`ckpt verify`, `export`, a resume) take no lock: a committed checkpoint never
//! changes, and the commit protocol keeps them from seeing a half-written one.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use crate::error::{CkptError, Result};

/// The lock file of writer `part` under `root`.
pub fn lock_path(root: &Path, part: usize) -> PathBuf {
    root.join(format!(".writer-{part:04}.lock"))
}

/// Whether `name` is a writer's lock file (part of a root's layout, not debris).
pub fn is_lock_file(name: &str) -> bool {
    name.strip_prefix(".writer-")
        .and_then(|r| r.strip_suffix(".lock"))
        .is_some_and(|d| d.bytes().all(|b| b.is_ascii_digit()))
}

/// The right to write part `part` of the checkpoints under a root, for as long as it lives.
#[derive(Debug)]
pub struct Owner {
    file: File,
    path: PathBuf,
}

impl Owner {
    /// Takes the lock of part `part` under `root` (created if needed), or fails with
    /// [`CkptError::Busy`] naming the process that holds it.
    pub fn acquire(root: &Path, part: usize) -> Result<Owner> {
        std::fs::create_dir_all(root).map_err(CkptError::io("cannot create", root))?;
        let path = lock_path(root, part);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(CkptError::io("cannot open the lock file", &path))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                return Err(CkptError::Busy {
                    dir: root.to_owned(),
                    holder: if holder.is_empty() { "another process".to_owned() } else { holder.to_owned() },
                });
            }
            Err(TryLockError::Error(e)) => return Err(CkptError::io("cannot lock", &path)(e)),
        }
        let me = format!("pid {} on host {}\n", std::process::id(), hostname());
        file.set_len(0)
            .and_then(|()| file.seek(SeekFrom::Start(0)))
            .and_then(|_| file.write_all(me.as_bytes()))
            .map_err(CkptError::io("cannot write", &path))?;
        Ok(Owner { file, path })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        // Closing the file releases the lock too; unlocking first makes it explicit. The
        // file stays: removing it would race with a writer that has just opened it.
        let _ = self.file.unlock();
    }
}

/// This machine's name, for the lock file (empty where the system will not say).
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_owner_of_a_part_is_refused_with_the_holder_named_until_the_first_leaves() {
        let root = tempfile::tempdir().unwrap();
        let first = Owner::acquire(root.path(), 0).unwrap();
        let err = Owner::acquire(root.path(), 0).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, CkptError::Busy { .. }), "{text}");
        assert!(text.contains(&format!("pid {}", std::process::id())), "{text}");
        // Another part is another owner.
        let other = Owner::acquire(root.path(), 1).unwrap();
        drop(first);
        Owner::acquire(root.path(), 0).unwrap();
        drop(other);
        assert!(is_lock_file(".writer-0000.lock") && !is_lock_file(".writer-x.lock") && !is_lock_file("LATEST"));
    }
}
