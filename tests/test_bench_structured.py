"""scripts/bench_structured.py: the schema check that counts invalid structured outputs
(written apart from both servers' grammar engines, so it must catch what they get wrong)
and the acceptance / tokens-per-pass arithmetic of its report. Pure: no model, no server."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def _script():
    sys.path.insert(0, str(SCRIPTS))
    spec = importlib.util.spec_from_file_location(
        "bench_structured", SCRIPTS / "bench_structured.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


bs = _script()
ORDER = bs.RECORDS[1][1]  # nested customer, an array of items, an enum
GOOD = {"order_id": 7, "customer": {"name": "Ana", "email": "a@b.pt"},
        "items": [{"sku": "X1", "qty": 2, "price": 9.5}], "status": "shipped"}  # fmt: skip


def test_a_record_that_follows_its_schema_passes() -> None:
    assert bs.validate(json.dumps(GOOD), ORDER) is None
    for _, schema in bs.RECORDS:  # every keyword the eight schemas use is one it checks
        bs.check({}, schema)


@pytest.mark.parametrize(
    ("broken", "why"),
    [
        (GOOD | {"status": "lost"}, "not in"),
        (GOOD | {"order_id": 7.5}, "not integer"),
        (GOOD | {"order_id": True}, "not integer"),
        (GOOD | {"extra": 1}, "extra key"),
        ({k: v for k, v in GOOD.items() if k != "customer"}, "missing customer"),
        (GOOD | {"customer": {"name": "x" * 41, "email": ""}}, "longer than 40"),
        (GOOD | {"items": [GOOD["items"][0]] * 4}, "4 items"),
        (GOOD | {"items": [{"sku": "X", "qty": "2", "price": 1}]}, "$.items[0].qty: not integer"),
    ],
)
def test_each_kind_of_break_is_caught(broken: dict, why: str) -> None:
    assert why in (bs.validate(json.dumps(broken), ORDER) or "")


def test_text_that_is_not_json_and_unknown_keywords_are_refused() -> None:
    assert "not JSON" in (bs.validate('{"order_id": 7', ORDER) or "")
    with pytest.raises(ValueError, match="pattern"):
        bs.check("a", {"type": "string", "pattern": "b"})


def test_acceptance_and_tokens_per_pass_of_each_server() -> None:
    ok = {"failure": None, "output_tokens": 100}
    specgen = [ok | {"speculative": {"num_steps": 20,
                     "num_tested_draft_tokens_by_source": {"draft": 40, "grammar": 30},
                     "num_accepted_draft_tokens_by_source": {"draft": 30, "grammar": 30}}}]  # fmt: skip
    s = bs.spec_counts(specgen + [{"failure": "timeout", "output_tokens": 5}])
    assert s == {"acceptance": 0.75, "tokens_per_pass": 5.0, "forced_share": 0.3}
    llama = [ok | {"spec": {"num_draft_tokens": 80, "num_accepted_draft_tokens": 60}}]
    # each pass samples one target token and keeps the accepted drafts before it
    assert bs.spec_counts(llama) == {
        "acceptance": 0.75,
        "tokens_per_pass": 2.5,
        "forced_share": None,
    }
