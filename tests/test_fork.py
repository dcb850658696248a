"""Policy objects across a process's life: ``repr`` of one whose constructor was refused,
``os.fork`` while another thread holds a policy's lock, and ``spawn`` (pickling) on both
backends.

A fork runs in a subprocess with a timeout, so a child that hangs fails the test instead
of hanging the suite.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest
from conftest import POLICY_NAMES, make_policy

from scissorhands.errors import ScissorhandsError
from scissorhands.options import BACKENDS, SPECS


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


_FORK_CHILD = textwrap.dedent("""
    import os, sys, threading
    import numpy as np
    from scissorhands.options import BACKENDS, SPECS
    import scissorhands, scissorhands.reference

    modules = {"native": scissorhands, "reference": scissorhands.reference}
    for backend in BACKENDS:
        first = [o.name for o in SPECS[sys.argv[1]].options if o.protects][:1]
        policy = modules[backend].POLICIES[sys.argv[1]](budget=4, heads=1, **dict.fromkeys(first, 1))
        for pos in range(1, 6):
            policy.step(pos, np.linspace(1.0, 2.0, policy.kept_count()))
        held, release = threading.Event(), threading.Event()

        def hold():
            with policy._lock:  # another thread inside a policy call at the fork
                held.set()
                release.wait()

        thread = threading.Thread(target=hold)
        thread.start()
        held.wait()
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: the holder thread does not exist here
            out = policy.step(6, np.linspace(1.0, 2.0, policy.kept_count()))
            os.write(write, repr((out, policy.kept_count(), repr(policy))).encode())
            os._exit(0)
        os.close(write)
        child = b""
        while chunk := os.read(read, 4096):
            child += chunk
        _, status = os.waitpid(pid, 0)
        release.set()
        thread.join()
        assert os.waitstatus_to_exitcode(status) == 0, status
        out = policy.step(6, np.linspace(1.0, 2.0, policy.kept_count()))
        mine = repr((out, policy.kept_count(), repr(policy)))
        assert child.decode() == mine, (backend, child.decode(), mine)
    print("ok")
""")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
@pytest.mark.parametrize("name", POLICY_NAMES)
def test_a_forked_child_steps_a_policy_whose_lock_another_thread_held(name):
    """After os.fork while another thread holds a policy's lock, the child's next step()
    runs (its lock made anew) and decides as the parent's does (both backends; a hang
    fails at the timeout)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    try:
        done = subprocess.run([sys.executable, "-c", _FORK_CHILD, name], capture_output=True, text=True,
                              timeout=30, env=env, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail("the forked child's step() hung on the lock another thread held at the fork")
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def _step_in_worker(policy: Any) -> tuple[Any, dict[str, Any]]:
    """A spawned worker's step of a policy it received by pickle."""
    out = policy.step(6, np.linspace(1.0, 2.0, policy.kept_count()))
    return out, policy.state_dict()


def test_a_spawned_worker_steps_a_pickled_policy_as_the_parent_does():
    """spawn (pickling the policy into a fresh interpreter) keeps working with the fork
    hook in place: the worker's step and state equal the parent's, both backends."""
    policies = []
    for backend in BACKENDS:
        from conftest import load_backend

        policy = make_policy(load_backend(backend), "h2o", budget=4, protected=1)
        for pos in range(1, 6):
            policy.step(pos, np.linspace(1.0, 2.0, policy.kept_count()))
        policies.append(policy)
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        theirs = pool.map(_step_in_worker, policies, chunksize=1)
    for policy, (out, state) in zip(policies, theirs, strict=True):
        assert out == policy.step(6, np.linspace(1.0, 2.0, policy.kept_count()))
        assert state == policy.state_dict()
