//! The pool and the phase classification against a scripted SMTP server on loopback: each
//! test says how the server behaves at one step and checks what `Mailer::send` concludes.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lettre::Message;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

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
}

impl Default for Script {
    fn default() -> Script {
        Script {
            greet: true,
            mail: "250 2.1.0 ok",
            rcpt: "250 2.1.5 ok",
            data: None,
            close_after_354: false,
            after_dot: AfterDot::Reply("250 2.0.0 queued"),
            messages_per_connection: None,
            closing_421: false,
            dot_delay: Duration::ZERO,
            pipelining: false,
            second_ehlo: None,
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
                let _ = session(socket, script, &c).await;
                c.open.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    Server { port, counters }
}

async fn session(socket: TcpStream, s: Script, c: &Counters) -> std::io::Result<()> {
    let (read, mut w) = socket.into_split();
    let mut lines = BufReader::new(read);
    if !s.greet {
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
    w.write_all(b"220 fake ESMTP\r\n").await?;
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
                None => match receive_data(&mut lines, &mut w, &s).await? {
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
async fn receive_data(
    lines: &mut BufReader<OwnedReadHalf>,
    w: &mut OwnedWriteHalf,
    s: &Script,
) -> std::io::Result<Option<&'static str>> {
    w.write_all(b"354 go ahead\r\n").await?;
    if s.close_after_354 {
        return Ok(None);
    }
    let mut line = String::new();
    loop {
        line.clear();
        if lines.read_line(&mut line).await? == 0 {
            return Ok(None);
        }
        if line == ".\r\n" {
            break;
        }
    }
    tokio::time::sleep(s.dot_delay).await;
    match s.after_dot {
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
        from: "Shop <noreply@shop.example>".parse().unwrap(),
        message_id_domain: "shop.example".into(),
        timeout,
        max_connections,
        dkim: None,
    })
    .unwrap()
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
async fn a_break_while_the_body_is_written_is_transient() {
    let s = server(Script {
        close_after_354: true,
        ..Script::default()
    })
    .await;
    let pool = pool::Pool::new(
        Endpoint::parse(&format!("smtp://127.0.0.1:{}", s.port).parse().unwrap()).unwrap(),
    );
    let envelope = message().envelope;
    // Far more than the socket buffers hold: the writes fail before the dot is reached.
    let body = vec![b'x'; 32 * 1024 * 1024];
    let phase = PhaseCell::default();
    let failure = pool.send(&envelope, &body, &phase).await.unwrap_err();
    assert_eq!(phase.get(), Phase::Body, "{failure}");
    assert!(matches!(
        classify(phase.get(), &failure, &pool.server()),
        SendError::Transient { .. }
    ));
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
