//! Coalesced acks on a real quorum queue: a run of settled deliveries shares one `multiple`
//! frame, and no frame covers a delivery still in flight or one rejected back to the queue.

use std::time::Duration;

use futures_util::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, BasicRejectOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Connection};
use mailroom::broker::Acks;

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
async fn a_run_of_acks_shares_a_frame_that_never_covers_a_delivery_in_flight_or_a_reject() {
    let conn = Connection::connect(&amqp_url(), Default::default())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    let queue = format!("mailroom-test-acks-{}", uuid::Uuid::new_v4());
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
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
    for i in 1..=20 {
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
    for _ in 0..20 {
        deliveries.push(next(&mut consumer).await);
    }
    let tags: Vec<u64> = deliveries.iter().map(|d| d.delivery_tag).collect();
    assert_eq!(tags, (1..=20).collect::<Vec<_>>());
    let acks = Acks::new();
    let ack_all = |range: std::ops::RangeInclusive<usize>| {
        let acks = &acks;
        let deliveries = &deliveries;
        futures_util::future::join_all(range.map(move |tag| {
            let d = &deliveries[tag - 1];
            async move { acks.ack(&d.acker, d.delivery_tag).await.unwrap() }
        }))
    };

    // Delivery 5 is still being worked on while 1-4 and 6-10 are acked: 1-4 share a frame,
    // and each of 6-10 goes alone.
    let written = ack_all(1..=4).await;
    assert!(written.iter().all(|w| *w));
    let written = futures_util::future::join(ack_all(6..=8), ack_all(9..=10)).await;
    assert!(written.0.iter().chain(&written.1).all(|w| *w));
    // 1-4 in one frame, then 6, 7, 8, 9, 10 one frame each.
    assert_eq!(acks.written(), (6, 9));

    // Delivery 5 goes back to the queue. Had any frame covered it, the broker would have
    // taken it as acked: this reject would close the channel and nothing would come back.
    assert!(
        deliveries[4]
            .reject(BasicRejectOptions { requeue: true })
            .await
            .unwrap()
    );
    acks.rejected(5);
    let again = next(&mut consumer).await;
    assert_eq!(id(&again), "m5");
    assert!(again.redelivered);
    assert_eq!(again.delivery_tag, 21);

    // 5-10 are settled, so the acks of 11-20 share one frame over the run 5-20, which stops
    // below the redelivered 21.
    let written = ack_all(11..=20).await;
    assert!(written.iter().all(|w| *w));
    assert_eq!(acks.written(), (7, 19));
    assert!(acks.ack(&again.acker, again.delivery_tag).await.unwrap());
    assert_eq!(acks.written(), (8, 20));

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
