//! A campaign's report: one self-contained HTML page with SVG plots of its tables (outcome
//! by bit position, by kind of state, loss curves against golden, the propagation heat
//! map) and its summary tables, rendered from the files of its record (`sdc`'s, which
//! [`crate::campaign::output`] writes for a lab campaign and the Python package's
//! `steadfast.lab` for a PyTorch one).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use fault::campaign::Outcome;
use plotters::prelude::*;

use crate::LabError;
use crate::campaign::output;
use crate::campaign::rows::{PropagationRow, SensitivityRow, Tables};
use crate::table;

/// The colour of an outcome class in every plot.
fn colour(o: Outcome) -> RGBColor {
    match o {
        Outcome::Masked => RGBColor(120, 190, 120),
        Outcome::Degraded => RGBColor(240, 170, 60),
        Outcome::Diverged => RGBColor(215, 50, 40),
        Outcome::Crashed => RGBColor(40, 40, 40),
        Outcome::Detected => RGBColor(60, 110, 200),
        Outcome::Corrected => RGBColor(150, 90, 190),
    }
}

/// The distinct values of `key` over `rows`, in first-seen order.
fn distinct<T, K: PartialEq + Clone>(rows: &[T], key: impl Fn(&T) -> K) -> Vec<K> {
    let mut v: Vec<K> = Vec::new();
    for r in rows {
        let k = key(r);
        if !v.contains(&k) {
            v.push(k);
        }
    }
    v
}

/// The report page of the campaign whose tables and spec are in `dir`.
pub fn render(dir: &Path) -> Result<String, LabError> {
    let tables = Tables::read(dir)?;
    let spec_path = dir.join("spec.toml");
    let about = std::fs::read_to_string(&spec_path)
        .map_err(|e| e.to_string())
        .and_then(|text| sdc::About::parse(&text).map_err(|e| e.to_string()))
        .map_err(|reason| LabError::Input { path: spec_path, reason })?;
    let title = output::headline(&about);
    let compute: f64 = tables.trials.iter().map(|t| t.seconds).sum();
    let intro = format!("{} The trials took {compute:.1} s of compute.", output::faults(&about));
    let replay = if about.is_pytorch() {
        "python -m steadfast.lab replay DIR --trials N"
    } else {
        "steadfast campaign SPEC --replay N"
    };

    let plots: Vec<(String, String)> = vec![
        ("Outcome by bit position".into(), outcome_bars(&tables.by_bit, "bit flipped (highest, if several)")?),
        ("Model against optimizer state".into(), outcome_bars(&tables.by_state, "kind of state hit")?),
        ("Training loss of trials against golden".into(), loss_curves(&tables)?),
        (
            "Propagation: mean fraction of each tensor's elements whose bits differ from golden \
             (white: none; pale: a few elements; red: all; colour by square root)"
                .into(),
            heat_map(&tables.propagation)?,
        ),
    ];

    let mut html = String::new();
    let _ = write!(
        html,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title>\n<style>\
         body{{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}}\
         table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #bbb;padding:3px 8px;text-align:right}}\
         th{{background:#eee}}section.plot{{margin:2em 0}}.legend span{{display:inline-block;margin-right:1.2em}}\
         .swatch{{width:12px;height:12px;display:inline-block;margin-right:4px;vertical-align:middle}}</style></head>\n<body>\n",
        escape(&title)
    );
    let _ = writeln!(html, "<h1>{}</h1>\n<p>{}</p>", escape(&title), escape(&intro));
    html.push_str("<p class=\"legend\">");
    for o in Outcome::ALL {
        let c = colour(o);
        let _ = write!(
            html,
            "<span><i class=\"swatch\" style=\"background:rgb({},{},{})\"></i>{}</span>",
            c.0,
            c.1,
            c.2,
            o.name()
        );
    }
    html.push_str("</p>\n");
    for (heading, svg) in &plots {
        let _ = writeln!(html, "<section class=\"plot\"><h2>{}</h2>\n{svg}\n</section>", escape(heading));
    }
    html.push_str("<h2>Outcomes by kind of state</h2>\n");
    html.push_str(&html_table(&tables.by_state, &[("key", "state")])?);
    html.push_str("<h2>Detectors</h2>\n");
    html.push_str(&html_table(&tables.detectors, &[])?);
    let _ = writeln!(
        html,
        "<p>Tables: <code>{}</code> (trials.csv has one row per trial, replayable with <code>{replay}</code>).</p>",
        escape(&dir.display().to_string())
    );
    html.push_str("</body></html>\n");
    Ok(html)
}

/// `s` as HTML text.
pub(crate) fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A table of typed rows as HTML, its columns as the CSV file names them (some renamed
/// for the page).
fn html_table<T: serde::Serialize>(rows: &[T], renamed: &[(&str, &str)]) -> Result<String, LabError> {
    let (header, cells) = table::cells(rows)?;
    let mut s = String::from("<table><tr>");
    for c in &header {
        let shown = renamed.iter().find(|(from, _)| from == c).map_or(c.as_str(), |(_, to)| to);
        let _ = write!(s, "<th>{}</th>", escape(shown));
    }
    s.push_str("</tr>\n");
    for r in &cells {
        s.push_str("<tr>");
        for v in r {
            let _ = write!(s, "<td>{}</td>", escape(v));
        }
        s.push_str("</tr>\n");
    }
    s.push_str("</table>\n");
    Ok(s)
}

/// Stacked bars of outcome fractions per key, one group of bars per strategy.
fn outcome_bars(rows: &[SensitivityRow], x_desc: &str) -> Result<String, LabError> {
    let strategies: Vec<String> = distinct(rows, |r| r.reduce.to_string());
    let mut keys = distinct(rows, |r| r.key.clone());
    if keys.iter().all(|x| x.parse::<u32>().is_ok()) {
        keys.sort_by_key(|x| x.parse::<u32>().unwrap_or(0));
    }
    let groups = strategies.len().max(1);
    let slots = keys.len() * groups;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1000, 380)).into_drawing_area();
        root.fill(&WHITE).map_err(LabError::plot)?;
        let mut chart = ChartBuilder::on(&root)
            .margin(10)
            .x_label_area_size(45)
            .y_label_area_size(55)
            .build_cartesian_2d(0f64..slots as f64, 0f64..1f64)
            .map_err(LabError::plot)?;
        let labels = keys.clone();
        let formatter = move |x: &f64| {
            let slot = x.floor() as usize;
            if slot / groups < labels.len() && slot.is_multiple_of(groups) {
                labels[slot / groups].clone()
            } else {
                String::new()
            }
        };
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(slots + 1)
            .x_label_formatter(&formatter)
            .x_desc(if groups > 1 { format!("{x_desc}; bars: {}", strategies.join(", ")) } else { x_desc.to_owned() })
            .y_desc("fraction of trials")
            .draw()
            .map_err(LabError::plot)?;
        for (ki, kv) in keys.iter().enumerate() {
            for (si, sv) in strategies.iter().enumerate() {
                let Some(row) = rows.iter().find(|r| &r.key == kv && &r.reduce.to_string() == sv) else { continue };
                if row.trials == 0 {
                    continue;
                }
                let x0 = (ki * groups + si) as f64 + 0.1;
                let mut y = 0.0;
                for o in Outcome::ALL {
                    let h = row.count(o) as f64 / row.trials as f64;
                    if h > 0.0 {
                        let colour = colour(o);
                        let fill = if si == 0 { colour.filled() } else { colour.mix(0.65).filled() };
                        chart
                            .draw_series(std::iter::once(Rectangle::new([(x0, y), (x0 + 0.8, y + h)], fill)))
                            .map_err(LabError::plot)?;
                    }
                    y += h;
                }
            }
        }
        root.present().map_err(LabError::plot)?;
    }
    Ok(svg)
}

