//! A training run's report: one HTML page that draws the run's progress against time,
//! with every failure and recovery marked, from its `metrics.jsonl` and its job's record
//! (`events.jsonl`).
//!
//! Every line of both files carries the time it was written, so the lines of an elastic
//! job's writers (worker 0, then whichever member wrote after it was lost), of the
//! launcher that kept the job's record, and of a job restarted from its checkpoint, fall
//! on one time line. The page shows the step reached against seconds (a recovery from
//! live replicas is a flat stretch, shaded; a rollback to a copy or a checkpoint is a
//! drop), each event as a mark beneath it, a table of the recoveries with their causes and
//! the time each took, and a table of the events.
//!
//! What counts, when the job's record is there (see [`comm::record`]):
//!
//! - a **loss** is a `lost` event: one per lost process, with its cause (the signal that
//!   killed it, its exit status, the coordinator's silence or closed connection, its
//!   expired lease), written by the launcher that reaped it or served the coordinator;
//! - a **replacement** is a `replaced` event, a **reroute** a `rerouted` one;
//! - a **recovery** runs from a loss (several losses before the job steps again are one
//!   recovery), or from a new coordinator's election, to the next epoch's first step (or,
//!   in a pipeline job, to the `recovered` line of its repair: a replay, a fetch, a roll
//!   forward). A worker that joins or rejoins a running job also ends an epoch, but that is
//!   no recovery: it is counted as a join.
//!
//! Without a record (a job whose coordinator ran on its own, a run written before the
//! record existed) the report falls back on the writer's own view: an epoch that ended and
//! whose next quorum lost workers (`members_left`) is a recovery; one that only gained
//! workers is a join.

use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;
use serde_json::Value;

use crate::LabError;
use crate::report::escape;

/// The job's record, beside `metrics.jsonl`.
const RECORD: &str = comm::record::JobRecord::FILE;

/// The kinds of line that mark an event, with their colour and what the legend calls them.
const EVENTS: [(&str, RGBColor, &str); 23] = [
    ("lost", RGBColor(215, 30, 30), "a worker lost (and why)"),
    ("replaced", RGBColor(240, 120, 20), "a new process in a lost worker's slot"),
    ("rerouted", RGBColor(180, 100, 20), "a lost worker's work taken over by the survivors"),
    ("joined", RGBColor(30, 130, 130), "a process joined the running job"),
    ("refused", RGBColor(100, 100, 100), "a process refused its slot"),
    ("elected", RGBColor(90, 60, 160), "a launcher took the coordinator role"),
    ("role_lost", RGBColor(60, 40, 110), "a launcher lost the coordinator role"),
    ("recovered", RGBColor(40, 140, 60), "a pipeline job repaired (replayed, fetched, rolled forward)"),
    ("stopped", RGBColor(0, 0, 0), "the job stopped"),
    ("finished", RGBColor(20, 90, 20), "the job finished"),
    ("process", RGBColor(120, 120, 120), "a worker process started"),
    ("epoch_ended", RGBColor(215, 50, 40), "an epoch ended (as the record's writer saw it)"),
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
    ("log_failed", RGBColor(120, 60, 60), "a boundary log failed"),
];

/// The writer's own view of the epochs, which the job's record supersedes when there is
/// one (the record's writer sees every loss, the worker only its own epochs). Its
/// `members_left` stays: a coordinator elected after a lost holder never knew the workers
/// that went with it, and the workers' view is then the only word of their loss.
const WRITERS_VIEW: [&str; 5] = ["epoch_ended", "quorum", "members_joined", "epoch_started", "process"];

/// One line of `metrics.jsonl` or of the job's record, timed.
struct Line {
    time: f64,
    value: Value,
}

impl Line {
    fn kind(&self) -> &str {
        self.value["kind"].as_str().unwrap_or("")
    }

    /// Who the line concerns, in words (`worker 0 (process 1), node 1`).
    fn who(&self) -> String {
        let v = &self.value;
        let mut who = match (v["worker"].as_u64(), v["process"].as_u64()) {
            (Some(w), Some(p)) => format!("worker {w} (process {p})"),
            (Some(w), None) => format!("worker {w}"),
            _ => match &v["workers"] {
                Value::Array(ws) if !ws.is_empty() => format!("workers {}", Value::Array(ws.clone())),
                _ => String::new(),
            },
        };
        if let Some(n) = v["node"].as_u64() {
            if !who.is_empty() {
                who.push_str(", ");
            }
            let _ = write!(who, "node {n}");
        }
        if let Some(g) = v["generation"].as_u64() {
            if !who.is_empty() {
                who.push_str(", ");
            }
            let _ = write!(who, "generation {g}");
        }
        who
    }
}

