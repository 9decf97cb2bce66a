//! `steadfast launch --engine mpi`: one run of a job under the system's MPI starter.
//!
//! MPI places the ranks (on the hosts of its own host file, if the starter's options name
//! one) and its collectives carry the all-reduce; the launcher only builds the command and
//! reads the starter's exit status. A rank's failure ends an MPI job on every rank, so a
//! job with `--max-restarts` is restarted whole from its last checkpoint (see
//! [`crate::restart`]).

use std::process::Command;

use crate::LaunchError;

/// The MPI starter and its options, as `--mpirun` gives them.
#[derive(Clone, Debug)]
pub struct Starter {
    words: Vec<String>,
}

impl Starter {
    /// Parses `--mpirun`: a program and its options, separated by spaces.
    pub fn parse(text: &str) -> Result<Starter, LaunchError> {
        let words: Vec<String> = text.split_whitespace().map(str::to_owned).collect();
        if words.is_empty() {
            return Err(LaunchError::Config(
                "--mpirun is empty: give the MPI starter, e.g. \"mpirun --oversubscribe\"".into(),
            ));
        }
        if words.iter().any(|w| w == "-n" || w == "-np" || w.starts_with("--np")) {
            return Err(LaunchError::Config("--mpirun must not set the process count: give it as --nproc".into()));
        }
        Ok(Starter { words })
    }

    /// The full command of a job of `nproc` ranks running `command` (`train ...`), with
    /// `env` exported to every rank.
    pub fn command(&self, nproc: usize, command: &[String], env: &[(String, String)]) -> Result<Command, LaunchError> {
        let exe = std::env::current_exe().map_err(LaunchError::io("cannot find this executable"))?;
        let mut c = Command::new(&self.words[0]);
        c.args(&self.words[1..]).args(["-n", &nproc.to_string()]);
        for (name, value) in env {
            // Set here for the ranks on this host, and exported to those elsewhere.
            c.env(name, value).args(["-x", name]);
        }
        c.arg(exe).args(command);
        if !has_engine_mpi(command)? {
            c.args(["--engine", "mpi"]);
        }
        Ok(c)
    }

    /// Runs the job once; returns why it failed (empty when it succeeded).
    pub fn run(&self, nproc: usize, command: &[String], env: &[(String, String)]) -> Result<Vec<String>, LaunchError> {
        let mut c = self.command(nproc, command, env)?;
        let status =
            c.status().map_err(LaunchError::io(format!("cannot start {:?} (is MPI installed?)", self.words[0])))?;
        Ok(if status.success() { Vec::new() } else { vec![format!("{} exited with {status}", self.words[0])] })
    }
}

/// Whether `command` already selects the MPI engine; an error when it selects another.
fn has_engine_mpi(command: &[String]) -> Result<bool, LaunchError> {
    let mut words = command.iter();
    while let Some(w) = words.next() {
        let value = match w.strip_prefix("--engine") {
            Some("") => words.next().map(String::as_str).unwrap_or(""),
            Some(rest) if rest.starts_with('=') => &rest[1..],
            _ => continue,
        };
        if value != "mpi" {
            return Err(LaunchError::Config(format!(
                "launch --engine mpi runs the workers with --engine mpi, not --engine {value}"
            )));
        }
        return Ok(true);
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn builds_the_starter_command() {
        let starter = Starter::parse("mpirun --oversubscribe").unwrap();
        let env = [("STEADFAST_INCARNATION".to_owned(), "2".to_owned())];
        let c = starter.command(3, &words("train --steps 5"), &env).unwrap();
        let args: Vec<String> = c.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(c.get_program(), "mpirun");
        assert_eq!(&args[..5], ["--oversubscribe", "-n", "3", "-x", "STEADFAST_INCARNATION"]);
        assert_eq!(&args[6..], ["train", "--steps", "5", "--engine", "mpi"]);
        // Already there: not given twice.
        let c = starter.command(2, &words("train --engine=mpi"), &[]).unwrap();
        assert_eq!(c.get_args().filter(|a| a.to_string_lossy().contains("mpi")).count(), 1);
    }

    #[test]
    fn refuses_what_would_contradict_it() {
        assert!(Starter::parse("  ").is_err());
        assert!(Starter::parse("mpirun -n 4").is_err());
        assert!(Starter::parse("mpirun --np 4").is_err());
        let starter = Starter::parse("mpirun").unwrap();
        let err = starter.command(2, &words("train --engine steadfast"), &[]).unwrap_err();
        assert!(err.to_string().contains("not --engine steadfast"), "{err}");
        assert!(starter.command(2, &words("train --engine"), &[]).is_err());
    }
}
