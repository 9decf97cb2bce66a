//! A job's worker processes on this node: each started as a copy of this executable with
//! its place in the job in its environment, its output forwarded line by line under a
//! `[slot]` prefix, and its exit heard as an event.
//!
//! No loop polls the children. For each worker a thread waits until both of its output
//! pipes close, then reaps it and sends an [`Exited`] event into the launcher's channel,
//! where it arrives among the coordinator's events. The pipes close when the worker exits
//! (a stopped worker keeps them open), unless a process the worker started outlives it
//! with them: a `steadfast train` worker starts none that lives on. Killing goes through
//! the same handle, so a signal never reaches a process that was already reaped (whose
//! pid may be reused).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::LaunchError;

/// A worker's process ended.
#[derive(Debug)]
pub struct Exited {
    /// The worker's slot.
    pub slot: usize,
    /// Which of the slot's processes (0 for the first).
    pub incarnation: u64,
    /// How it ended (an error if it could not be reaped).
    pub status: Result<ExitStatus, String>,
}

/// A running worker.
struct Running {
    incarnation: u64,
    child: Arc<Mutex<Child>>,
}

/// The subcommand of this executable that `command` runs (`train`, `bench`, or a word
/// that names no program), or `None` when it runs another program (`python train.py`: a
/// path, or a name found on the `PATH`), which the workers start as it is.
pub fn own_subcommand(command: &[String]) -> Option<&str> {
    let first = command.first().map(String::as_str)?;
    (matches!(first, "train" | "bench") || !is_program(first)).then_some(first)
}

/// Whether `name` is a program to run: a path to a file, or a file found on the `PATH`.
fn is_program(name: &str) -> bool {
    if name.contains('/') {
        return std::path::Path::new(name).is_file();
    }
    std::env::var_os("PATH").is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(name).is_file()))
}

/// The workers this launcher started, by slot; their exits go to a channel as `T`.
pub struct Workers<T> {
    exe: PathBuf,
    command: Vec<String>,
    env: Vec<(String, String)>,
    running: BTreeMap<usize, Running>,
    events: Sender<T>,
    wrap: fn(Exited) -> T,
    waiters: Vec<JoinHandle<()>>,
}

fn lock(child: &Mutex<Child>) -> std::sync::MutexGuard<'_, Child> {
    child.lock().unwrap_or_else(|e| e.into_inner())
}

impl<T: Send + 'static> Workers<T> {
    /// Workers that run this executable with `command` (`train ...`), or the program it
    /// names (`python train.py`), and `env` (the job's
    /// settings, the same for every worker); each exit is sent to `events` as `wrap(exit)`.
    pub fn new(
        command: &[String],
        env: Vec<(String, String)>,
        events: Sender<T>,
        wrap: fn(Exited) -> T,
    ) -> Result<Self, LaunchError> {
        let (exe, command) = match own_subcommand(command) {
            Some(_) => {
                (std::env::current_exe().map_err(LaunchError::io("cannot find this executable"))?, command.to_vec())
            }
            None => {
                let (program, args) =
                    command.split_first().ok_or_else(|| LaunchError::Config("no worker command".into()))?;
                (PathBuf::from(program), args.to_vec())
            }
        };
        let mut env = env;
        env.push((crate::LAUNCHER_PID.to_owned(), std::process::id().to_string()));
        Ok(Workers { exe, command, env, running: BTreeMap::new(), events, wrap, waiters: Vec::new() })
    }

    /// Starts process `incarnation` of `slot`, with `env` besides the job's; returns its pid.
    pub fn start(&mut self, slot: usize, incarnation: u64, env: &[(String, String)]) -> Result<u32, LaunchError> {
        let mut child = Command::new(&self.exe)
            .args(&self.command)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(LaunchError::io(format!("cannot start worker {slot}")))?;
        let pid = child.id();
        let pumps = forward_output(slot, &mut child);
        let child = Arc::new(Mutex::new(child));
        let (reaped, events, wrap) = (Arc::clone(&child), self.events.clone(), self.wrap);
        self.waiters.push(std::thread::spawn(move || {
            // The output ends when the process does: then it is reaped at once.
            for p in pumps {
                let _ = p.join();
            }
            let status = lock(&reaped).wait().map_err(|e| e.to_string());
            let _ = events.send(wrap(Exited { slot, incarnation, status }));
        }));
        self.running.insert(slot, Running { incarnation, child });
        Ok(pid)
    }

    /// Kills the process of `slot` if it still runs (and, given `incarnation`, only that
    /// process of the slot); returns its pid when it was signalled.
    pub fn kill(&mut self, slot: usize, incarnation: Option<u64>) -> Option<u32> {
        let r = self.running.get(&slot).filter(|r| incarnation.is_none_or(|i| i == r.incarnation))?;
        let mut child = lock(&r.child);
        if child.try_wait().ok().flatten().is_some() {
            return None;
        }
        let _ = child.kill();
        Some(child.id())
    }

    /// Takes note of an exit that the channel delivered: the slot is free.
    pub fn exited(&mut self, e: &Exited) {
        if self.running.get(&e.slot).is_some_and(|r| r.incarnation == e.incarnation) {
            self.running.remove(&e.slot);
        }
    }

    /// The slots whose process runs, in order.
    pub fn running(&self) -> Vec<usize> {
        self.running.keys().copied().collect()
    }

    /// Whether any worker runs.
    pub fn any_running(&self) -> bool {
        !self.running.is_empty()
    }

    /// Waits until every worker's output has been forwarded.
    pub fn join(self) {
        for w in self.waiters {
            let _ = w.join();
        }
    }
}

/// Forwards a worker's standard output and error (piped) to ours, each line prefixed with
/// `[slot]` and written whole, to the end of each pipe (bytes that are not UTF-8 are
/// replaced, not a reason to stop).
fn forward_output(slot: usize, child: &mut Child) -> [JoinHandle<()>; 2] {
    let out = child.stdout.take().expect("piped");
    let err = child.stderr.take().expect("piped");
    [
        std::thread::spawn(move || {
            each_line(out, |line| println!("[{slot}] {line}"));
        }),
        std::thread::spawn(move || {
            each_line(err, |line| {
                // One write per line: unbuffered, a formatted line goes out in pieces.
                let text = format!("[{slot}] {line}\n");
                let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), text.as_bytes());
            });
        }),
    ]
}

/// Calls `f` with each line of `pipe` until it closes (or cannot be read).
fn each_line(pipe: impl std::io::Read, mut f: impl FnMut(&str)) {
    let mut reader = BufReader::new(pipe);
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                let text = String::from_utf8_lossy(&line);
                f(text.trim_end_matches(['\n', '\r']));
            }
        }
    }
}

#[cfg(test)]
mod program_tests {
    use super::own_subcommand;

    fn words(w: &[&str]) -> Vec<String> {
        w.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_worker_command_runs_this_executable_unless_it_names_another_program() {
        assert_eq!(own_subcommand(&words(&["train", "--steps", "3"])), Some("train"));
        // A word that names no program is this executable's (and refused unless train).
        assert_eq!(own_subcommand(&words(&["no-such-program-here"])), Some("no-such-program-here"));
        // A program on the PATH, or a path to one, runs as it is.
        assert_eq!(own_subcommand(&words(&["sh", "-c", "true"])), None);
        assert_eq!(own_subcommand(&words(&["/bin/sh"])), None);
        assert_eq!(own_subcommand(&[]), None);
    }
}
