//! The charts `cargo xtask bench router` draws from its report
//! (`target/bench/router.json`), as SVG beside it: throughput against
//! clients per engine, latency at each fixed rate, and with `--compare`
//! each cell's head-to-base ratios. Each chart puts the router beside what
//! the same run measured without it: the fake upstream alone and the proxy
//! that keeps nothing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use plotters::coord::Shift;
use plotters::prelude::*;
use serde_json::Value;

/// One measured series of a cell: who was driven, with what.
const SERIES: [(&str, &str, RGBColor); 4] = [
    ("router", "surety", RGBColor(31, 119, 180)),
    ("base", "surety (base)", RGBColor(148, 103, 189)),
    ("null_proxy", "null proxy", RGBColor(255, 127, 14)),
    ("direct", "fake upstream alone", RGBColor(44, 160, 44)),
];

/// A figure of one series at one x: (x, per_s, p50_ms, p99_ms).
type Point = (f64, f64, f64, f64);

/// What a report holds per engine: for each series, its closed-loop points
/// (x = clients) and its open-loop points (x = the rate asked for).
#[derive(Default)]
struct Engine {
    closed: BTreeMap<&'static str, Vec<Point>>,
    open: BTreeMap<&'static str, Vec<Point>>,
}

fn engines(report: &Value) -> BTreeMap<String, Engine> {
    let mut out: BTreeMap<String, Engine> = BTreeMap::new();
    for cell in report["cells"].as_array().into_iter().flatten() {
        let (Some(engine), Some(load)) = (cell["engine"].as_str(), cell["load"].as_str()) else {
            continue;
        };
        let (closed, x) = if let Some(c) = load.strip_prefix("closed ") {
            (true, c.parse::<f64>().ok())
        } else if let Some(r) = load
            .strip_prefix("open ")
            .and_then(|r| r.strip_suffix("/s"))
        {
            (false, r.parse::<f64>().ok())
        } else {
            continue;
        };
        let Some(x) = x else { continue };
        let entry = out.entry(engine.to_owned()).or_default();
        for (key, _, _) in SERIES {
            let s = &cell[key];
            if let (Some(per_s), Some(p50), Some(p99)) = (
                s["per_s"].as_f64(),
                s["p50_ms"].as_f64(),
                s["p99_ms"].as_f64(),
            ) {
                let series = if closed {
                    &mut entry.closed
                } else {
                    &mut entry.open
                };
                series.entry(key).or_default().push((x, per_s, p50, p99));
            }
        }
    }
    for engine in out.values_mut() {
        for points in engine.closed.values_mut().chain(engine.open.values_mut()) {
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
    }
    out
}

/// Whether `report` has a closed or open cell to draw (a run of only the
/// feature cells has none).
pub fn drawable(report: &Value) -> bool {
    !engines(report).is_empty()
}

/// Writes the charts for `report` into `dir` and returns their paths:
/// `router-throughput.svg` and `router-latency.svg` where the report has
/// closed and open cells, and `router-compare.svg` where it has ratios.
pub fn write(report: &Value, dir: &Path) -> Result<Vec<PathBuf>> {
    let engines = engines(report);
    if engines.is_empty() {
        bail!("the report has no closed or open cells to draw");
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let base = report["compared_with"].as_str().map(str::to_owned);
    let mut written = Vec::new();
    let closed: Vec<(&String, &Engine)> = engines
        .iter()
        .filter(|(_, e)| !e.closed.is_empty())
        .collect();
    if !closed.is_empty() {
        let path = dir.join("router-throughput.svg");
        panels(&path, closed.len(), |area, i| {
            let (name, engine) = closed[i];
            throughput(area, name, engine, base.as_deref())
        })?;
        written.push(path);
    }
    let open: Vec<(&String, &Engine)> =
        engines.iter().filter(|(_, e)| !e.open.is_empty()).collect();
    if !open.is_empty() {
        let path = dir.join("router-latency.svg");
        panels(&path, open.len(), |area, i| {
            let (name, engine) = open[i];
            latency(area, name, engine, base.as_deref())
        })?;
        written.push(path);
    }
    let ratios: Vec<(String, f64, f64)> = report["cells"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| {
            let r = &c["ratio_head_to_base"];
            Some((
                format!("{} {}", c["engine"].as_str()?, c["load"].as_str()?),
                r["throughput"].as_f64()?,
                r["p99"].as_f64()?,
            ))
        })
        .collect();
    if !ratios.is_empty() {
        let path = dir.join("router-compare.svg");
        {
            let root = SVGBackend::new(&path, (1100, 640)).into_drawing_area();
            root.fill(&WHITE)?;
            let halves = root.split_evenly((2, 1));
            let name = base.as_deref().unwrap_or("base");
            ratio_bars(
                &halves[0],
                &ratios,
                |r| r.1,
                &format!("jobs/s, head ÷ {name}"),
            )?;
            ratio_bars(&halves[1], &ratios, |r| r.2, &format!("p99, head ÷ {name}"))?;
            root.present()
                .with_context(|| format!("writing {}", path.display()))?;
        }
        written.push(path);
    }
    Ok(written)
}

/// The report's closed and open cells as two Markdown tables, the router
/// beside the proxy that keeps nothing and the fake upstream alone of the
/// same cell (what docs/operations.md shows under its charts).
pub fn tables(report: &Value) -> String {
    let cells: Vec<&Value> = report["cells"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["router"]["per_s"].is_number() && c["direct"]["per_s"].is_number())
        .collect();
    let f = |v: &Value| v.as_f64().unwrap_or(f64::NAN);
    let mut out = String::from(
        "| engine | clients | surety, jobs/s | null proxy, req/s | fake alone, req/s | surety ÷ null proxy | router CPU per job |\n| --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for c in cells
        .iter()
        .filter(|c| c["load"].as_str().is_some_and(|l| l.starts_with("closed ")))
    {
        let (router, proxy, direct) = (
            f(&c["router"]["per_s"]),
            f(&c["null_proxy"]["per_s"]),
            f(&c["direct"]["per_s"]),
        );
        out.push_str(&format!(
            "| {} | {} | {router:.0} | {proxy:.0} | {direct:.0} | {:.2} | {:.0} µs |\n",
            c["engine"].as_str().unwrap_or("?"),
            c["load"]
                .as_str()
                .unwrap_or("?")
                .trim_start_matches("closed "),
            router / proxy,
            f(&c["router"]["cpu_per_job_us"]),
        ));
    }
    out.push_str(
        "\n| engine | jobs/s asked | surety p50 / p99, ms | null proxy p50 / p99 | fake alone p50 / p99 | p99 surety adds beyond the proxy |\n| --- | --- | --- | --- | --- | --- |\n",
    );
    for c in cells
        .iter()
        .filter(|c| c["load"].as_str().is_some_and(|l| l.starts_with("open ")))
    {
        let pair = |s: &Value| format!("{:.2} / {:.2}", f(&s["p50_ms"]), f(&s["p99_ms"]));
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {:.2} ms |\n",
            c["engine"].as_str().unwrap_or("?"),
            c["load"]
                .as_str()
                .unwrap_or("?")
                .trim_start_matches("open ")
                .trim_end_matches("/s"),
            pair(&c["router"]),
            pair(&c["null_proxy"]),
            pair(&c["direct"]),
            f(&c["router"]["p99_ms"]) - f(&c["null_proxy"]["p99_ms"]),
        ));
    }
    out
}

/// A chart of `n` panels side by side, each drawn by `draw`.
fn panels(
    path: &Path,
    n: usize,
    draw: impl Fn(&DrawingArea<SVGBackend<'_>, Shift>, usize) -> Result<()>,
) -> Result<()> {
    let width = u32::try_from(n).unwrap_or(4).clamp(1, 4) * 420;
    let root = SVGBackend::new(path, (width, 380)).into_drawing_area();
    root.fill(&WHITE)?;
    for (i, area) in root.split_evenly((1, n)).iter().enumerate() {
        draw(area, i)?;
    }
    root.present()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

fn label(key: &str, name: &str, base: Option<&str>) -> String {
    match (key, base) {
        ("base", Some(base)) => format!("surety ({base})"),
        _ => name.to_owned(),
    }
}

/// An axis's range on a log scale around every value, by whole decades.
fn decades(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values
        .filter(|v| *v > 0.0)
        .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if lo > hi {
        return (0.1, 10.0);
    }
    (
        10f64.powf(lo.log10().floor()),
        10f64.powf(hi.log10().ceil()),
    )
}

/// The largest x of any series, at least 1.
fn widest(series: &BTreeMap<&'static str, Vec<Point>>) -> f64 {
    series.values().flatten().map(|p| p.0).fold(1.0, f64::max)
}

/// A series' mark in the legend: a short line of its colour.
fn mark((x, y): (i32, i32), color: RGBColor) -> PathElement<(i32, i32)> {
    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
}

/// The legend of the series labelled so far, at `position`.
fn legend<'a, CT: plotters::coord::CoordTranslate>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, CT>,
    position: SeriesLabelPosition,
) -> Result<()> {
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

fn throughput(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    name: &str,
    engine: &Engine,
    base: Option<&str>,
) -> Result<()> {
    let (lo, hi) = decades(engine.closed.values().flatten().map(|p| p.1));
    let max_x = widest(&engine.closed);
    let mut chart = ChartBuilder::on(area)
        .caption(format!("{name}: closed loop"), ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(60)
        .build_cartesian_2d((0.8..max_x * 1.25).log_scale(), (lo..hi).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("clients")
        .y_desc("requests/s")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()?;
    for (key, series_name, color) in SERIES {
        let Some(points) = engine.closed.get(key) else {
            continue;
        };
        let line: Vec<(f64, f64)> = points.iter().map(|p| (p.0, p.1)).collect();
        chart
            .draw_series(LineSeries::new(line.clone(), color.stroke_width(2)))?
            .label(label(key, series_name, base))
            .legend(move |at| mark(at, color));
        chart.draw_series(line.into_iter().map(|p| Circle::new(p, 3, color.filled())))?;
    }
    legend(&mut chart, SeriesLabelPosition::LowerRight)?;
    Ok(())
}

fn latency(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    name: &str,
    engine: &Engine,
    base: Option<&str>,
) -> Result<()> {
    let (lo, hi) = decades(engine.open.values().flatten().flat_map(|p| [p.2, p.3]));
    let max_x = widest(&engine.open);
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!("{name}: p50 (dashed) and p99 at fixed rates"),
            ("sans-serif", 16),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..max_x * 1.15, (lo..hi).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("jobs/s asked for")
        .y_desc("latency, ms")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y}"))
        .draw()?;
    for (key, series_name, color) in SERIES {
        let Some(points) = engine.open.get(key) else {
            continue;
        };
        let p99: Vec<(f64, f64)> = points.iter().map(|p| (p.0, p.3)).collect();
        let p50: Vec<(f64, f64)> = points.iter().map(|p| (p.0, p.2)).collect();
        chart
            .draw_series(LineSeries::new(p99.clone(), color.stroke_width(2)))?
            .label(label(key, series_name, base))
            .legend(move |at| mark(at, color));
        chart.draw_series(p99.into_iter().map(|p| Circle::new(p, 3, color.filled())))?;
        chart.draw_series(DashedLineSeries::new(
            p50.clone(),
            5,
            4,
            color.stroke_width(1),
        ))?;
        chart.draw_series(p50.into_iter().map(|p| Circle::new(p, 2, color)))?;
    }
    legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    Ok(())
}

/// A bar per cell of one ratio, with 1 (no change) drawn across.
fn ratio_bars(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    ratios: &[(String, f64, f64)],
    value: impl Fn(&(String, f64, f64)) -> f64,
    caption: &str,
) -> Result<()> {
    let n = u32::try_from(ratios.len()).unwrap_or(u32::MAX);
    let top = ratios.iter().map(&value).fold(1.0, f64::max) * 1.15;
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d((0..n).into_segmented(), 0.0..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(ratios.len())
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => ratios
                .get(*i as usize)
                .map(|r| r.0.clone())
                .unwrap_or_default(),
            _ => String::new(),
        })
        .draw()?;
    chart.draw_series(
        Histogram::vertical(&chart)
            .style(SERIES[0].2.filled())
            .margin(8)
            .data(ratios.iter().enumerate().map(|(i, r)| (i as u32, value(r)))),
    )?;
    chart.draw_series(LineSeries::new(
        [(SegmentValue::Exact(0), 1.0), (SegmentValue::Exact(n), 1.0)],
        BLACK.stroke_width(1),
    ))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cell(engine: &str, load: &str, router: f64, with_base: bool) -> Value {
        let s = |per_s: f64| json!({"per_s": per_s, "p50_ms": 0.5, "p99_ms": 2.0, "n": 10});
        let mut c = json!({"engine": engine, "load": load, "router": s(router),
            "null_proxy": s(router * 4.0), "direct": s(router * 8.0)});
        if with_base {
            c["base"] = s(router / 2.0);
            c["ratio_head_to_base"] =
                json!({"throughput": 2.0, "p50": 1.0, "p99": 0.8, "cpu_per_job": 0.5});
        }
        c
    }

    #[test]
    fn a_report_becomes_its_charts_with_every_series_named() {
        let dir = tempfile::tempdir().unwrap();
        let report = json!({"compared_with": "abc123", "cells": [
            cell("sqlite", "closed 1", 1000.0, true), cell("sqlite", "closed 64", 9000.0, true),
            cell("postgres", "closed 16", 2000.0, true), cell("sqlite", "open 500/s", 500.0, true),
            {"engine": "sqlite", "build": "head", "router_rss_kib": 40000},
        ]});
        let written = write(&report, dir.path()).unwrap();
        let names: Vec<String> = written
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            [
                "router-throughput.svg",
                "router-latency.svg",
                "router-compare.svg"
            ]
        );
        let throughput = std::fs::read_to_string(&written[0]).unwrap();
        for text in [
            "sqlite: closed loop",
            "postgres: closed loop",
            "surety (abc123)",
            "null proxy",
            "fake upstream alone",
            "clients",
        ] {
            assert!(
                throughput.contains(text),
                "the throughput chart has no `{text}`"
            );
        }
        let compare = std::fs::read_to_string(&written[2]).unwrap();
        assert!(
            compare.contains("sqlite closed 64") && compare.contains("head ÷ abc123"),
            "{compare}"
        );
    }

    #[test]
    fn the_tables_put_the_router_beside_the_proxy_and_the_upstream() {
        let mut open = cell("postgres", "open 500/s", 500.0, false);
        open["router"]["p99_ms"] = json!(3.5);
        let report = json!({"cells": [cell("sqlite", "closed 64", 9000.0, false), open]});
        let tables = tables(&report);
        assert!(
            tables.contains("| sqlite | 64 | 9000 | 36000 | 72000 | 0.25 |"),
            "{tables}"
        );
        assert!(
            tables
                .contains("| postgres | 500 | 0.50 / 3.50 | 0.50 / 2.00 | 0.50 / 2.00 | 1.50 ms |"),
            "{tables}"
        );
    }

    #[test]
    fn a_report_without_cells_to_draw_is_refused_and_nothing_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("charts");
        let report = json!({"cells": [{"engine": "sqlite", "build": "head", "router_rss_kib": 1},
            {"engine": "postgres", "load": "budgets, closed 16", "throughput_ratio": 0.7}]});
        assert!(!drawable(&report));
        let e = write(&report, &out).unwrap_err();
        assert!(e.to_string().contains("no closed or open cells"), "{e}");
        assert!(!out.exists());
    }
}
