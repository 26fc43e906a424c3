//! Driving the test cluster: `scripts/cluster`, `rabbitmqctl` on one of its nodes (always named
//! with `-n rmqcN@localhost`, never the shared node), the quorum queues' replicas, and signals.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use tokio::process::Command;

use crate::helpers::*;

/// `scripts/cluster ARGS`: its stdout, or a panic with its stderr.
pub async fn cluster_script(args: &[&str]) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/cluster");
    let out = Command::new(script).args(args).output().await.unwrap();
    assert!(
        out.status.success(),
        "scripts/cluster {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// `rabbitmqctl -q -n rmqcN@localhost ARGS`: its stdout, or a panic with its stderr.
pub async fn ctl(node: u8, args: &[&str]) -> String {
    try_ctl(node, args)
        .await
        .unwrap_or_else(|e| panic!("rabbitmqctl on rmqc{node} {args:?}: {e}"))
}

/// [`ctl`], its stderr as the error: for a node that may be restarting.
pub async fn try_ctl(node: u8, args: &[&str]) -> Result<String, String> {
    let out = Command::new("rabbitmqctl")
        .args(["-q", "-n", &format!("rmqc{node}@localhost")])
        .args(args)
        .output()
        .await
        .unwrap();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).to_string())
    }
}

/// A quorum queue's leader, and how many of its members there are and how many are online.
#[derive(Clone, Debug)]
pub struct Replicas {
    pub leader: String,
    pub members: usize,
    pub online: usize,
}

/// `list_queues name leader members online` on node `via`: queue → its replicas.
pub async fn quorum_layout(via: u8) -> HashMap<String, Replicas> {
    let out = ctl(via, &["list_queues", "name", "leader", "members", "online"]).await;
    parse_layout(&out)
}

fn parse_layout(out: &str) -> HashMap<String, Replicas> {
    out.lines()
        .filter_map(|line| {
            let cols: Vec<&str> = line.split('\t').collect();
            let [name, leader, members, online] = cols[..] else {
                return None;
            };
            let replicas = Replicas {
                leader: leader.to_string(),
                members: members.matches("rmqc").count(),
                online: online.matches("rmqc").count(),
            };
            Some((name.to_string(), replicas))
        })
        .collect()
}

/// The queues of the app's topology: work, dead letters, retry tiers.
pub fn app_queues(app: &TestApp) -> Vec<String> {
    let t = &app.topology;
    let mut queues = vec![t.queue.clone(), t.dead.clone()];
    queues.extend(t.retry_delays.iter().map(|d| t.retry_queue(*d)));
    queues
}

/// Waits (bounded) until every queue of the app has all three members online, read on `via`
/// (asked again while `via` refuses: a node the cluster's partition handling restarts).
pub async fn await_replicas(app: &TestApp, via: u8) {
    let queues = app_queues(app);
    let args = ["list_queues", "name", "leader", "members", "online"];
    eventually_within(
        Duration::from_secs(120),
        "every quorum queue with three members online",
        || async {
            let layout = parse_layout(&try_ctl(via, &args).await.ok()?);
            queues
                .iter()
                .all(|q| layout.get(q).is_some_and(|r| r.online == 3))
                .then_some(())
        },
    )
    .await;
}

/// The nodes' Erlang `net_ticktime` (`MAILROOM_CLUSTER_NET_TICKTIME` of scripts/cluster), read
/// on `node`.
pub async fn net_ticktime(node: u8) -> Duration {
    let out = ctl(node, &["eval", "net_kernel:get_net_ticktime()."]).await;
    let seconds = out
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("net_ticktime {out:?}"));
    Duration::from_secs(seconds)
}

/// The node number of `rmqcN@localhost`.
pub fn node_number(name: &str) -> u8 {
    name.strip_prefix("rmqc")
        .and_then(|s| s.split('@').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("node {name:?}"))
}

/// The URL list with node `first` first (every process connects to it while it is up), each
/// URL with `query` appended (e.g. `heartbeat=5`).
pub fn urls_from(urls: &str, first: u8, query: &str) -> String {
    let mut list: Vec<&str> = urls.split(',').collect();
    list.rotate_left(usize::from(first - 1));
    let sep = |u: &str| if u.contains('?') { '&' } else { '?' };
    list.iter()
        .map(|u| match query {
            "" => u.to_string(),
            q => format!("{u}{}{q}", sep(u)),
        })
        .collect::<Vec<_>>()
        .join(",")
}

pub async fn signal(pid: &str, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, pid])
        .status()
        .await
        .unwrap();
    assert!(ok.success(), "kill {sig} {pid}");
}

/// Waits (bounded) until every process named in `names` (their AMQP connection names, e.g.
/// `mailroom worker (pid 42)`) has a connection to node `node`.
pub async fn await_connected(node: u8, names: &[String]) {
    eventually_within(
        Duration::from_secs(60),
        &format!("{names:?} connected to rmqc{node}"),
        || async {
            // The name a client gives its connection is among its client properties.
            let conns = ctl(node, &["list_connections", "client_properties"]).await;
            names
                .iter()
                .all(|n| conns.contains(n.as_str()))
                .then_some(())
        },
    )
    .await;
}
