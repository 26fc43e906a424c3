#!/usr/bin/python3
"""Enqueue an email from Python in the same transaction as the business row.

This is the whole producer contract for applications outside Rust (Django, SQLAlchemy, Rails
do the same with their own connection): insert the job into `mailroom_outbox` inside the
transaction that writes your row. If the transaction rolls back, no email exists; if it
commits, mailroom's relay publishes the job and a worker sends it exactly once.

PostgreSQL (psycopg2) or MySQL/MariaDB (PyMySQL), chosen by the URL:

    DATABASE_URL=postgres://mailroom:mailroom@127.0.0.1:5432/mailroom \\
        /usr/bin/python3 examples/outbox.py --order-id 1042 --to "Ada <ada@example.com>" [--rollback]
    DATABASE_URL=mysql://mailroom:mailroom@127.0.0.1:3306/mailroom \\
        /usr/bin/python3 examples/outbox.py --order-id 1042 --to "Ada <ada@example.com>"
"""

import argparse
import datetime
import json
import os
import urllib.parse

# The job_id + kind pair is the idempotency key: inserting it twice is a no-op, so a request
# that is retried (a double click, a retried HTTP call) never queues a second email.
ENQUEUE = {
    "postgres": """
        INSERT INTO mailroom_outbox (job_id, kind, payload)
        VALUES (%(job_id)s, %(kind)s, %(payload)s::jsonb)
        ON CONFLICT (job_id, kind) DO NOTHING
    """,
    # MySQL has no ON CONFLICT: `id = id` makes a duplicate a no-op. (Not INSERT IGNORE: it
    # would turn unrelated errors, such as a truncated value, into warnings.)
    "mysql": """
        INSERT INTO mailroom_outbox (job_id, kind, payload)
        VALUES (%(job_id)s, %(kind)s, %(payload)s)
        ON DUPLICATE KEY UPDATE id = id
    """,
}


def connect(url):
    """A DB-API connection (autocommit off: every statement joins one transaction)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme in ("postgres", "postgresql"):
        import psycopg2

        return "postgres", psycopg2.connect(url)
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


def place_order(engine, conn, order_id, to, rollback=False):
    job = {
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
    with conn.cursor() as cur:
        cur.execute("INSERT INTO orders (id, total) VALUES (%s, %s)", (order_id, "$39.90"))
        cur.execute(
            ENQUEUE[engine],
            {"job_id": job["job_id"], "kind": job["kind"], "payload": json.dumps(job)},
        )
    if rollback:
        conn.rollback()
        print(f"order {order_id} rolled back: no email")
    else:
        conn.commit()
        print(f"order {order_id} committed: {job['job_id']} queued")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
