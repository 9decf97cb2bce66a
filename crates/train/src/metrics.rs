//! `metrics.jsonl`: what a run reports, one JSON object per line, flushed as written, so
//! that a run killed at any instant leaves every line it finished.

use std::io::Write;
use std::path::PathBuf;

use crate::error::TrainError;

/// `metrics.jsonl`: one JSON object per line, flushed as written.
pub struct MetricsFile {
    file: Option<(PathBuf, std::io::BufWriter<std::fs::File>)>,
}

impl MetricsFile {
    /// Opens `dir/metrics.jsonl` (appending when a run resumes); writes nothing without a
    /// directory.
    pub fn create(dir: Option<&PathBuf>, append: bool) -> Result<Self, TrainError> {
        let Some(dir) = dir else {
            return Ok(MetricsFile { file: None });
        };
        let path = dir.join("metrics.jsonl");
        let err = |source| TrainError::Output { path: path.clone(), source };
        std::fs::create_dir_all(dir).map_err(err)?;
        let f = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(&path)
            .map_err(err)?;
        Ok(MetricsFile { file: Some((path, std::io::BufWriter::new(f))) })
    }

    /// Writes one line.
    pub fn write(&mut self, value: serde_json::Value) -> Result<(), TrainError> {
        if let Some((path, w)) = &mut self.file {
            writeln!(w, "{value}")
                .and_then(|()| w.flush())
                .map_err(|source| TrainError::Output { path: path.clone(), source })?;
        }
        Ok(())
    }
}
