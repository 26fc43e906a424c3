//! Latency summaries (HdrHistogram, microsecond resolution) and the percentile curve drawn in
//! the chart.

use hdrhistogram::Histogram;
use serde::Serialize;

/// Percentiles in milliseconds.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Lat {
    pub count: u64,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
    pub mean: f64,
    /// (percentile, ms) points for the chart.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub curve: Vec<(f64, f64)>,
}

/// Collects samples.
pub struct Recorder(Histogram<u64>);

impl Default for Recorder {
    fn default() -> Self {
        // 1 µs .. 1 h, 3 significant digits.
        Recorder(Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds"))
    }
}

impl Recorder {
    pub fn record_ms(&mut self, ms: f64) {
        let us = (ms * 1000.0).round().max(1.0) as u64;
        let _ = self.0.record(us.min(3_600_000_000));
    }

    pub fn record_duration(&mut self, d: std::time::Duration) {
        self.record_ms(d.as_secs_f64() * 1000.0);
    }

    pub fn merge(&mut self, other: &Recorder) {
        let _ = self.0.add(&other.0);
    }

    pub fn summary(&self, with_curve: bool) -> Lat {
        let h = &self.0;
        if h.is_empty() {
            return Lat::default();
        }
        let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
        let curve = if with_curve {
            let mut qs: Vec<f64> = (0..=98).map(f64::from).collect();
            qs.extend([99.0, 99.5, 99.9, 100.0]);
            qs.into_iter().map(|p| (p, ms(p / 100.0))).collect()
        } else {
            vec![]
        };
        Lat {
            count: h.len(),
            p50: ms(0.50),
            p95: ms(0.95),
            p99: ms(0.99),
            max: h.max() as f64 / 1000.0,
            mean: h.mean() / 1000.0,
            curve,
        }
    }
}

impl Lat {
    pub fn triple(&self) -> String {
        if self.count == 0 {
            return "–".into();
        }
        format!("{} / {} / {} ms", ms(self.p50), ms(self.p95), ms(self.p99))
    }
}

/// A millisecond figure with sensible precision.
pub fn ms(v: f64) -> String {
    if v < 10.0 {
        format!("{v:.2}")
    } else if v < 100.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.0}")
    }
}
