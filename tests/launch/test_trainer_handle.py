"""The one trainer contract the loops use (``TrainerHandle``) and the one fan-out of a multi-rank stage
(``FanOutTrainer``), which ``ranks.LeaderTrainer`` and ``ray_trainer.RayTrainer`` share (issue 28 item 4)."""

from pathlib import Path

import pytest

from trivium.launch.ranks import LeaderTrainer
from trivium.launch.ray_trainer import RayTrainer
from trivium.launch.trainer_handle import COLLECTIVE, FanOutTrainer, TrainerHandle
from trivium.trainer.trainer import Trainer

CALLS = [
    name for name in vars(TrainerHandle) if not name.startswith("_") and callable(vars(TrainerHandle)[name])
]


@pytest.mark.parametrize("cls", [Trainer, LeaderTrainer, RayTrainer])
def test_every_trainer_the_loops_see_answers_the_whole_contract(cls):
    assert set(CALLS) == {"train_step", "export_weights", "save_model", "load_state_dict", "state_dict"}
    missing = [name for name in CALLS if not callable(getattr(cls, name, None))]
    assert not missing, f"{cls.__name__} lacks {missing}"


def test_both_multi_rank_trainers_fan_out_the_same_calls():
    assert issubclass(LeaderTrainer, FanOutTrainer) and issubclass(RayTrainer, FanOutTrainer)
    assert set(COLLECTIVE) <= set(RayTrainer.COMMANDS)


class Recorded(FanOutTrainer):
    def __init__(self):
        self.sent = []

    def _everywhere(self, command, *args):
        self.sent.append((command, args))
        return {"loss": 1.0} if command == "train_step" else None


def test_a_fan_out_sends_each_collective_call_once_and_keeps_the_driver_state_home():
    trainer = Recorded()
    assert trainer.train_step(iter([1, 2])) == {"loss": 1.0}
    trainer.export_weights(None)
    trainer.save_model("out")
    trainer.load_state_dict({"step": 3, "optim": {}, "resume": {"k": 1}, "rng": [0]}, Path("ckpt"))
    assert trainer.sent == [
        ("train_step", ([1, 2],)),  # an iterator is sent as a list
        ("export_weights", (None,)),
        ("save_model", (Path("out"),)),
        ("load_state_dict", ({"step": 3, "optim": {}}, Path("ckpt"))),  # no resume point, no RNGs
    ]


@pytest.mark.parametrize(
    "cls", ["trivium.explorer.explorer:Explorer", "trivium.launch.ray_explorer:RemoteExplorer"]
)
def test_every_explorer_the_loops_see_answers_the_whole_contract(cls):
    """The explorer's side of the placement seam (``placement.ExplorerHandle``)."""
    from trivium.launch.placement import ExplorerHandle
    from trivium.registry import import_object

    calls = [n for n, v in vars(ExplorerHandle).items() if not n.startswith("_") and callable(v)]
    assert set(calls) == {"explore_step", "evaluate", "state_dict", "load_state_dict", "in_flight"}
    found = import_object(cls, "explorer")
    assert not [n for n in calls if not callable(getattr(found, n, None))]
