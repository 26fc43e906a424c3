//! `bench.svg`: four panels that tell the result at a glance.
//! 1. emails/s per 1 s bucket of each worker-only run, with the raw limits as dashed lines;
//! 2. latency percentile curves (claim → accepted; publish → accepted at offered rates), with
//!    the unloaded latency of each raw part as dashed lines;
//! 3. throughput of each worker-only run next to the raw limits (bars);
//! 4. CPU by process during each worker-only run, against the machine's capacity.

use std::path::Path;

use plotters::prelude::*;

use crate::Results;
use crate::report::{path_floor_ms, thousands};

const RUNS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(188, 189, 34),
    RGBColor(0, 0, 128),
    RGBColor(128, 128, 0),
];
const BROKER: RGBColor = RGBColor(255, 127, 14);
const DB: RGBColor = RGBColor(214, 39, 40);
const SMTP: RGBColor = RGBColor(23, 190, 207);
const GREY: RGBColor = RGBColor(120, 120, 120);

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow::anyhow!("drawing the chart: {e:?}")
}

pub fn draw(r: &Results, path: &Path) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (1400, 1000)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let root = root
        .titled(
            &format!(
                "mailroom worker vs raw limits: {} cores, everything on loopback, N = {}",
                r.machine.cores,
                thousands(r.opts.n as f64)
            ),
            ("sans-serif", 22),
        )
        .map_err(err)?;
    let panels = root.split_evenly((2, 2));
    throughput_over_time(r, &panels[0])?;
    latency(r, &panels[1])?;
    throughput_bars(r, &panels[2])?;
    cpu_bars(r, &panels[3])?;
    root.present().map_err(err)?;
    Ok(())
}

