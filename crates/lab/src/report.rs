//! A campaign's report: one self-contained HTML page with SVG plots of its tables (outcome
//! by bit position, by kind of state, loss curves against golden, the propagation heat
//! map) and its summary tables, rendered from the files that [`crate::campaign::output`]
//! writes.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use fault::campaign::Outcome;
use plotters::prelude::*;

use crate::LabError;

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

/// A CSV file of a campaign: its header and rows (our tables quote nothing).
struct Table {
    path: std::path::PathBuf,
    columns: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    fn read(dir: &Path, name: &str) -> Result<Table, LabError> {
        let path = dir.join(name);
        let text = std::fs::read_to_string(&path).map_err(|e| LabError::Input {
            path: path.clone(),
            reason: format!("{e}: is {} the output of `steadfast campaign`?", dir.display()),
        })?;
        let mut lines = text.lines();
        let columns: Vec<String> = lines.next().unwrap_or("").split(',').map(str::to_owned).collect();
        let rows: Vec<Vec<String>> =
            lines.filter(|l| !l.is_empty()).map(|l| l.split(',').map(str::to_owned).collect()).collect();
        if let Some((i, r)) = rows.iter().enumerate().find(|(_, r)| r.len() != columns.len()) {
            return Err(LabError::Input {
                reason: format!("line {}: {} fields where the header has {}", i + 2, r.len(), columns.len()),
                path,
            });
        }
        Ok(Table { path, columns, rows })
    }

    fn col(&self, name: &str) -> Result<usize, LabError> {
        self.columns
            .iter()
            .position(|c| c == name)
            .ok_or_else(|| LabError::Input { path: self.path.clone(), reason: format!("no column {name:?}") })
    }

    /// The distinct values of a column, in first-seen order.
    fn distinct(&self, col: usize) -> Vec<String> {
        let mut v: Vec<String> = Vec::new();
        for r in &self.rows {
            if !v.contains(&r[col]) {
                v.push(r[col].clone());
            }
        }
        v
    }
}

fn plot_err<E: std::fmt::Debug>(e: E) -> LabError {
    LabError::Plot(format!("{e:?}"))
}

