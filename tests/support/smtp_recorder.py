#!/usr/bin/python3
"""A real SMTP server that records what it accepts, for mailroom's tests and local demo.

Run it with Debian's interpreter, /usr/bin/python3, which has python3-aiosmtpd (1.4.x); a
`python3` found on PATH may be another interpreter without it. Only aiosmtpd's stable API is
used: aiosmtpd.smtp.SMTP with a handler's handle_MAIL / handle_RCPT / handle_DATA.

    /usr/bin/python3 tests/support/smtp_recorder.py --port 0 --log received.jsonl \\
        [--maildir DIR] [--fail STAGE:CODE[/ENHANCED][:COUNT[:DOMAIN]]]... [--data-delay SECONDS] [--stall-file FILE] \\
        [--stall-greeting COUNT] [--lose-reply close|silent[:COUNT]] [--max-sessions N] \\
        [--gate-354 FILE] [--session-messages N] \\
        [--no-smtputf8] [--no-pipelining]

Once listening it prints one line, `LISTENING <port>`, to stdout. Every ACCEPTED message is
appended to --log as one JSON line {"mail_from", "rcpt_tos", "message_id", "data",
"mail_at" (Unix time in seconds, when MAIL FROM was accepted), "received_at" (when the final
dot is answered, after any --data-delay), "pipelined" (MAIL FROM, every RCPT TO and DATA
arrived in one read, as a client pipelining them sends them), "behind_dot" (MAIL FROM arrived
in the same read as the previous message's final dot on this connection: the client wrote this
message's commands behind that dot)} and fsynced before the client is told 250, so a
reader that sees 250 finds the line; [mail_at, received_at] is the transaction, from which a
test counts the deliveries in progress at once. --fail RCPT:451:2
answers the first two RCPT commands (counted over all connections) with 451; without a count,
always; --fail RCPT:421:5:slow.test answers only RCPT commands to addresses @slow.test
(COUNT may be empty: RCPT:421::slow.test always). CODE/ENHANCED gives the reply an enhanced
status of its own: RCPT:421/4.7.28 is Gmail's rate-limit reply, RCPT:450/4.7.1 a per-recipient
"slow down". Several --fail options for one stage are
used in the order given. A 421 reply also
closes the connection, as RFC 5321 says it should. STAGE is MAIL, RCPT, DATACMD (the DATA
command, before any content) or DATA (alias DOT: the reply to the final dot).
--no-smtputf8 leaves SMTPUTF8 out of the EHLO reply, as many servers do: a non-ASCII address
is then refused. PIPELINING (RFC 2920) is offered, as by Postfix and most servers;
--no-pipelining leaves it out, and a client must then wait for each reply.

Faults for the tests of the uncertain window and of timeouts:
  --stall-greeting COUNT   the first COUNT connections are accepted and never greeted (the
                           socket stays open until the client gives up).
  --lose-reply MODE[:N]    the first N messages (all without N) are accepted and logged, then
                           the reply to the final dot is lost: `close` drops the connection,
                           `silent` never answers. The client cannot know it was delivered.
  --max-sessions N         at most N sessions at once; one more is answered `421 too many
                           sessions` and closed. The peak is printed on exit and, with -v,
                           on every new session.
  --stall-file FILE        switches a stall on and off while the server runs: whenever
                           FILE exists and holds a number of seconds, that wait replaces
                           --data-delay before the final dot is answered (the chaos soak writes
                           and removes it). A client that gives up during the wait is not
                           recorded: its session is cancelled before the log line.
  --session-messages N     after N accepted messages on one connection, the next MAIL FROM is
                           answered `421 too many messages` and the connection closed, as
                           providers that cap messages per connection do.
  --gate-354 FILE          while FILE exists, the DATA command waits for its 354 (the server
                           has read MAIL, RCPT and DATA and not yet asked for the content):
                           a test holds a send there while it lines more up behind it, and
                           removes FILE to let it go.
"""

import argparse
import asyncio
import email.parser
import email.policy
import json
import os
import re
import signal
import sys
import time

from aiosmtpd.smtp import SMTP

