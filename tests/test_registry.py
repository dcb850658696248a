"""The registry: each policy declared once, by its ``PolicySpec``, and every table built
from it (both backends' classes, the C kind, bytes per slot, the score key, plot style,
the harness's names, the tests' own lists)."""

from __future__ import annotations

import importlib
import sys

import conftest
import pytest
from conftest import BACKENDS, POLICY_NAMES, load_backend

from scissorhands import _native
from scissorhands._shared import memory_bytes
from scissorhands.commands.harness import _policy_name
from scissorhands.errors import ScissorhandsError
from scissorhands.options import RECOMMENDED, SPECS, policy_classes

NAMES = tuple(SPECS)


def test_the_registry_lists_each_policy_once_in_table_order():
    """SPECS keys are the specs' names, the tests iterate exactly them, full first."""
    assert all(spec.name == name for name, spec in SPECS.items())
    assert POLICY_NAMES == NAMES and NAMES[0] == "full"
    assert len({s.class_name for s in SPECS.values()}) == len(SPECS)


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_each_backend_registry_is_the_classes_the_specs_name(backend_name):
    """Both backends' POLICIES map each registry name to the class the spec names, whose
    ``name`` is that registry name, in the registry's order."""
    registry = policy_classes(backend_name)
    backend = load_backend(backend_name)
    assert list(registry) == list(NAMES)
    for name, spec in SPECS.items():
        cls = registry[name]
        assert cls.__name__ == spec.class_name and cls.name == name
        assert getattr(backend, spec.class_name) is cls


@pytest.mark.parametrize("name", NAMES)
def test_the_native_class_lives_in_the_module_its_spec_names(name):
    """The C-backed class is defined in ``scissorhands.policies.<module>``."""
    spec = SPECS[name]
    module = importlib.import_module(f"scissorhands.policies.{spec.module}")
    assert getattr(module, spec.class_name) is policy_classes("native")[name]


@pytest.mark.parametrize("name", NAMES)
def test_each_policy_module_declares_its_spec(name):
    """The registry's spec of each policy is the ``SPEC`` of its module in
    scissorhands.policies, the module it names."""
    spec = SPECS[name]
    assert importlib.import_module(f"scissorhands.policies.{spec.module}").SPEC is spec


def test_the_registry_is_discovered_in_order_with_the_model_commands_defaults():
    """SPECS is every public policy module's SPEC, by ascending ``order``, with the names
    and order the tables always had; MODEL_POLICIES are those with ``model_runs``, all but
    the latest-attention policy."""
    from scissorhands import _registry
    from scissorhands.options import MODEL_POLICIES

    assert _registry.discover() == SPECS
    assert NAMES == ("full", "streaming-llm", "h2o", "tova", "scissorhands")
    orders = [spec.order for spec in SPECS.values()]
    assert orders == sorted(orders) and len(set(orders)) == len(orders)
    assert tuple(n for n, spec in SPECS.items() if spec.model_runs) == MODEL_POLICIES
    assert MODEL_POLICIES == ("full", "streaming-llm", "h2o", "scissorhands")


def test_a_new_policy_module_is_found_without_editing_the_registry(tmp_path, monkeypatch):
    """``discover`` finds the SPEC of every module not starting with ``_`` of a package,
    ordered by ``order`` rather than by file name, and refuses a module without one."""
    from scissorhands import _registry

    package = tmp_path / "fake_policies"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "_shared_bits.py").write_text("X = 1\n")
    spec_line = "from scissorhands._policy_spec import PolicySpec\nSPEC = PolicySpec({!r}, {!r}, (), order={})\n"
    (package / "alpha.py").write_text(spec_line.format("alpha", "Alpha", 20))
    (package / "zeta.py").write_text(spec_line.format("zeta", "Zeta", 10))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert list(_registry.discover("fake_policies")) == ["zeta", "alpha"]
    (package / "omega.py").write_text("Y = 2\n")
    importlib.invalidate_caches()
    with pytest.raises(ScissorhandsError, match="omega declares no SPEC"):
        _registry.discover("fake_policies")
    for name in [m for m in sys.modules if m.split(".")[0] == "fake_policies"]:
        monkeypatch.delitem(sys.modules, name)


def test_the_documented_policies_keep_the_designs_bytes_per_slot():
    """The design's bytes per slot: 9 Scissorhands, 13 H2O and TOVA, 4 StreamingLLM and Full."""
    assert {n: SPECS[n].slot_bytes for n in ("scissorhands", "h2o", "tova", "streaming-llm", "full")} == {
        "scissorhands": 9, "h2o": 13, "tova": 13, "streaming-llm": 4, "full": 4}


def test_each_policy_has_its_own_c_kind():
    """Every spec names a distinct ``sh_kind`` constant of the C header."""
    kinds = [getattr(_native.lib, s.kind) for s in SPECS.values()]
    assert len(set(kinds)) == len(kinds)


@pytest.mark.parametrize("name", NAMES)
def test_the_c_object_has_the_spec_kind_and_slot_bytes(name):
    """The native object is built with the spec's kind and stores its bytes per slot."""
    p = conftest.make_policy(load_backend("native"), name)
    assert p._kind == getattr(_native.lib, SPECS[name].kind)
    assert _native.lib.sh_policy_slot_bytes(p._ptr) == SPECS[name].slot_bytes


