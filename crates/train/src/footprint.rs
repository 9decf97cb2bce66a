//! How much memory a run needs, estimated before anything is allocated.
//!
//! An allocation that fails aborts the process (Rust's default), after it has grown for
//! as long as the system lets it: `--width 200000` makes an MLP of 20 G parameters, which
//! took a minute to reach 17 GB and then died with SIGABRT. So a run whose state cannot
//! fit is refused before it starts, with the estimate and what is available.
//!
//! The estimate counts the copies of the parameters that a step holds at once, each four
//! bytes an element: the model's own tensors, the state's parameters, the gradient sum,
//! one micro-batch's gradient, the optimizer's slots (two for AdamW, one for SGD), and the
//! checkpoint writer's snapshot when checkpoints are on. Activations and data are left
//! out: it is a lower bound, so a run it refuses could never have fit. Only the MLP's size
//! is a setting (`--width`); the CNN and the GPT have fixed shapes well under a gigabyte.

use crate::config::TrainConfig;
use crate::error::ConfigError;
use crate::model::ModelKind;
use crate::optim::OptimKind;

/// The parameters of the MLP whose first hidden layer is `width` wide.
pub fn mlp_parameters(width: usize) -> u64 {
    let w = crate::model::Mlp::widths(width);
    w.windows(2).map(|p| (p[0] as u64).saturating_mul(p[1] as u64).saturating_add(p[1] as u64)).sum()
}

/// Bytes that `config`'s state needs at least, with what they are made of; `None` for a
/// model whose size is fixed.
pub fn estimate(config: &TrainConfig) -> Option<(u64, String)> {
    if config.model != ModelKind::Mlp {
        return None;
    }
    let parameters = mlp_parameters(config.mlp_width);
    let slots = match config.optimizer {
        OptimKind::AdamW => 2,
        OptimKind::Sgd => 1,
    };
    let snapshot = u64::from(config.checkpoint.is_some());
    let copies = 4 + slots + snapshot;
    let what = format!(
        "{parameters} parameters x 4 bytes x {copies} copies: the model, the state, the gradient sum, a micro-batch's \
         gradient, {slots} optimizer slot(s){}",
        if snapshot == 1 { ", the checkpoint snapshot" } else { "" }
    );
    Some((parameters.saturating_mul(4).saturating_mul(copies), what))
}

/// The memory this machine can give a new process now: `MemAvailable`, or the room left
/// under this process's cgroup limit when that is smaller. `None` where neither can be read.
pub fn available() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib = |key: &str| {
        meminfo.lines().find_map(|l| l.strip_prefix(key)?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
    };
    let mut free = kib("MemAvailable:")?.saturating_mul(1024);
    let read = |p: &str| std::fs::read_to_string(p).ok().and_then(|s| s.trim().parse::<u64>().ok());
    if let (Some(max), Some(used)) = (read("/sys/fs/cgroup/memory.max"), read("/sys/fs/cgroup/memory.current")) {
        free = free.min(max.saturating_sub(used));
    }
    Some(free)
}

/// Refuses `config` when its estimate exceeds `available` bytes.
pub fn check(config: &TrainConfig, available: Option<u64>) -> Result<(), ConfigError> {
    let (Some((needed, what)), Some(available)) = (estimate(config), available) else { return Ok(()) };
    if needed <= available {
        return Ok(());
    }
    let gb = |b: u64| b as f64 / 1e9;
    Err(ConfigError::Invalid(format!(
        "this run needs at least {:.1} GB ({what}) and {:.1} GB is available: choose a smaller --width",
        gb(needed),
        gb(available)
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimate_refuses_what_cannot_fit_and_passes_what_can() {
        let mut c = TrainConfig::defaults(ModelKind::Mlp);
        assert_eq!(mlp_parameters(256), 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
        c.mlp_width = 200_000;
        let err = check(&c, Some(24_000_000_000)).unwrap_err().to_string();
        assert!(err.contains("GB") && err.contains("24.0 GB is available") && err.contains("--width"), "{err}");
        c.mlp_width = 256;
        assert!(check(&c, Some(24_000_000_000)).is_ok());
        assert!(check(&c, Some(1_000)).is_err());
        assert!(check(&c, None).is_ok(), "nothing is refused where the system will not say");
        assert!(check(&TrainConfig::defaults(ModelKind::Cnn), Some(1)).is_ok());
    }
}
