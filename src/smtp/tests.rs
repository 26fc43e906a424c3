//! The pool and the phase classification against a scripted SMTP server on loopback: each
//! test says how the server behaves at one step and checks what `Mailer::send` concludes.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lettre::Message;
use lettre::message::Mailbox;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::io::{ReadHalf, WriteHalf};
use tokio::net::TcpListener;

use super::*;

/// What the scripted server does after the final dot.
#[derive(Clone, Copy)]
enum AfterDot {
    Reply(&'static str),
    Close,
    Stall,
}

#[derive(Clone, Copy)]
struct Script {
    greet: bool,
    mail: &'static str,
    rcpt: &'static str,
    /// `None`: answer 354 and read the body; `Some(reply)`: answer DATA with it.
    data: Option<&'static str>,
    /// Close the connection right after the 354.
    close_after_354: bool,
    /// Stop reading (without closing) right after the 354.
    stall_after_354: bool,
    after_dot: AfterDot,
    /// Hang up once this many messages were accepted on a connection (a server that drops
    /// clients idle too long); with `closing_421` it says 421 first.
    messages_per_connection: Option<usize>,
    closing_421: bool,
    dot_delay: Duration,
    /// Offer PIPELINING in the EHLO reply.
    pipelining: bool,
    /// The reply to a second EHLO in a session, when not the first one's.
    second_ehlo: Option<&'static str>,
    /// What to do after the dot of a message whose body has this text, instead of `after_dot`.
    marked: Option<(&'static str, AfterDot)>,
}

impl Default for Script {
    fn default() -> Script {
        Script {
            greet: true,
            mail: "250 2.1.0 ok",
            rcpt: "250 2.1.5 ok",
            data: None,
            close_after_354: false,
            stall_after_354: false,
            after_dot: AfterDot::Reply("250 2.0.0 queued"),
            messages_per_connection: None,
            closing_421: false,
            dot_delay: Duration::ZERO,
            pipelining: false,
            second_ehlo: None,
            marked: None,
        }
    }
}

#[derive(Default)]
struct Counters {
    connections: AtomicUsize,
    accepted: AtomicUsize,
    open: AtomicUsize,
    max_open: AtomicUsize,
    /// Transactions whose MAIL arrived with its RCPT and DATA already behind it, unanswered.
    pipelined: AtomicUsize,
    /// MAIL FROM commands received.
    mails: AtomicUsize,
    /// Final dots that arrived with the next message's MAIL FROM behind them.
    chained: AtomicUsize,
    /// The messages received up to their final dot, dot-stuffing undone.
    bodies: std::sync::Mutex<Vec<String>>,
}

struct Server {
    port: u16,
    counters: Arc<Counters>,
}

async fn server(script: Script) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let counters = Arc::new(Counters::default());
    let c = counters.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let c = c.clone();
            c.connections.fetch_add(1, Ordering::SeqCst);
            let open = c.open.fetch_add(1, Ordering::SeqCst) + 1;
            c.max_open.fetch_max(open, Ordering::SeqCst);
            tokio::spawn(async move {
                let _ = session(socket, script, &c, false).await;
                c.open.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    Server { port, counters }
}

/// One client's session; `greeted` when the greeting and the first EHLO were had already (in
/// the clear, before STARTTLS).
async fn session<S: AsyncRead + AsyncWrite>(
    socket: S,
    s: Script,
    c: &Counters,
    greeted: bool,
) -> std::io::Result<()> {
    let (read, mut w) = tokio::io::split(socket);
    let mut lines = BufReader::new(read);
    if !s.greet {
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
    if !greeted {
        w.write_all(b"220 fake ESMTP\r\n").await?;
    }
    let mut accepted_here = 0;
    let mut ehlos = 0;
    let mut line = String::new();
    loop {
        line.clear();
        if lines.read_line(&mut line).await? == 0 {
            return Ok(());
        }
        let verb = line.get(..4).unwrap_or("").to_ascii_uppercase();
        if verb == "EHLO" {
            ehlos += 1;
        }
        let reply = match verb.as_str() {
            "EHLO" if ehlos > 1 && s.second_ehlo.is_some() => s.second_ehlo.unwrap_or_default(),
            "EHLO" if s.pipelining => "250-fake\r\n250-PIPELINING\r\n250 8BITMIME",
            "EHLO" => "250-fake\r\n250 8BITMIME",
            "MAIL" => {
                c.mails.fetch_add(1, Ordering::SeqCst);
                // What the client sent past MAIL before it had MAIL's reply.
                let ahead = String::from_utf8_lossy(lines.buffer()).to_ascii_uppercase();
                if ahead.starts_with("RCPT TO:") && ahead.ends_with("DATA\r\n") {
                    c.pipelined.fetch_add(1, Ordering::SeqCst);
                }
                s.mail
            }
            "RCPT" => s.rcpt,
            "DATA" => match s.data {
                Some(reply) => reply,
                None => match receive_data(&mut lines, &mut w, &s, c).await? {
                    Some(reply) => {
                        if reply.starts_with('2') {
                            c.accepted.fetch_add(1, Ordering::SeqCst);
                            accepted_here += 1;
                        }
                        reply
                    }
                    None => return Ok(()),
                },
            },
            "QUIT" => {
                w.write_all(b"221 bye\r\n").await?;
                return Ok(());
            }
            _ => "250 ok",
        };
        w.write_all(format!("{reply}\r\n").as_bytes()).await?;
        if s.messages_per_connection == Some(accepted_here) {
            if s.closing_421 {
                w.write_all(b"421 4.4.2 idle too long\r\n").await?;
            }
            return Ok(());
        }
    }
}

/// After DATA: 354, the message up to its final dot, then the reply the script gives after
/// the dot; `None` when the session ends instead (closed, or stalled for an hour).
async fn receive_data<S: AsyncRead + AsyncWrite>(
    lines: &mut BufReader<ReadHalf<S>>,
    w: &mut WriteHalf<S>,
    s: &Script,
    c: &Counters,
) -> std::io::Result<Option<&'static str>> {
    w.write_all(b"354 go ahead\r\n").await?;
    if s.close_after_354 {
        return Ok(None);
    }
    if s.stall_after_354 {
        tokio::time::sleep(Duration::from_secs(3600)).await;
        return Ok(None);
    }
    let mut line = String::new();
    let mut body = String::new();
    loop {
        line.clear();
        if lines.read_line(&mut line).await? == 0 {
            return Ok(None);
        }
        if line == ".\r\n" {
            break;
        }
        body.push_str(line.strip_prefix('.').unwrap_or(&line));
    }
    if lines.buffer().starts_with(b"MAIL FROM:") {
        c.chained.fetch_add(1, Ordering::SeqCst);
    }
    let after_dot = match s.marked {
        Some((text, after)) if body.contains(text) => after,
        _ => s.after_dot,
    };
    c.bodies.lock().unwrap().push(body);
    tokio::time::sleep(s.dot_delay).await;
    match after_dot {
        AfterDot::Reply(r) => Ok(Some(r)),
        AfterDot::Close => Ok(None),
        AfterDot::Stall => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok(None)
        }
    }
}

fn mailer(port: u16, timeout: Duration, max_connections: u32) -> Mailer {
    Mailer::new(&MailerSettings {
        url: format!("smtp://127.0.0.1:{port}").parse().unwrap(),
        timeout,
        ..settings(max_connections)
    })
    .unwrap()
}

/// A mailer's settings for a server on port 9 (never reached by tests that do not send).
fn settings(max_connections: u32) -> MailerSettings {
    MailerSettings {
        url: "smtp://127.0.0.1:9".parse().unwrap(),
        from: "Shop <noreply@shop.example>".parse().unwrap(),
        message_id_domain: "shop.example".into(),
        timeout: Duration::from_secs(1),
        max_connections,
        reserved_ahead: 0,
        deeper: None,
        dkim: None,
    }
}

fn message() -> Outgoing {
    let message = Message::builder()
        .from("Shop <noreply@shop.example>".parse().unwrap())
        .to("Ada <ada@example.com>".parse().unwrap())
        .subject("hello")
        .body(String::from("Hello Ada.\r\n.\r\nA dot line above."))
        .unwrap();
    Outgoing::format(&message).unwrap()
}

fn message_with(text: &str) -> Outgoing {
    let message = Message::builder()
        .from("Shop <noreply@shop.example>".parse().unwrap())
        .to("Ada <ada@example.com>".parse().unwrap())
        .subject("hello")
        .body(text.to_owned())
        .unwrap();
    Outgoing::format(&message).unwrap()
}

/// Two messages through a mailer with one connection (and `timeout` a send): `first` holds the
/// connection, `second` waits in line for it (at most `within`), and `first` is sent once
/// `second` waits. `None`: `second` had no connection in time.
async fn one_behind_the_other(
    s: &Server,
    timeout: Duration,
    (first, second): (&Outgoing, &Outgoing),
    within: Duration,
) -> (
    Result<String, SendError>,
    Option<Result<String, SendError>>,
    u64,
) {
    let m = Mailer::new(&MailerSettings {
        url: format!("smtp://127.0.0.1:{}", s.port).parse().unwrap(),
        timeout,
        reserved_ahead: 1,
        ..settings(1)
    })
    .unwrap();
    let held = m.reserve().await.unwrap().session(first, Duration::ZERO);
    let held = held.await.unwrap();
    let waiting = async {
        let session = m.reserve().await.unwrap().session(second, within).await?;
        Some(m.send_in(&session, second).await)
    };
    let sending = async {
        while m.waiting() == 0 {
            tokio::task::yield_now().await;
        }
        let sent = m.send_in(&held, first).await;
        drop(held);
        sent
    };
    let (second, first) = tokio::join!(waiting, sending);
    (first, second, m.taken_along())
}

async fn outcome(script: Script) -> Result<String, SendError> {
    let s = server(script).await;
    mailer(s.port, Duration::from_millis(500), 4)
        .send(&message())
        .await
}

fn class(r: &Result<String, SendError>) -> &'static str {
    match r {
        Ok(_) => "sent",
        Err(SendError::Transient { .. }) => "transient",
        Err(SendError::Unreachable { .. }) => "unreachable",
        Err(SendError::Permanent { .. }) => "permanent",
        Err(SendError::Uncertain { .. }) => "uncertain",
    }
}

#[tokio::test]
async fn sockets_have_nagle_off() {
    let s = server(Script::default()).await;
    let tcp = pool::connect_tcp("127.0.0.1", s.port).await.unwrap();
    assert!(tcp.nodelay().unwrap());
}

#[tokio::test]
async fn sequential_sends_reuse_one_connection() {
    let s = server(Script::default()).await;
    let m = mailer(s.port, Duration::from_secs(5), 4);
    for _ in 0..5 {
        let reply = m.send(&message()).await.unwrap();
        assert!(reply.starts_with("250"), "{reply}");
    }
    assert_eq!(s.counters.connections.load(Ordering::SeqCst), 1);
    assert_eq!(s.counters.accepted.load(Ordering::SeqCst), 5);
    assert_eq!(m.idle_connections(), 1);
}

#[tokio::test]
async fn the_breaker_probe_waits_for_a_free_session_like_any_send() {
    let s = server(Script::default()).await;
    let m = Arc::new(mailer(s.port, Duration::from_secs(5), 1));
    let held = m.session().await.unwrap();
    let mut probing = tokio::spawn({
        let m = m.clone();
        async move { m.probe().await }
    });
    // While the only session is held, the probe opens no connection of its own.
    let early = tokio::time::timeout(Duration::from_millis(300), &mut probing).await;
    assert!(early.is_err(), "the probe ran outside the session cap");
    assert_eq!(s.counters.connections.load(Ordering::SeqCst), 0);
    drop(held);
    assert!(
        probing.await.unwrap(),
        "the probe answers once a session is free"
    );
    assert_eq!(s.counters.connections.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_line_of_reservations_ahead_waits_for_the_cap_and_gives_up_at_its_budget() {
    let m = Mailer::new(&MailerSettings {
        reserved_ahead: 5,
        ..settings(1)
    })
    .unwrap();
    // One connection and one place ahead of it, whatever was asked for beyond that.
    let sending = m
        .reserve()
        .await
        .unwrap()
        .session(&message(), Duration::ZERO)
        .await;
    let sending = sending.expect("a free connection is taken without waiting");
    let in_line = m.reserve().await.unwrap();
    let third = tokio::time::timeout(Duration::from_millis(100), m.reserve()).await;
    assert!(
        third.is_err(),
        "a third delivery got a place in a line of two"
    );
    // The connection stays busy past the budget: the claim in line gets none.
    let started = tokio::time::Instant::now();
    assert!(
        in_line
            .session(&message(), Duration::from_millis(200))
            .await
            .is_none()
    );
    assert!(started.elapsed() >= Duration::from_millis(200));
    // Its place is given up with it, and the next in line gets the connection once it is free.
    let next = m.reserve().await.unwrap();
    drop(sending);
    assert!(
        next.session(&message(), Duration::from_millis(200))
            .await
            .is_some()
    );
}

/// `f`, unless it is still waiting after 50 ms.
async fn within<F: std::future::Future>(f: F) -> Result<F::Output, tokio::time::error::Elapsed> {
    tokio::time::timeout(Duration::from_millis(50), f).await
}

#[tokio::test]
async fn deeper_places_are_taken_only_while_sends_are_fast() {
    let s = server(Script::default()).await;
    let fast = Duration::from_secs(2);
    let m = Mailer::new(&MailerSettings {
        url: format!("smtp://127.0.0.1:{}", s.port).parse().unwrap(),
        timeout: Duration::from_secs(5),
        reserved_ahead: 1,
        deeper: Some(line::Deeper { places: 2, fast }),
        ..settings(1)
    })
    .unwrap();
    // Shallow until sends were seen: the connection and one place ahead of it.
    let (a, b) = (m.reserve().await.unwrap(), m.reserve().await.unwrap());
    assert!(!a.is_deeper() && !b.is_deeper());
    assert!(
        within(m.reserve()).await.is_err(),
        "a third place while shallow"
    );
    drop((a, b));
    // Two fast sends (twice the one connection) deepen it by its two places, no more.
    for _ in 0..2 {
        m.send(&message()).await.unwrap();
    }
    let line: Vec<_> = futures_util::future::join_all((0..4).map(|_| m.reserve())).await;
    let deeper = line.iter().flatten().filter(|r| r.is_deeper()).count();
    assert_eq!((line.iter().flatten().count(), deeper), (4, 2));
    let mut fifth = std::pin::pin!(m.reserve());
    assert!(
        within(&mut fifth).await.is_err(),
        "a fifth place in a line of four"
    );
    // A send running past `fast` makes the line shallow at once: a deeper place that comes
    // free is not taken, the wait goes on for the line proper.
    tokio::time::pause();
    let depth = &m.deeper.as_ref().unwrap().depth;
    let stuck = depth.start();
    tokio::time::advance(fast + Duration::from_millis(1)).await;
    let (proper, mut deeper): (Vec<_>, Vec<_>) =
        line.into_iter().flatten().partition(|r| !r.is_deeper());
    let still_deeper = deeper.pop().unwrap();
    drop(deeper);
    assert!(
        within(&mut fifth).await.is_err(),
        "a deeper place taken while a send is long"
    );
    // Nor is a place of the line proper used while a deeper one is held: the claim made
    // there would wait behind it, further back than the line proper allows.
    drop(proper);
    assert!(
        within(&mut fifth).await.is_err(),
        "a place taken behind a deeper one"
    );
    drop(still_deeper);
    let fifth = within(&mut fifth).await.unwrap().unwrap();
    assert!(!fifth.is_deeper());
    // That send ended slow: shallow until two fast sends in a row again.
    drop(stuck);
    assert!(!depth.is_deep());
}

#[tokio::test]
async fn concurrent_sends_never_open_more_than_the_cap() {
    let s = server(Script {
        dot_delay: Duration::from_millis(20),
        ..Script::default()
    })
    .await;
    let m = Arc::new(mailer(s.port, Duration::from_secs(10), 3));
    let sends = (0..24).map(|_| {
        let m = m.clone();
        tokio::spawn(async move { m.send(&message()).await })
    });
    for r in futures_util::future::join_all(sends).await {
        r.unwrap().unwrap();
    }
    assert_eq!(s.counters.accepted.load(Ordering::SeqCst), 24);
    assert!(s.counters.max_open.load(Ordering::SeqCst) <= 3);
    assert!(s.counters.connections.load(Ordering::SeqCst) <= 3);
}

#[tokio::test]
async fn reply_codes_are_answers_whatever_the_phase() {
    let cases = [
        (
            Script {
                mail: "451 4.3.0 try later",
                ..Script::default()
            },
            "transient",
            "MAIL FROM",
        ),
        (
            Script {
                mail: "421 4.3.0 closing",
                ..Script::default()
            },
            "transient",
            "MAIL FROM",
        ),
        (
            Script {
                rcpt: "550 5.1.1 no such user",
                ..Script::default()
            },
            "permanent",
            "RCPT TO",
        ),
        (
            Script {
                data: Some("554 5.0.0 no"),
                ..Script::default()
            },
            "permanent",
            "DATA",
        ),
        (
            Script {
                after_dot: AfterDot::Reply("452 4.3.1 full"),
                ..Script::default()
            },
            "transient",
            "final dot",
        ),
        (
            Script {
                after_dot: AfterDot::Reply("552 5.3.4 too big"),
                ..Script::default()
            },
            "permanent",
            "final dot",
        ),
    ];
    for (script, expected, phase) in cases {
        for pipelining in [false, true] {
            let r = outcome(Script {
                pipelining,
                ..script
            })
            .await;
            assert_eq!(class(&r), expected, "pipelining {pipelining}: {r:?}");
            let reason = r.unwrap_err().to_string();
            assert!(
                reason.contains(phase),
                "pipelining {pipelining}: {reason} should name {phase}"
            );
        }
    }
}

#[tokio::test]
async fn mail_rcpt_and_data_go_in_one_write_only_to_a_server_that_offers_pipelining() {
    for pipelining in [false, true] {
        let s = server(Script {
            pipelining,
            ..Script::default()
        })
        .await;
        let m = mailer(s.port, Duration::from_secs(5), 1);
        for _ in 0..3 {
            m.send(&message()).await.unwrap();
        }
        assert_eq!(s.counters.accepted.load(Ordering::SeqCst), 3);
        assert_eq!(
            s.counters.pipelined.load(Ordering::SeqCst),
            if pipelining { 3 } else { 0 },
            "pipelining offered: {pipelining}"
        );
    }
}

#[tokio::test]
async fn a_waiting_message_rides_behind_the_dot_before_it_and_takes_its_connection() {
    for pipelining in [false, true] {
        let s = server(Script {
            pipelining,
            ..Script::default()
        })
        .await;
        let (one, two) = (message_with("the first"), message_with("the second"));
        let (first, second, taken) = one_behind_the_other(
            &s,
            Duration::from_secs(5),
            (&one, &two),
            Duration::from_secs(5),
        )
        .await;
        first.unwrap();
        second.unwrap().unwrap();
        let c = &s.counters;
        let bodies = c.bodies.lock().unwrap().clone();
        assert_eq!(bodies.len(), 2);
        assert!(bodies[0].contains("the first") && bodies[1].contains("the second"));
        assert_eq!(c.connections.load(Ordering::SeqCst), 1);
        let chained = usize::from(pipelining);
        assert_eq!(c.chained.load(Ordering::SeqCst), chained, "{pipelining}");
        assert_eq!(taken, chained as u64);
        assert_eq!(c.mails.load(Ordering::SeqCst), 2);
    }
}

#[tokio::test]
async fn when_the_dot_before_it_fails_a_waiting_message_is_sent_once_on_its_own_connection() {
    // Refused, closed or left unanswered after the dot: the waiting message's commands were on
    // that connection, its body never was, and it is sent once, on a connection of its own.
    // `mails`: the MAIL FROM commands the server read. One that hangs up or stops reading
    // after the dot never reads the waiting message's first MAIL.
    for (after, outcome, reason, mails) in [
        (AfterDot::Reply("554 5.7.1 no"), "permanent", "554", 3),
        (AfterDot::Close, "uncertain", "after the final dot", 2),
        (AfterDot::Stall, "uncertain", "after the final dot", 2),
    ] {
        let s = server(Script {
            pipelining: true,
            marked: Some(("fail here", after)),
            ..Script::default()
        })
        .await;
        let (one, two) = (message_with("fail here"), message_with("the second"));
        let (first, second, taken) = one_behind_the_other(
            &s,
            Duration::from_millis(500),
            (&one, &two),
            Duration::from_secs(5),
        )
        .await;
        assert_eq!(class(&first), outcome, "{first:?}");
        assert!(format!("{first:?}").contains(reason), "{first:?}");
        second.unwrap().unwrap();
        let c = &s.counters;
        assert_eq!((taken, c.chained.load(Ordering::SeqCst)), (1, 1));
        // Its MAIL went out twice, its body once: on the second connection.
        assert_eq!(c.mails.load(Ordering::SeqCst), mails, "{outcome}");
        assert_eq!(c.connections.load(Ordering::SeqCst), 2);
        let bodies = c.bodies.lock().unwrap().clone();
        assert_eq!(
            bodies.iter().filter(|b| b.contains("the second")).count(),
            1
        );
    }
}

#[tokio::test]
async fn a_stall_in_a_body_with_a_message_behind_it_is_before_the_dot() {
    // The next message's commands follow the dot in the same write: the dot counts as out only
    // once every byte up to it was written, not when the write began or ended.
    let s = server(Script {
        pipelining: true,
        stall_after_354: true,
        ..Script::default()
    })
    .await;
    let big = Outgoing {
        envelope: message().envelope,
        // Far more than the socket buffers hold: the write cannot finish.
        bytes: vec![b'x'; 32 * 1024 * 1024],
    };
    let (first, second, taken) = one_behind_the_other(
        &s,
        Duration::from_millis(500),
        (&big, &message()),
        Duration::from_millis(100),
    )
    .await;
    assert_eq!(class(&first), "transient", "{first:?}");
    assert!(format!("{first:?}").contains("while sending the message body"));
    assert_eq!(taken, 1, "the waiting message's commands were in the write");
    assert!(
        second.is_none(),
        "no connection came free in time: {second:?}"
    );
}

#[tokio::test]
async fn a_server_that_refuses_a_second_ehlo_is_spoken_to_one_command_at_a_time() {
    let s = server(Script {
        pipelining: true,
        second_ehlo: Some("502 5.5.1 EHLO once is enough"),
        ..Script::default()
    })
    .await;
    let m = mailer(s.port, Duration::from_secs(5), 1);
    for _ in 0..2 {
        m.send(&message()).await.unwrap();
    }
    assert_eq!(s.counters.accepted.load(Ordering::SeqCst), 2);
    assert_eq!(s.counters.connections.load(Ordering::SeqCst), 1);
    assert_eq!(s.counters.pipelined.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_refused_pipelined_transaction_leaves_no_reply_for_the_next_message() {
    // The first RCPT is refused: DATA's reply (503) stays unread on that connection, which
    // must not be reused, or the next message would read it as its own MAIL reply.
    let s = server(Script {
        pipelining: true,
        rcpt: "550 5.1.1 no such user",
        ..Script::default()
    })
    .await;
    let m = mailer(s.port, Duration::from_secs(5), 1);
    for _ in 0..3 {
        let r = m.send(&message()).await;
        assert_eq!(class(&r), "permanent", "{r:?}");
        let reason = r.unwrap_err().to_string();
        assert!(reason.contains("RCPT TO"), "{reason}");
    }
    assert_eq!(s.counters.connections.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn no_greeting_or_no_listener_is_an_unreachable_server() {
    let silent = outcome(Script {
        greet: false,
        ..Script::default()
    })
    .await;
    assert_eq!(class(&silent), "unreachable", "{silent:?}");
    let refused = {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        mailer(port, Duration::from_secs(1), 1)
            .send(&message())
            .await
    };
    assert_eq!(class(&refused), "unreachable", "{refused:?}");
}

#[tokio::test]
async fn a_break_or_a_stall_while_the_body_is_written_is_transient() {
    // The body and the dot leave in one write: a write that fails, or that the server never
    // lets finish, has not handed the dot to the network, so nothing can have been accepted.
    let broken = Script {
        close_after_354: true,
        ..Script::default()
    };
    let stalled = Script {
        stall_after_354: true,
        ..Script::default()
    };
    for (script, failure) in [(broken, "network error"), (stalled, "no answer within")] {
        let s = server(script).await;
        let big = Outgoing {
            envelope: message().envelope,
            // Far more than the socket buffers hold: the write cannot finish.
            bytes: vec![b'x'; 32 * 1024 * 1024],
        };
        let r = mailer(s.port, Duration::from_secs(1), 1).send(&big).await;
        assert_eq!(class(&r), "transient", "{r:?}");
        let reason = r.unwrap_err().to_string();
        assert!(reason.contains(failure), "{reason}");
        assert!(
            reason.contains("while sending the message body"),
            "{reason}"
        );
    }
}

#[tokio::test]
async fn a_message_that_is_not_text_is_refused_before_mail_from() {
    let s = server(Script::default()).await;
    let mut bytes = message().bytes;
    bytes.extend_from_slice(b"\r\nLatin-1: caf\xe9");
    let at = bytes.len() - 1;
    let odd = Outgoing {
        envelope: message().envelope,
        bytes,
    };
    let r = mailer(s.port, Duration::from_secs(5), 1).send(&odd).await;
    assert_eq!(class(&r), "permanent", "{r:?}");
    let reason = r.unwrap_err().to_string();
    assert!(
        reason.contains(&format!("not UTF-8 text (byte {at})")),
        "{reason}"
    );
    assert!(reason.contains("at MAIL FROM"), "{reason}");
    // The server never saw a transaction begin.
    assert_eq!(s.counters.connections.load(Ordering::SeqCst), 1);
    assert_eq!(s.counters.mails.load(Ordering::SeqCst), 0);
}

/// A self-signed certificate for `localhost` and its key, in PEM, from the openssl CLI.
fn localhost_certificate() -> (Vec<u8>, Vec<u8>) {
    static MADE: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "mailroom-smtp-tls-{}-{}",
        std::process::id(),
        MADE.fetch_add(1, Ordering::SeqCst)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let out = std::process::Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "2"])
        .args([
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost",
        ])
        .args(["-addext", "basicConstraints=critical,CA:FALSE", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pems = (std::fs::read(&cert).unwrap(), std::fs::read(&key).unwrap());
    std::fs::remove_dir_all(&dir).unwrap();
    pems
}

/// A scripted server behind TLS: from the first byte (`implicit`), or after STARTTLS.
async fn tls_server(script: Script, implicit: bool, cert: &[u8], key: &[u8]) -> Server {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_slice_iter(cert)
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_slice(key).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let counters = Arc::new(Counters::default());
    let c = counters.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let (c, acceptor) = (c.clone(), acceptor.clone());
            c.connections.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                if !implicit {
                    // Greeting, EHLO and STARTTLS in the clear; the client says nothing more
                    // until it has the 220, so no byte of its handshake is read here.
                    socket.write_all(b"220 fake ESMTP\r\n").await.unwrap();
                    let mut clear = BufReader::new(&mut socket);
                    let mut line = String::new();
                    clear.read_line(&mut line).await.unwrap();
                    assert!(line.to_ascii_uppercase().starts_with("EHLO"), "{line}");
                    let offer = "250-fake\r\n250-STARTTLS\r\n250 8BITMIME\r\n";
                    clear.get_mut().write_all(offer.as_bytes()).await.unwrap();
                    line.clear();
                    clear.read_line(&mut line).await.unwrap();
                    assert_eq!(line.to_ascii_uppercase(), "STARTTLS\r\n");
                    clear
                        .get_mut()
                        .write_all(b"220 go ahead\r\n")
                        .await
                        .unwrap();
                }
                let Ok(tls) = acceptor.accept(socket).await else {
                    return;
                };
                let _ = session(tls, script, &c, !implicit).await;
            });
        }
    });
    Server { port, counters }
}

/// A pool that trusts `cert` and speaks TLS to `port`, from the first byte or by STARTTLS.
fn tls_pool(port: u16, implicit: bool, cert: &[u8]) -> pool::Pool {
    use lettre::transport::smtp::client::{Certificate, TlsParameters};
    let params = TlsParameters::builder("localhost".into())
        .add_root_certificate(Certificate::from_pem(cert).unwrap())
        .build_rustls()
        .unwrap();
    let mut endpoint =
        Endpoint::parse(&format!("smtp://127.0.0.1:{port}").parse().unwrap()).unwrap();
    endpoint.tls = if implicit {
        TlsMode::Implicit(params)
    } else {
        TlsMode::Required(params)
    };
    pool::Pool::new(endpoint)
}

#[tokio::test]
async fn over_tls_the_body_arrives_whole_and_a_send_knows_when_its_dot_is_out() {
    // Under STARTTLS the connection's reads that mark the dot as written are lettre's TLS
    // reading the server's records; with implicit TLS they are plain text. Either way: the
    // message arrives as it was built, a stall while the body is written is before the dot,
    // and a stall after the whole write is after it.
    let (cert, key) = localhost_certificate();
    for implicit in [false, true] {
        let s = tls_server(Script::default(), implicit, &cert, &key).await;
        let pool = tls_pool(s.port, implicit, &cert);
        let m = message();
        let phase = Arc::new(PhaseCell::default());
        pool.send(&m, &phase, &Default::default()).await.unwrap();
        let text = String::from_utf8(m.bytes.clone()).unwrap();
        assert!(
            text.contains("\r\n.\r\n"),
            "the message has a line that is a dot"
        );
        assert_eq!(
            s.counters.bodies.lock().unwrap().as_slice(),
            [format!("{text}\r\n")],
            "implicit {implicit}"
        );

        // The phase a send is left in when the server stalls as `script` says.
        let stalled = async |script, body: &[u8]| {
            let s = tls_server(script, implicit, &cert, &key).await;
            let pool = tls_pool(s.port, implicit, &cert);
            let phase = Arc::new(PhaseCell::default());
            let body = Outgoing {
                envelope: m.envelope.clone(),
                bytes: body.to_vec(),
            };
            let held = Default::default();
            let sending = pool.send(&body, &phase, &held);
            assert!(
                tokio::time::timeout(Duration::from_secs(1), sending)
                    .await
                    .is_err()
            );
            (phase.get(), s.counters.bodies.lock().unwrap().len())
        };
        let after_dot = Script {
            after_dot: AfterDot::Stall,
            ..Script::default()
        };
        let (phase, arrived) = stalled(after_dot, &m.bytes).await;
        assert_eq!(arrived, 1, "the dot arrived");
        assert_eq!(phase, Phase::FinalDot, "implicit {implicit}");
        let mid_body = Script {
            stall_after_354: true,
            ..Script::default()
        };
        let (phase, _) = stalled(mid_body, &vec![b'x'; 32 * 1024 * 1024]).await;
        assert_eq!(phase, Phase::Body, "implicit {implicit}");
    }
}

#[tokio::test]
async fn over_tls_a_waiting_message_rides_behind_the_dot_and_both_arrive_whole() {
    let (cert, key) = localhost_certificate();
    for implicit in [false, true] {
        let script = Script {
            pipelining: true,
            ..Script::default()
        };
        let s = tls_server(script, implicit, &cert, &key).await;
        let pool = tls_pool(s.port, implicit, &cert);
        let (one, two) = (message_with("the first"), message_with("the second"));
        let permits = Arc::new(tokio::sync::Semaphore::new(1));
        let permit = permits.clone().try_acquire_owned().unwrap();
        let held = std::sync::Mutex::new(pool::Held::permit(permit));
        let (_ticket, handed) = pool.line_up(&two);
        let phase = Arc::new(PhaseCell::default());
        pool.send(&one, &phase, &held).await.unwrap();
        let handoff = handed
            .await
            .expect("the first send hands its connection over");
        let next = std::sync::Mutex::new(pool::Held::handed(handoff));
        let phase = Arc::new(PhaseCell::default());
        pool.send(&two, &phase, &next).await.unwrap();
        let c = &s.counters;
        let bodies = c.bodies.lock().unwrap().clone();
        assert_eq!(bodies.len(), 2, "implicit {implicit}");
        for (body, m) in bodies.iter().zip([&one, &two]) {
            let text = String::from_utf8(m.bytes.clone()).unwrap();
            assert_eq!(body, &format!("{text}\r\n"), "implicit {implicit}");
        }
        assert_eq!(c.chained.load(Ordering::SeqCst), 1, "implicit {implicit}");
        assert_eq!(c.connections.load(Ordering::SeqCst), 1);
        // The permit went along with the connection, and is given back with it.
        assert_eq!(permits.available_permits(), 0);
        drop(next);
        assert_eq!(permits.available_permits(), 1);
    }
}

#[tokio::test]
async fn a_break_after_the_final_dot_is_uncertain() {
    let closed = outcome(Script {
        after_dot: AfterDot::Close,
        ..Script::default()
    })
    .await;
    assert_eq!(class(&closed), "uncertain", "{closed:?}");
    let stalled = outcome(Script {
        after_dot: AfterDot::Stall,
        ..Script::default()
    })
    .await;
    assert_eq!(class(&stalled), "uncertain", "{stalled:?}");
    assert!(
        stalled
            .unwrap_err()
            .to_string()
            .contains("no answer within")
    );
}

#[tokio::test]
async fn a_pooled_connection_the_server_dropped_is_replaced_without_failing_the_send() {
    for (closing_421, pipelining) in [(false, false), (true, false), (false, true), (true, true)] {
        let s = server(Script {
            messages_per_connection: Some(1),
            closing_421,
            pipelining,
            ..Script::default()
        })
        .await;
        let m = mailer(s.port, Duration::from_secs(5), 2);
        for _ in 0..3 {
            m.send(&message()).await.unwrap();
        }
        assert_eq!(s.counters.accepted.load(Ordering::SeqCst), 3);
        assert_eq!(s.counters.connections.load(Ordering::SeqCst), 3);
    }
}

/// `build_message` gives lettre the envelope instead of letting it parse the headers back: the
/// envelope must be the one lettre derives from the same headers, for every kind of address a
/// job may carry (display names that need quoting or encoding, UTF-8 local parts, IDN domains
/// as the door stores them, the same address twice, Cc and Bcc in their order).
#[test]
fn the_envelope_is_the_one_lettre_derives_from_the_headers() {
    let from: Mailbox = "\"Shop, Inc.\" <noreply@shop.example>".parse().unwrap();
    let jobs = [
        json!({"to": ["ada@example.com"]}),
        json!({"to": ["\"Lovelace, Ada\" <ada@example.com>", "Grace <grace@example.org>"],
               "cc": ["Zoë Ünïcode <zoe@example.net>"], "bcc": ["audit@shop.example"]}),
        json!({"to": ["josé@example.com", "ada@münchen.example"], "cc": ["ada@example.com"],
               "bcc": ["ada@example.com"]}),
        json!({"to": ["a@example.com"], "bcc": ["b@example.com", "c@example.com"]}),
    ];
    let email = RenderedEmail {
        subject: "hello".into(),
        html: "<p>hi</p>".into(),
        text: Some("hi".into()),
    };
    for fields in jobs {
        let mut body = json!({"job_id": "j-1", "kind": "welcome", "to": [], "data": {}});
        body.as_object_mut()
            .unwrap()
            .extend(fields.as_object().unwrap().clone());
        let job = crate::job::EmailJob::decode(body.to_string().as_bytes()).unwrap();
        let ours = build_message(&from, "shop.example", &job, &email).unwrap();
        // The same From and recipient headers, the envelope left to lettre.
        let theirs = recipients(Message::builder().from(from.clone()), &job)
            .body(String::from("hi"))
            .unwrap();
        assert_eq!(ours.envelope(), theirs.envelope(), "{body}");
        assert!(!ours.envelope().to().is_empty(), "{body}");
    }
}

#[test]
fn message_id_is_deterministic_and_valid() {
    assert_eq!(
        message_id(
            "order-1042-confirmation",
            "order_confirmation",
            "shop.example"
        ),
        "<order-1042-confirmation.order_confirmation@shop.example>"
    );
    assert_eq!(
        message_id("a b<@>.c", "welcome", "x.example"),
        "<a=20b=3C=40=3E=2Ec.welcome@x.example>"
    );
}

#[tokio::test]
async fn implicit_tls_to_a_plaintext_server_is_an_unreachable_server() {
    let s = server(Script::default()).await;
    let m = Mailer::new(&MailerSettings {
        url: format!("smtps://127.0.0.1:{}", s.port).parse().unwrap(),
        from: "Shop <noreply@shop.example>".parse().unwrap(),
        message_id_domain: "shop.example".into(),
        timeout: Duration::from_secs(2),
        max_connections: 1,
        reserved_ahead: 0,
        deeper: None,
        dkim: None,
    })
    .unwrap();
    let r = m.send(&message()).await;
    assert_eq!(class(&r), "unreachable", "{r:?}");
    let error = r.unwrap_err().to_string();
    assert!(error.contains("while connecting"), "{error}");
    let server = format!("SMTP server 127.0.0.1:{}", s.port);
    assert!(
        error.contains(&server),
        "the error names the server: {error}"
    );
}

#[tokio::test]
async fn a_421_or_a_4_7_reply_asks_to_slow_down_and_says_what_about() {
    use super::SlowDown;
    let slow = |rcpt| Script {
        rcpt,
        ..Script::default()
    };
    let recipient = Some(SlowDown::Recipient("example.com".into()));
    let cases = [
        ("421 4.7.28 rate limited, slow down", recipient.clone()),
        ("421 4.3.2 closing", Some(SlowDown::Server)),
        ("421 closing", Some(SlowDown::Server)),
        ("450 4.7.1 too many messages, slow down", recipient),
        ("451 4.3.0 try later", None),
        ("550 5.7.1 refused", None),
    ];
    for (reply, expected) in cases {
        let result = outcome(slow(reply)).await;
        let error = result.as_ref().err();
        let asks = error.is_some_and(SendError::is_slow_down);
        assert_eq!(asks, expected.is_some(), "{reply}: {result:?}");
        assert_eq!(error.and_then(SendError::slow_down), expected, "{reply}");
    }
    let at_mail = Script {
        mail: "451 4.7.1 sending too fast",
        ..Script::default()
    };
    let result = outcome(at_mail).await;
    let scope = result.as_ref().err().and_then(SendError::slow_down);
    assert_eq!(scope, Some(SlowDown::Message), "{result:?}");
}
