#!/usr/bin/python3
"""A real SMTP server that records what it accepts, for mailroom's tests and local demo.

Run it with Debian's interpreter, /usr/bin/python3, which has python3-aiosmtpd (1.4.x); a
`python3` found on PATH may be another interpreter without it. Only aiosmtpd's stable API is
used: aiosmtpd.smtp.SMTP with a handler's handle_MAIL / handle_RCPT / handle_DATA.

    /usr/bin/python3 tests/support/smtp_recorder.py --port 0 --log received.jsonl \\
        [--maildir DIR] [--fail STAGE:CODE[:COUNT]]... [--data-delay SECONDS] [--stall-file FILE]

Once listening it prints one line, `LISTENING <port>`, to stdout. Every ACCEPTED message is
appended to --log as one JSON line {"mail_from", "rcpt_tos", "message_id", "data"} and fsynced
before the client is told 250, so a reader that sees 250 finds the line. --fail RCPT:451:2
answers the first two RCPT commands (counted over all connections) with 451; without a count,
always. Several --fail options for one stage are used in the order given. A 421 reply also
closes the connection, as RFC 5321 says it should. --stall-file FILE switches a stall on and
off while it runs: whenever FILE exists and holds a number of seconds, that wait replaces
--data-delay before the final dot is answered (the chaos soak writes and removes it). A client
that gives up during the wait is not recorded: its session is cancelled before the log line.
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

from aiosmtpd.smtp import SMTP

STAGES = ("MAIL", "RCPT", "DATA")
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
        if len(parts) not in (2, 3) or parts[0].upper() not in STAGES:
            raise argparse.ArgumentTypeError(
                f"--fail {spec!r}: expected STAGE:CODE[:COUNT], STAGE one of {', '.join(STAGES)}"
            )
        self.stage = parts[0].upper()
        try:
            self.code = int(parts[1])
            self.remaining = int(parts[2]) if len(parts) == 3 else None  # None: always
        except ValueError:
            raise argparse.ArgumentTypeError(f"--fail {spec!r}: CODE and COUNT are numbers")
        if not 400 <= self.code <= 599:
            raise argparse.ArgumentTypeError(f"--fail {spec!r}: CODE must be 4xx or 5xx")
        if self.remaining is not None and self.remaining < 1:
            raise argparse.ArgumentTypeError(f"--fail {spec!r}: COUNT must be at least 1")

    def reply(self):
        text = DEFAULT_TEXT.get(self.code, f"{self.code // 100}.0.0 injected failure")
        return f"{self.code} {text}"


class Recorder:
    """The aiosmtpd handler. All sessions share it; asyncio runs them on one thread."""

    def __init__(self, args):
        self.rules = args.fail
        self.data_delay = args.data_delay
        self.stall_file = args.stall_file
        self.verbose = args.verbose
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

    def injected(self, server, stage):
        """The failure reply for this stage, if a --fail rule still applies, else None."""
        for rule in self.rules:
            if rule.stage != stage or rule.remaining == 0:
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

    async def handle_MAIL(self, server, session, envelope, address, mail_options):
        reply = self.injected(server, "MAIL")
        if reply:
            return reply
        envelope.mail_from = address
        envelope.mail_options.extend(mail_options)
        return "250 OK"

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        reply = self.injected(server, "RCPT")
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
            }
            self.log.write(json.dumps(record, ensure_ascii=False) + "\n")
            self.log.flush()
            os.fsync(self.log.fileno())
        self.note(f"accepted #{self.seq} {message_id} for {envelope.rcpt_tos}")
        return "250 2.0.0 OK: queued as %d" % self.seq


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port (default)")
    p.add_argument("--log", help="append one JSON line per accepted message")
    p.add_argument("--maildir", help="also write each accepted message as DIR/<n>-<id>.eml")
    p.add_argument("--fail", type=FailRule, action="append", default=[],
                   metavar="STAGE:CODE[:COUNT]",
                   help="answer MAIL, RCPT or DATA (the final dot) with CODE, COUNT times")
    p.add_argument("--data-delay", type=float, default=0.0, metavar="SECONDS",
                   help="wait this long before answering the final dot of DATA")
    p.add_argument("--stall-file", metavar="FILE",
                   help="while FILE holds a number of seconds, wait that long instead of --data-delay")
    p.add_argument("-v", "--verbose", action="store_true", help="one stderr line per event")
    return p.parse_args(argv)


async def main(argv):
    args = parse_args(argv)
    handler = Recorder(args)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: SMTP(
            handler,
            data_size_limit=MAX_MESSAGE_BYTES,
            enable_SMTPUTF8=True,
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
    if handler.log:
        handler.log.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
