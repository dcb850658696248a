"""Policy objects across a process's life: ``repr`` of one whose constructor was refused,
on both backends.
"""

from __future__ import annotations

from typing import Any

import pytest
from conftest import POLICY_NAMES

from scissorhands.errors import ScissorhandsError
from scissorhands.options import SPECS


def _refused_selves(build: Any) -> list[object]:
    """The ``self`` of every frame a refused constructor call passed through (what
    ``--showlocals`` and debuggers render)."""
    with pytest.raises(ScissorhandsError) as info:
        build()
    found, tb = [], info.value.__traceback__
    while tb is not None:
        if "self" in tb.tb_frame.f_locals:
            found.append(tb.tb_frame.f_locals["self"])
        tb = tb.tb_next
    return found


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_repr_never_raises_for_a_policy_whose_constructor_was_refused(backend, name):
    """repr of a policy whose constructor was refused at its budget, an option or its
    heads (or never ran) names the class instead of raising AttributeError."""
    cls = backend.POLICIES[name]
    first = next((o.name for o in SPECS[name].options if o.protects), None)
    builds = [lambda: cls(budget=0), lambda: cls(budget=4, heads=0)]
    if first is not None:
        builds.append(lambda: cls(budget=4, **{first: 99}))
    objects: list[object] = [cls.__new__(cls)]
    for build in builds:
        objects += [o for o in _refused_selves(build) if isinstance(o, cls)]
    assert len(objects) > len(builds)  # each refusal left its part-built policy in a frame
    for obj in objects:
        assert repr(obj).startswith(f"{type(obj).__name__}(")
