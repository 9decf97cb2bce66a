//! A training run's report: one HTML page that draws the run's progress against time,
//! with every failure and recovery marked, from its `metrics.jsonl`.
//!
//! Every line of `metrics.jsonl` carries the time it was written, so the lines of an
//! elastic job's worker 0 and of its replacements, or of a job restarted from its
//! checkpoint, fall on one time line. The page shows the step reached against seconds
//! (a recovery from live replicas is a flat stretch; a rollback to a copy or a checkpoint
//! is a drop), the events beneath it, and a table of the events with the time each
//! recovery took, from the epoch that ended to the next one's first step.

use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;
use serde_json::Value;

use crate::LabError;
use crate::report::escape;

/// The kinds of line that mark an event, with their colour and what the legend calls them.
const EVENTS: [(&str, RGBColor, &str); 12] = [
    ("process", RGBColor(120, 120, 120), "a worker process started"),
    ("epoch_ended", RGBColor(215, 50, 40), "an epoch ended (a failure seen)"),
    ("members_left", RGBColor(150, 20, 20), "workers left the job (a node lost, say)"),
    ("quorum", RGBColor(240, 150, 40), "a quorum formed"),
    ("members_joined", RGBColor(30, 130, 130), "workers joined (a node back, say)"),
    ("fetch", RGBColor(60, 110, 200), "the state fetched from live replicas"),
    ("restore", RGBColor(150, 90, 190), "back to the in-memory copy"),
    ("resumed", RGBColor(140, 80, 40), "resumed from a checkpoint"),
    ("checkpoint_skipped", RGBColor(190, 190, 40), "a checkpoint passed over (its writer's lock held)"),
    ("epoch_started", RGBColor(60, 160, 80), "an epoch's first step"),
    ("divergence", RGBColor(0, 0, 0), "replicas diverged"),
    ("inject", RGBColor(230, 60, 160), "a bit flipped"),
];

/// One line of `metrics.jsonl`, timed.
struct Line {
    time: f64,
    value: Value,
}

impl Line {
    fn kind(&self) -> &str {
        self.value["kind"].as_str().unwrap_or("")
    }
}

/// Reads the timed lines of `path`; a line that is not a JSON object is an error naming
/// it. (Lines written before lines carried their time are skipped.)
fn read(path: &Path) -> Result<Vec<Line>, LabError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| LabError::Input { path: path.to_path_buf(), reason: e.to_string() })?;
    let mut lines = Vec::new();
    for (i, text) in text.lines().enumerate().filter(|(_, t)| !t.trim().is_empty()) {
        let value: Value = serde_json::from_str(text).map_err(|e| LabError::Input {
            path: path.to_path_buf(),
            reason: format!("line {} is not JSON: {e}", i + 1),
        })?;
        if !value.is_object() {
            return Err(LabError::Input {
                path: path.to_path_buf(),
                reason: format!("line {} is not an object", i + 1),
            });
        }
        if let Some(time) = value["time"].as_f64() {
            lines.push(Line { time, value });
        }
    }
    if lines.is_empty() {
        return Err(LabError::Input { path: path.to_path_buf(), reason: "no timed line".into() });
    }
    Ok(lines)
}

/// A recovery: from the epoch that ended to the next epoch's first step.
struct Recovery {
    ended: f64,
    resumed: Option<f64>,
    step: u64,
    why: String,
}

fn recoveries(lines: &[Line]) -> Vec<Recovery> {
    let mut out: Vec<Recovery> = Vec::new();
    for l in lines {
        match l.kind() {
            "epoch_ended" => out.push(Recovery {
                ended: l.time,
                resumed: None,
                step: l.value["step"].as_u64().unwrap_or(0),
                why: l.value["why"].as_str().unwrap_or("").to_owned(),
            }),
            "epoch_started" => {
                if let Some(r) = out.last_mut().filter(|r| r.resumed.is_none()) {
                    r.resumed = Some(l.time);
                }
            }
            _ => {}
        }
    }
    out
}

