"""Fixtures shared by the suite: a fresh PostgreSQL schema per test on the server
``CTXWIN_PG_URL`` names (``scripts/pg-server.sh start`` prints it), dropped afterwards, as the
Rust PostgreSQL tests do."""

import os
import uuid

import pytest


@pytest.fixture
def pg_url():
    """The URL of a fresh schema (its ``search_path`` set by the connection's options); the
    test skips, saying so, without ``CTXWIN_PG_URL``."""
    base = os.environ.get("CTXWIN_PG_URL")
    if not base:
        pytest.skip("CTXWIN_PG_URL is not set (scripts/pg-server.sh start prints it)")
    import psycopg

    name = f"ctxwin_py_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {name}")
    separator = "&" if "?" in base else "?"
    try:
        yield f"{base}{separator}options=-csearch_path%3D{name}"
    finally:
        with psycopg.connect(base, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA {name} CASCADE")