/// Whether `dir` holds a training run's lines (`metrics.jsonl` or a job's record) rather
/// than a campaign's tables.
pub fn is_run(dir: &Path) -> bool {
    !dir.join("spec.toml").exists() && (dir.join("metrics.jsonl").exists() || dir.join(RECORD).exists())
}

/// The page of `dir`: a training run's ([`render`]) when it holds one ([`is_run`]), else a
/// campaign's ([`crate::report::render`]).
pub fn render_dir(dir: &Path) -> Result<String, LabError> {
    if is_run(dir) {
        return render(dir);
    }
    if !dir.join("spec.toml").exists() {
        let what = if dir.is_dir() { "is neither" } else { "is not a directory, so neither" };
        return Err(LabError::Input {
            path: dir.to_path_buf(),
            reason: format!(
                "it {what} a training run's output (metrics.jsonl or {RECORD}, as `train --out` or \
                 `launch ... -- train --out` writes it) nor the output of `steadfast campaign` (its spec.toml and \
                 tables)"
            ),
        });
    }
    crate::report::render(dir)
}

/// Reads the timed lines of `path` (none when it does not exist); a line that is not a
/// JSON object is an error naming it. (Lines written before lines carried their time are
/// skipped.)
fn read(path: &Path) -> Result<Vec<Line>, LabError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(LabError::Input { path: path.to_path_buf(), reason: e.to_string() }),
    };
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
    Ok(lines)
}

/// The run's lines, in time order: the job's record, and the lines of `metrics.jsonl`
/// that it does not supersede; and whether there was a record.
fn read_run(dir: &Path) -> Result<(Vec<Line>, bool), LabError> {
    let metrics = read(&dir.join("metrics.jsonl"))?;
    let record = read(&dir.join(RECORD))?;
    let kept = !record.is_empty();
    let mut lines: Vec<Line> =
        metrics.into_iter().filter(|l| !kept || !WRITERS_VIEW.contains(&l.kind())).chain(record).collect();
    if lines.is_empty() {
        return Err(LabError::Input {
            path: dir.to_path_buf(),
            reason: format!("no timed line in metrics.jsonl or {RECORD}"),
        });
    }
    // (Stable: lines written in the same millisecond keep their order.)
    lines.sort_by(|a, b| a.time.total_cmp(&b.time));
    Ok((lines, kept))
}

/// A recovery: from the failure that ended the job's stepping to its first step again.
#[derive(Debug)]
struct Recovery {
    ended: f64,
    resumed: Option<f64>,
    step: Option<u64>,
    /// What failed: each loss, with its cause.
    why: Vec<String>,
    /// What was done: replacements, who fetched from whom, the repair.
    how: Vec<String>,
    /// The workers it lost.
    lost: Vec<u64>,
    /// Whether it began with a failure (always, with a record; without one, whether the
    /// next quorum lost workers).
    failure: bool,
}

/// What the run went through.
#[derive(Debug, Default, PartialEq, Eq)]
struct Tally {
    losses: usize,
    replacements: usize,
    reroutes: usize,
    /// Epochs ended by a join (a replacement's arrival within a recovery is not one).
    joins: usize,
    divergences: usize,
}

