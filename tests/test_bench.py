"""The benchmark (``python -m bench``): its smoke run and JSON report, and its numpy baseline.

No timing is asserted anywhere: the figures depend on the machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import scissorhands

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # bench/ lives at the repository root, beside src/
    sys.path.insert(0, str(ROOT))

from bench.cases import CASES  # noqa: E402
from bench.numpy_policy import NUMPY_POLICIES  # noqa: E402

STAT_KEYS = {"median_ns", "q1_ns", "q3_ns", "min_ns", "max_ns", "repeats", "number"}
PARAMS = {"scissorhands": {"recent_window": 4}, "h2o": {"recent_window": 4}, "streaming-llm": {"sinks": 2}}


def _bench(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _assert_usage_error(err: str) -> None:
    """A refusal printed as argparse prints its own: the usage, then one error line under the program."""
    usage, sep, message = err.rpartition("\npython -m bench: error: ")
    assert sep and usage.startswith("usage: python -m bench ") and message.count("\n") == 1, err


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str]:
    path = tmp_path_factory.mktemp("bench") / "quick.json"
    proc = _bench("--quick", "--json", str(path))
    assert proc.returncode == 0, proc.stderr
    return json.loads(path.read_text()), proc.stdout


def test_quick_run_writes_the_report_shape(quick_report: tuple[dict, str]) -> None:
    """python -m bench --quick --json PATH runs every quick case and writes machine info, stats, ratios and targets."""
    report, _ = quick_report
    assert report["format"] == "scissorhands.bench" and report["version"] == 1 and report["quick"] is True
    machine = report["machine"]
    assert {"cpu_model", "logical_cores", "python", "numpy", "cffi", "scissorhands"} <= set(machine)
    assert machine["numpy"] == np.__version__ and machine["scissorhands"] == scissorhands.__version__
    names = [r["name"] for r in report["results"]]
    assert names == [c.name for c in CASES if c.quick]
    for r in report["results"]:
        if r["group"] in ("decode", "evict-one", "evict-bulk", "batch"):
            for impl in ("c", "c_raw", "noop", "numpy"):
                assert set(r["impls"][impl]) == STAT_KEYS, (r["name"], impl)
                assert r["impls"][impl]["repeats"] >= 2
            assert {"numpy/c", "c/noop", "c_raw/noop"} <= set(r["ratios"])
            assert r["ratios"]["numpy/c"] > 0 and "c_work_ns_per_slot" in r
        if r["group"] == "batch":
            assert {"separate/c", "c/bandwidth"} <= set(r["ratios"])
        if r["group"] == "serving":
            for impl in ("c", "c_raw", "noop", "numpy", "bandwidth"):
                assert set(r["impls"][impl]) == STAT_KEYS, (r["name"], impl)
            assert {"numpy/c", "c/bandwidth", "c_raw/bandwidth"} <= set(r["ratios"])
            assert r["impls_same_victims"] is True
        if r["group"].startswith("evict"):
            assert r["numpy_same_victims"] is True
    replays = [r for r in report["results"] if r["group"] == "replay"]
    assert {r["policy"] for r in replays} == {"scissorhands", "h2o", "streaming-llm"}
    assert all(r["same_metrics"] and 0 < r["impls"]["c"]["policy_share"] <= 1 for r in replays)
    memory = next(r for r in report["results"] if r["group"] == "memory")
    per_slot = {row["policy"]: row["c_bytes_per_slot"] for row in memory["rows"]}
    assert per_slot == {"scissorhands": 9, "h2o": 13, "streaming-llm": 4}
    assert all(t["met"] in (True, False, None) and t["target"] for t in report["targets"])
    named = " ".join(t["target"] for t in report["targets"])
    assert "single row at 8192" in named and "<= 3x the no-op cffi call" in named


def test_quick_run_prints_the_tables(quick_report: tuple[dict, str]) -> None:
    """The printed report has a table per case group, the targets and the total run time."""
    _, out = quick_report
    for title in ("== Decode step", "== Evict in the steady state", "== Evict in bulk", "== A layer's heads",
                  "== Serving shapes", "== decode-4096 replay", "== Memory", "== Where the Python API's time goes",
                  "== Targets"):
        assert title in out
    assert "Total run time" in out


def test_json_into_a_missing_directory_fails_before_the_bench_runs(tmp_path: Path) -> None:
    """python -m bench --json missing-dir/x.json exits 2 at once naming the path: no case runs."""
    for path in (tmp_path / "missing-dir" / "x.json", tmp_path):
        proc = _bench("--json", str(path), timeout=60)
        assert proc.returncode == 2 and f"--json {path}: " in proc.stderr, proc.stderr
        _assert_usage_error(proc.stderr)
        assert proc.stdout == "" and "[1/" not in proc.stderr and "Traceback" not in proc.stderr


def test_list_and_case_selection() -> None:
    """--list names every case; --case with an unknown name is a usage error."""
    listed = _bench("--list")
    assert listed.returncode == 0 and listed.stdout.split() == [c.name for c in CASES]
    bad = _bench("--case", "no-such-case")
    assert bad.returncode == 2 and "no case matches" in bad.stderr
    _assert_usage_error(bad.stderr)


@pytest.mark.parametrize("heads", [1, 3], ids=["one-head", "three-heads"])
@pytest.mark.parametrize("policy", sorted(NUMPY_POLICIES))
def test_numpy_baseline_picks_the_c_victims(policy: str, heads: int) -> None:
    """On random steps, split steps and bulk evictions (ties included) numpy evicts what the C path evicts."""
    rng = np.random.default_rng([heads, len(policy)])
    c = scissorhands.POLICIES[policy](budget=24, heads=heads, **PARAMS[policy])
    npo = NUMPY_POLICIES[policy](budget=24, heads=heads, **PARAMS[policy])
    for t in range(1, 800):
        n = c.kept_count()
        if rng.random() < 0.5:  # coarse weights: many equal votes and scores, so ties decide
            attn = rng.integers(0, 4, size=(heads, n)).astype(np.float32) / max(n, 1)
        else:
            attn = rng.exponential(size=(heads, n)).astype(np.float32)
            attn /= attn.sum(axis=1, keepdims=True)
        if rng.random() < 0.3:
            attn = attn.astype(np.float64)
        if heads == 1:
            attn = attn[0]
        if rng.random() < 0.15:
            budget = int(rng.integers(PARAMS[policy].get("recent_window", 2) + 1, 30))
            c.on_decode_step(t, attn)
            npo.on_decode_step(t, attn)
            got_c, got_np = c.evict(budget), npo.evict(budget)
        else:
            got_c, got_np = c.step(t, attn), npo.step(t, attn)
        assert np.array_equal(np.asarray(got_c), np.asarray(got_np)), (t, got_c, got_np)
        assert np.array_equal(c.kept, npo.kept)
    score = {"scissorhands": "votes", "h2o": "scores"}.get(policy)
    if score is not None:
        assert np.array_equal(getattr(c, score), npo.scores_array)


def test_numpy_baseline_validates_weights() -> None:
    """The numpy baseline does the C path's validation work: NaN, inf and negative weights are refused."""
    npo = NUMPY_POLICIES["scissorhands"](budget=8, recent_window=2)
    for bad in (np.nan, np.inf, -0.5):
        with pytest.raises(ValueError):
            npo.on_decode_step(1, np.array([bad], dtype=np.float32))
    assert npo.kept_count() == 1


def test_serving_case_times_the_threaded_call(tmp_path: Path) -> None:
    """A serving case over a model's rows (256 x 4096) also times the call on two threads and
    checks that every implementation evicts the same positions."""
    path = tmp_path / "serving.json"
    proc = _bench("--quick", "--case", "serving/scissorhands/256x4096", "--json", str(path))
    assert proc.returncode == 0, proc.stderr
    (r,) = json.loads(path.read_text())["results"]
    assert r["threads"] == 2 and set(r["impls"]["c_threads"]) == STAT_KEYS
    assert r["ratios"]["c/c_threads"] > 0 and r["impls_same_victims"] is True