/// The golden loss over the trials' window and the loss of up to 30 trials that were not
/// masked and 10 masked ones that changed state (first strategy); a dot marks where a
/// trial stopped.
fn loss_curves(tables: &Tables) -> Result<String, LabError> {
    // The first strategy's (a campaign without trials still has its golden runs).
    let first = tables.trials.first().map(|t| t.reduce).or(tables.golden.first().map(|g| g.reduce));
    let Some(strategy) = first else {
        return Err(LabError::Input { path: "golden.csv".into(), reason: "the campaign has no golden run".into() });
    };
    let mine = || tables.trials.iter().filter(|t| t.reduce == strategy);
    let mut chosen: Vec<(u64, Outcome)> =
        mine().filter(|t| t.outcome != Outcome::Masked).map(|t| (t.trial, t.outcome)).take(30).collect();
    chosen.extend(
        mine().filter(|t| t.outcome == Outcome::Masked && t.max_differing != 0).map(|t| (t.trial, t.outcome)).take(10),
    );
    let steps = || tables.steps.iter().filter(|r| r.reduce == strategy);
    let mut curves: BTreeMap<u64, Vec<(f64, f64)>> = BTreeMap::new();
    for r in steps() {
        let loss = f64::from(r.loss);
        if chosen.iter().any(|(t, _)| *t == r.trial) && loss.is_finite() && loss > 0.0 {
            curves.entry(r.trial).or_default().push((r.step as f64, loss));
        }
    }
    let (first, last) = steps().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), r| {
        let x = r.step as f64;
        (a.min(x), b.max(x))
    });
    let (first, last) = if first.is_finite() { (first - 1.0, last.max(first)) } else { (0.0, 1.0) };
    let gold: Vec<(f64, f64)> = tables
        .golden
        .iter()
        .filter(|r| r.reduce == strategy)
        .map(|r| (r.step as f64, f64::from(r.loss)))
        .filter(|&(x, y)| x >= first && x <= last && y > 0.0)
        .collect();
    let ys = curves.values().flatten().chain(&gold).map(|p| p.1);
    let (lo, hi) = ys.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), y| (a.min(y), b.max(y)));
    let (lo, hi) = if lo.is_finite() && hi > lo { (lo * 0.8, hi * 1.25) } else { (1e-3, 10.0) };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1000, 420)).into_drawing_area();
        root.fill(&WHITE).map_err(LabError::plot)?;
        let mut chart = ChartBuilder::on(&root)
            .margin(10)
            .caption(format!("{strategy}: golden (black) and trials that were not masked"), ("sans-serif", 16))
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(first..last, (lo..hi).log_scale())
            .map_err(LabError::plot)?;
        chart
            .configure_mesh()
            .x_desc("step")
            .y_desc("training loss")
            .y_label_formatter(&|y| format!("{y:.0e}"))
            .draw()
            .map_err(LabError::plot)?;
        for (trial, points) in &curves {
            let outcome = chosen.iter().find(|(t, _)| t == trial).map_or(Outcome::Masked, |&(_, o)| o);
            let colour = colour(outcome);
            chart
                .draw_series(LineSeries::new(points.clone(), colour.mix(0.7).stroke_width(1)))
                .map_err(LabError::plot)?;
            if let Some(&end) = points.last() {
                chart.draw_series(std::iter::once(Circle::new(end, 3, colour.filled()))).map_err(LabError::plot)?;
            }
        }
        chart.draw_series(LineSeries::new(gold, BLACK.stroke_width(2))).map_err(LabError::plot)?;
        root.present().map_err(LabError::plot)?;
    }
    Ok(svg)
}

