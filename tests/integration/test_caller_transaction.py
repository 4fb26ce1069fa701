"""Election steps inside the caller's own transaction commit or roll back with it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from celery_election.backends import SQLBackend, backend_from_url
from celery_election.core.lease import Bid

from ..conftest import token, unique_prefix


@pytest.fixture
def setup(sql_url: str) -> Iterator[tuple[SQLBackend, sa.Engine]]:
    backend = backend_from_url(sql_url, table_prefix=unique_prefix())
    assert isinstance(backend, SQLBackend)
    backend.install()
    app = sa.create_engine(backend.engine.url)  # the application's own engine
    yield backend, app
    app.dispose()
    backend.uninstall()
    backend.close()


def test_a_rolled_back_transaction_takes_its_election_with_it(
    setup: tuple[SQLBackend, sa.Engine],
) -> None:
    backend, app = setup
    t = token()
    backend.register("tx", t, "a", "h", 1, 30.0)  # creates nothing in the lease table
    with app.connect() as conn:
        trans = conn.begin()
        result = backend.elect(Bid("tx", t, "a", 30.0), connection=conn)
        assert result.won and result.lease is not None
        assert backend.current("tx", connection=conn).held_by(t)  # seen inside
        trans.rollback()
    lease = backend.current("tx")
    assert lease is None or not lease.held


def test_a_committed_session_keeps_the_election_and_the_app_write(
    setup: tuple[SQLBackend, sa.Engine],
) -> None:
    backend, app = setup
    notes = sa.Table(
        f"{backend.table_prefix}notes", sa.MetaData(), sa.Column("term", sa.BigInteger)
    )
    notes.create(app)
    t = token()
    try:
        with Session(app) as session, session.begin():
            result = backend.elect(Bid("tx", t, "a", 30.0), connection=session)
            assert result.won and result.lease is not None
            session.execute(sa.insert(notes).values(term=result.lease.term))
        lease = backend.current("tx")
        assert lease is not None and lease.held_by(t)
        with app.connect() as conn:
            assert conn.execute(sa.select(notes.c.term)).scalar_one() == lease.term
        with Session(app) as session, session.begin():
            assert backend.resign("tx", t, lease.term, connection=session)
        assert not backend.current("tx").held
    finally:
        notes.drop(app)
