"""The control socket's request models for b300ctl's status and checkpoint prune: what
fits, and the one-line refusal (exit 2) of what does not."""

from __future__ import annotations

from typing import Any

import pytest

from b300.app import requests as rq
from b300.errors import UsageError


def test_status_and_prune_requests_parse() -> None:
    assert rq.parse_request({"op": "status", "deadline": 1.5}) == rq.Status(op="status", deadline=1.5)
    one = rq.parse_request({"op": "status", "run": "r-1"})
    assert isinstance(one, rq.Status) and (one.run, one.all) == ("r-1", False)
    prune = rq.parse_request({"op": "checkpoints_prune", "run_id": "r-1", "keep_last": 2,
                              "keep_daily_for": "7d", "keep_hourly_for": None})
    assert isinstance(prune, rq.CheckpointsPrune)
    assert (prune.run_id, prune.keep_last, prune.keep_daily_for) == ("r-1", 2, "7d")
    assert "status" in rq.READ_ONLY and "checkpoints_prune" not in rq.READ_ONLY


@pytest.mark.parametrize(("raw", "says"), [
    ({"op": "status", "all": "yes"}, "status: all must be true or false"),
    ({"op": "status", "runs": "r-1"}, "status: unknown key 'runs'"),
    ({"op": "checkpoints_prune"}, "checkpoints_prune: run_id is missing"),
    ({"op": "checkpoints_prune", "run_id": "r-1", "keep_last": True}, "checkpoints_prune: keep_last must be"),
    ({"op": "checkpoints_prune", "run_id": "r-1", "keep_daily_for": 7},
     "checkpoints_prune: keep_daily_for must be a string"),
])
def test_a_request_that_does_not_fit_is_one_line(raw: dict[str, Any], says: str) -> None:
    with pytest.raises(UsageError) as err:
        rq.parse_request(raw)
    assert str(err.value).startswith(says) and "\n" not in str(err.value) and err.value.exit_code == 2