fn raw_limits(r: &Results) -> Vec<(String, f64, RGBColor)> {
    vec![
        (
            format!("raw RabbitMQ {}/s", thousands(r.raw_broker.rate)),
            r.raw_broker.rate,
            BROKER,
        ),
        (
            format!(
                "raw PostgreSQL claim+record, grouped {}/s",
                thousands(r.raw_db.grouped_rate)
            ),
            r.raw_db.grouped_rate,
            DB,
        ),
        (
            format!("raw SMTP (Mailer) {}/s", thousands(r.raw_smtp.rate)),
            r.raw_smtp.rate,
            SMTP,
        ),
    ]
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

fn throughput_over_time(r: &Results, area: &Area) -> anyhow::Result<()> {
    let limits = raw_limits(r);
    let xmax = r
        .worker_runs
        .iter()
        .map(|w| w.timeline.len())
        .max()
        .unwrap_or(1)
        .max(2) as f64;
    let ymax = limits
        .iter()
        .map(|l| l.1)
        .chain(
            r.worker_runs
                .iter()
                .flat_map(|w| w.timeline.iter().copied()),
        )
        .fold(1.0, f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(area)
        .caption(
            "worker only: emails/s per 1 s (from process start)",
            ("sans-serif", 16),
        )
        .margin(12)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..xmax, 0f64..ymax)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("seconds since the worker processes started")
        .y_desc("emails/s")
        .draw()
        .map_err(err)?;
    for (i, w) in r.worker_runs.iter().enumerate() {
        let color = RUNS[i % RUNS.len()];
        // Each bucket's rate drawn at the bucket's end.
        let points: Vec<(f64, f64)> = std::iter::once((0.0, 0.0))
            .chain(
                w.timeline
                    .iter()
                    .enumerate()
                    .map(|(s, v)| (s as f64 + 1.0, *v)),
            )
            .collect();
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(err)?
            .label(format!(
                "{} worker process(es): {}/s",
                w.workers,
                thousands(w.emails_per_s)
            ))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    for (label, value, color) in limits {
        chart
            .draw_series(DashedLineSeries::new(
                vec![(0.0, value), (xmax, value)],
                8,
                5,
                color.stroke_width(2),
            ))
            .map_err(err)?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 12))
        .draw()
        .map_err(err)?;
    Ok(())
}

fn latency(r: &Results, area: &Area) -> anyhow::Result<()> {
    let mut curves: Vec<(String, Vec<(f64, f64)>)> = vec![];
    if let Some(w) = r.worker_runs.iter().find(|w| w.workers == 1) {
        curves.push((
            "backlog, 1 process: claim → accepted".into(),
            w.claim_to_sent.curve.clone(),
        ));
    }
    for p in &r.paced_runs {
        curves.push((
            format!("{:.0}/s offered: publish → accepted", p.offered_rate),
            p.latency.curve.clone(),
        ));
    }
    for p in &r.relay.end_to_end_paced {
        curves.push((
            format!(
                "end to end, {:.0}/s offered: commit → accepted",
                p.offered_rate.unwrap_or(0.0)
            ),
            p.latency.curve.clone(),
        ));
    }
    let refs = vec![
        (
            "RabbitMQ hop, 1 at a time (p50)",
            r.raw_broker.floor.p50,
            BROKER,
        ),
        ("claim + record, 1 at a time (p50)", r.raw_db.floor.p50, DB),
        ("SMTP send, 1 at a time (p50)", r.raw_smtp.floor.p50, SMTP),
        ("sum of the raw parts", path_floor_ms(r), GREY),
    ];
    let values = curves
        .iter()
        .flat_map(|c| c.1.iter().map(|p| p.1))
        .chain(refs.iter().map(|r| r.1))
        .filter(|v| *v > 0.0);
    let (lo, hi) = values.fold((f64::INFINITY, 0.0f64), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    let (lo, hi) = if hi > 0.0 {
        (lo / 2.0, hi * 2.0)
    } else {
        (0.01, 10.0)
    };
    let mut chart = ChartBuilder::on(area)
        .caption("latency percentiles (ms, log scale)", ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..100f64, (lo..hi).log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("percentile")
        .y_desc("ms")
        .draw()
        .map_err(err)?;
    for (i, (label, curve)) in curves.into_iter().enumerate() {
        let color = RUNS[i % RUNS.len()];
        let points: Vec<(f64, f64)> = curve.into_iter().map(|(p, v)| (p, v.max(lo))).collect();
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(err)?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    for (label, value, color) in refs {
        if value <= 0.0 {
            continue;
        }
        chart
            .draw_series(DashedLineSeries::new(
                vec![(0.0, value), (100.0, value)],
                8,
                5,
                color.stroke_width(2),
            ))
            .map_err(err)?
            .label(format!("{label}: {value:.2} ms"))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 12))
        .draw()
        .map_err(err)?;
    Ok(())
}

/// Horizontal bars with a label each.
fn bars(
    area: &Area,
    caption: &str,
    unit: &str,
    rows: &[(String, f64, RGBColor)],
    xmax: f64,
) -> anyhow::Result<()> {
    let n = rows.len().max(1);
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(35)
        .y_label_area_size(10)
        .build_cartesian_2d(0f64..xmax, 0f64..n as f64)
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .disable_y_axis()
        .x_desc(unit)
        .draw()
        .map_err(err)?;
    for (i, (label, value, color)) in rows.iter().enumerate() {
        let y = (n - 1 - i) as f64;
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(0.0, y + 0.15), (*value, y + 0.85)],
                color.mix(0.75).filled(),
            )))
            .map_err(err)?;
        chart
            .draw_series(std::iter::once(Text::new(
                label.clone(),
                (xmax * 0.01, y + 0.62),
                ("sans-serif", 13),
            )))
            .map_err(err)?;
    }
    Ok(())
}

