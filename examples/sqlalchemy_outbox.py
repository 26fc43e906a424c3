#!/usr/bin/env python3
"""SQLAlchemy 2: an order and its outbox event in ONE `session.begin()`.

PostgreSQL (psycopg 3) or MySQL/MariaDB (PyMySQL), chosen by the URL:

    python3 -m venv .venv && .venv/bin/pip install -r examples/requirements.txt
    DATABASE_URL=mysql://mailroom:mailroom@127.0.0.1:3306/mailroom \\
        .venv/bin/python examples/sqlalchemy_outbox.py --order-id 1042 --to "Ada <ada@example.com>"

Run it twice with the same order id: the second run finds the job already queued and writes
nothing (exit status 0). `--rollback` raises inside the block: no order, no email.
"""

import argparse
import datetime
import decimal
import os
import urllib.parse

from sqlalchemy import JSON, BigInteger, Column, MetaData, Numeric, String, Table, create_engine
from sqlalchemy.dialects import mysql, postgresql
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

ER_DUP_ENTRY = 1062

# mailroom's table, as far as a producer writes it (mailroom's migrations own its schema).
outbox = Table(
    "mailroom_outbox",
    MetaData(),
    Column("id", BigInteger, primary_key=True),
    Column("job_id", String(200), nullable=False),
    Column("kind", String(64), nullable=False),
    Column("payload", JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=False),
)


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "sa_orders"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    email: Mapped[str] = mapped_column(String(320))
    total: Mapped[decimal.Decimal] = mapped_column(Numeric(10, 2))


class AlreadyQueued(Exception):
    """The job (job_id, kind) is in the outbox already: this request was done before."""


class RolledBack(Exception):
    """Raised inside the block to show that a rollback takes the email with it."""


def engine_url(url):
    """mailroom's DATABASE_URL spelled with the SQLAlchemy driver to use."""
    scheme, rest = url.split("://", 1)
    if scheme in ("postgres", "postgresql"):
        return "postgresql+psycopg://" + rest
    if scheme in ("mysql", "mariadb"):
        return "mysql+pymysql://" + rest + ("&" if "?" in rest else "?") + "charset=utf8mb4"
    raise SystemExit(f"unsupported DATABASE_URL scheme {scheme!r}")


def enqueue(session, job):
    """Inserts the job into mailroom_outbox in the session's transaction.

    The outbox's unique key (job_id, kind) is the idempotency key: on PostgreSQL a duplicate
    returns no row (ON CONFLICT DO NOTHING RETURNING id); on MySQL/MariaDB it fails with 1062,
    the outbox's only unique key besides its id. Either way AlreadyQueued is raised, and leaving
    `session.begin()` with it rolls everything back.
    """
    row = {"job_id": job["job_id"], "kind": job["kind"], "payload": job}
    if session.get_bind().dialect.name == "postgresql":
        insert = postgresql.insert(outbox).values(row)
        insert = insert.on_conflict_do_nothing(index_elements=["job_id", "kind"])
        if session.execute(insert.returning(outbox.c.id)).first() is None:
            raise AlreadyQueued(job["job_id"])
        return
    try:
        session.execute(mysql.insert(outbox).values(row))
    except IntegrityError as e:
        if e.orig.args[0] == ER_DUP_ENTRY:
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


def place_order(engine, order_id, to, rollback=False):
    order = Order(id=order_id, email=to, total=decimal.Decimal("39.90"))
    job = confirmation_job(order)
    try:
        with Session(engine) as session, session.begin():
            enqueue(session, job)  # first: a duplicate request stops before it writes anything
            session.add(order)  # flushed at commit, in the same transaction
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
    parser.add_argument("--rollback", action="store_true", help="raise inside session.begin()")
    args = parser.parse_args()
    engine = create_engine(engine_url(os.environ["DATABASE_URL"]))
    Base.metadata.create_all(engine)  # the demo's table; a project has a migration instead
    place_order(engine, args.order_id, args.to, args.rollback)


if __name__ == "__main__":
    main()
