//! mailroom on a three-node RabbitMQ cluster (`scripts/cluster`: rmqc1..3@localhost on
//! 5681-5683): a relay and two workers given all three URLs keep sending while a node fails
//! (SIGKILLed, frozen past the heartbeat, stopped gracefully, every node restarted in turn), and
//! afterwards every job was sent once and nothing is left in any queue.
//!
//! Disruptive, so ignored unless asked for; they run only against the test cluster, never the
//! shared node on 5672, and skip themselves, saying why, when `MAILROOM_TEST_CLUSTER_URLS` (set
//! by scripts/test when `scripts/cluster --status` succeeds) is not set. The kills are here, the
//! other faults in `load`; each test prints what the fault did to the flow (`cluster: ...`).

use std::sync::Arc;
use std::time::Duration;

use lapin::options::{QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use tokio::time::Instant;

use crate::helpers::*;
use harness::*;
use nodes::*;

mod harness;
mod load;
mod nodes;

/// How long a killed node stays dead before it is restarted.
const OUTAGE: Duration = Duration::from_secs(12);

/// SIGKILLs node `node`, restarts it after [`OUTAGE`]; recovery starts with the restart.
async fn kill_and_restart(node: u8) -> Instant {
    let pid = cluster_script(&["--pid", &node.to_string()]).await;
    signal(&pid, "-KILL").await;
    tokio::time::sleep(OUTAGE).await;
    let restarted = Instant::now();
    cluster_script(&[]).await;
    restarted
}

// Also the proof that a confirm means the quorum committed: the relay marks a row published
// only on its confirm, and the quorum work queue confirms after a majority wrote it; with the
// leader killed mid-stream, no row marked published is missing at the SMTP server.
#[tokio::test]
#[ignore = "disruptive: SIGKILLs a node of the scripts/cluster test cluster"]
async fn disruptive_cluster_work_queue_leader_killed_and_restarted_loses_and_stalls_nothing() {
    let Some(urls) = cluster_or_skip("disruptive_cluster_work_queue_leader_killed") else {
        return;
    };
    let first = urls.split(',').next().unwrap().to_string();
    let app = Arc::new(TestApp::spawn_on(first, SLOW_SERVER).await);
    let layout = quorum_layout(2).await;
    let work = layout[&app.topology.queue].clone();
    assert_eq!(
        work.members, 3,
        "three replicas of the work queue: {layout:?}"
    );
    assert_eq!(
        layout[&app.topology.dead].members, 3,
        "a quorum dead-letter queue: {layout:?}"
    );

    let leader = node_number(&work.leader);
    let outage = under_load(&app, &urls, |_| kill_and_restart(leader)).await;
    report(
        &format!("leader {} SIGKILLed for {OUTAGE:?}", work.leader),
        &outage,
    );
    assert!(
        outage.sent_while_down > 0,
        "work went on while {} was down",
        work.leader
    );
}

#[tokio::test]
#[ignore = "disruptive: SIGKILLs a node of the scripts/cluster test cluster"]
async fn disruptive_cluster_home_node_of_a_classic_dead_queue_killed_stops_nothing() {
    let Some(urls) = cluster_or_skip("disruptive_cluster_home_node_of_a_classic_dead_queue") else {
        return;
    };
    let nodes: Vec<&str> = urls.split(',').collect();
    let app = Arc::new(TestApp::spawn_on(nodes[0].to_string(), SLOW_SERVER).await);
    // An installation not yet migrated: <ns>.dead classic, its home node 2.
    let on_node_2 = lapin::Connection::connect(nodes[1], Default::default())
        .await
        .unwrap();
    let ch = on_node_2.create_channel().await.unwrap();
    let t = &app.topology;
    ch.queue_delete(t.dead.as_str().into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    ch.queue_declare(t.dead.as_str().into(), durable, FieldTable::default())
        .await
        .unwrap();
    ch.queue_bind(
        t.dead.as_str().into(),
        t.dlx.as_str().into(),
        "".into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    drop(on_node_2);

    // Node 2 first: every process must fail over, and redeclare without the dead queue.
    let outage = under_load(&app, &urls_from(&urls, 2, ""), |_| kill_and_restart(2)).await;
    report(
        &format!(
            "rmqc2 (home of the classic {}) SIGKILLed for {OUTAGE:?}",
            t.dead
        ),
        &outage,
    );
    assert!(
        outage.sent_while_down > 0,
        "work went on without the dead-letter queue"
    );
}
