"""``python -m scissorhands``: the replay table, JSON, plot, exit codes and the eval/record arguments."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from scissorhands.commands.cli import build_parser, main
from scissorhands.commands.traces import save_recorded_trace
from scissorhands.options import POLICY_NAMES

FAST = ["--no-progress", "--budgets", "256"]


def _refusal(err, command):
    """The message of a user error printed as argparse prints its own: ``command``'s
    usage, then one line ``scissorhands <command>: error: <message>`` (nothing else)."""
    usage, sep, message = err.rpartition(f"\nscissorhands {command}: error: ")
    assert sep and usage.startswith(f"usage: scissorhands {command} ") and "error:" not in usage, err
    assert message.count("\n") == 1 and message.endswith("\n") and "Traceback" not in err, err
    return message[:-1]


def test_replay_prints_published_numbers(capsys):
    """The default subcommand prints an aligned table with Scissorhands' published figures."""
    assert main(["--policies", "scissorhands,full", *FAST]) == 0
    out = capsys.readouterr().out
    assert out.startswith("decode-4096 (seed 7): 4095 decode steps, native backend")
    row = next(line for line in out.splitlines() if line.startswith("scissorhands"))
    assert row.split()[-6:-2] == ["256", "0.641318", "0.882339", "3840"]
    lines = out.splitlines()
    assert len(lines[1]) == len(lines[2].rstrip())  # header as wide as the rule
    assert main(["replay", "--policies", "scissorhands,full", *FAST]) == 0
    again = capsys.readouterr().out.splitlines()
    assert again[:3] == lines[:3] and again[3].split()[:-2] == lines[3].split()[:-2]


def test_json_shape(tmp_path, capsys):
    """--json writes format/version/backend/trace/budgets/results rows with the metrics."""
    path = tmp_path / "r.json"
    argv = ["--policies", "full,streaming-llm,scissorhands", "--recent-window", "32", "64",
            "--backend", "reference", "--json", str(path), *FAST]
    assert main(argv) == 0
    capsys.readouterr()
    data = json.loads(path.read_text())
    assert (data["format"], data["version"], data["backend"]) == ("scissorhands.replay", 1, "reference")
    assert data["trace"] == {"name": "decode-4096", "kind": "synthetic", "seed": 7,
                             "num_positions": 4096, "steps": 4095, "streams": 1}
    assert data["budgets"] == [256]
    keys = [(r["policy"], r["params"], r["budget"]) for r in data["results"]]
    assert keys == [("full", {}, None), ("streaming-llm", {"sinks": 4}, 256),
                    ("scissorhands", {"recent_window": 32}, 256),
                    ("scissorhands", {"recent_window": 64}, 256)]
    row = data["results"][2]
    assert set(row) == {"policy", "params", "budget", "retained_mass", "heavy_hitter_recall",
                        "eviction_calls", "steps", "policy_seconds"}
    assert (row["retained_mass"], row["heavy_hitter_recall"]) == (0.641318, 0.882339)


