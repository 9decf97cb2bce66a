//! What the launcher reads of a worker command (`train ...`): a flag's value, and the
//! pipeline stages it asks for, which decide how its workers are checked and placed.

/// The value that the worker command `command` gives `flag` (`--flag VALUE` or
/// `--flag=VALUE`; the last, when given twice).
pub(crate) fn flag_value<'a>(command: &'a [String], flag: &str) -> Option<&'a str> {
    let mut found = None;
    for (i, a) in command.iter().enumerate() {
        if a == flag {
            found = command.get(i + 1).map(String::as_str);
        } else if let Some(v) = a.strip_prefix(flag).and_then(|rest| rest.strip_prefix('=')) {
            found = Some(v);
        }
    }
    found
}

/// The pipeline stages that the worker command asks for (1: none).
pub(crate) fn pipeline_stages(command: &[String]) -> usize {
    flag_value(command, "--pipeline-stages").and_then(|v| v.parse().ok()).unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn the_worker_command_s_flags_are_read_in_both_forms_the_last_one_winning() {
        assert_eq!(pipeline_stages(&words("train --pipeline-stages 3 --out=runs/a --steps 9")), 3);
        assert_eq!(pipeline_stages(&words("train --pipeline-stages=2")), 2);
        assert_eq!(pipeline_stages(&words("train --steps 9")), 1);
        assert_eq!(flag_value(&words("train --out a --out=b"), "--out"), Some("b"));
        assert_eq!(flag_value(&words("train --outdir a"), "--out"), None);
    }
}
