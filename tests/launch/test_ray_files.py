"""cluster.checkpoint_files: which trainer ranks' checkpoint files go through the driver (the decision;
the files' journey through Ray is tests/launch/test_ray_nodes.py's three-node run and its resume on one
node)."""

from pathlib import Path

import pytest

from trivium.launch.ray_cluster import ClusterError
from trivium.launch.ray_files import Visibility, routes, sees

NAMES = ["grpo/rank-0", "grpo/rank-1"]
FOLDER = Path("/runs/r/checkpoints/grpo")


def test_auto_sends_only_the_ranks_that_do_not_see_the_run_folder():
    seen = [(True, "10.0.0.1"), (False, "10.0.0.2")]
    assert routes("auto", seen, NAMES, FOLDER, "save") == [False, True]
    assert routes("auto", [(True, "a"), (True, "b")], NAMES, FOLDER, "save") == [False, False]
    assert routes("driver", [(True, "a"), (True, "b")], NAMES, FOLDER, "save") == [True, True]


def test_shared_with_a_rank_that_does_not_see_the_folder_names_it_and_the_way_out():
    with pytest.raises(ClusterError) as caught:
        routes("shared", [(True, "10.0.0.1"), (False, "10.0.0.2")], NAMES, FOLDER, "first checkpoint")
    message = str(caught.value)
    assert "grpo/rank-1 (node 10.0.0.2)" in message and "grpo/rank-0" not in message
    assert str(FOLDER) in message and "checked before the first checkpoint" in message
    assert "cluster.checkpoint_files: auto (or driver)" in message


def test_the_visibility_marker_is_seen_at_its_path_and_removed_after(tmp_path):
    check = Visibility(tmp_path / "checkpoints" / "grpo")  # created if missing
    with check.written() as marker:
        assert sees(str(check.folder), marker)
        assert not sees(str(tmp_path / "elsewhere"), marker)
    assert not sees(str(check.folder), marker) and list(check.folder.iterdir()) == []
