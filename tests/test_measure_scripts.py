"""``scripts/steady_pass.py`` and ``scripts/decode_overhead.py``'s memory floor and argument checks: the
steady pass runs on a small shape and takes the steady step it times; both refuse bad arguments before any
work."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest

SCRIPTS = os.path.join(os.path.dirname(__file__), os.pardir, "scripts")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    """The steady-pass script run with ``args``, its output captured."""
    return subprocess.run([sys.executable, os.path.join(SCRIPTS, "steady_pass.py"), *args],
                          capture_output=True, text=True, timeout=300, check=False)


def test_the_steady_pass_script_times_the_steady_step_beside_its_floor():
    """A small shape runs to its one summary line: the step taken every time (else it exits non-zero)."""
    done = run("--batch", "1", "--held", "32", "--steps", "4")
    assert done.returncode == 0, done.stderr
    line = re.fullmatch(r"batch 1, 32 held, 90 rows: steady step ([0-9.]+) ms \(fastest ([0-9.]+) ms\) over 2 steps; "
                        r"memory floor ([0-9.]+) ms \(([0-9.]+)x\)\n", done.stdout)
    assert line is not None, done.stdout
    assert 0 < float(line[2]) <= float(line[1]) and float(line[3]) > 0


def test_the_steady_pass_script_times_the_pass_layer_by_layer_beside_the_one_call():
    """``--per-layer`` adds a second line: the same pass made one layer at a time, every step taken (else it
    exits non-zero), its ratio to the one call's time measured the same way."""
    done = run("--batch", "1", "--held", "32", "--steps", "4", "--per-layer")
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    assert first.startswith("batch 1, 32 held, 90 rows: steady step ")
    line = re.fullmatch(r"layer by layer, each call after its layer's weights were written: ([0-9.]+) ms \(fastest "
                        r"([0-9.]+) ms\) a step, ([0-9.]+)x the one call's ([0-9.]+) ms \(both measured inside C\)",
                        second)
    assert line is not None, second
    assert 0 < float(line[2]) <= float(line[1]) and float(line[4]) > 0
    ratio, per_layer, one_call = float(line[3]), float(line[1]), float(line[4])
    # The ratio of the two times, to the digits printed (ratio to 0.005, times to 0.0005 ms).
    assert abs(ratio * one_call - per_layer) <= 0.005 * one_call + 0.0005 * (1 + ratio)


@pytest.mark.parametrize(("args", "says"), [(["--held", "16"], "--held must be at least 17"),
                                            (["--steps", "2"], "--steps at least 3"),
                                            (["--batch", "0"], "--batch must be at least 1"),
                                            (["--held", "3000000"], "--batch 8 --held 3000000 needs about")])
def test_the_steady_pass_script_refuses_bad_arguments(args, says):
    """A held count below the recent window plus sinks, too few steps, no batch or arrays larger than half the
    machine's memory: argparse's error naming the value, before anything is allocated."""
    done = run(*args)
    assert done.returncode == 2 and says in done.stderr and done.stdout == ""


def test_the_memory_floor_grows_with_the_rows_it_reads():
    """decode_overhead's floor is positive and larger for eight sequences' rows than for one's."""
    sys.path.insert(0, SCRIPTS)
    try:
        from decode_overhead import floor_ms
    finally:
        sys.path.remove(SCRIPTS)
    config = SimpleNamespace(num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3)
    one, eight = floor_ms(config, 1, 1024), floor_ms(config, 8, 1024)
    assert 0 < one < eight


@pytest.mark.parametrize(("args", "says"), [
    (["--held", "200000", "--steps", "5"],
     r"must stay within SmolLM2-135M's trained context of 8192 positions .*, got 200000 \+ 8 \+ 5"),
    (["--held", "8180", "--steps", "5"], r"got 8180 \+ 8 \+ 5"),
    (["--batch", "100000"], r"--batch 100000 --held 2048 needs about [0-9.]+ GiB .* more than half of this machine's"),
    (["--batch", "0"], r"must be at least 1, got --steps 24 --repeats 2 --batch 0"),
    (["--repeats", "0", "--steps", "3"], r"must be at least 1, got --steps 3 --repeats 0 --batch 1"),
])
def test_the_decode_overhead_script_refuses_a_run_past_the_model_or_the_machine(args, says):
    """Positions past the model's trained context, keys, values and a chunk's attention larger than half the
    machine's memory, or no steps, repeats or sequences: argparse's error naming the values, before the model is
    loaded."""
    done = subprocess.run([sys.executable, os.path.join(SCRIPTS, "decode_overhead.py"), *args],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2 and done.stdout == ""
    assert re.search(says, done.stderr), done.stderr
