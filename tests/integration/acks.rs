//! Coalesced acks on a real quorum queue: acks wait (up to a hold) for the delivery before
//! them, a run of settled deliveries shares one `multiple` frame, and no frame covers a
//! delivery still in flight or one rejected back to the queue.

use std::time::Duration;

use futures_util::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, BasicRejectOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection};
use mailroom::broker::{AckPolicy, Acks};

use crate::helpers::*;

async fn next(consumer: &mut lapin::Consumer) -> Delivery {
    tokio::time::timeout(Duration::from_secs(10), consumer.next())
        .await
        .expect("a delivery within 10 s")
        .expect("the consumer is open")
        .expect("a delivery, not an error")
}

fn id(d: &Delivery) -> String {
    String::from_utf8(d.data.clone()).unwrap()
}

// The default current-thread runtime: the acks asked for in one `join_all` are all settled
// before the task that writes the frames runs, so the frame count is exact.
#[tokio::test]
async fn acks_wait_for_the_delivery_before_them_share_a_frame_and_never_cover_one_in_flight() {
    let conn = Connection::connect(&amqp_url(), Default::default())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    let queue = format!("mailroom-test-acks-{}", uuid::Uuid::new_v4());
    let args = mailroom::broker::quorum_queue_args();
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    ch.queue_declare(queue.as_str().into(), durable, args)
        .await
        .unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    for i in 1..=30 {
        let body = format!("m{i}");
        let confirm = ch
            .basic_publish(
                "".into(),
                queue.as_str().into(),
                BasicPublishOptions::default(),
                body.as_bytes(),
                BasicProperties::default().with_delivery_mode(2),
            )
            .await
            .unwrap();
        assert!(confirm.await.unwrap().is_ack());
    }

    let cch = conn.create_channel().await.unwrap();
    cch.basic_qos(32, BasicQosOptions::default()).await.unwrap();
    let mut consumer = cch
        .basic_consume(
            queue.as_str().into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let mut deliveries = Vec::new();
    for _ in 0..30 {
        deliveries.push(next(&mut consumer).await);
    }
    let tags: Vec<u64> = deliveries.iter().map(|d| d.delivery_tag).collect();
    assert_eq!(tags, (1..=30).collect::<Vec<_>>());
    // Runs of ten go at once; a linger far longer than this test's steps: acks held past a gap
    // go out either with the run once the gap closes, or alone once the linger is over, or once
    // ten wait.
    let hold = Duration::from_secs(2);
    let acks = Acks::new(AckPolicy {
        batch: 10,
        linger: hold,
    });
    let ack_all = |range: std::ops::RangeInclusive<usize>| {
        let acks = &acks;
        let deliveries = &deliveries;
        futures_util::future::join_all(range.map(move |tag| {
            let d = &deliveries[tag - 1];
            async move { acks.ack(&d.acker, d.delivery_tag).await.unwrap() }
        }))
    };

    // 2-10 are acked while delivery 1 is still being worked on: they wait for it, and once it
    // is acked one frame carries all ten.
    let (held, first) = futures_util::future::join(ack_all(2..=10), async {
        tokio::task::yield_now().await;
        let d = &deliveries[0];
        acks.ack(&d.acker, d.delivery_tag).await.unwrap()
    })
    .await;
    assert!(first && held.iter().all(|w| *w));
    assert_eq!(acks.written(), (1, 10));

    // 12-20 are acked while delivery 11 is in flight and stays so: once the hold is over,
    // each goes alone.
    let started = std::time::Instant::now();
    let written = ack_all(12..=20).await;
    assert!(written.iter().all(|w| *w));
    assert!(
        started.elapsed() >= hold,
        "acks past a gap went out before the hold was over"
    );
    assert_eq!(acks.written(), (10, 19));

    // 21-30 are acked with 11 still in flight: ten past the gap fill the batch, so each goes
    // alone at once instead of holding the prefetch for the whole linger.
    let started = std::time::Instant::now();
    let written = ack_all(21..=30).await;
    assert!(written.iter().all(|w| *w));
    assert!(
        started.elapsed() < hold,
        "a full batch of acks past a gap waited out the hold"
    );
    assert_eq!(acks.written(), (20, 29));

    // Delivery 11 goes back to the queue. Had any frame covered it, the broker would have
    // taken it as acked: this reject would close the channel and nothing would come back.
    assert!(
        deliveries[10]
            .reject(BasicRejectOptions { requeue: true })
            .await
            .unwrap()
    );
    acks.rejected(11);
    let again = next(&mut consumer).await;
    assert_eq!(id(&again), "m11");
    assert!(again.redelivered);
    assert_eq!(again.delivery_tag, 31);

    // 11-30 are settled, so the ack of 31 is a run of its own, written once the linger is over.
    assert!(acks.ack(&again.acker, again.delivery_tag).await.unwrap());
    assert_eq!(acks.written(), (21, 30));

    // Every ack took: once the closed channel's consumer is gone (and with it anything it held
    // unacked put back), the queue is empty.
    cch.close(200, "done".into()).await.unwrap();
    let ready = eventually("the closed channel's consumer to be gone", || async {
        let q = ch
            .queue_declare(
                queue.as_str().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap();
        (q.consumer_count() == 0).then_some(q.message_count())
    })
    .await;
    assert_eq!(ready, 0, "a message was never acked");
    ch.queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    let _ = conn.close(200, "done".into()).await;
}

/// A delivery frees its concurrency slot once its outcome is decided, not once it is settled:
/// with one slot, the next job is sent while the first job's ack is still held (here at its
/// failpoint; in production an ack lingering for others to share its frame, or a retry's
/// republish a blocked broker holds). Once the acks go, every delivery is settled and each job
/// was sent once.
#[tokio::test]
async fn a_delivery_frees_its_slot_once_decided_and_the_next_is_sent_while_its_ack_waits() {
    let app = TestApp::spawn().await;
    let release = app.dir.path().join("release");
    let mut worker = app.spawn_worker_process(
        &["--concurrency", "1", "--prefetch", "2"],
        &[(
            "MAILROOM_FAILPOINTS",
            &format!("worker.before_ack=until:{}", release.display()),
        )],
    );
    let log = app.dir.path().join("worker.log");
    let held = || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        text.matches("failpoint: holding this delivery").count()
    };
    app.publish(&app.job("first")).await;
    eventually("the first job's ack held at its failpoint", || async {
        (held() == 1).then_some(())
    })
    .await;
    assert_eq!(app.smtp.received().len(), 1);
    app.publish(&app.job("second")).await;
    app.smtp.wait_for(2).await;
    eventually("the second job's ack held too", || async {
        (held() == 2).then_some(())
    })
    .await;
    assert!(
        !release.exists(),
        "both were sent with the first ack unwritten"
    );

    std::fs::write(&release, "").unwrap();
    terminate(&worker).await;
    let status = tokio::time::timeout(PATIENCE, worker.wait())
        .await
        .expect("the worker exits")
        .unwrap();
    assert!(status.success(), "{status}");
    assert_eq!(app.ready_messages().await, 0, "a delivery was never acked");
    for id in ["first", "second"] {
        let row = app.notification(id, "welcome").await.unwrap();
        assert_eq!(row.status, mailroom::db::LedgerStatus::Sent, "{id}");
    }
    assert_eq!(app.smtp.received().len(), 2, "each job sent once");
}
