"""The project's own known-answer vectors (``vectors/*.json``) on both backends (the C path
on both kernel paths, SIMD and scalar), and their generator: regenerating them from the
reference changes nothing."""

from __future__ import annotations

import pytest
from c_paths import backend_fixture  # noqa: F401  (the backend fixture: both C paths and the reference)
from conftest import POLICY_NAMES, VECTORS_DIR, load_generator, load_vectors
from vector_runner import FORMAT, VERSION, VectorError, check_case

from scissorhands import errors

GENERATE = load_generator()
VECTORS = load_vectors()


def _cases() -> list[pytest.param]:
    params = []
    for doc in VECTORS.values():
        for case in doc["cases"]:
            params.append(pytest.param(doc["policy"], case, id=f"{doc['policy']}: {case['name']}"))
    return params


@pytest.mark.parametrize(("policy", "case"), _cases())
def test_vector(backend, policy, case):
    """Every step of one vector case gives its answer; every error leaves the state as it was."""
    check_case(backend.module, errors, policy, case)


def test_vector_files_are_well_formed():
    """Each file declares the format, version 1 and a known policy, with uniquely named cases."""
    assert sorted(doc["policy"] for doc in VECTORS.values()) == sorted(POLICY_NAMES)
    for file_name, doc in VECTORS.items():
        assert (doc["format"], doc["version"]) == (FORMAT, VERSION) == ("scissorhands-vectors", 1), file_name
        assert file_name == f"{doc['policy']}.json"
        names = [c["name"] for c in doc["cases"]]
        assert names and len(names) == len(set(names)), file_name


def test_every_answer_is_explicit():
    """Every step carries an expect or a raises, and every case a note saying why."""
    for doc in VECTORS.values():
        for case in doc["cases"]:
            assert case["note"], case["name"]
            assert "raises" in case or case["steps"], case["name"]
            for step in case["steps"]:
                assert ("expect" in step) != ("raises" in step), (case["name"], step)


def test_regenerating_changes_nothing():
    """Rebuilding the vectors in memory from the generator reproduces the committed files."""
    built = GENERATE.build()
    assert sorted(built) == sorted(p.name for p in VECTORS_DIR.glob("*.json"))
    for name, text in built.items():
        assert (VECTORS_DIR / name).read_text(encoding="utf-8") == text, f"{name} is stale"


def test_generator_refuses_a_wrong_hand_answer():
    """The generator's check rejects a case whose hand-written answer the reference contradicts."""
    from scissorhands import reference

    case = GENERATE.case("wrong", "deliberately wrong", [GENERATE.s("kept_count", expect=2)],
                         budget=3, recent_window=1)
    with pytest.raises(VectorError):
        check_case(reference, errors, "scissorhands", case)