/// One heat map per kind of state hit (first strategy): tensors by steps since the fault,
/// coloured by the square root of the mean fraction of elements that differ.
fn heat_map(all: &[PropagationRow]) -> Result<String, LabError> {
    let strategy = all.first().map(|x| x.reduce).unwrap_or_default();
    let rows: Vec<&PropagationRow> = all.iter().filter(|x| x.reduce == strategy).collect();
    let kinds = distinct(all, |x| x.state);
    let tensors = distinct(all, |x| x.tensor.clone());
    let steps = rows.iter().map(|x| x.since).max().unwrap_or(1);
    let panels = kinds.len().max(1);
    let mut svg = String::new();
    {
        let height = 70 + 16 * tensors.len() as u32;
        let root = SVGBackend::with_string(&mut svg, (1000, height * panels as u32)).into_drawing_area();
        root.fill(&WHITE).map_err(LabError::plot)?;
        for (area, kind) in root.split_evenly((panels, 1)).iter().zip(&kinds) {
            let names = tensors.clone();
            let mut chart = ChartBuilder::on(area)
                .margin(8)
                .caption(format!("{strategy}: faults in {kind}"), ("sans-serif", 14))
                .x_label_area_size(25)
                .y_label_area_size(260)
                .build_cartesian_2d(0f64..steps as f64, 0f64..names.len() as f64)
                .map_err(LabError::plot)?;
            let label = move |y: &f64| names.get(y.floor() as usize).cloned().unwrap_or_default();
            chart
                .configure_mesh()
                .disable_mesh()
                .y_labels(tensors.len() * 2 + 1)
                .y_label_formatter(&label)
                .x_desc("steps since the fault")
                .draw()
                .map_err(LabError::plot)?;
            for x in rows.iter().filter(|x| x.state == *kind) {
                let Some(ti) = tensors.iter().position(|n| *n == x.tensor) else { continue };
                let (step, f) = (x.since, x.mean_fraction);
                // The square root of the fraction, so that small fractions stay visible;
                // any difference at all is at least a pale tint.
                let level = if f > 0.0 { f.sqrt().clamp(0.08, 1.0) } else { 0.0 };
                let colour = RGBColor(255, (255.0 * (1.0 - level)) as u8, (255.0 * (1.0 - level) * 0.8) as u8);
                let (x0, y0) = ((step - 1) as f64, ti as f64);
                chart
                    .draw_series(std::iter::once(Rectangle::new([(x0, y0), (x0 + 1.0, y0 + 1.0)], colour.filled())))
                    .map_err(LabError::plot)?;
            }
        }
        root.present().map_err(LabError::plot)?;
    }
    Ok(svg)
}
