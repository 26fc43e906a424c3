#!/usr/bin/env python3
"""Django: save a model and enqueue its email in ONE `transaction.atomic()`.

A standalone Django (settings configured in code, no project scaffolding), so it runs as is;
in a project, `place_order` is what your view or service calls. PostgreSQL (psycopg 3) or
MySQL/MariaDB (PyMySQL), chosen by the URL:

    python3 -m venv .venv && .venv/bin/pip install -r examples/requirements.txt
    DATABASE_URL=postgres://mailroom:mailroom@127.0.0.1:5432/mailroom \\
        .venv/bin/python examples/django_outbox.py --order-id 1042 --to "Ada <ada@example.com>"

Run it twice with the same order id: the second run finds the job already queued and writes
nothing (exit status 0). `--rollback` raises inside the block: no order, no email.
"""

import argparse
import datetime
import decimal
import json
import os
import urllib.parse

import django
from django.conf import settings


def database_settings(url):
    """Django's DATABASES entry for mailroom's DATABASE_URL syntax."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme in ("postgres", "postgresql"):
        engine, options = "django.db.backends.postgresql", {}
    elif parts.scheme in ("mysql", "mariadb"):
        # PyMySQL stands in for mysqlclient (no C compiler needed).
        import pymysql

        pymysql.install_as_MySQLdb()
        engine, options = "django.db.backends.mysql", {"charset": "utf8mb4"}
    else:
        raise SystemExit(f"unsupported DATABASE_URL scheme {parts.scheme!r}")
    return {
        "ENGINE": engine,
        "NAME": parts.path.lstrip("/"),
        "USER": urllib.parse.unquote(parts.username or ""),
        "PASSWORD": urllib.parse.unquote(parts.password or ""),
        "HOST": parts.hostname or "127.0.0.1",
        "PORT": str(parts.port or ""),
        "OPTIONS": options,
    }


settings.configure(
    DATABASES={"default": database_settings(os.environ["DATABASE_URL"])},
    INSTALLED_APPS=[],
    USE_TZ=True,
)
django.setup()

from django.db import IntegrityError, connection, models, transaction  # noqa: E402

ER_DUP_ENTRY = 1062


class Order(models.Model):
    id = models.BigIntegerField(primary_key=True)
    email = models.CharField(max_length=320)
    total = models.DecimalField(max_digits=10, decimal_places=2)

    class Meta:
        app_label = "shop"
        db_table = "shop_order"


class AlreadyQueued(Exception):
    """The job (job_id, kind) is in the outbox already: this request was done before."""


class RolledBack(Exception):
    """Raised inside the block to show that a rollback takes the email with it."""


def enqueue(job):
    """Inserts the job into mailroom_outbox on the atomic block's connection.

    The outbox's unique key (job_id, kind) is the idempotency key: on PostgreSQL a duplicate
    returns no row (ON CONFLICT DO NOTHING RETURNING id); on MySQL/MariaDB it fails with 1062,
    the outbox's only unique key besides its id. Either way AlreadyQueued is raised, and leaving
    `transaction.atomic()` with it rolls everything back.
    """
    payload = json.dumps(job)
    with connection.cursor() as cur:
        if connection.vendor == "postgresql":
            cur.execute(
                "INSERT INTO mailroom_outbox (job_id, kind, payload) VALUES (%s, %s, %s::jsonb)"
                " ON CONFLICT (job_id, kind) DO NOTHING RETURNING id",
                [job["job_id"], job["kind"], payload],
            )
            if cur.fetchone() is None:
                raise AlreadyQueued(job["job_id"])
            return
        try:
            cur.execute(
                "INSERT INTO mailroom_outbox (job_id, kind, payload) VALUES (%s, %s, %s)",
                [job["job_id"], job["kind"], payload],
            )
        except IntegrityError as e:
            if e.args[0] == ER_DUP_ENTRY:
                raise AlreadyQueued(job["job_id"]) from None
            raise


def confirmation_job(order):
    return {
        "job_id": f"order-{order.id}-confirmation",
        "kind": "order_confirmation",
        "to": [order.email],
        "data": {
            "product_name": "Acme Store",
            "user": {"name": order.email.split("<")[0].strip() or "customer"},
            "order": {
                "id": str(order.id),
                "placed_on": datetime.date.today().strftime("%d %B %Y"),
                "url": f"https://store.acme.example/orders/{order.id}",
                "items": [{"name": "Pour-over kettle", "quantity": 1, "price": f"${order.total}"}],
                "total": f"${order.total}",
            },
            "shipping_address": {
                "name": "Ada Lovelace", "line1": "12 St James's Square", "city": "London",
                "postal_code": "SW1Y 4JH", "country": "United Kingdom",
            },
        },
    }


def place_order(order_id, to, rollback=False):
    order = Order(id=order_id, email=to, total=decimal.Decimal("39.90"))
    job = confirmation_job(order)
    try:
        with transaction.atomic():
            enqueue(job)  # first: a duplicate request stops before it writes anything
            order.save(force_insert=True)
            if rollback:
                raise RolledBack
    except AlreadyQueued:
        print(f"order {order_id}: job {job['job_id']} already exists; nothing written")
    except RolledBack:
        print(f"order {order_id} rolled back: no email")
    else:
        print(f"order {order_id} committed: {job['job_id']} queued")


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--order-id", type=int, required=True)
    parser.add_argument("--to", required=True)
    parser.add_argument("--rollback", action="store_true", help="raise inside the atomic block")
    args = parser.parse_args()
    # The demo's table; a project has a migration for it instead.
    if Order._meta.db_table not in connection.introspection.table_names():
        with connection.schema_editor() as editor:
            editor.create_model(Order)
    place_order(args.order_id, args.to, args.rollback)


if __name__ == "__main__":
    main()
