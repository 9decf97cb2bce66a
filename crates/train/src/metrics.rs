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

    /// Writes one line, stamped with the time it was written (`"time"`, seconds since the
    /// Unix epoch), so that the lines of a job's processes, and of its restarts, fall on
    /// one time line.
    pub fn write(&mut self, mut value: serde_json::Value) -> Result<(), TrainError> {
        if let Some((path, w)) = &mut self.file {
            if let Some(object) = value.as_object_mut() {
                let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
                // Milliseconds are enough, and keep the lines short.
                let seconds = (now.as_secs_f64() * 1000.0).round() / 1000.0;
                object.insert("time".into(), serde_json::json!(seconds));
            }
            writeln!(w, "{value}")
                .and_then(|()| w.flush())
                .map_err(|source| TrainError::Output { path: path.clone(), source })?;
        }
        Ok(())
    }
}
