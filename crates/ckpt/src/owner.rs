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
//! A writer that belongs to a job of several processes (an elastic job, whose committer
//! changes from epoch to epoch) names its job in the lock file too
//! ([`Owner::acquire_for`]). Then a process can tell a lock held by a former member of its
//! own job, which it may wait for, from one held by another job, which it must refuse
//! ([`holder`], [`Holder::is_other_job`]).
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

/// Who holds a lock, as its lock file says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    /// "pid 1234 on host a", and the job where one was named ("pid 1234 on host a, job 5f..").
    pub text: String,
    /// The job the holder belongs to, where it named one.
    pub job: Option<String>,
}

impl Holder {
    fn parse(text: &str) -> Holder {
        let text = text.trim();
        let job = text.rsplit_once(", job ").map(|(_, j)| j.trim().to_owned()).filter(|j| !j.is_empty());
        Holder { text: if text.is_empty() { "another process".to_owned() } else { text.to_owned() }, job }
    }

    /// Whether the holder is not a member of job `job`: a plain run, or another job.
    pub fn is_other_job(&self, job: &str) -> bool {
        self.job.as_deref() != Some(job)
    }
}

/// Who holds the lock of part `part` under `root` right now (`None`: nobody, or no such
/// lock file). Takes no lock that outlives the call.
pub fn holder(root: &Path, part: usize) -> Result<Option<Holder>> {
    let path = lock_path(root, part);
    let mut file = match OpenOptions::new().read(true).open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(CkptError::io("cannot open the lock file", &path)(e)),
    };
    match file.try_lock_shared() {
        Ok(()) => {
            let _ = file.unlock();
            Ok(None)
        }
        Err(TryLockError::WouldBlock) => {
            let mut text = String::new();
            let _ = file.read_to_string(&mut text);
            Ok(Some(Holder::parse(&text)))
        }
        Err(TryLockError::Error(e)) => Err(CkptError::io("cannot lock", &path)(e)),
    }
}

/// Fails with [`CkptError::Busy`] when another run (a plain one, or another job than
/// `job`) holds the lock of `root`: a job of several writers checks this before its first
/// step, since it must not write beside that run.
pub fn refuse_other_jobs(root: &Path, job: &str) -> Result<()> {
    match holder(root, 0)? {
        Some(h) if h.is_other_job(job) => Err(CkptError::Busy { dir: root.to_path_buf(), holder: h.text, job: h.job }),
        _ => Ok(()),
    }
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
        Self::acquire_for(root, part, None)
    }

    /// [`acquire`](Owner::acquire) for a member of job `job` (an identifier the job's
    /// processes share), which the lock file names for whoever finds it held.
    pub fn acquire_for(root: &Path, part: usize, job: Option<&str>) -> Result<Owner> {
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
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                let Holder { text, job } = Holder::parse(&text);
                return Err(CkptError::Busy { dir: root.to_owned(), holder: text, job });
            }
            Err(TryLockError::Error(e)) => return Err(CkptError::io("cannot lock", &path)(e)),
        }
        let me = match job {
            Some(job) => format!("pid {} on host {}, job {job}\n", std::process::id(), hostname()),
            None => format!("pid {} on host {}\n", std::process::id(), hostname()),
        };
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

    #[test]
    fn a_held_lock_names_its_job_and_a_free_one_names_nobody() {
        let root = tempfile::tempdir().unwrap();
        assert_eq!(holder(root.path(), 0).unwrap(), None, "no lock file yet");
        let plain = Owner::acquire(root.path(), 0).unwrap();
        let h = holder(root.path(), 0).unwrap().expect("held");
        assert_eq!(h.job, None);
        assert!(h.is_other_job("a1"), "a plain run is never a member of a job");
        drop(plain);
        assert_eq!(holder(root.path(), 0).unwrap(), None, "released");
        let member = Owner::acquire_for(root.path(), 0, Some("a1")).unwrap();
        let h = holder(root.path(), 0).unwrap().expect("held");
        assert_eq!(h.job.as_deref(), Some("a1"));
        assert!(!h.is_other_job("a1") && h.is_other_job("b2"));
        match Owner::acquire_for(root.path(), 0, Some("b2")).unwrap_err() {
            CkptError::Busy { job, holder, .. } => {
                assert_eq!(job.as_deref(), Some("a1"));
                assert!(holder.contains("job a1"), "{holder}");
            }
            other => panic!("{other}"),
        }
        drop(member);
    }
}
