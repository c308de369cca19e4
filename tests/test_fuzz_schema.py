"""Schemathesis against the proxy's own OpenAPI schema: no generated request may get a 5xx.

Bounded (positive + negative cases per operation) so it stays a few seconds in the default suite.
The route matches every model, so well-formed cases really go through LiteLLM to the fake backend.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import schemathesis
from conftest import route_config
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

CASES_PER_MODE = 40
KEY = "fuzz-key"


@pytest.fixture
def proxy(make_proxy, backend, tmp_path):
    raw = route_config(backend.api_base, tmp_path / "fuzz")
    raw["routes"][0]["model"] = "*"  # every generated model string reaches the backend
    raw["auth"] = {"keys": [KEY]}
    return make_proxy(raw=raw)


def _operations(proxy: Any) -> list[Any]:
    schema = schemathesis.openapi.from_url(f"{proxy.url}/openapi.json", headers={"authorization": f"Bearer {KEY}"})
    ops = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in ops} >= {"/v1/chat/completions", "/v1/models", "/health", "/metrics"}
    return ops


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["positive", "negative"])
def test_no_generated_request_gets_a_5xx(proxy, mode):
    failures: list[str] = []
    statuses: Counter[int] = Counter()
    for op in _operations(proxy):

        @settings(
            max_examples=CASES_PER_MODE,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=op.as_strategy(generation_mode=mode))
        def run(case: Any) -> None:
            resp = case.call(base_url=proxy.url, headers={"authorization": f"Bearer {KEY}"}, timeout=30)
            statuses[resp.status_code] += 1
            if resp.status_code >= 500:
                failures.append(
                    f"{op.method.upper()} {op.path} → {resp.status_code}: {resp.text[:300]}\n  body={case.body!r:.300}"
                )

        try:
            run()
        except Unsatisfiable:  # negative mode: an operation without inputs has nothing to break
            assert mode is GenerationMode.NEGATIVE and not op.body and not op.query
    print(f"{mode.value}: {dict(sorted(statuses.items()))}")
    assert not failures, "\n".join(failures[:10])
