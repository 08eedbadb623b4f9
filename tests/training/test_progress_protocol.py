"""Progress protocol v1: one line in, a record or a one-line problem out, never an exception."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from b300.training.protocol import (
    MAX_LINE_BYTES,
    CheckpointEvent,
    ExitIntent,
    ProgressRecord,
    ReadProblem,
    RecordSource,
    encode_record,
    parse_legacy_snapshot,
    parse_progress_line,
)


def _line(**fields: object) -> bytes:
    return json.dumps({"v": 1, "step": 10, "time": 1_700_000_000.5, **fields}).encode()


def test_a_full_line_is_every_field() -> None:
    rec = parse_progress_line(_line(loss=2.5, tokens=4096, samples=2, host="gpu01", rank=3,
                                    step_time_s=0.42, event="ckpt_begin", path="/ckpt/step_10",
                                    exit_intent={"restart": False, "why": "data done"}))
    assert rec == ProgressRecord(step=10, time=1_700_000_000.5, loss=2.5, tokens=4096, samples=2,
                                 host="gpu01", rank=3, step_time_s=0.42, event=CheckpointEvent.BEGIN,
                                 path="/ckpt/step_10", exit_intent=ExitIntent(False, "data done"))


@pytest.mark.parametrize("raw", ["NaN", '"nan"', '"NaN"', "Infinity", '"inf"', '"-inf"', "-Infinity"])
def test_a_nonfinite_loss_is_news_not_an_error(raw: str) -> None:
    line = b'{"v":1,"step":3,"time":5,"loss":' + raw.encode() + b"}"
    rec = parse_progress_line(line)
    assert isinstance(rec, ProgressRecord) and rec.loss is not None and not math.isfinite(rec.loss)
    assert rec.loss_is_bad


@pytest.mark.parametrize(("fields", "what"), [
    ({"step": True}, "step must be an integer"),
    ({"step": "12"}, "step must be an integer"),
    ({"step": -1}, "step must be between"),
    ({"step": 2**60}, "step must be between"),
    ({"step": 1.0}, "step must be an integer"),
    ({"time": "now"}, "time must be a number"),
    ({"time": 0}, "time must be a finite number"),
    ({"loss": "low"}, "loss must be a number"),
    ({"loss": [1]}, "loss must be a number"),
    ({"tokens": -5}, "tokens must be between"),
    ({"host": ""}, "host must be 1-255"),
    ({"host": "a\nb"}, "host must be 1-255"),
    ({"host": 7}, "host must be a string"),
    ({"step_time_s": -0.1}, "step_time_s must be a finite"),
    ({"event": 3}, "event must be a string"),
    ({"exit_intent": {"why": "x"}}, "exit_intent must be an object with a boolean restart"),
    ({"exit_intent": {"restart": "no"}}, "exit_intent must be an object"),
    ({"v": 0}, "v must be between 1"),
])
def test_a_wrong_field_is_a_one_line_problem(fields: dict[str, object], what: str) -> None:
    problem = parse_progress_line(_line(**fields), offset=77)
    assert isinstance(problem, ReadProblem), problem
    assert what in problem.what and "\n" not in problem.what and problem.offset == 77


def test_missing_step_or_time() -> None:
    assert "step is missing" in str(parse_progress_line(b'{"v":1,"time":3}'))
    assert "time is missing" in str(parse_progress_line(b'{"v":1,"step":3}'))


@pytest.mark.parametrize(("line", "what"), [
    (b"\xff\xfe{}", "not UTF-8"),
    (b"{not json", "not JSON"),
    (b"[1, 2]", "not a JSON object"),
    (b"42", "not a JSON object"),
    (b"x" * MAX_LINE_BYTES, "over the 4096-byte limit"),
])
def test_garbage(line: bytes, what: str) -> None:
    problem = parse_progress_line(line)
    assert isinstance(problem, ReadProblem) and what in problem.what


def test_blank_lines_are_nothing() -> None:
    assert parse_progress_line(b"") is None
    assert parse_progress_line(b"   \t") is None


def test_forward_compatible_unknown_keys_events_and_versions() -> None:
    rec = parse_progress_line(_line(v=2, gpu_temp=81, event="eval_begin"))
    assert isinstance(rec, ProgressRecord)
    assert rec.version == 2 and rec.event is None and rec.step == 10


def test_why_is_one_bounded_line() -> None:
    rec = parse_progress_line(_line(exit_intent={"restart": False, "why": "a\nb" + "x" * 900}))
    assert isinstance(rec, ProgressRecord) and rec.exit_intent is not None
    assert rec.exit_intent.why.startswith("a b") and len(rec.exit_intent.why) == 500


def test_a_line_without_v_is_a_legacy_record() -> None:
    rec = parse_progress_line(b'{"step": 4, "time": 1700000000.0, "attempt": 2}')
    assert isinstance(rec, ProgressRecord) and rec.source is RecordSource.LEGACY and rec.step == 4


@pytest.mark.parametrize(("data", "step", "when"), [
    (b'{"step": 12}', 12, 99.0),
    (b'{"step": 12, "time": 50.5, "attempt": 1}', 12, 50.5),
    (b"12\n", 12, 99.0),
    (b'"12"', 12, 99.0),
    (b'{"step": "12"}', 12, 99.0),
])
def test_legacy_snapshots(data: bytes, step: int, when: float) -> None:
    rec = parse_legacy_snapshot(data, mtime=99.0)
    assert isinstance(rec, ProgressRecord) and (rec.step, rec.time) == (step, when)
    assert rec.source is RecordSource.LEGACY


@pytest.mark.parametrize("data", [b"epoch-3", b"[1]", '{"step": "²"}'.encode(), b"\xff", b'{"step": true}'])
def test_legacy_snapshots_that_are_wrong(data: bytes) -> None:
    assert isinstance(parse_legacy_snapshot(data, mtime=1.0), ReadProblem)


def test_an_empty_legacy_file_is_no_step_yet() -> None:
    assert parse_legacy_snapshot(b"  \n", mtime=1.0) is None


def test_encode_writes_strict_json_and_refuses_what_would_not_parse() -> None:
    line = encode_record({"step": 1, "time": 2.0, "loss": math.nan, "host": None})
    assert line.endswith(b"\n") and b"NaN" not in line
    assert json.loads(line) == {"v": 1, "step": 1, "time": 2.0, "loss": "nan"}
    with pytest.raises(ValueError, match="over the 4096-byte limit"):
        encode_record({"step": 1, "time": 2.0, "path": "/" + "p" * 5000})
    with pytest.raises(ValueError, match="step must be an integer"):
        encode_record({"step": "one", "time": 2.0})


@settings(max_examples=300)
@given(st.binary(max_size=5000))
def test_any_bytes_give_a_result_never_an_exception(data: bytes) -> None:
    for result in (parse_progress_line(data), parse_legacy_snapshot(data, 1.0)):
        assert result is None or isinstance(result, ProgressRecord | ReadProblem)


_finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)


@settings(max_examples=200)
@given(step=st.integers(0, 2**53), when=st.floats(1.0, 4e9), loss=st.none() | _finite | st.just(math.inf),
       tokens=st.none() | st.integers(0, 2**53), host=st.none() | st.text(st.characters(
           whitelist_categories=("L", "N", "P")), min_size=1, max_size=40))
def test_encode_then_parse_round_trips(step: int, when: float, loss: float | None, tokens: int | None,
                                       host: str | None) -> None:
    rec = parse_progress_line(encode_record({"step": step, "time": when, "loss": loss, "tokens": tokens,
                                             "host": host})[:-1])
    assert isinstance(rec, ProgressRecord)
    assert (rec.step, rec.time, rec.loss, rec.tokens, rec.host) == (step, when, loss, tokens, host)
