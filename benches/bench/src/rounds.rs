//! Paired rounds: the two ratios that say how close mailroom comes to this machine's raw limits,
//! each measured several times with its own raw limit right before it, and the scaling ratio
//! (the most worker processes of the run against one, measured right after it).
//!
//! This machine drifts between runs by more than most changes move: across full runs of similar
//! code the worker-only run's ratio to the grouped claim + record limit ranged from 0.53 to 0.70,
//! and end to end from 0.43 to 0.61. A ratio made of one mailroom run and a raw limit measured
//! minutes earlier carries that drift twice. Here each round measures the raw limit and then
//! mailroom at once, so a slow minute slows both, and the table gives every round's ratio and
//! their median.

use std::path::Path;

use serde::Serialize;

use crate::world::{Services, SmtpSink};
use crate::{Opts, raw, relay, step, workers};

/// One ratio measured in rounds: mailroom's rate and the raw limit measured just before it.
#[derive(Clone, Debug, Serialize)]
pub struct Paired {
    /// mailroom's rate in each round (emails/s).
    pub ours: Vec<f64>,
    /// The raw limit measured right before each of them.
    pub raw: Vec<f64>,
}

impl Paired {
    pub fn ratios(&self) -> Vec<f64> {
        self.ours
            .iter()
            .zip(&self.raw)
            .map(|(o, r)| if *r > 0.0 { o / r } else { 0.0 })
            .collect()
    }

    /// The median of the rounds' ratios (the mean of the middle two for an even count); `None`
    /// with no round.
    pub fn median(&self) -> Option<f64> {
        median(self.ratios())
    }
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len().is_multiple_of(2) {
        (v[mid - 1] + v[mid]) / 2.0
    } else {
        v[mid]
    })
}

/// Both ratios in `rounds` rounds each.
#[derive(Clone, Debug, Serialize)]
pub struct Rounds {
    /// One worker process draining `n` jobs, against the grouped claim + record limit.
    pub worker: Paired,
    /// One relay and one worker behind 32 producers, against the producers alone.
    pub end_to_end: Paired,
    /// `most` worker processes draining `n` jobs, against the one process of the same round
    /// (`None` when the run has only one).
    pub scaling: Option<(usize, Paired)>,
}

/// `rounds` rounds of each pair, worker first, with the full run's sizes: `opts.n` jobs per
/// mailroom run, the raw database run of `opts.raw_n` pairs after `opts.floor_n` sequential
/// ones, and the producers' `opts.floor_n * 30` rows (as the full run's raw rows).
pub async fn run(
    services: &Services,
    sink: &SmtpSink,
    rounds: usize,
    opts: &Opts,
    logs: &Path,
) -> anyhow::Result<Rounds> {
    let (n, commits) = (opts.n, opts.floor_n * 30);
    let mut worker = Paired {
        ours: vec![],
        raw: vec![],
    };
    let mut end_to_end = worker.clone();
    let most = opts.workers.iter().copied().max().filter(|&k| k > 1);
    let mut scaling = worker.clone();
    for round in 1..=rounds {
        step(&format!(
            "paired round {round} of {rounds}: grouped claim + record, then 1 worker process"
        ));
        // The raw run as the full run's table measures it (its own-commit run first), so a
        // round's limit is the headline row's.
        let limit =
            raw::database(services, opts.raw_n, opts.floor_n, raw::WORKER_CONCURRENCY).await?;
        worker.raw.push(limit.grouped_rate);
        let run =
            workers::backlog(services, sink, &format!("round-{round}-1w"), 1, n, logs).await?;
        worker.ours.push(run.emails_per_s);
        step(&format!(
            "  {:.0} pairs/s, {:.0} emails/s",
            worker.raw[round - 1],
            run.emails_per_s
        ));
        if let Some(k) = most {
            // Right after the one process, so both runs see the same minute of this machine.
            let more = workers::backlog(services, sink, &format!("round-{round}-{k}w"), k, n, logs)
                .await?;
            scaling.raw.push(run.emails_per_s);
            scaling.ours.push(more.emails_per_s);
            step(&format!(
                "  {k} processes: {:.0} emails/s",
                more.emails_per_s
            ));
        }
        step(&format!(
            "paired round {round} of {rounds}: the producers alone, then end to end"
        ));
        let alone = relay::outbox_commits_in(
            services,
            mailroom::db::Engine::Postgres,
            &["none"],
            commits,
            logs,
        )
        .await?;
        end_to_end.raw.push(alone.rate("none"));
        let run =
            relay::end_to_end(services, sink, &format!("round-{round}-e2e"), None, n, logs).await?;
        end_to_end.ours.push(run.emails_per_s);
        step(&format!(
            "  {:.0} commits/s, {:.0} emails/s",
            alone.rate("none"),
            run.emails_per_s
        ));
    }
    Ok(Rounds {
        worker,
        end_to_end,
        scaling: most.map(|k| (k, scaling)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_is_the_middle_round_or_the_mean_of_the_middle_two() {
        let p = |ours: &[f64], raw: &[f64]| Paired {
            ours: ours.to_vec(),
            raw: raw.to_vec(),
        };
        assert_eq!(
            p(&[50.0, 70.0, 60.0], &[100.0, 100.0, 100.0]).median(),
            Some(0.6)
        );
        // Each round's ratio uses its own raw limit, not the mean of them.
        assert_eq!(p(&[40.0, 90.0], &[80.0, 100.0]).median(), Some(0.7));
        assert_eq!(p(&[], &[]).median(), None);
    }
}