STAGES = ("MAIL", "RCPT", "DATACMD", "DATA")
STAGE_ALIASES = {"DOT": "DATA"}
DEFAULT_TEXT = {
    421: "4.3.2 service shutting down, closing channel",
    450: "4.2.1 mailbox busy, try again later",
    451: "4.3.0 try again later",
    452: "4.3.1 insufficient system storage",
    550: "5.1.1 mailbox unavailable",
    552: "5.3.4 message too big",
    553: "5.1.3 mailbox name not allowed",
    554: "5.0.0 transaction failed",
}
MAX_MESSAGE_BYTES = 10 * 1024 * 1024


class FailRule:
    def __init__(self, spec):
        parts = spec.split(":")
        if parts:
            parts[0] = STAGE_ALIASES.get(parts[0].upper(), parts[0].upper())
        if len(parts) not in (2, 3, 4) or parts[0] not in STAGES:
            raise argparse.ArgumentTypeError(
                f"--fail {spec!r}: expected STAGE:CODE[/ENHANCED][:COUNT[:DOMAIN]], STAGE one of {', '.join(STAGES)}"
            )
        self.stage = parts[0]
        self.domain = parts[3].lower() if len(parts) == 4 else None
        if self.domain is not None and self.stage != "RCPT":
            raise argparse.ArgumentTypeError(f"--fail {spec!r}: only RCPT rules name a DOMAIN")
        code, _, self.enhanced = parts[1].partition("/")
        if self.enhanced and not re.fullmatch(r"[45]\.\d{1,3}\.\d{1,3}", self.enhanced):
            raise argparse.ArgumentTypeError(f"--fail {spec!r}: ENHANCED is a status like 4.7.28")
        try:
            self.code = int(code)
            self.remaining = int(parts[2]) if len(parts) >= 3 and parts[2] else None  # None: always
        except ValueError:
            raise argparse.ArgumentTypeError(f"--fail {spec!r}: CODE and COUNT are numbers")
        if not 400 <= self.code <= 599:
            raise argparse.ArgumentTypeError(f"--fail {spec!r}: CODE must be 4xx or 5xx")
        if self.remaining is not None and self.remaining < 1:
            raise argparse.ArgumentTypeError(f"--fail {spec!r}: COUNT must be at least 1")

    def reply(self):
        if self.enhanced:
            return f"{self.code} {self.enhanced} injected failure, slow down"
        text = DEFAULT_TEXT.get(self.code, f"{self.code // 100}.0.0 injected failure")
        return f"{self.code} {text}"


class LoseReply:
    MODES = ("close", "silent")

    def __init__(self, spec):
        mode, _, count = spec.partition(":")
        if mode not in self.MODES:
            raise argparse.ArgumentTypeError(f"--lose-reply {spec!r}: MODE is close or silent")
        try:
            self.remaining = int(count) if count else None  # None: always
        except ValueError:
            raise argparse.ArgumentTypeError(f"--lose-reply {spec!r}: COUNT is a number")
        self.mode = mode

    def take(self):
        """True if this message's reply is to be lost."""
        if self.remaining == 0:
            return False
        if self.remaining is not None:
            self.remaining -= 1
        return True


