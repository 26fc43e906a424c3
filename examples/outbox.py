#!/usr/bin/env python3
"""Enqueue an email from Python in the same transaction as the business row (plain DB-API).

This is the whole producer contract for applications outside Rust: insert the job into
`mailroom_outbox` inside the transaction that writes your row. If the transaction rolls back,
no email exists; if it commits, mailroom's relay publishes the job and a worker sends it once.
django_outbox.py and sqlalchemy_outbox.py do the same through those libraries.

PostgreSQL (psycopg 3) or MySQL/MariaDB (PyMySQL), chosen by the URL:

    python3 -m venv .venv && .venv/bin/pip install -r examples/requirements.txt
    DATABASE_URL=postgres://mailroom:mailroom@127.0.0.1:5432/mailroom \\
        .venv/bin/python examples/outbox.py --order-id 1042 --to "Ada <ada@example.com>" [--rollback]
    DATABASE_URL=mysql://mailroom:mailroom@127.0.0.1:3306/mailroom \\
        .venv/bin/python examples/outbox.py --order-id 1042 --to "Ada <ada@example.com>"

Run it twice with the same order id: the second run finds the job already queued and writes
nothing (exit status 0: a retried request that was already done is not an error).
"""

import argparse
import datetime
import json
import os
import urllib.parse

# The outbox's unique key (job_id, kind), constraint `mailroom_outbox_job`, is the request's
# idempotency key: the job row goes in FIRST, and if the key is taken the request was already
# done, so the transaction is rolled back before it writes anything else. The same statements
# as mailroom's own Rust API (src/db/postgres.rs, src/db/mysql.rs):
ENQUEUE = {
    # A duplicate is no error and returns no row.
    "postgres": """
        INSERT INTO mailroom_outbox (job_id, kind, payload)
        VALUES (%(job_id)s, %(kind)s, %(payload)s::jsonb)
        ON CONFLICT (job_id, kind) DO NOTHING
        RETURNING id
    """,
    # MySQL has no ON CONFLICT … RETURNING: a plain INSERT whose duplicate-key error (1062) is
    # caught. InnoDB rolls back that statement only. The outbox has no other unique key, so 1062
    # here always means (job_id, kind). (Not INSERT IGNORE, which turns unrelated errors into
    # warnings; and not ON DUPLICATE KEY UPDATE, whose row count cannot say "duplicate" when the
    # driver sets CLIENT_FOUND_ROWS, as Django's and SQLAlchemy's do.)
    "mysql": """
        INSERT INTO mailroom_outbox (job_id, kind, payload)
        VALUES (%(job_id)s, %(kind)s, %(payload)s)
    """,
}
ER_DUP_ENTRY = 1062


class AlreadyQueued(Exception):
    """The job (job_id, kind) is in the outbox already: this request was done before."""


def connect(url):
    """A DB-API connection (autocommit off: every statement joins one transaction)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme in ("postgres", "postgresql"):
        import psycopg

        return "postgres", psycopg.connect(url)
    if parts.scheme in ("mysql", "mariadb"):
        import pymysql

        conn = pymysql.connect(
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 3306,
            user=urllib.parse.unquote(parts.username or ""),
            password=urllib.parse.unquote(parts.password or ""),
            database=parts.path.lstrip("/"),
            charset="utf8mb4",
        )
        return "mysql", conn
    raise SystemExit(f"unsupported DATABASE_URL scheme {parts.scheme!r}")


def enqueue(engine, cur, job):
    """Inserts the job into the outbox; raises AlreadyQueued if its key is there already."""
    row = {"job_id": job["job_id"], "kind": job["kind"], "payload": json.dumps(job)}
    if engine == "postgres":
        cur.execute(ENQUEUE[engine], row)
        if cur.fetchone() is None:
            raise AlreadyQueued(job["job_id"])
        return
    import pymysql

    try:
        cur.execute(ENQUEUE[engine], row)
    except pymysql.err.IntegrityError as e:
        if e.args[0] == ER_DUP_ENTRY:
            raise AlreadyQueued(job["job_id"]) from None
        raise


def confirmation_job(order_id, to):
    """The order confirmation: its job id is derived from the order, so a retry is the same job."""
    return {
        "job_id": f"order-{order_id}-confirmation",
        "kind": "order_confirmation",
        "to": [to],
        "data": {
            "product_name": "Acme Store",
            "user": {"name": to.split("<")[0].strip() or "customer"},
            "order": {
                "id": str(order_id),
                "placed_on": datetime.date.today().strftime("%d %B %Y"),
                "url": f"https://store.acme.example/orders/{order_id}",
                "items": [{"name": "Pour-over kettle", "quantity": 1, "price": "$39.90"}],
                "total": "$39.90",
            },
            "shipping_address": {
                "name": "Ada Lovelace", "line1": "12 St James's Square", "city": "London",
                "postal_code": "SW1Y 4JH", "country": "United Kingdom",
            },
        },
        "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(),
    }


def place_order(engine, conn, order_id, to, rollback=False):
    job = confirmation_job(order_id, to)
    try:
        with conn.cursor() as cur:
            enqueue(engine, cur, job)
            cur.execute("INSERT INTO orders (id, total) VALUES (%s, %s)", (order_id, "$39.90"))
    except AlreadyQueued:
        conn.rollback()
        print(f"order {order_id}: job {job['job_id']} already exists; nothing written")
        return
    except BaseException:
        conn.rollback()
        raise
    if rollback:
        conn.rollback()
        print(f"order {order_id} rolled back: no email")
    else:
        conn.commit()
        print(f"order {order_id} committed: {job['job_id']} queued")


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--order-id", type=int, required=True)
    parser.add_argument("--to", required=True)
    parser.add_argument("--rollback", action="store_true", help="roll the transaction back instead")
    args = parser.parse_args()
    engine, conn = connect(os.environ["DATABASE_URL"])
    try:
        # The demo's own business table. Created in a transaction of its own: on MySQL, DDL
        # commits implicitly and must not share the order's transaction.
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE IF NOT EXISTS orders (id BIGINT PRIMARY KEY, total TEXT)")
        conn.commit()
        place_order(engine, conn, args.order_id, args.to, args.rollback)
    finally:
        conn.close()


if __name__ == "__main__":
    main()
