//! Writing the Prometheus text format (version 0.0.4): `# HELP` and `# TYPE` lines, samples,
//! histograms and label escaping. Everything else in `/metrics` is built from these.

use std::fmt::Write as _;

use crate::worker::histogram::Histogram;

/// The `# HELP` and `# TYPE` lines of a metric family.
pub fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// One sample: `name{labels} value`; `labels` as pairs, escaped here.
pub fn sample(
    out: &mut String,
    name: &str,
    labels: &[(&str, &str)],
    value: impl std::fmt::Display,
) {
    out.push_str(name);
    push_labels(out, labels);
    let _ = writeln!(out, " {value}");
}

/// A counter family of one unlabelled sample.
pub fn counter(out: &mut String, name: &str, help: &str, value: u64) {
    header(out, name, "counter", help);
    sample(out, name, &[], value);
}

/// A gauge family of one unlabelled sample.
pub fn gauge(out: &mut String, name: &str, help: &str, value: impl std::fmt::Display) {
    header(out, name, "gauge", help);
    sample(out, name, &[], value);
}

/// The buckets, sum and count of `h` under `labels` (the family's header written by the caller).
pub fn histogram_samples(out: &mut String, name: &str, labels: &[(&str, &str)], h: &Histogram) {
    let bucket = format!("{name}_bucket");
    for (bound, cumulative) in h.cumulative() {
        let le = bound.to_string();
        sample(out, &bucket, &with(labels, ("le", &le)), cumulative);
    }
    let count = h.count();
    sample(out, &bucket, &with(labels, ("le", "+Inf")), count);
    sample(out, &format!("{name}_sum"), labels, h.sum_seconds());
    sample(out, &format!("{name}_count"), labels, count);
}

fn with<'a>(labels: &[(&'a str, &'a str)], last: (&'a str, &'a str)) -> Vec<(&'a str, &'a str)> {
    let mut all = labels.to_vec();
    all.push(last);
    all
}

fn push_labels(out: &mut String, labels: &[(&str, &str)]) {
    if labels.is_empty() {
        return;
    }
    out.push('{');
    for (i, (name, value)) in labels.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{name}=\"{}\"", escape(value));
    }
    out.push('}');
}

/// Escapes a label value: backslash, double quote and line feed.
pub fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative_and_end_with_inf() {
        let h = Histogram::new(&[0.1, 1.0]);
        h.observe(Duration::from_millis(50));
        h.observe(Duration::from_millis(500));
        h.observe(Duration::from_secs(5));
        let mut out = String::new();
        histogram_samples(&mut out, "x_seconds", &[("kind", "a")], &h);
        assert!(
            out.contains("x_seconds_bucket{kind=\"a\",le=\"0.1\"} 1\n"),
            "{out}"
        );
        assert!(
            out.contains("x_seconds_bucket{kind=\"a\",le=\"1\"} 2\n"),
            "{out}"
        );
        assert!(
            out.contains("x_seconds_bucket{kind=\"a\",le=\"+Inf\"} 3\n"),
            "{out}"
        );
        assert!(out.contains("x_seconds_sum{kind=\"a\"} 5.55\n"), "{out}");
        assert!(out.contains("x_seconds_count{kind=\"a\"} 3\n"), "{out}");
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
        let mut out = String::new();
        sample(&mut out, "m", &[("k", "x\"y")], 1);
        assert_eq!(out, "m{k=\"x\\\"y\"} 1\n");
    }
}