@pytest.mark.parametrize("name", NAMES)
def test_memory_bytes_follows_the_spec_slot_bytes_in_both_backends(backend, name):
    """A fresh policy (options off) reports 64 + capacity * the spec's bytes per slot."""
    p = conftest.make_policy(backend, name, budget=10, heads=1)
    capacity = 64 if not SPECS[name].evicts else 11
    assert p.memory_bytes() == memory_bytes(capacity, 1, SPECS[name].slot_bytes)


@pytest.mark.parametrize("name", NAMES)
def test_the_score_key_is_the_state_key_and_the_property(backend, name):
    """A state carries the spec's score key exactly when it has one, and the class reads
    it as a property of that name."""
    p = conftest.make_policy(backend, name)
    key = SPECS[name].score_key
    state = p.state_dict()
    assert ({"votes", "scores"} & set(state)) == ({key} if key else set())
    if key:
        assert list(getattr(p, key)) == state[key][0]


@pytest.mark.parametrize("name", NAMES)
def test_the_harness_names_a_duck_typed_policy_by_its_class_name(name):
    """An object without ``name`` whose class is called like a registry class is reported
    under that registry name."""
    stand_in = type(SPECS[name].class_name, (), {})()
    assert _policy_name(stand_in) == name


def test_evicting_policies_have_their_own_plot_style():
    """Each evicting policy has a colour and a marker no other has; the full cache none
    (it is drawn as a line of its own)."""
    evicting = [s for s in SPECS.values() if s.evicts]
    assert all(s.colour and s.marker for s in evicting)
    assert len({s.colour for s in evicting}) == len({s.marker for s in evicting}) == len(evicting)
    assert all(not s.colour and not s.marker for s in SPECS.values() if not s.evicts)


def test_a_hindsight_configuration_is_not_dressed_as_the_full_cache():
    """HindsightConfig is named ``hindsight`` (no registry policy), evicts, and reads no
    attention through its own property, which the cache asks instead of the registry."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import numpy as np

    from scissorhands import hf
    from scissorhands.hindsight import hindsight_schedule

    schedule = hindsight_schedule(np.full((1, 6, 6), 0.2), [3], window=2, prompt_tokens=2)[3]
    config = hf.HindsightConfig.of(schedule, backend="reference")
    assert (config.policy, config.evicts, config.reads_attention, config.pooled) == ("hindsight", True, False, False)
    assert config.policy not in SPECS
    assert hf.PolicyConfig("h2o", 8).reads_attention and not hf.PolicyConfig("streaming-llm", 8).reads_attention


def test_flag_help_names_the_policies_and_defaults_from_the_registry(monkeypatch):
    """Each flag's help lists the policies taking its option and their defaults as the
    registry declares them (nothing per policy is written in the help strings); with the
    five documented policies it is the help as it always read."""
    from scissorhands import _registry
    from scissorhands.options import OPTIONS, RECENT_WINDOW, SINKS, flag_help

    documented = ("full", "streaming-llm", "h2o", "tova", "scissorhands")
    monkeypatch.setattr(_registry, "SPECS", {n: SPECS[n] for n in documented})
    assert flag_help(RECENT_WINDOW, False).startswith("recent window of h2o, tova and scissorhands:")
    assert "(default: each policy's own, h2o and scissorhands 32, tova 1; tova needs at least 1)" \
        in flag_help(RECENT_WINDOW, True)
    assert flag_help(SINKS, False).endswith(
        "(default: each policy's own, streaming-llm 4, h2o, tova and scissorhands 0)")
    assert all("{" not in flag_help(o, True) for o in OPTIONS)


def test_the_tasks_grid_is_built_from_the_registry_under_its_published_names():
    """tasks' configurations: each policy in registry order, then each other prompt-aware one as +pa,
    then the recommendation under its preset's name, the names outputs and docs use."""
    from scissorhands.commands.retrieval.driver import CONFIGS
    from scissorhands.prompt_aware import PROMPT_AWARE_POLICIES

    assert [name for name in CONFIGS if name in SPECS] == list(NAMES)
    assert [name for name in CONFIGS if name.endswith("+pa")] == [f"{n}+pa" for n in PROMPT_AWARE_POLICIES
                                                                  if n != RECOMMENDED.policy]
    if NAMES == ("full", "streaming-llm", "h2o", "tova", "scissorhands"):
        assert list(CONFIGS) == ["full", "streaming-llm", "h2o", "tova", "scissorhands", "scissorhands-seed",
                                 "h2o+pa", "tova+pa", "recommended", "recommended+archive"]
    assert all(CONFIGS[name] == (name, {}) for name in NAMES if name != "scissorhands")
    assert CONFIGS["scissorhands"] == ("scissorhands", {"recent_window": "0.75x", "sinks": 4})
    assert CONFIGS["recommended"] == (RECOMMENDED.policy, {**RECOMMENDED.values, "prompt_aware": True})
