"""The seed system's shared vectors (``../shared/conformance``), replayed on both backends.

The seed names its calls in camelCase and its parameters ``recentWindow``/``sinks``;
this maps them onto the Python API and checks every ``expect``.
"""

from __future__ import annotations

from typing import Any

import pytest
from conftest import load_conformance

FILES = {
    "scissorhands": "scissorhands.vectors.json",
    "h2o": "h2o.vectors.json",
    "streaming-llm": "streaming-llm.vectors.json",
}
CALLS = {
    "onDecodeStep": "on_decode_step",
    "evict": "evict",
    "keptCount": "kept_count",
    "votesOf": "votes_of",
    "scoreOf": "score_of",
    "sinkCount": "sink_count",
}
PARAMS = {"budget": "budget", "recentWindow": "recent_window", "sinks": "sinks"}


def _cases() -> list[Any]:
    params = []
    for policy, file_name in FILES.items():
        doc = load_conformance(file_name)
        if doc.get("version") != 1 or doc.get("policy") != f"kv-cache/{policy}":
            raise ValueError(f"{file_name}: unexpected format (version/policy changed)")
        if not doc["cases"]:
            raise ValueError(f"{file_name}: no cases")
        for case in doc["cases"]:
            params.append(pytest.param(policy, case, id=f"{policy}: {case['name']}"))
    return params


CASES = _cases()


@pytest.mark.parametrize(("policy", "case"), CASES)
def test_seed_vector(backend, policy, case):
    """The policy reproduces every expectation of one seed conformance case."""
    cls = backend.POLICIES[policy]
    p = cls(**{PARAMS[k]: v for k, v in case["params"].items()}, rng=case.get("seed"))
    checked = 0
    for i, step in enumerate(case["steps"]):
        result = getattr(p, CALLS[step["call"]])(*step["args"])
        if "expect" in step:
            assert result == step["expect"], f"step {i}: {step}"
            checked += 1
    assert checked > 0


def test_every_seed_call_is_mapped():
    """No seed call name goes unmapped (a new one would otherwise raise KeyError late)."""
    seen = {step["call"] for p in CASES for step in p.values[1]["steps"]}
    assert seen <= set(CALLS)


def test_the_skip_without_the_shared_folder_says_what_is_missing_and_what_still_runs(monkeypatch, tmp_path):
    """Without ../shared the skip names the folder as outside the clone and says the project's own vectors run."""
    import conftest

    monkeypatch.setattr(conftest, "SHARED_CONFORMANCE", tmp_path / "absent")
    with pytest.raises(pytest.skip.Exception, match=r"beside the clone, not in it.*project's own vectors"):
        conftest.load_conformance("trace-prefix.json")
