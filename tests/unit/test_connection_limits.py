"""The connection cap's arithmetic and the rate-limited warnings (the protocol itself is tested
through a live server in test_connections.py)."""

import asyncio
import logging
import time

import pytest

from asr_service.server.connections import (ACCEPT_BURSTS_IN_FLIGHT, ACCEPT_OUT_OF_FILES, BASE_RESERVED_FILES,
                                            DEFAULT_MAX_CONNECTIONS,
                                            MAX_BACKLOG, MAX_LINGERING, MIN_BACKLOG, ConnectionPlan,
                                            RateLimitedLog, plan_connections, quiet_accept_errors)

pytestmark = pytest.mark.unit

RESERVED = BASE_RESERVED_FILES + MAX_LINGERING + 64  # one file for each of 64 pending requests


def test_the_default_cap_fits_in_the_open_files_limit():
    assert plan_connections(None, 1, 64, 1_048_576) == ConnectionPlan(DEFAULT_MAX_CONNECTIONS, MAX_BACKLOG)
    for open_files in (1024, 512, 440):
        plan = plan_connections(None, 1, 64, open_files)
        assert plan.max_connections >= 1 and plan.backlog >= MIN_BACKLOG
        # every connection, the accepts in flight and the reserve fit: accept() cannot run out of files
        in_flight = ACCEPT_BURSTS_IN_FLIGHT * plan.backlog
        assert RESERVED + plan.max_connections + in_flight <= open_files, (open_files, plan)
    with pytest.raises(ValueError, match="ulimit -n"):
        plan_connections(None, 1, 64, RESERVED + ACCEPT_BURSTS_IN_FLIGHT * MIN_BACKLOG)


def test_an_asked_for_cap_is_kept_or_refused_with_the_reason():
    assert plan_connections(500, 1, 64, 1_048_576) == ConnectionPlan(500, MAX_BACKLOG)
    assert plan_connections(500, 1, 64, RESERVED + 800) == ConnectionPlan(500, 100)  # a smaller burst of accepts
    in_flight = ACCEPT_BURSTS_IN_FLIGHT * MIN_BACKLOG
    with pytest.raises(ValueError, match=f"at most {1024 - RESERVED - in_flight} connections fit"):
        plan_connections(5000, 1, 64, 1024)
    with pytest.raises(ValueError):
        plan_connections(0, 1, 64, 1_048_576)


def test_a_flood_of_failed_accepts_is_one_warning_with_a_count(caplog):
    logger = logging.getLogger("test.connections")
    warnings = RateLimitedLog(logger, every_seconds=0.5)

    async def flood():
        loop = asyncio.get_running_loop()
        quiet_accept_errors(loop, warnings)
        for _ in range(5000):  # what asyncio reports when every accept fails with EMFILE
            loop.call_exception_handler({"message": ACCEPT_OUT_OF_FILES, "exception": OSError(24, "Too many open files")})
        loop.call_exception_handler({"message": "something else"})  # other errors: the default handler, as before

    with caplog.at_level(logging.WARNING):
        asyncio.run(flood())
    ours = [r for r in caplog.records if r.name == "test.connections"]
    assert len(ours) == 1 and "Too many open files" in ours[0].getMessage()
    assert any(r.getMessage() == "something else" for r in caplog.records if r.name == "asyncio")

    time.sleep(0.5)  # the next period: one line that counts what was left out
    warnings.warning("accept", "cannot accept connections: %s", "again")
    assert "(4999 more like it since the last such line)" in caplog.records[-1].getMessage()