/// The report page of the campaign whose tables are in `dir`.
pub fn render(dir: &Path) -> Result<String, LabError> {
    let bits = Table::read(dir, "sensitivity_bit.csv")?;
    let states = Table::read(dir, "sensitivity_state.csv")?;
    let steps = Table::read(dir, "steps.csv")?;
    let golden = Table::read(dir, "golden.csv")?;
    let trials = Table::read(dir, "trials.csv")?;
    let propagation = Table::read(dir, "propagation.csv")?;
    let detectors = Table::read(dir, "detectors.csv")?;
    let summary = std::fs::read_to_string(dir.join("summary.md")).unwrap_or_default();
    let title = summary.lines().next().unwrap_or("# Campaign").trim_start_matches("# ").to_owned();
    let about = summary.lines().nth(2).unwrap_or("").to_owned();

    let plots: Vec<(String, String)> = vec![
        ("Outcome by bit position".into(), outcome_bars(&bits, "bit", "bit flipped (highest, if several)")?),
        ("Model against optimizer state".into(), outcome_bars(&states, "state", "kind of state hit")?),
        ("Training loss of trials against golden".into(), loss_curves(&steps, &golden, &trials)?),
        (
            "Propagation: mean fraction of each tensor's elements whose bits differ from golden \
             (white: none; pale: a few elements; red: all; colour by square root)"
                .into(),
            heat_map(&propagation)?,
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
    let _ = writeln!(html, "<h1>{}</h1>\n<p>{}</p>", escape(&title), escape(&about));
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
    html.push_str(&html_table(&states));
    html.push_str("<h2>Detectors</h2>\n");
    html.push_str(&html_table(&detectors));
    let _ = writeln!(
        html,
        "<p>Tables: <code>{}</code> (trials.csv has one row per trial, replayable with \
         <code>steadfast campaign SPEC --replay N</code>).</p>",
        escape(&dir.display().to_string())
    );
    // The browser marks how many plots it laid out with a visible, non-empty area; the
    // tests read the mark from the rendered page.
    html.push_str(
        "<script>window.addEventListener('load',function(){var n=0;document.querySelectorAll('section.plot svg')\
         .forEach(function(s){var b=s.getBoundingClientRect();if(b.width>50&&b.height>50&&\
         s.querySelectorAll('rect,path,polyline,line,circle,text').length>10)n++;});\
         document.body.setAttribute('data-plots-rendered',String(n));});</script>\n</body></html>\n",
    );
    Ok(html)
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

fn html_table(t: &Table) -> String {
    let mut s = String::from("<table><tr>");
    for c in &t.columns {
        let _ = write!(s, "<th>{}</th>", escape(c));
    }
    s.push_str("</tr>\n");
    for r in &t.rows {
        s.push_str("<tr>");
        for v in r {
            let _ = write!(s, "<td>{}</td>", escape(v));
        }
        s.push_str("</tr>\n");
    }
    s.push_str("</table>\n");
    s
}

/// Stacked bars of outcome fractions per key, one group of bars per strategy.
fn outcome_bars(t: &Table, key: &str, x_desc: &str) -> Result<String, LabError> {
    let (k, red, n) = (t.col(key)?, t.col("reduce")?, t.col("trials")?);
    let outcome_cols: Vec<usize> = Outcome::ALL.iter().map(|o| t.col(o.name())).collect::<Result<_, LabError>>()?;
    let strategies = t.distinct(red);
    let mut keys = t.distinct(k);
    if keys.iter().all(|x| x.parse::<u32>().is_ok()) {
        keys.sort_by_key(|x| x.parse::<u32>().unwrap_or(0));
    }
    let groups = strategies.len().max(1);
    let slots = keys.len() * groups;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1000, 380)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let mut chart = ChartBuilder::on(&root)
            .margin(10)
            .x_label_area_size(45)
            .y_label_area_size(55)
            .build_cartesian_2d(0f64..slots as f64, 0f64..1f64)
            .map_err(plot_err)?;
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
            .map_err(plot_err)?;
        for (ki, kv) in keys.iter().enumerate() {
            for (si, sv) in strategies.iter().enumerate() {
                let Some(row) = t.rows.iter().find(|r| &r[k] == kv && &r[red] == sv) else { continue };
                let total: f64 = row[n].parse().unwrap_or(0.0);
                if total == 0.0 {
                    continue;
                }
                let x0 = (ki * groups + si) as f64 + 0.1;
                let mut y = 0.0;
                for (oi, &c) in outcome_cols.iter().enumerate() {
                    let h = row[c].parse::<f64>().unwrap_or(0.0) / total;
                    if h > 0.0 {
                        let colour = colour(Outcome::ALL[oi]);
                        let fill = if si == 0 { colour.filled() } else { colour.mix(0.65).filled() };
                        chart
                            .draw_series(std::iter::once(Rectangle::new([(x0, y), (x0 + 0.8, y + h)], fill)))
                            .map_err(plot_err)?;
                    }
                    y += h;
                }
            }
        }
        root.present().map_err(plot_err)?;
    }
    Ok(svg)
}

/// The golden loss over the trials' window and the loss of up to 30 trials that were not
/// masked and 10 masked ones that changed state (first strategy); a dot marks where a
/// trial stopped.
fn loss_curves(steps: &Table, golden: &Table, trials: &Table) -> Result<String, LabError> {
    let (st, sr, ss, sl) = (steps.col("trial")?, steps.col("reduce")?, steps.col("step")?, steps.col("loss")?);
    let (gr, gs, gl) = (golden.col("reduce")?, golden.col("step")?, golden.col("loss")?);
    let (tt, tr, to, td) =
        (trials.col("trial")?, trials.col("reduce")?, trials.col("outcome")?, trials.col("max_differing")?);
    let strategy = trials.rows.first().map(|r| r[tr].clone()).unwrap_or_default();
    let mine = || trials.rows.iter().filter(|r| r[tr] == strategy);
    let mut chosen: Vec<(String, String)> =
        mine().filter(|r| r[to] != "masked").map(|r| (r[tt].clone(), r[to].clone())).take(30).collect();
    chosen
        .extend(mine().filter(|r| r[to] == "masked" && r[td] != "0").map(|r| (r[tt].clone(), r[to].clone())).take(10));
    let mut curves: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for r in steps.rows.iter().filter(|r| r[sr] == strategy) {
        if chosen.iter().any(|(t, _)| *t == r[st])
            && let (Ok(x), Ok(y)) = (r[ss].parse::<f64>(), r[sl].parse::<f64>())
            && y.is_finite()
            && y > 0.0
        {
            curves.entry(r[st].clone()).or_default().push((x, y));
        }
    }
    let all_steps = steps.rows.iter().filter(|r| r[sr] == strategy).filter_map(|r| r[ss].parse::<f64>().ok());
    let (first, last) = all_steps.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| (a.min(x), b.max(x)));
    let (first, last) = if first.is_finite() { (first - 1.0, last.max(first)) } else { (0.0, 1.0) };
    let gold: Vec<(f64, f64)> = golden
        .rows
        .iter()
        .filter(|r| r[gr] == strategy)
        .filter_map(|r| Some((r[gs].parse().ok()?, r[gl].parse().ok()?)))
        .filter(|(x, y): &(f64, f64)| *x >= first && *x <= last && *y > 0.0)
        .collect();
    let ys = curves.values().flatten().chain(&gold).map(|p| p.1);
    let (lo, hi) = ys.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), y| (a.min(y), b.max(y)));
    let (lo, hi) = if lo.is_finite() && hi > lo { (lo * 0.8, hi * 1.25) } else { (1e-3, 10.0) };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1000, 420)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let mut chart = ChartBuilder::on(&root)
            .margin(10)
            .caption(format!("{strategy}: golden (black) and trials that were not masked"), ("sans-serif", 16))
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(first..last, (lo..hi).log_scale())
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .x_desc("step")
            .y_desc("training loss")
            .y_label_formatter(&|y| format!("{y:.0e}"))
            .draw()
            .map_err(plot_err)?;
        for (trial, points) in &curves {
            let outcome = chosen.iter().find(|(t, _)| t == trial).map_or("masked", |(_, o)| o.as_str());
            let colour = Outcome::ALL.iter().find(|o| o.name() == outcome).map_or(BLUE, |&o| colour(o));
            chart.draw_series(LineSeries::new(points.clone(), colour.mix(0.7).stroke_width(1))).map_err(plot_err)?;
            if let Some(&end) = points.last() {
                chart.draw_series(std::iter::once(Circle::new(end, 3, colour.filled()))).map_err(plot_err)?;
            }
        }
        chart.draw_series(LineSeries::new(gold, BLACK.stroke_width(2))).map_err(plot_err)?;
        root.present().map_err(plot_err)?;
    }
    Ok(svg)
}