/// The run's recoveries and counts (see the module's documentation).
fn recoveries(lines: &[Line], record: bool) -> (Vec<Recovery>, Tally) {
    let step_at = |time: f64| {
        lines.iter().rev().filter(|l| l.kind() == "train" && l.time <= time).find_map(|l| l.value["step"].as_u64())
    };
    let begin = |l: &Line, failure: bool| Recovery {
        ended: l.time,
        resumed: None,
        step: l.value["step"].as_u64().or_else(|| step_at(l.time)),
        why: Vec::new(),
        how: Vec::new(),
        lost: Vec::new(),
        failure,
    };
    let text = |v: &Value, key: &str| v[key].as_str().unwrap_or("").to_owned();
    let (mut out, mut tally, mut open): (Vec<Recovery>, Tally, Option<Recovery>) = Default::default();
    for l in lines {
        let v = &l.value;
        match l.kind() {
            "lost" => {
                tally.losses += 1;
                let r = open.get_or_insert_with(|| begin(l, true));
                r.failure = true;
                r.lost.extend(v["worker"].as_u64());
                r.why.push(format!("{}: {}", l.who(), text(v, "cause")));
            }
            "elected" if v["generation"].as_u64().is_some_and(|g| g > 0) => {
                let r = open.get_or_insert_with(|| begin(l, true));
                r.failure = true;
                r.why.push(format!("the coordinator moved ({}): {}", l.who(), text(v, "cause")));
            }
            "replaced" => {
                tally.replacements += 1;
                if let Some(r) = open.as_mut() {
                    r.how.push(format!("{} started in its place ({})", l.who(), text(v, "how")));
                }
            }
            "rerouted" => {
                tally.reroutes += 1;
                if let Some(r) = open.as_mut() {
                    r.how.push(format!("{}: {}", l.who(), text(v, "how")));
                }
            }
            "joined" => match open.as_mut() {
                Some(r) => r.how.push(format!("{} joined", l.who())),
                None => tally.joins += 1,
            },
            "divergence" => tally.divergences += 1,
            // The writer's view, without a record: an epoch that ended opens a recovery,
            // which is one if the next quorum lost workers.
            "epoch_ended" if !record => {
                let r = open.get_or_insert_with(|| begin(l, false));
                let why = text(v, "why");
                if !why.is_empty() {
                    r.why.push(why);
                }
            }
            // The workers a quorum lost, as the writer saw it: losses unless the record
            // has them already (in this recovery or the one just before).
            "members_left" => {
                let workers: Vec<u64> =
                    v["workers"].as_array().map(|a| a.iter().filter_map(Value::as_u64).collect()).unwrap_or_default();
                let seen = |w: &u64| open.iter().chain(out.last()).any(|r| r.lost.contains(w));
                let unseen: Vec<u64> = workers.into_iter().filter(|w| !seen(w)).collect();
                if unseen.is_empty() {
                    continue;
                }
                tally.losses += unseen.len();
                let r = open.get_or_insert_with(|| begin(l, true));
                r.failure = true;
                r.lost.extend(&unseen);
                let unrecorded = if record { " (the job's record has no loss of them)" } else { "" };
                r.why.push(format!("workers {unseen:?} left{unrecorded}"));
            }
            "quorum" => {
                if let (Some(r), Some(how)) = (open.as_mut(), v["how"].as_str()) {
                    r.how.push(how.to_owned());
                }
            }
            "epoch_started" => {
                if let Some(mut r) = open.take() {
                    r.resumed = Some(l.time);
                    if r.failure {
                        out.push(r);
                    } else {
                        tally.joins += 1;
                    }
                }
            }
            "recovered" => {
                let mut r = open.take().unwrap_or_else(|| {
                    // No loss seen (no record): the repair says how long it took.
                    let mut r = begin(l, true);
                    r.ended = l.time - v["seconds"].as_f64().unwrap_or(0.0);
                    r.why.push("a step failed".to_owned());
                    r
                });
                r.resumed = Some(l.time);
                r.step = r.step.or_else(|| v["step"].as_u64());
                let how = text(v, "how");
                r.how.push(if how.is_empty() { "every rank went on as it was".to_owned() } else { how });
                out.push(r);
            }
            _ => {}
        }
    }
    out.extend(open.filter(|r| r.failure));
    (out, tally)
}

