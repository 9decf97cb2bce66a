//! How a PyTorch campaign's trials replay: only Python can train its model, so `steadfast
//! campaign SPEC --replay N` runs the campaign's own interpreter (`[run] python`) on
//! `python -m steadfast.lab replay DIR --trials N`, where `DIR` is the spec's directory
//! (the campaign's output, which holds its golden trajectory).

use std::path::Path;
use std::process::Command;

use fault::campaign::BadSpec;

use crate::SdcError;
use crate::about::{About, PYTORCH, run_string};

/// Whether the spec text is a PyTorch campaign's (`[run] framework = "pytorch"`).
pub fn is_pytorch(text: &str) -> bool {
    run_string(text, "framework").as_deref() == Some(PYTORCH)
}

/// The command that replays `trials` of the PyTorch campaign whose spec, `text`, was read
/// from `spec`. Refuses a spec that does not parse, an empty list of trials (the campaign
/// itself runs from Python) and a spec that names no interpreter.
pub fn python_command(spec: &Path, text: &str, trials: &[u64]) -> Result<Command, SdcError> {
    About::parse(text)?;
    let refuse = |m: String| Err(SdcError::Spec(BadSpec(m)));
    if trials.is_empty() {
        return refuse(format!(
            "{} is a PyTorch campaign, which runs from Python, where its model trains (`python -m steadfast.lab` \
             or `steadfast.lab.campaign`); here only its trials replay (--replay N)",
            spec.display()
        ));
    }
    let Some(python) = run_string(text, "python") else {
        return refuse(format!(
            "{} names no interpreter to replay its trials with: [run] needs `python`, the Python that has the \
             steadfast package and the campaign's model",
            spec.display()
        ));
    };
    let dir = match spec.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let list = trials.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
    let mut command = Command::new(python);
    command.args(["-m", "steadfast.lab", "replay"]).arg(dir).args(["--trials", &list]);
    Ok(command)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: &str = "[run]\nmodel = \"m\"\nframework = \"pytorch\"\npython = \"/usr/bin/python3\"\n\
                        [trials]\ncount = 3\ninject_at = [5]\nsteps_after = 4\nstate = [\"param\"]\n";

    #[test]
    fn the_command_runs_the_campaign_s_python_on_the_spec_s_directory() {
        assert!(is_pytorch(SPEC) && !is_pytorch("[run]\nmodel = \"mlp\"\n"));
        let c = python_command(Path::new("runs/x/spec.toml"), SPEC, &[3, 17]).unwrap();
        assert_eq!(c.get_program(), "/usr/bin/python3");
        let args: Vec<_> = c.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(args, ["-m", "steadfast.lab", "replay", "runs/x", "--trials", "3,17"]);
        let here = python_command(Path::new("spec.toml"), SPEC, &[1]).unwrap();
        assert_eq!(here.get_args().nth(3).unwrap(), ".");
    }

    #[test]
    fn a_run_without_trials_or_without_python_is_refused() {
        let err = python_command(Path::new("s.toml"), SPEC, &[]).unwrap_err().to_string();
        assert!(err.contains("runs from Python"), "{err}");
        let err = python_command(Path::new("s.toml"), &SPEC.replace("python = \"/usr/bin/python3\"\n", ""), &[1])
            .unwrap_err()
            .to_string();
        assert!(err.contains("needs `python`"), "{err}");
    }
}
