"""Every example config passes validation (files that a make_data script or an earlier run creates are not
required to exist here)."""

from pathlib import Path

import pytest

from trivium.validation import load_config

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").rglob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.parent.name + "/" + p.name for p in EXAMPLES])
def test_example_config_is_valid(path, plugin_registries):
    assert load_config(path, check_files=False).stages