/// `n` of a thing, in words.
fn count(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// The counts in a sentence: `1 loss, 1 replacement, 1 recovery`.
fn tally_text(t: &Tally, recovered: usize) -> String {
    let mut parts = vec![
        count(t.losses, "loss", "losses"),
        count(t.replacements, "replacement", "replacements"),
        count(recovered, "recovery", "recoveries"),
    ];
    if t.reroutes > 0 {
        parts.push(count(t.reroutes, "reroute", "reroutes"));
    }
    if t.joins > 0 {
        parts.push(format!("{} (not recoveries)", count(t.joins, "join", "joins")));
    }
    if t.divergences > 0 {
        parts.push(count(t.divergences, "divergence", "divergences"));
    }
    parts.join(", ")
}

/// The report page of the run whose `metrics.jsonl` and job's record are in `dir`.
pub fn render(dir: &Path) -> Result<String, LabError> {
    let (lines, record) = read_run(dir)?;
    let t0 = lines.iter().map(|l| l.time).fold(f64::INFINITY, f64::min);
    let steps: Vec<(f64, f64)> = lines
        .iter()
        .filter(|l| l.kind() == "train")
        .filter_map(|l| Some((l.time - t0, l.value["step"].as_f64()?)))
        .collect();
    let events: Vec<(&Line, RGBColor)> =
        lines.iter().filter_map(|l| EVENTS.iter().find(|(k, _, _)| *k == l.kind()).map(|(_, c, _)| (l, *c))).collect();
    let summary = lines.iter().rev().find(|l| l.kind() == "summary");
    let (recovered, tally) = recoveries(&lines, record);
    let counts = tally_text(&tally, recovered.len());
    let name = escape(&dir.display().to_string());

    let mut html = String::new();
    let _ = write!(
        html,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Run {name}</title>\n<style>\
         body{{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}}\
         table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #bbb;padding:3px 8px;text-align:left}}\
         th{{background:#eee}}.legend span{{display:inline-block;margin-right:1.2em}}\
         .swatch{{width:12px;height:12px;display:inline-block;margin-right:4px;vertical-align:middle}}</style></head>\n<body>\n"
    );
    let _ = writeln!(html, "<h1>Run <code>{name}</code></h1>");
    let ending = |kind: &str| lines.iter().rev().find(|l| l.kind() == kind);
    match (summary, ending("finished"), ending("stopped")) {
        (Some(s), _, _) => {
            let _ = writeln!(
                html,
                "<p>{} steps in {:.2} s; fingerprint <code>{}</code>; {counts}.</p>",
                s.value["steps"],
                s.time - t0,
                escape(s.value["fingerprint"].as_str().unwrap_or("?")),
            );
        }
        (None, Some(f), _) => {
            let _ = writeln!(
                html,
                "<p>The job finished at {:.2} s, by its record, but no summary line is here (the worker that \
                 wrote it last kept the record in its own output directory); {counts}.</p>",
                f.time - t0
            );
        }
        (None, None, Some(s)) => {
            let cause = escape(s.value["cause"].as_str().unwrap_or("no reason given"));
            let _ = writeln!(html, "<p>The job stopped at {:.2} s: {cause}; {counts}.</p>", s.time - t0);
        }
        (None, None, None) => {
            let _ = writeln!(html, "<p>The run has not finished (no summary line); {counts}.</p>");
        }
    }
    html.push_str(if record {
        "<p>Losses, replacements and epochs are from the job's record (<code>events.jsonl</code>), kept by the \
         launcher that served the coordinator.</p>\n"
    } else {
        "<p>No job record (<code>events.jsonl</code>) is here: losses are as the workers that wrote \
         <code>metrics.jsonl</code> saw them.</p>\n"
    });
    html.push_str("<p class=\"legend\">");
    if !recovered.is_empty() {
        html.push_str(
            "<span><i class=\"swatch\" style=\"background:rgb(250,200,200)\"></i>a recovery (from the failure \
             to the first step again)</span>",
        );
    }
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
    let spans: Vec<(f64, Option<f64>)> = recovered.iter().map(|r| (r.ended - t0, r.resumed.map(|t| t - t0))).collect();
    let _ =
        writeln!(html, "<section><h2>Step against time</h2>\n{}\n</section>", timeline(&steps, &events, &spans, t0)?);

    recoveries_table(&mut html, &recovered, t0);
    events_table(&mut html, &events, t0);
    html.push_str("</body></html>\n");
    Ok(html)
}

/// The table of recoveries (none: no table): when each began, at which step, how long it
/// took, why and how.
fn recoveries_table(html: &mut String, recovered: &[Recovery], t0: f64) {
    if recovered.is_empty() {
        return;
    }
    html.push_str(
        "<h2>Recoveries</h2>\n<table><tr><th>at (s)</th><th>step</th><th>took (s)</th><th>why</th>\
         <th>how</th></tr>\n",
    );
    for r in recovered {
        let took = r.resumed.map_or_else(|| "did not resume".to_owned(), |t| format!("{:.3}", t - r.ended));
        let step = r.step.map_or_else(String::new, |s| s.to_string());
        let _ = writeln!(
            html,
            "<tr><td>{:.3}</td><td>{step}</td><td>{took}</td><td>{}</td><td>{}</td></tr>",
            r.ended - t0,
            escape(&r.why.join("; ")),
            escape(&r.how.join("; "))
        );
    }
    html.push_str("</table>\n");
}

/// The table of events (each of `events` with its time, who, cause and what else it says).
fn events_table(html: &mut String, events: &[(&Line, RGBColor)], t0: f64) {
    html.push_str(
        "<h2>Events</h2>\n<table><tr><th>at (s)</th><th>event</th><th>who</th><th>cause</th><th>details</th></tr>\n",
    );
    for (l, _) in events {
        let mut details = l.value.clone();
        let cause = l.value["cause"].as_str().or_else(|| l.value["why"].as_str()).unwrap_or("").to_owned();
        if let Some(o) = details.as_object_mut() {
            for key in ["kind", "time", "worker", "process", "node", "generation", "cause", "why"] {
                o.remove(key);
            }
        }
        let details =
            if details.as_object().is_some_and(|o| o.is_empty()) { String::new() } else { details.to_string() };
        let _ = writeln!(
            html,
            "<tr><td>{:.3}</td><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td></tr>",
            l.time - t0,
            escape(l.kind()),
            escape(&l.who()),
            escape(&cause),
            escape(&details)
        );
    }
    html.push_str("</table>\n");
}

/// The step reached against seconds since the first line: each recovery shaded from its
/// failure to its first step again, a vertical mark for each event, and the lost
/// workers named above their marks.
fn timeline(
    steps: &[(f64, f64)],
    events: &[(&Line, RGBColor)],
    spans: &[(f64, Option<f64>)],
    t0: f64,
) -> Result<String, LabError> {
    let end = steps.iter().map(|p| p.0).chain(events.iter().map(|(l, _)| l.time - t0)).fold(0.0, f64::max);
    let top = steps.iter().map(|p| p.1).fold(1.0, f64::max);
    let right = end.max(1e-3) * 1.02;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1000, 420)).into_drawing_area();
        root.fill(&WHITE).map_err(LabError::plot)?;
        let mut chart = ChartBuilder::on(&root)
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..right, 0.0..top * 1.12)
            .map_err(LabError::plot)?;
        chart.configure_mesh().x_desc("seconds").y_desc("step").draw().map_err(LabError::plot)?;
        let shade = RGBColor(250, 200, 200);
        for &(from, to) in spans {
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(from, 0.0), (to.unwrap_or(right), top * 1.05)],
                    shade.filled(),
                )))
                .map_err(LabError::plot)?;
        }
        for (l, colour) in events {
            let x = l.time - t0;
            chart
                .draw_series(LineSeries::new([(x, 0.0), (x, top * 1.05)], colour.mix(0.8).stroke_width(1)))
                .map_err(LabError::plot)?;
            if l.kind() == "lost" {
                let label = l.value["worker"].as_u64().map_or_else(|| "lost".to_owned(), |w| format!("lost {w}"));
                let style = ("sans-serif", 12).into_font().color(colour);
                chart.draw_series(std::iter::once(Text::new(label, (x, top * 1.1), style))).map_err(LabError::plot)?;
            }
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

    fn run(metrics: &[&str], record: &[&str]) -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().unwrap();
        if !metrics.is_empty() {
            std::fs::write(dir.path().join("metrics.jsonl"), metrics.join("\n")).unwrap();
        }
        if !record.is_empty() {
            std::fs::write(dir.path().join(RECORD), record.join("\n")).unwrap();
        }
        let page = render(dir.path()).unwrap();
        (dir, page)
    }

    #[test]
    fn without_a_record_a_recovery_is_an_epoch_that_lost_workers() {
        let (_dir, page) = run(
            &[
                r#"{"kind":"quorum","epoch":1,"members":[0,1],"step":0,"sources":[0,1],"time":100.0}"#,
                r#"{"kind":"epoch_started","epoch":1,"step":0,"time":100.1}"#,
                r#"{"kind":"train","step":1,"loss":1.0,"time":100.2}"#,
                r#"{"kind":"epoch_ended","epoch":1,"step":1,"why":"lost <1>","time":100.5}"#,
                r#"{"kind":"members_left","workers":[1],"epoch":2,"step":1,"time":100.7}"#,
                r#"{"kind":"epoch_started","epoch":2,"step":1,"time":100.75}"#,
                r#"{"kind":"train","step":2,"loss":0.5,"time":100.8}"#,
                // A worker joins: the epoch ends, but nothing was lost.
                r#"{"kind":"epoch_ended","epoch":2,"step":2,"why":"the coordinator ended epoch 2","time":100.85}"#,
                r#"{"kind":"members_joined","workers":[2],"epoch":3,"step":2,"time":100.87}"#,
                r#"{"kind":"epoch_started","epoch":3,"step":2,"time":100.9}"#,
                r#"{"kind":"summary","steps":2,"fingerprint":"00ff","time":101.0}"#,
            ],
            &[],
        );
        assert!(
            page.contains("<td>0.500</td><td>1</td><td>0.250</td><td>lost &lt;1&gt;; workers [1] left</td>"),
            "{page}"
        );
        assert!(
            page.contains(
                "2 steps in 1.00 s; fingerprint <code>00ff</code>; \
                 1 loss, 0 replacements, 1 recovery, 1 join (not recoveries)."
            ),
            "{page}"
        );
        assert!(page.contains("No job record"), "{page}");
        assert!(page.contains("<svg"));
        // A change of membership is an event of its own, in the table and the legend.
        assert!(
            page.contains("<td>members_left</td><td>workers [1]</td><td></td><td><code>{&quot;epoch&quot;:2"),
            "{page}"
        );
        assert!(page.contains("workers left the job"), "{page}");
    }

    /// `launch --nproc 3 --max-restarts 1`, worker 0 killed with SIGKILL and replaced: the
    /// worker's view (written by worker 0's replacement) has no epoch that ended; the
    /// launcher's record has the loss with its signal, the replacement and the recovery.
    #[test]
    fn a_killed_worker_0_is_a_loss_a_replacement_and_one_recovery_from_the_record() {
        let metrics = [
            r#"{"kind":"process","worker":0,"incarnation":0,"time":100.0}"#,
            r#"{"kind":"quorum","epoch":1,"members":[0,1,2],"step":0,"time":100.1}"#,
            r#"{"kind":"epoch_started","epoch":1,"step":0,"time":100.2}"#,
            r#"{"kind":"train","step":1,"loss":1.0,"time":100.3}"#,
            r#"{"kind":"train","step":2,"loss":0.9,"time":100.4}"#,
            // Worker 0's replacement appends: its first quorum, no epoch that ended.
            r#"{"kind":"quorum","epoch":2,"members":[0,1,2],"step":2,"time":101.5}"#,
            r#"{"kind":"fetch","step":2,"bytes":100,"time":101.6}"#,
            r#"{"kind":"epoch_started","epoch":2,"step":2,"time":101.7}"#,
            r#"{"kind":"train","step":3,"loss":0.8,"time":101.8}"#,
            r#"{"kind":"summary","steps":3,"fingerprint":"00ff","time":102.0}"#,
        ];
        let record = [
            r#"{"kind":"quorum","time":100.1,"epoch":1,"step":0,"members":[0,1,2]}"#,
            r#"{"kind":"epoch_started","time":100.2,"epoch":1}"#,
            r#"{"kind":"lost","time":100.5,"worker":0,"process":1,"cause":"killed by signal 9 (SIGKILL)"}"#,
            r#"{"kind":"replaced","time":100.51,"worker":0,"process":2,"how":"restart 1 of 1"}"#,
            r#"{"kind":"joined","time":101.4,"worker":0,"process":2}"#,
            r#"{"kind":"quorum","time":101.5,"epoch":2,"step":2,"members":[0,1,2],"how":"[0] fetch the state from [1, 2]"}"#,
            r#"{"kind":"epoch_started","time":101.7,"epoch":2}"#,
            r#"{"kind":"finished","time":101.9}"#,
        ];
        // Before the record, this run read as no recovery at all. (With it, the time line
        // starts at the record's first line: the writer's `process` line gives way.)
        let (_dir, page) = run(&metrics, &[]);
        assert!(page.contains("0 losses, 0 replacements, 0 recoveries"), "{page}");
        let (_dir, page) = run(&metrics, &record);
        assert!(page.contains("fingerprint <code>00ff</code>; 1 loss, 1 replacement, 1 recovery."), "{page}");
        assert!(
            page.contains(
                "<td>0.400</td><td>2</td><td>1.200</td><td>worker 0 (process 1): killed by signal 9 (SIGKILL)</td>\
                 <td>worker 0 (process 2) started in its place (restart 1 of 1); worker 0 (process 2) joined; \
                 [0] fetch the state from [1, 2]</td>"
            ),
            "{page}"
        );
        // On the events table with who and why, and on the timeline: the shaded recovery
        // and the loss named above its mark.
        assert!(
            page.contains("<td>lost</td><td>worker 0 (process 1)</td><td>killed by signal 9 (SIGKILL)</td>"),
            "{page}"
        );
        assert!(page.contains("a worker lost (and why) (lost)"), "{page}");
        assert!(page.contains("\nlost 0\n</text>"), "{page}");
        assert!(page.contains("fill=\"#FAC8C8\"") || page.contains("fill=\"#fac8c8\""), "{page}");
        // The writer's own view of the epochs gives way to the record's: one quorum line
        // per epoch in the table, not two.
        assert_eq!(page.matches("<td>quorum</td>").count(), 2, "{page}");
        assert!(page.contains("from the job's record"), "{page}");
    }

    /// A rejoin (a stopped worker back with the same process) ends an epoch but is no
    /// recovery; a loss seen by the coordinator alone (another node's worker) and a new
    /// coordinator elected are.
    #[test]
    fn a_rejoin_is_no_recovery_and_an_election_after_a_lost_holder_is() {
        let (_dir, page) = run(
            &[r#"{"kind":"train","step":1,"loss":1.0,"time":10.0}"#],
            &[
                r#"{"kind":"quorum","time":9.0,"epoch":1,"step":0,"members":[0,1,2,3]}"#,
                r#"{"kind":"epoch_started","time":9.5,"epoch":1}"#,
                r#"{"kind":"joined","time":11.0,"worker":1,"process":1}"#,
                r#"{"kind":"quorum","time":11.1,"epoch":2,"step":1,"members":[0,1,2,3]}"#,
                r#"{"kind":"epoch_started","time":11.2,"epoch":2}"#,
                r#"{"kind":"elected","time":12.0,"generation":1,"node":0,"cause":"the holder of generation 0 is gone"}"#,
                r#"{"kind":"lost","time":12.5,"worker":2,"process":1,"node":1,"cause":"its lease in etcd expired"}"#,
                r#"{"kind":"lost","time":12.6,"worker":3,"process":1,"node":1,"cause":"its connection closed"}"#,
                r#"{"kind":"quorum","time":13.0,"epoch":1099511627777,"step":1,"members":[0,1]}"#,
                r#"{"kind":"epoch_started","time":13.5,"epoch":1099511627777}"#,
            ],
        );
        assert!(page.contains("2 losses, 0 replacements, 1 recovery, 1 join (not recoveries)"), "{page}");
        assert!(page.contains("The run has not finished (no summary line)"), "{page}");
        assert!(
            page.contains(
                "<td>the coordinator moved (node 0, generation 1): the holder of generation 0 is gone; \
                 worker 2 (process 1), node 1: its lease in etcd expired; worker 3 (process 1), node 1: its \
                 connection closed</td>"
            ),
            "{page}"
        );
    }

    /// The etcd job that lost node 0 with the coordinator role, as node 1's directory has
    /// it: node 1's launcher, elected, kept the record from then on, and worker 2 the
    /// steps; the new coordinator never knew workers 0 and 1, so only the writer's view
    /// says they left. A loss in both the record and the writer's view counts once.
    #[test]
    fn a_lost_node_is_counted_once_whoever_saw_it() {
        let (_dir, page) = run(
            &[
                r#"{"kind":"train","step":3,"loss":1.0,"time":10.1}"#,
                r#"{"kind":"members_left","workers":[3],"epoch":2,"step":3,"time":10.25}"#,
                r#"{"kind":"members_left","workers":[0,1],"epoch":1099511627777,"step":4,"time":13.1}"#,
                r#"{"kind":"train","step":5,"loss":0.9,"time":14.0}"#,
                r#"{"kind":"summary","steps":5,"fingerprint":"0123","time":15.0}"#,
            ],
            &[
                r#"{"kind":"quorum","time":9.0,"epoch":1,"step":0,"members":[0,1,2,3]}"#,
                r#"{"kind":"epoch_started","time":9.5,"epoch":1}"#,
                r#"{"kind":"lost","time":10.0,"worker":3,"process":1,"node":1,"cause":"its connection closed"}"#,
                r#"{"kind":"quorum","time":10.2,"epoch":2,"step":3,"members":[0,1,2]}"#,
                r#"{"kind":"epoch_started","time":10.3,"epoch":2}"#,
                r#"{"kind":"elected","time":12.0,"generation":1,"node":1,"cause":"the holder of generation 0 is gone"}"#,
                r#"{"kind":"quorum","time":13.0,"epoch":1099511627777,"step":4,"members":[2]}"#,
                r#"{"kind":"epoch_started","time":13.5,"epoch":1099511627777}"#,
                r#"{"kind":"finished","time":14.9}"#,
            ],
        );
        assert!(page.contains("fingerprint <code>0123</code>; 3 losses, 0 replacements, 2 recoveries."), "{page}");
        assert!(
            page.contains(
                "<td>the coordinator moved (node 1, generation 1): the holder of generation 0 is gone; workers [0, 1] \
                 left (the job's record has no loss of them)</td>"
            ),
            "{page}"
        );
    }

    /// A pipeline job: the launcher's record has the loss and the replacement, the
    /// collector's metrics the repair (a replay), which ends the recovery.
    #[test]
    fn a_pipeline_replay_ends_the_recovery_its_loss_began() {
        let (_dir, page) = run(
            &[
                r#"{"kind":"train","step":5,"loss":1.0,"time":20.0}"#,
                r#"{"kind":"recovered","step":5,"how":"rank 1 (stage 1) replayed from step 4 to step 5 on ranks [1]","seconds":1.5,"time":22.0}"#,
                r#"{"kind":"train","step":6,"loss":0.9,"time":22.1}"#,
                r#"{"kind":"summary","steps":6,"fingerprint":"0abc","time":23.0}"#,
            ],
            &[
                r#"{"kind":"lost","time":20.5,"worker":1,"process":1,"cause":"killed by signal 9 (SIGKILL)"}"#,
                r#"{"kind":"replaced","time":20.6,"worker":1,"process":2,"how":"restart 1 of 2"}"#,
                r#"{"kind":"finished","time":22.9}"#,
            ],
        );
        assert!(page.contains("1 loss, 1 replacement, 1 recovery."), "{page}");
        assert!(
            page.contains("<td>0.500</td><td>5</td><td>1.500</td><td>worker 1 (process 1): killed by signal 9"),
            "{page}"
        );
        assert!(page.contains("rank 1 (stage 1) replayed from step 4 to step 5 on ranks [1]</td></tr>"), "{page}");
        assert!(page.contains("a pipeline job repaired"), "{page}");
    }

    /// The record alone (the directory of a node whose workers never held the metrics)
    /// says how the job ended.
    #[test]
    fn a_record_alone_says_the_job_finished() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!is_run(dir.path()));
        std::fs::write(
            dir.path().join(RECORD),
            "{\"kind\":\"lost\",\"time\":1.0,\"worker\":0,\"process\":1,\"node\":0,\"cause\":\"its connection closed\"}\n\
             {\"kind\":\"finished\",\"time\":3.0}\n",
        )
        .unwrap();
        assert!(is_run(dir.path()));
        let page = render(dir.path()).unwrap();
        assert!(page.contains("The job finished at 2.00 s, by its record"), "{page}");
        assert!(page.contains("1 loss, 0 replacements, 1 recovery"), "{page}");
        assert!(page.contains("<td>did not resume</td>"), "{page}");
    }

    #[test]
    fn a_directory_that_is_no_run_and_no_campaign_says_what_it_lacks() {
        let tmp = tempfile::tempdir().unwrap();
        let err = render_dir(tmp.path()).unwrap_err().to_string();
        assert!(err.contains("neither a training run's output (metrics.jsonl"), "{err}");
        assert!(err.contains("nor the output of `steadfast campaign` (its spec.toml"), "{err}");
        let err = render_dir(&tmp.path().join("missing")).unwrap_err().to_string();
        assert!(err.contains("is not a directory"), "{err}");
    }

    #[test]
    fn a_line_that_is_not_json_is_named() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("metrics.jsonl"), "{\"kind\":\"train\",\"time\":1}\n{\"kind\":").unwrap();
        let e = render(dir.path()).unwrap_err().to_string();
        assert!(e.contains("line 2 is not JSON"), "{e}");
        let e = render(&dir.path().join("absent")).unwrap_err().to_string();
        assert!(e.contains("no timed line in metrics.jsonl or events.jsonl"), "{e}");
    }
}