class Recorder:
    """The aiosmtpd handler. All sessions share it; asyncio runs them on one thread."""

    def __init__(self, args):
        self.rules = args.fail
        self.data_delay = args.data_delay
        self.lose_reply = args.lose_reply
        self.stall_file = args.stall_file
        self.gate_354 = args.gate_354
        self.session_messages = args.session_messages
        self.verbose = args.verbose
        self.pipelining = not args.no_pipelining
        self.log = open(args.log, "a", encoding="utf-8") if args.log else None
        self.maildir = args.maildir
        self.seq = 0
        if self.maildir:
            os.makedirs(self.maildir, exist_ok=True)
            # Keep numbering after the files already there (a demo may run twice).
            numbers = [int(m.group(1)) for f in os.listdir(self.maildir)
                       if (m := re.match(r"(\d+)-.*\.eml$", f))]
            self.seq = max(numbers, default=0)
        self.header_parser = email.parser.BytesHeaderParser(policy=email.policy.compat32)

    def note(self, text):
        if self.verbose:
            print(f"smtp_recorder: {text}", file=sys.stderr, flush=True)

    def current_delay(self):
        """--data-delay, or the stall written in --stall-file while that file exists."""
        if self.stall_file:
            try:
                with open(self.stall_file, encoding="utf-8") as f:
                    return float(f.read().strip() or 0)
            except (FileNotFoundError, ValueError):
                pass
        return self.data_delay

    def injected(self, server, stage, address=None):
        """The failure reply for this stage (and RCPT address), if a --fail rule still applies,
        else None."""
        for rule in self.rules:
            if rule.stage != stage or rule.remaining == 0:
                continue
            if rule.domain is not None and not (address or "").lower().endswith("@" + rule.domain):
                continue
            if rule.remaining is not None:
                rule.remaining -= 1
            reply = rule.reply()
            self.note(f"{stage} -> {reply} (injected)")
            if rule.code == 421:
                # aiosmtpd keeps the connection open after any reply; 421 means closing.
                # The reply is written before this callback runs, and close() flushes it.
                asyncio.get_running_loop().call_soon(server.transport.close)
            return reply
        return None

    async def handle_EHLO(self, server, session, envelope, hostname, responses):
        session.host_name = hostname
        if self.pipelining:
            responses.insert(len(responses) - 1, "250-PIPELINING")
        return responses

    async def handle_MAIL(self, server, session, envelope, address, mail_options):
        reply = self.injected(server, "MAIL")
        if reply:
            return reply
        if self.session_messages is not None and \
                getattr(server, "accepted", 0) >= self.session_messages:
            self.note(f"MAIL -> 421 (session cap of {self.session_messages} messages)")
            asyncio.get_running_loop().call_soon(server.transport.close)
            return "421 4.7.0 too many messages in this session, reconnect"
        envelope.mail_read = server.reads
        envelope.behind_dot = server.reads == getattr(server, "dot_read", None)
        envelope.mail_from = address
        envelope.mail_at = time.time()
        envelope.mail_options.extend(mail_options)
        return "250 OK"

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        reply = self.injected(server, "RCPT", address)
        if reply:
            return reply
        envelope.rcpt_tos.append(address)
        envelope.rcpt_options.extend(rcpt_options)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        delay = self.current_delay()
        if delay > 0:
            await asyncio.sleep(delay)
        reply = self.injected(server, "DATA")
        if reply:
            return reply
        # A client sends nothing after its dot (and the commands it wrote behind it) until
        # the dot is answered, so the read count is still that of the read with the dot.
        server.dot_read = server.reads
        server.accepted = getattr(server, "accepted", 0) + 1
        raw = envelope.original_content or b""
        message_id = self.header_parser.parsebytes(raw).get("Message-ID")
        message_id = " ".join(str(message_id).split()) if message_id is not None else None
        self.seq += 1
        if self.maildir:
            safe = re.sub(r"[^A-Za-z0-9._@-]+", "_", (message_id or "").strip("<>"))[:150]
            path = os.path.join(self.maildir, f"{self.seq:06d}-{safe or 'no-message-id'}.eml")
            with open(path, "wb") as f:
                f.write(raw)
        if self.log:
            record = {
                "mail_from": envelope.mail_from,
                "rcpt_tos": list(envelope.rcpt_tos),
                "message_id": message_id,
                # errors="replace": JSON readers (serde_json) reject lone surrogates.
                "data": raw.decode("utf-8", errors="replace"),
                "mail_at": getattr(envelope, "mail_at", None),
                "received_at": time.time(),
                "pipelined": getattr(envelope, "mail_read", None) is not None
                and getattr(envelope, "mail_read", None) == getattr(envelope, "data_read", None),
                "behind_dot": getattr(envelope, "behind_dot", False),
            }
            self.log.write(json.dumps(record, ensure_ascii=False) + "\n")
            self.log.flush()
            os.fsync(self.log.fileno())
        self.note(f"accepted #{self.seq} {message_id} for {envelope.rcpt_tos}")
        if self.lose_reply and self.lose_reply.take():
            self.note(f"losing the reply to #{self.seq} ({self.lose_reply.mode})")
            if self.lose_reply.mode == "close":
                server.transport.abort()
            # Never answer; the session ends when the client gives up and closes.
            await asyncio.Event().wait()
        return "250 2.0.0 OK: queued as %d" % self.seq


