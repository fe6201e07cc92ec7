"""``Registry(builtins=...)``: the modules that fill a registry are imported on its first use, once, so the
module defining a registry never imports them (issue 28: no import circle between a registry and its parts)."""

import subprocess
import sys
import threading

import pytest

from trivium.registry import Registry


@pytest.fixture
def parts_module(tmp_path, monkeypatch):
    """A module ``builtin_parts_N`` on the import path that registers ``double`` in ``REG`` when imported."""
    monkeypatch.syspath_prepend(str(tmp_path))
    made = []

    def make(body="REG.register('double')(lambda x: 2 * x)\n"):
        name = f"builtin_parts_{len(made)}_{id(tmp_path)}"
        (tmp_path / f"{name}.py").write_text(f"import {__name__} as here\nREG = here.CURRENT\n{body}")
        made.append(name)
        return name

    yield make
    for name in made:
        sys.modules.pop(name, None)


CURRENT: Registry | None = None


def registry(*modules):
    global CURRENT
    CURRENT = Registry("test part", builtins=modules)
    return CURRENT


def test_builtins_are_imported_on_first_use_once(parts_module):
    name = parts_module()
    reg = registry(name)
    assert name not in sys.modules  # made, nothing imported
    assert reg.get("double")(4) == 8 and name in sys.modules
    assert reg.names() == ["double"] and "double" in reg


def test_a_part_that_takes_a_builtins_name_is_refused_at_once(parts_module):
    reg = registry(parts_module())
    with pytest.raises(ValueError, match="'double' is already registered"):
        reg.register("double")(lambda x: x)


def test_a_failed_builtin_import_is_raised_and_tried_again(parts_module):
    name = parts_module("raise RuntimeError('no gymnasium here')\n")
    reg = registry(name)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="no gymnasium"):
            reg.names()


def test_threads_wait_for_the_first_load(parts_module):
    name = parts_module("import time\ntime.sleep(0.3)\nREG.register('double')(lambda x: 2 * x)\n")
    reg = registry(name)
    seen = []
    threads = [threading.Thread(target=lambda: seen.append(reg.names())) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == [["double"]] * 4


def test_a_snapshot_keeps_the_builtins(parts_module):
    reg = registry(parts_module())
    with reg.snapshot():
        reg.register("triple")(lambda x: 3 * x)
    assert reg.names() == ["double"]


def test_every_seam_finds_its_builtins_in_a_fresh_process():
    """Each registry of the package, asked first thing in a new interpreter, lists its built-in parts."""
    code = (
        "from trivium.algorithm.registry import ADVANTAGE_FNS, POLICY_LOSS_FNS, KL_FNS, AGGREGATIONS\n"
        "from trivium.envs.base import ENVIRONMENTS\n"
        "from trivium.sync.protocol import SYNC_METHODS\n"
        "from trivium.workflows.registry import WORKFLOWS\n"
        "from trivium.buffer.operators import EXPERIENCE_OPS\n"
        "assert {'grpo', 'gae', 'on_policy_distill', 'rloo'} <= set(ADVANTAGE_FNS.names()), ADVANTAGE_FNS.names()\n"
        "assert {'ppo_clip', 'gspo', 'chord', 'rec'} <= set(POLICY_LOSS_FNS.names()), POLICY_LOSS_FNS.names()\n"
        "assert 'k3' in KL_FNS and AGGREGATIONS.names()\n"
        "assert {'frozenlake', 'calculator', 'tools'} <= set(ENVIRONMENTS.names())\n"
        "assert set(SYNC_METHODS.names()) == {'memory', 'checkpoint', 'collective'}\n"
        "assert {'math', 'openai_agent', 'multi_turn', 'code'} <= set(WORKFLOWS.names()), WORKFLOWS.names()\n"
        "assert 'ruler' in EXPERIENCE_OPS\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