fn throughput_bars(r: &Results, area: &Area) -> anyhow::Result<()> {
    let mut rows = raw_limits(r);
    if let Some(src) = r.raw_smtp.smtp_source_rate {
        rows.push((
            format!("raw SMTP (smtp-source) {}/s", thousands(src)),
            src,
            SMTP,
        ));
    }
    if let Some(nd) = r.raw_smtp.nodelay_rate {
        rows.push((
            format!("raw SMTP (bare lettre connections) {}/s", thousands(nd)),
            nd,
            SMTP,
        ));
    }
    for (i, w) in r.worker_runs.iter().enumerate() {
        rows.push((
            format!(
                "mailroom, {} worker process(es): {}/s",
                w.workers,
                thousands(w.emails_per_s)
            ),
            w.emails_per_s,
            RUNS[i % RUNS.len()],
        ));
    }
    let c = &r.relay.outbox_commits;
    for m in c.modes.iter().filter(|m| m.per_s > 0.0) {
        rows.push((
            format!(
                "raw outbox commits ({} producers), wake-up {} {}/s",
                c.producers,
                m.mode,
                thousands(m.per_s)
            ),
            m.per_s,
            DB,
        ));
    }
    let e2e = &r.relay.end_to_end_max;
    rows.push((
        format!(
            "mailroom end to end (1 relay + 1 worker): {}/s",
            thousands(e2e.emails_per_s)
        ),
        e2e.emails_per_s,
        GREY,
    ));
    for a in &r.relay.alone {
        rows.push((
            format!(
                "mailroom relay only on {} (outbox → queue): {}/s",
                a.engine,
                thousands(a.relay_only.rows_per_s)
            ),
            a.relay_only.rows_per_s,
            BROKER,
        ));
    }
    let xmax = rows.iter().map(|r| r.1).fold(1.0, f64::max) * 1.05;
    bars(
        area,
        "throughput: mailroom next to the raw limits",
        "per second",
        &rows,
        xmax,
    )
}

fn cpu_bars(r: &Results, area: &Area) -> anyhow::Result<()> {
    let n = r.worker_runs.len().max(1);
    let capacity = r
        .worker_runs
        .first()
        .map_or(200.0, |w| w.cpu.machine_capacity);
    let mut chart = ChartBuilder::on(area)
        .caption(
            "CPU by process during each worker-only run (% of one core)",
            ("sans-serif", 16),
        )
        .margin(12)
        .x_label_area_size(35)
        .y_label_area_size(10)
        .build_cartesian_2d(0f64..capacity * 1.1, 0f64..n as f64)
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .disable_y_axis()
        .x_desc("% of one core (capacity dashed)")
        .draw()
        .map_err(err)?;
    let roles = [
        ("worker", RUNS[0]),
        ("RabbitMQ", BROKER),
        ("PostgreSQL", DB),
        ("smtp-sink", SMTP),
        ("bench", GREY),
    ];
    for (i, w) in r.worker_runs.iter().enumerate() {
        let y = (n - 1 - i) as f64;
        let c = &w.cpu;
        let shares = [c.worker, c.broker, c.postgres, c.smtp_sink, c.bench];
        let mut x = 0.0;
        for (share, (_, color)) in shares.iter().zip(roles) {
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(x, y + 0.2), (x + share, y + 0.8)],
                    color.mix(0.75).filled(),
                )))
                .map_err(err)?;
            x += share;
        }
        chart
            .draw_series(std::iter::once(Text::new(
                format!(
                    "{} process(es): worker {:.0}, RabbitMQ {:.0}, PostgreSQL {:.0}, sink {:.0}, bench {:.0}; machine {:.0} %",
                    w.workers, c.worker, c.broker, c.postgres, c.smtp_sink, c.bench, c.machine_busy
                ),
                (capacity * 0.01, y + 0.95),
                ("sans-serif", 12),
            )))
            .map_err(err)?;
    }
    chart
        .draw_series(DashedLineSeries::new(
            vec![(capacity, 0.0), (capacity, n as f64)],
            8,
            5,
            BLACK.stroke_width(2),
        ))
        .map_err(err)?;
    for (name, color) in roles {
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(0.0, 0.0), (0.0, 0.0)],
                color.filled(),
            )))
            .map_err(err)?
            .label(name.to_string())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 12))
        .draw()
        .map_err(err)?;
    Ok(())
}