class Session(SMTP):
    """aiosmtpd's SMTP with the connection-level faults: session cap, stalled greeting, and a
    failure rule for the DATA command itself (aiosmtpd has no handler hook before 354)."""

    active = 0
    peak = 0
    stalls_left = 0
    max_sessions = None

    def connection_made(self, transport):
        cls = Session
        if cls.max_sessions is not None and cls.active >= cls.max_sessions:
            transport.write(b"421 4.7.0 too many sessions, try again later\r\n")
            transport.close()
            self._refused = True
            self.event_handler.note("session refused: cap reached")
            return
        self._refused = False
        cls.active += 1
        cls.peak = max(cls.peak, cls.active)
        self.event_handler.note(f"session opened ({cls.active} active, peak {cls.peak})")
        if cls.stalls_left > 0:
            cls.stalls_left -= 1
            self._stalled = transport
            self.event_handler.note("stalling before the greeting")
            return
        self._stalled = None
        super().connection_made(transport)

    def connection_lost(self, exc):
        if getattr(self, "_refused", False):
            return
        Session.active -= 1
        if getattr(self, "_stalled", None) is not None:
            return
        super().connection_lost(exc)

    def eof_received(self):
        if getattr(self, "_refused", False) or getattr(self, "_stalled", None) is not None:
            return False  # let the transport close
        return super().eof_received()

    def data_received(self, data):
        if getattr(self, "_refused", False) or getattr(self, "_stalled", None) is not None:
            return  # never greeted: ignore whatever the client sends
        # Reads so far: commands that arrived in the same read were sent without waiting.
        self.reads = getattr(self, "reads", 0) + 1
        super().data_received(data)

    async def smtp_DATA(self, arg):
        reply = self.event_handler.injected(self, "DATACMD")
        if reply:
            await self.push(reply)
            return
        self.envelope.data_read = getattr(self, "reads", 0)
        gate = self.event_handler.gate_354
        if gate and os.path.exists(gate):
            self.event_handler.note("holding the 354 while the gate file exists")
            while os.path.exists(gate):
                await asyncio.sleep(0.005)
        await super().smtp_DATA(arg)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port (default)")
    p.add_argument("--log", help="append one JSON line per accepted message")
    p.add_argument("--maildir", help="also write each accepted message as DIR/<n>-<id>.eml")
    p.add_argument("--fail", type=FailRule, action="append", default=[],
                   metavar="STAGE:CODE[/ENHANCED][:COUNT[:DOMAIN]]",
                   help="answer MAIL, RCPT or DATA (the final dot) with CODE, COUNT times "
                        "(RCPT: only to addresses @DOMAIN, when given)")
    p.add_argument("--data-delay", type=float, default=0.0, metavar="SECONDS",
                   help="wait this long before answering the final dot of DATA")
    p.add_argument("--stall-greeting", type=int, default=0, metavar="COUNT",
                   help="accept the first COUNT connections and never greet them")
    p.add_argument("--lose-reply", type=LoseReply, metavar="close|silent[:COUNT]",
                   help="accept and log a message, then lose the reply to its final dot")
    p.add_argument("--max-sessions", type=int, metavar="N",
                   help="answer 421 and close beyond N concurrent sessions")
    p.add_argument("--stall-file", metavar="FILE",
                   help="while FILE holds a number of seconds, wait that long instead of --data-delay")
    p.add_argument("--session-messages", type=int, metavar="N",
                   help="answer MAIL with 421 and close once a connection carried N messages")
    p.add_argument("--gate-354", metavar="FILE",
                   help="while FILE exists, hold the 354 reply to the DATA command")
    p.add_argument("--no-smtputf8", action="store_true",
                   help="do not offer SMTPUTF8 (non-ASCII addresses are refused)")
    p.add_argument("--no-pipelining", action="store_true",
                   help="do not offer PIPELINING (the client waits for each reply)")
    p.add_argument("-v", "--verbose", action="store_true", help="one stderr line per event")
    return p.parse_args(argv)


async def main(argv):
    args = parse_args(argv)
    handler = Recorder(args)
    Session.stalls_left = args.stall_greeting
    Session.max_sessions = args.max_sessions
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: Session(
            handler,
            data_size_limit=MAX_MESSAGE_BYTES,
            enable_SMTPUTF8=not args.no_smtputf8,
            decode_data=False,
            # Without a hostname aiosmtpd calls socket.getfqdn() per connection: slow here.
            hostname="recorder.localhost",
            ident="mailroom smtp_recorder",
        ),
        host=args.host,
        port=args.port,
        backlog=1024,
    )
    port = server.sockets[0].getsockname()[1]
    print(f"LISTENING {port}", flush=True)

    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.close()  # open sessions are cancelled when asyncio.run() returns
    if args.max_sessions is not None:
        print(f"smtp_recorder: peak sessions {Session.peak}", file=sys.stderr, flush=True)
    if handler.log:
        handler.log.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