/// The report page of the run whose `metrics.jsonl` is in `dir`.
pub fn render(dir: &Path) -> Result<String, LabError> {
    let lines = read(&dir.join("metrics.jsonl"))?;
    let t0 = lines.iter().map(|l| l.time).fold(f64::INFINITY, f64::min);
    let steps: Vec<(f64, f64)> = lines
        .iter()
        .filter(|l| l.kind() == "train")
        .filter_map(|l| Some((l.time - t0, l.value["step"].as_f64()?)))
        .collect();
    let events: Vec<(&Line, RGBColor)> =
        lines.iter().filter_map(|l| EVENTS.iter().find(|(k, _, _)| *k == l.kind()).map(|(_, c, _)| (l, *c))).collect();
    let summary = lines.iter().rev().find(|l| l.kind() == "summary");
    let recovered = recoveries(&lines);

    let mut html = String::new();
    let _ = write!(
        html,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Run {}</title>\n<style>\
         body{{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}}\
         table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #bbb;padding:3px 8px;text-align:left}}\
         th{{background:#eee}}.legend span{{display:inline-block;margin-right:1.2em}}\
         .swatch{{width:12px;height:12px;display:inline-block;margin-right:4px;vertical-align:middle}}</style></head>\n<body>\n",
        escape(&dir.display().to_string())
    );
    let _ = writeln!(html, "<h1>Run <code>{}</code></h1>", escape(&dir.display().to_string()));
    match summary {
        Some(s) => {
            let _ = writeln!(
                html,
                "<p>{} steps in {:.2} s; fingerprint <code>{}</code>; {} recovery(ies).</p>",
                s.value["steps"],
                s.time - t0,
                escape(s.value["fingerprint"].as_str().unwrap_or("?")),
                recovered.len()
            );
        }
        None => html.push_str("<p>The run has not finished (no summary line).</p>\n"),
    }
    html.push_str("<p class=\"legend\">");
    for (kind, c, about) in EVENTS.iter().filter(|(k, _, _)| events.iter().any(|(l, _)| l.kind() == *k)) {
        let _ = write!(
            html,
            "<span><i class=\"swatch\" style=\"background:rgb({},{},{})\"></i>{} ({kind})</span>",
            c.0,
            c.1,
            c.2,
            escape(about)
        );
    }
    html.push_str("</p>\n");
    let _ = writeln!(html, "<section><h2>Step against time</h2>\n{}\n</section>", timeline(&steps, &events, t0)?);

    if !recovered.is_empty() {
        html.push_str(
            "<h2>Recoveries</h2>\n<table><tr><th>at (s)</th><th>step</th><th>took (s)</th><th>why</th></tr>\n",
        );
        for r in &recovered {
            let took = r.resumed.map_or_else(|| "did not resume".to_owned(), |t| format!("{:.3}", t - r.ended));
            let _ = writeln!(
                html,
                "<tr><td>{:.3}</td><td>{}</td><td>{took}</td><td>{}</td></tr>",
                r.ended - t0,
                r.step,
                escape(&r.why)
            );
        }
        html.push_str("</table>\n");
    }
    html.push_str("<h2>Events</h2>\n<table><tr><th>at (s)</th><th>event</th><th>details</th></tr>\n");
    for (l, _) in &events {
        let mut details = l.value.clone();
        if let Some(o) = details.as_object_mut() {
            o.remove("kind");
            o.remove("time");
        }
        let _ = writeln!(
            html,
            "<tr><td>{:.3}</td><td>{}</td><td><code>{}</code></td></tr>",
            l.time - t0,
            escape(l.kind()),
            escape(&details.to_string())
        );
    }
    html.push_str("</table>\n</body></html>\n");
    Ok(html)
}

/// The step reached against seconds since the first line, with a vertical mark for each
/// event.
fn timeline(steps: &[(f64, f64)], events: &[(&Line, RGBColor)], t0: f64) -> Result<String, LabError> {
    let end = steps.iter().map(|p| p.0).chain(events.iter().map(|(l, _)| l.time - t0)).fold(0.0, f64::max);
    let top = steps.iter().map(|p| p.1).fold(1.0, f64::max);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1000, 420)).into_drawing_area();
        root.fill(&WHITE).map_err(LabError::plot)?;
        let mut chart = ChartBuilder::on(&root)
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..end.max(1e-3) * 1.02, 0.0..top * 1.05)
            .map_err(LabError::plot)?;
        chart.configure_mesh().x_desc("seconds").y_desc("step").draw().map_err(LabError::plot)?;
        for (l, colour) in events {
            let x = l.time - t0;
            chart
                .draw_series(LineSeries::new([(x, 0.0), (x, top * 1.05)], colour.mix(0.8).stroke_width(1)))
                .map_err(LabError::plot)?;
        }
        // Points, not a line: a rollback is a drop, not a slope.
        chart.draw_series(steps.iter().map(|&p| Circle::new(p, 2, BLACK.filled()))).map_err(LabError::plot)?;
        root.present().map_err(LabError::plot)?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recovery_is_timed_from_the_epoch_that_ended_to_the_next_first_step() {
        let dir = tempfile::tempdir().unwrap();
        let text = [
            r#"{"kind":"quorum","epoch":1,"members":[0,1],"step":0,"sources":[0,1],"time":100.0}"#,
            r#"{"kind":"epoch_started","epoch":1,"step":0,"time":100.1}"#,
            r#"{"kind":"train","step":1,"loss":1.0,"time":100.2}"#,
            r#"{"kind":"epoch_ended","epoch":1,"step":1,"why":"lost <1>","time":100.5}"#,
            r#"{"kind":"members_left","workers":[1],"epoch":2,"step":1,"time":100.7}"#,
            r#"{"kind":"epoch_started","epoch":2,"step":1,"time":100.75}"#,
            r#"{"kind":"train","step":2,"loss":0.5,"time":100.8}"#,
            r#"{"kind":"summary","steps":2,"fingerprint":"00ff","time":101.0}"#,
        ]
        .join("\n");
        std::fs::write(dir.path().join("metrics.jsonl"), text).unwrap();
        let page = render(dir.path()).unwrap();
        assert!(page.contains("<td>0.500</td><td>1</td><td>0.250</td><td>lost &lt;1&gt;</td>"), "{page}");
        assert!(page.contains("2 steps in 1.00 s; fingerprint <code>00ff</code>; 1 recovery(ies)"), "{page}");
        assert!(page.contains("<svg"));
        // A change of membership is an event of its own, in the table and the legend.
        assert!(page.contains("<td>members_left</td><td><code>{&quot;epoch&quot;:2"), "{page}");
        assert!(page.contains("workers left the job"), "{page}");
    }

    #[test]
    fn a_line_that_is_not_json_is_named() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("metrics.jsonl"), "{\"kind\":\"train\",\"time\":1}\n{\"kind\":").unwrap();
        let e = render(dir.path()).unwrap_err().to_string();
        assert!(e.contains("line 2 is not JSON"), "{e}");
        assert!(render(&dir.path().join("absent")).is_err());
    }
}