def test_plot_written(tmp_path, capsys):
    """--plot draws a PNG (two panels: retained mass and recall against budget)."""
    pytest.importorskip("matplotlib")
    path = tmp_path / "r.png"
    argv = ["--policies", "full,h2o,scissorhands", "--budgets", "256", "512", "--no-progress",
            "--plot", str(path)]
    assert main(argv) == 0
    capsys.readouterr()
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib(tmp_path, monkeypatch, capsys):
    """Without matplotlib, --plot fails up front with exit 2 and says how to install it."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["--plot", str(tmp_path / "x.png"), *FAST]) == 2
    err = capsys.readouterr().err
    assert _refusal(err, "replay") == "--plot needs matplotlib: pip install 'scissorhands[plot]'"


def test_unknown_policy_is_a_usage_error(capsys):
    """An unknown policy name exits 2 with the list of valid names."""
    assert main(["--policies", "scissorhands,lru"]) == 2
    assert f"unknown policy 'lru'; choose from {', '.join(POLICY_NAMES)}" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--budgets", "0"], ["--budgets", "x"], ["--backend", "gpu"],
                                  ["--recent-window", "-1"], ["nonsense"]])
def test_bad_arguments_exit_2(argv, capsys):
    """Malformed arguments are argparse usage errors (exit 2)."""
    assert main(argv) == 2
    assert "usage:" in capsys.readouterr().err


def test_invalid_configuration_exits_2_on_one_line(capsys):
    """A budget not above the recent window exits 2 with a one-line message, no traceback."""
    assert main(["--policies", "scissorhands", "--budgets", "16", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert _refusal(err, "replay").startswith("scissorhands (recent window 32) at budget 16:")


def test_missing_trace_file_exits_2(tmp_path, capsys):
    """A --trace path that does not exist exits 2 naming the flag and the path."""
    assert main(["--trace", str(tmp_path / "none.npz"), "--no-progress"]) == 2
    assert f"--trace {tmp_path / 'none.npz'}: no such file" in capsys.readouterr().err


def test_recorded_trace_mean_and_worst(tmp_path, capsys):
    """With --trace every (layer, KV head) stream is replayed; rows give the mean and the worst."""
    rng = np.random.default_rng(0)
    steps = []
    for t in range(1, 100):
        w = rng.random((3, t)) ** 8
        steps.append(w / w.sum(axis=1, keepdims=True))
    trace = tmp_path / "t.npz"
    save_recorded_trace(trace, steps, layers=[0, 1, 1], heads=[0, 0, 1], prompt_tokens=8, model="tiny")
    out_json = tmp_path / "t.json"
    assert main(["--trace", str(trace), "--policies", "h2o,full", "--recent-window", "8",
                 "--no-progress", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("t.npz: 3 streams (layers 0-1, KV heads 0-1), 99 decode steps")
    assert "mass worst" in out
    data = json.loads(out_json.read_text())
    assert data["budgets"] == [12, 25, 50]  # N/8, N/4, N/2 of N = 100 positions
    row = data["results"][0]
    assert len(row["streams"]) == 3 and row["policy"] == "h2o"
    masses = [s["retained_mass"] for s in row["streams"]]
    assert row["worst_retained_mass"] == min(masses)
    assert abs(row["retained_mass"] - sum(masses) / 3) < 1e-6
    worst = row["worst_retained_mass_stream"]
    where = [(s["layer"], s["head"]) for s in row["streams"]].index((worst["layer"], worst["head"]))
    assert masses[where] == min(masses)


def test_eval_and_record_namespaces():
    """eval and record parse into the attribute names scissorhands.commands.evaluate reads."""
    parser = build_parser()
    ev = parser.parse_args(["eval"])
    assert vars(ev) == {
        "command": "eval", "no_progress": False, "policies": None,
        "budgets": None, "recent_window": None, "sinks": None, "backend": "native", "json": None,
        "plot": None, "tokens": 512, "prompt_tokens": None, "text": None, "model": None,
        "head_mode": "per-head", "history_window": None, "vote_rate": None, "pool": None, "hindsight": None,
        "cache_mode": "reuse",
        "attention": "eager", "threads": 1,
    }
    ev = parser.parse_args(["eval", "--tokens", "2048", "--budgets", "409", "204", "--recent-window",
                            "32", "204", "--sinks", "4", "0", "--head-mode", "mean", "--text", "t.txt"])
    assert (ev.tokens, ev.budgets, ev.recent_window, ev.sinks, ev.head_mode, ev.text) == (
        2048, [409, 204], [32, 204], [4, 0], "mean", "t.txt")
    rec = parser.parse_args(["record", "--layers", "0", "5", "29", "--out", "x.npz"])
    assert vars(rec) == {
        "command": "record", "no_progress": False, "tokens": 512, "prompt_tokens": None, "text": None,
        "model": None, "layers": [0, 5, 29], "out": "x.npz", "attention": "eager", "threads": 1,
    }


def test_generate_takes_one_value_per_option_and_the_prompt_after_it(monkeypatch, capsys):
    """generate runs one configuration: each option flag takes exactly one value, so a
    prompt after it stays the prompt, and the help does not promise a sweep."""
    from scissorhands.commands import generate

    gen = build_parser().parse_args(["generate", "--recent-window", "75%", "--sinks", "4", "Name a planet."])
    assert gen.prompt == "Name a planet."
    assert (gen.recent_window, gen.sinks, gen.history_window) == ("75%", 4, None)
    requests = []
    monkeypatch.setattr(generate, "run_generate", lambda request, usage=None: requests.append(request) or 0)
    assert main(["generate", "--recent-window", "75%", "--vote-rate", "on", "hello"]) == 0
    assert requests[0].values == {"recent_window": "75%", "vote_rate": True}
    assert requests[0].prompt == "hello"
    assert (requests[0].policy, requests[0].budget, requests[0].budget_defaulted) == ("recommended", 512, True)
    assert main(["generate", "--help"]) == 0
    out = capsys.readouterr().out
    assert "several values" not in out and "runs both" not in out
    assert main(["eval", "--help"]) == 0
    assert "several values run each" in capsys.readouterr().out


def test_eval_and_record_dispatch(monkeypatch):
    """eval and record call scissorhands.commands.evaluate.run_eval / run_record with their requests
    and return their status."""
    from scissorhands.commands import evaluate

    calls = []
    monkeypatch.setattr(evaluate, "run_eval", lambda request: calls.append(("eval", request.tokens)) or 0)
    monkeypatch.setattr(evaluate, "run_record", lambda request: calls.append(("record", request.out)) or 3)
    assert main(["eval", "--tokens", "64", "--no-progress"]) == 0
    assert main(["record", "--out", "o.npz"]) == 3
    assert calls == [("eval", 64), ("record", "o.npz")]


def test_help_exits_0(capsys):
    """--help at the top level and per subcommand exits 0."""
    for argv in (["--help"], ["replay", "--help"], ["eval", "--help"], ["record", "--help"]):
        assert main(argv) == 0
    assert "{replay,eval,record,report,generate,longctx,tasks}" in capsys.readouterr().out


def test_python_dash_m(tmp_path):
    """python -m scissorhands runs as a program and exits with main's status."""
    done = subprocess.run(
        [sys.executable, "-m", "scissorhands", "--policies", "streaming-llm", "--budgets", "512",
         "--no-progress"],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "0.786153" in done.stdout
    bad = subprocess.run([sys.executable, "-m", "scissorhands", "--policies", "lru"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2


# ---------------------------------------------------------------- report


def _eval_doc(sha, source, results, tokens=2048):
    """A minimal 'eval --json' document with a full-cache run of perplexity 10."""
    return {
        "format": "scissorhands.eval", "version": 1,
        "config": {"tokens": tokens, "prompt_tokens": 64, "head_mode": "per-head",
                   "text": {"source": source, "token_ids_sha256": sha},
                   "model": {"path": "/models/m.gguf"}},
        "results": [{"policy": "full", "budget": None, "perplexity": 10.0}, *results],
    }


def _result(policy, budget, ppl, **config):
    return {"policy": policy, "budget": budget, "perplexity": ppl, **config}


def _write(tmp_path, name, doc):
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


def test_report_combines_eval_files(tmp_path, capsys):
    """Files on the same text share columns; rows are ordered by policy and options; each
    cell is the perplexity and its change against that text's full cache."""
    a = _eval_doc("aa", "pydoc_data.topics (Python standard library)", [
        _result("scissorhands", 256, 12.5, recent_window=128, recent_window_spec="50%", sinks=4,
                history_window=None, vote_rate=True),
        _result("streaming-llm", 256, 13.0, sinks=4),
        _result("scissorhands", 409, 11.0, recent_window=32, sinks=None, history_window=None)])
    b = _eval_doc("bb", "/data/devil.txt", [
        _result("h2o", 256, 10.5, recent_window=192, recent_window_spec="75%", sinks=4)])
    c = _eval_doc("aa", "pydoc_data.topics (Python standard library)", [
        _result("scissorhands", 256, 12.0, recent_window=128, recent_window_spec="50%", sinks=4,
                history_window=None)])
    files = [_write(tmp_path, n, d) for n, d in (("a.json", a), ("b.json", b), ("c.json", c))]
    plot = tmp_path / "report.png"
    assert main(["report", *files, "--plot", str(plot)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["configuration", "pydoc_data.topics", "@256", "pydoc_data.topics",
                                "@409", "devil.txt", "@256"]
    rows = {line[:33].strip(): line[33:].split("  ") for line in lines[2:]}
    assert [line[:33].strip() for line in lines[2:]] == [
        "full cache", "streaming-llm sinks=4", "h2o rw=75% sinks=4", "scissorhands rw=32 sinks=0",
        "scissorhands rw=50% sinks=4", "scissorhands rw=50% sinks=4 rate"]
    cells = {k: [c.strip() for c in v if c.strip()] for k, v in rows.items()}
    assert cells["full cache"] == ["10.000", "10.000", "10.000"]
    assert cells["scissorhands rw=50% sinks=4 rate"] == ["12.500 (+25.0%)", "-", "-"]
    assert cells["scissorhands rw=32 sinks=0"] == ["-", "11.000 (+10.0%)", "-"]
    assert cells["h2o rw=75% sinks=4"] == ["-", "-", "10.500 (+5.0%)"]
    assert plot.stat().st_size > 0


def test_report_markdown_bolds_the_best_of_each_column(tmp_path, capsys):
    doc = _eval_doc("aa", "t.txt", [
        _result("streaming-llm", 256, 13.0, sinks=4),
        _result("h2o", 256, 12.0, recent_window=32, sinks=0)])
    assert main(["report", _write(tmp_path, "a.json", doc), "--markdown"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == ["| configuration | t.txt @256 |", "|---|---|"]
    assert out[3] == "| streaming-llm sinks=4 | 13.000 (+30.0%) |"
    assert out[4] == "| h2o rw=32 sinks=0 | **12.000 (+20.0%)** |"


def test_report_notes_a_configuration_measured_twice_differently(tmp_path, capsys):
    first = _eval_doc("aa", "t.txt", [_result("streaming-llm", 256, 13.0, sinks=4)])
    second = _eval_doc("aa", "t.txt", [_result("streaming-llm", 256, 13.5, sinks=4)])
    files = [_write(tmp_path, "1.json", first), _write(tmp_path, "2.json", second)]
    assert main(["report", *files]) == 0
    out = capsys.readouterr().out
    assert "13.000 (+30.0%)" in out and "13.500" not in out.split("note:")[0]
    assert "note: streaming-llm sinks=4 at 256 on t.txt: 13.500000 in file 2 differs" in out


@pytest.mark.parametrize("change", [
    "tokens", "scored", "format", "version", "no full", "not json", "zero ppl", "nan ppl",
    "str budget", "float budget", "bad spec", "config list", "model null", "only full"])
def test_report_refuses_files_that_do_not_compare(tmp_path, capsys, change):
    """Other tokens or scored positions (or prompt, head mode, model), a file that is not
    an eval result or has a malformed field, or nothing but full-cache runs: one error
    line and exit 2, never a traceback."""
    run = _result("streaming-llm", 256, 13.0, sinks=4)
    first = _eval_doc("aa", "t.txt", [] if change == "only full" else [run])
    second = _eval_doc("bb", "u.txt", [dict(run)], tokens=512 if change == "tokens" else 2048)
    r = second["results"]
    if change == "scored":
        first["config"]["scored_positions"], second["config"]["scored_positions"] = [409, 2047], [102, 2047]
    elif change == "format":
        second["format"] = "scissorhands.replay"
    elif change == "version":
        second["version"] = 99
    elif change == "no full":
        del r[0]
    elif change == "zero ppl":
        r[1]["perplexity"] = 0
    elif change == "nan ppl":
        r[0]["perplexity"] = float("nan")
    elif change == "str budget":
        r[1]["budget"] = "abc"
    elif change == "float budget":
        r[1]["budget"] = 256.9
    elif change == "bad spec":
        r[1].update(policy="h2o", recent_window=8, recent_window_spec="abc%", sinks=0)
    elif change == "config list":
        second["config"] = []
    elif change == "model null":
        second["config"]["model"] = None
        second["config"]["tokens"] = 1
    elif change == "only full":
        del r[1]
    path = _write(tmp_path, "2.json", second)
    if change == "not json":
        (tmp_path / "2.json").write_text("{")
    assert main(["report", _write(tmp_path, "1.json", first), path, "--plot",
                 str(tmp_path / "p.png")]) == 2
    err = capsys.readouterr().err
    _refusal(err, "report")
    assert not (tmp_path / "p.png").exists()
    if change == "format":
        assert path in err


def test_report_refuses_eval_and_longctx_files_together(tmp_path, capsys):
    """An eval file and a longctx file in one report: one error naming both."""
    run = _result("streaming-llm", 256, 13.0, sinks=4)
    evaluated = _write(tmp_path, "e.json", _eval_doc("aa", "t.txt", [run]))
    long = _write(tmp_path, "l.json", {"format": "scissorhands.longctx", "version": 1})
    assert main(["report", evaluated, long]) == 2
    err = capsys.readouterr().err
    message = _refusal(err, "report")
    assert evaluated in message and long in message


def test_report_merges_spellings_of_one_window(tmp_path, capsys):
    """50% and 0.5x are the same window: one row."""
    a = _eval_doc("aa", "t.txt", [_result("h2o", 256, 12.0, recent_window=128,
                                          recent_window_spec="50%", sinks=4)])
    b = _eval_doc("aa", "t.txt", [_result("h2o", 409, 11.0, recent_window=204,
                                          recent_window_spec="0.5x", sinks=4)])
    assert main(["report", _write(tmp_path, "a.json", a), _write(tmp_path, "b.json", b)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:3] for line in lines[3:]] == [["h2o", "rw=50%", "sinks=4"]]


def test_replay_runs_a_window_given_twice_once(capsys):
    """50%, 0.5x and 128 are one recent window at budget 256: one row, not three."""
    assert main(["--policies", "scissorhands", "--recent-window", "50%", "0.5x", "128", *FAST]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("scissorhands")]
    assert len(rows) == 1 and "recent window 128" in rows[0]


def test_a_bare_fraction_for_the_recent_window_says_how_to_write_one(capsys):
    """--recent-window 0.75 (the Python API's spelling) is refused with the spellings the
    command line takes."""
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["eval", "--recent-window", "0.75"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "'0.75' is not an integer" in err and "0.75x" in err


def test_eval_refuses_a_missing_text_before_importing_torch():
    """A missing --text is reported before the transformers layer (torch) is imported."""
    code = ("import sys; from scissorhands.commands.cli import main; "
            "rc = main(['eval', '--text', 'missing-text.txt', '--no-progress']); print(rc, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.stdout.split() == ["2", "False"], (done.stdout, done.stderr)
    assert "--text missing-text.txt" in done.stderr


def test_report_orders_pools_given_as_rows_and_as_scopes():
    """Rows per pool and named scopes sort together (rows first, then layer, model)."""
    from scissorhands.commands.report import _report_order

    base = {"policy": "scissorhands", "budget": 8, "recent_window": 2, "sinks": 0, "history_window": None,
            "vote_rate": False}
    keys = [_report_order({**base, "pool": p}) for p in ("model", 1, "layer", 3)]
    assert sorted(range(4), key=lambda i: keys[i]) == [1, 3, 2, 0]


# ----------------------------------------------------------------------------- paths before work


def _path_cases(tmp):
    """(argv, message) for every command and flag taking a path: each refused at once."""
    empty, blank, latin, short = tmp / "empty.txt", tmp / "blank.txt", tmp / "latin.txt", tmp / "short.txt"
    short.write_text("A few words of text.")
    empty.write_text("")
    blank.write_text(" \n\t\n")
    latin.write_bytes("caf\xe9".encode("latin-1"))
    pickled = tmp / "pickled.npz"
    pickled.write_bytes(b"\x80\x04K\x01.")  # a pickle: np.load would offer allow_pickle=True
    missing, folder = tmp / "missing-dir" / "x", tmp
    cases = []
    for command in ("eval", "longctx"):
        cases += [([command, "--json", f"{missing}.json"], f"--json {missing}.json: the directory"),
                  ([command, "--plot", f"{missing}.png"], f"--plot {missing}.png: the directory"),
                  ([command, "--plot", str(tmp / "x.nosuchformat")], "not 'nosuchformat'")]
    for command in ("eval", "record", "longctx"):
        cases += [([command, "--text", str(empty)], f"--text {empty}: the file is empty"),
                  ([command, "--text", str(blank)], f"--text {blank}: the file holds only whitespace"),
                  ([command, "--text", str(latin)], f"--text {latin}: not UTF-8 text"),
                  ([command, "--text", str(folder)], f"--text {folder}: a directory, not a file"),
                  ([command, "--text", str(short)], f"--text {short}: 20 bytes cannot hold")]
    cases += [
        (["record", "--out", f"{missing}.npz"], f"--out {missing}.npz: the directory"),
        (["record", "--out", str(folder)], f"--out {folder}: a directory, not a file"),
        (["replay", "--json", f"{missing}.json"], f"--json {missing}.json: the directory"),
        (["replay", "--plot", f"{missing}.png"], f"--plot {missing}.png: the directory"),
        (["replay", "--trace", f"{missing}.npz"], f"--trace {missing}.npz: no such file"),
        (["replay", "--trace", str(folder)], f"--trace {folder}: a directory, not a file"),
        (["replay", "--trace", str(pickled)], f"{pickled}: not a recorded trace"),
        (["report", f"{missing}.json"], f"{missing}.json: no such file"),
        (["report", str(folder)], f"{folder}: a directory, not a file"),
        (["report", str(latin)], f"cannot read {latin}"),
        (["generate", "--file", f"{missing}.txt"], f"--file {missing}.txt: no such file"),
        (["generate", "--file", str(folder)], f"--file {folder}: a directory, not a file"),
        (["generate", "--file", str(latin)], f"--file {latin}: not UTF-8 text"),
    ]
    return cases


def test_every_path_is_checked_before_any_work(tmp_path):
    """Each command's input and output paths (--json, --plot, --out, --text, --trace,
    --file, report's files) are refused at once: exit 2, one line naming the flag and
    the path, nothing on stdout, no NumPy advice, and before torch (the model) is
    imported."""
    pytest.importorskip("matplotlib")
    report = tmp_path / "ok.json"
    cases = _path_cases(tmp_path)
    code = ("import contextlib, io, json, sys; from scissorhands.commands.cli import main\n"
            "out = []\n"
            f"for argv in {[argv for argv, _ in cases]!r}:\n"
            "    err, std = io.StringIO(), io.StringIO()\n"
            "    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(std):\n"
            "        rc = main([*argv, '--no-progress'] if argv[0] != 'report' else argv)\n"
            "    out.append([rc, err.getvalue(), std.getvalue(), 'torch' in sys.modules])\n"
            f"open({str(report)!r}, 'w').write(json.dumps(out))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    for (argv, message), (rc, err, out, torch_loaded) in zip(cases, json.loads(report.read_text())):
        assert rc == 2 and message in err, (argv, err)
        assert out == "" and "Traceback" not in err and "allow_pickle" not in err, (argv, err)
        assert not torch_loaded, argv
        assert message in _refusal(err, argv[0]), (argv, err)  # usage, then the message, under the command


@pytest.mark.parametrize("command, argv, message", [
    ("replay", ["--trace", "{missing}.npz"], "--trace {missing}.npz: no such file"),
    ("eval", ["--text", "{missing}.txt"], "--text {missing}.txt: no such file"),
    ("record", ["--out", "{missing}.npz"], "--out {missing}.npz: the directory {parent} does not exist"),
    ("longctx", ["--json", "{missing}.json"], "--json {missing}.json: the directory {parent} does not exist"),
    ("report", ["{missing}.json"], "{missing}.json: no such file"),
    ("generate", ["--file", "{missing}.txt"], "--file {missing}.txt: no such file"),
])
def test_each_command_prints_its_own_checks_as_argparse_prints_its_errors(command, argv, message, tmp_path,
                                                                          capsys):
    """A value refused by the command's own check (before any model loads) prints the
    usage argparse prints for that command, then ``scissorhands <command>: error:``, exit 2."""
    names = {"missing": tmp_path / "missing-dir" / "x", "parent": tmp_path / "missing-dir"}
    argv = [command, *[a.format(**names) for a in argv], *([] if command == "report" else ["--no-progress"])]
    assert main([*argv, "--no-such-flag"]) == 2
    own = capsys.readouterr().err
    assert _refusal(own, command) == "unrecognized arguments: --no-such-flag"
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert _refusal(err, command) == message.format(**names)
    assert err.partition(f"scissorhands {command}: error: ")[0] == own.partition(f"scissorhands {command}: error: ")[0]


def test_a_failure_of_the_system_exits_1_on_one_line_under_the_command(monkeypatch, capsys):
    """An OSError during a run (a full disk) is not a usage error: exit 1, one line under
    ``scissorhands <command>:``, no usage."""
    from scissorhands.commands import replay

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(replay, "run_replay", full_disk)
    assert main(["replay", *FAST]) == 1
    assert capsys.readouterr().err == "scissorhands replay: error: [Errno 28] No space left on device\n"


def test_a_trace_holding_object_arrays_is_refused_without_numpy_advice(tmp_path, capsys):
    """A .npz whose arrays are pickled objects: one line saying so, exit 2, never
    NumPy's advice to pass allow_pickle."""
    steps = [np.full((1, t), 1.0 / t) for t in range(1, 20)]
    good = tmp_path / "good.npz"
    save_recorded_trace(good, steps, layers=[0], heads=[0], prompt_tokens=2, model="m")
    with np.load(good) as data:
        fields = dict(data)
    fields["weights"] = np.array([{"a": 1}], dtype=object)
    np.savez(tmp_path / "objects.npz", **fields)
    (tmp_path / "cut.npz").write_bytes(good.read_bytes()[:200])
    for name, reason in (("objects.npz", "pickled (object) data, which is never loaded"),
                         ("cut.npz", "not a readable recorded trace")):
        assert main(["replay", "--trace", str(tmp_path / name), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert reason in _refusal(err, "replay") and "allow_pickle" not in err, err


def test_replay_plot_in_a_missing_directory_is_refused_before_the_replay(tmp_path, capsys):
    """--plot (and --json) into a missing directory stops before any replay is run."""
    pytest.importorskip("matplotlib")
    assert main(["--plot", str(tmp_path / "nowhere" / "r.png"), *FAST]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "the directory" in captured.err


def test_generate_chat_flags():
    """generate: the chat template by default (None: when the tokenizer has one),
    --chat forces it, --no-chat and --raw send the prompt as written, not both."""
    parse = build_parser().parse_args
    assert parse(["generate", "x"]).chat is None
    assert parse(["generate", "--chat", "x"]).chat is True
    assert parse(["generate", "--no-chat", "x"]).chat is False
    assert parse(["generate", "--raw", "x"]).chat is False
    with pytest.raises(SystemExit) as exc:
        parse(["generate", "--chat", "--no-chat", "x"])
    assert exc.value.code == 2


def test_generate_summary_counts_one_token_in_the_singular():
    """The summary line says "1 token" for one generated token and for a one-token prompt,
    and the plural for other counts."""
    from scissorhands.commands.generate import _summary

    class Held:  # what the summary reads of a cache
        def get_seq_length(self) -> int:
            return 2

        def held_counts(self) -> np.ndarray:
            return np.array([2])

        def kv_bytes(self, positions: int) -> int:
            return 1024 * positions

    one = _summary(Held(), 1, 1, 0.0, 1.0, [0.5])
    assert one.startswith("1 token in 1.0 s: the first after 0.50 s (prompt of 1 token), then -;"), one
    many = _summary(Held(), 3, 7, 0.0, 2.0, [0.5])
    assert many.startswith("3 tokens in 2.0 s: the first after 0.50 s (prompt of 7 tokens), then 1.3 tokens/s;"), many


def test_help_lists_the_lm_eval_command_line_with_the_recommendation():
    """python -m scissorhands --help names python -m scissorhands.commands.retrieval (lm-eval's own command
    line), run with the recommendation by name."""
    text = build_parser().format_help()
    assert "python -m scissorhands.commands.retrieval --model scissorhands" in text
    assert "--model_args policy=recommended,budget=128" in text