/// One heat map per kind of state hit (first strategy): tensors by steps since the fault,
/// coloured by the mean fraction of elements that differ, on a log scale.
fn heat_map(t: &Table) -> Result<String, LabError> {
    let (r, s, tn, since, frac) =
        (t.col("reduce")?, t.col("state")?, t.col("tensor")?, t.col("since")?, t.col("mean_fraction")?);
    let strategy = t.rows.first().map(|x| x[r].clone()).unwrap_or_default();
    let rows: Vec<&Vec<String>> = t.rows.iter().filter(|x| x[r] == strategy).collect();
    let kinds = t.distinct(s);
    let tensors = t.distinct(tn);
    let steps = rows.iter().filter_map(|x| x[since].parse::<usize>().ok()).max().unwrap_or(1);
    let panels = kinds.len().max(1);
    let mut svg = String::new();
    {
        let height = 70 + 16 * tensors.len() as u32;
        let root = SVGBackend::with_string(&mut svg, (1000, height * panels as u32)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        for (area, kind) in root.split_evenly((panels, 1)).iter().zip(&kinds) {
            let names = tensors.clone();
            let mut chart = ChartBuilder::on(area)
                .margin(8)
                .caption(format!("{strategy}: faults in {kind}"), ("sans-serif", 14))
                .x_label_area_size(25)
                .y_label_area_size(260)
                .build_cartesian_2d(0f64..steps as f64, 0f64..names.len() as f64)
                .map_err(plot_err)?;
            let label = move |y: &f64| names.get(y.floor() as usize).cloned().unwrap_or_default();
            chart
                .configure_mesh()
                .disable_mesh()
                .y_labels(tensors.len() * 2 + 1)
                .y_label_formatter(&label)
                .x_desc("steps since the fault")
                .draw()
                .map_err(plot_err)?;
            for x in rows.iter().filter(|x| &x[s] == kind) {
                let (Some(ti), Ok(step), Ok(f)) =
                    (tensors.iter().position(|n| *n == x[tn]), x[since].parse::<usize>(), x[frac].parse::<f64>())
                else {
                    continue;
                };
                // The square root of the fraction, so that small fractions stay visible;
                // any difference at all is at least a pale tint.
                let level = if f > 0.0 { f.sqrt().clamp(0.08, 1.0) } else { 0.0 };
                let colour = RGBColor(255, (255.0 * (1.0 - level)) as u8, (255.0 * (1.0 - level) * 0.8) as u8);
                let (x0, y0) = ((step - 1) as f64, ti as f64);
                chart
                    .draw_series(std::iter::once(Rectangle::new([(x0, y0), (x0 + 1.0, y0 + 1.0)], colour.filled())))
                    .map_err(plot_err)?;
            }
        }
        root.present().map_err(plot_err)?;
    }
    Ok(svg)
}
