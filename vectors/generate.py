"""Generate the known-answer vectors in this directory from the pure-Python reference.

    python vectors/generate.py          # rewrite vectors/*.json
    python vectors/generate.py --check  # exit 1 if a committed file would change

Each scenario below is written by hand together with the answer it must give: every
step that returns something carries a hand-written ``expect`` (or ``raises``), and the
generator refuses to write a file when :mod:`scissorhands.reference` disagrees with a
hand-written answer.  The files therefore hold two independent statements of the
semantics that agree.  The format is described in ``vectors/README.md``.

The interpreter that replays a vector step (``tests/vector_runner.py``) is the tests'
own; the generator uses it too, so the two read the format in exactly one way.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))  # the scenarios, vector_cases/
import vector_cases  # noqa: E402
from vector_cases.observed import observed_cases  # noqa: E402
from vector_cases.writing import case, s  # noqa: E402, F401  (the tests write cases with them)
from vector_runner import FORMAT, VERSION, VectorError, check_case  # noqa: E402


def scenarios() -> dict[str, Callable[[], list[dict[str, Any]]]]:
    """Registry name -> its cases, from every module of ``vector_cases/`` that names a
    policy (``POLICY``, ``cases()``); the shared modules name none.  One module per
    vector file: a new policy's cases are its own module, listed nowhere else."""
    found: dict[str, Callable[[], list[dict[str, Any]]]] = {}
    for info in sorted(pkgutil.iter_modules(vector_cases.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"vector_cases.{info.name}")
        policy = getattr(module, "POLICY", None)
        if policy is not None:
            if policy in found:
                raise VectorError(f"vector_cases.{info.name}: a second module for {policy!r}")
            found[policy] = module.cases
    return found


# --------------------------------------------------------------------------------------
# Checking the hand-written answers against the reference, and writing.
# --------------------------------------------------------------------------------------


def build() -> dict[str, str]:
    """Every vector file's text, keyed by file name, after checking it on the reference."""
    from scissorhands import errors, reference

    files = {}
    for policy, cases_of in scenarios().items():
        cases = cases_of() + observed_cases(policy)
        names = [c["name"] for c in cases]
        if len(set(names)) != len(names):
            raise VectorError(f"{policy}: case names are not unique")
        for c in cases:
            check_case(reference, errors, policy, c)
        doc = {"format": FORMAT, "version": VERSION, "policy": policy,
               "generator": "vectors/generate.py", "cases": cases}
        files[f"{policy}.json"] = dump(doc)
    return files


def dump(doc: dict[str, Any]) -> str:
    """The vector file's text: one line per field and per step, so diffs stay readable."""
    def one(value: Any) -> str:
        return json.dumps(value, allow_nan=False)

    head = [f" {one(k)}: {one(v)}" for k, v in doc.items() if k != "cases"]
    cases = []
    for c in doc["cases"]:
        fields = [f"   {one(k)}: {one(v)}" for k, v in c.items() if k != "steps"]
        steps = ",\n".join(f"    {one(step)}" for step in c["steps"])
        fields.append('   "steps": [' + (f"\n{steps}\n   ]" if steps else "]"))
        cases.append("  {\n" + ",\n".join(fields) + "\n  }")
    body = ",\n".join(head + [' "cases": [\n' + ",\n".join(cases) + "\n ]"])
    text = "{\n" + body + "\n}\n"
    if json.loads(text) != json.loads(json.dumps(doc)):  # the layout must change nothing
        raise VectorError("dump() changed the data")
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="do not write; exit 1 if a committed file would change")
    opts = parser.parse_args(argv)
    stale = []
    for name, text in build().items():
        path = HERE / name
        if opts.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print("out of date: " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
