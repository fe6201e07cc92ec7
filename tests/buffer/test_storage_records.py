import dataclasses
import math

import pytest
import torch

from trivium.buffer.storage import StorageError, experience_to_record, record_to_experience
from trivium.types import Experience


def rich_experience() -> Experience:
    tokens = torch.arange(100, 112, dtype=torch.long)
    mask = torch.tensor([True, False, True, True, False, True, True, True], dtype=torch.bool)
    return Experience(
        tokens=tokens,
        prompt_length=4,
        action_mask=mask,
        logprobs=torch.randn(8, dtype=torch.float32) * mask,
        reward=-0.1 + 1e-9,
        task_id="задача:7 🚀",
        group_id=2**40,
        run_index=3,
        model_version=12,
        explore_step=5,
        is_expert=True,
        info={"response": 'x² = 4 ⇒ x = ±2\n"quoted"\x00', "turns": [{"role": "tool", "ok": None}]},
        metrics={"accuracy": 1.0, "len": 8.0, "nan": float("nan")},
    )


def assert_same(a: Experience, b: Experience) -> None:
    for f in dataclasses.fields(Experience):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y), f.name
        elif f.name == "metrics":
            assert x.keys() == y.keys()
            assert all(x[k] == y[k] or (math.isnan(x[k]) and math.isnan(y[k])) for k in x)
        else:
            assert x == y and type(x) is type(y), f.name


def test_round_trip_is_lossless():
    e = rich_experience()
    assert_same(record_to_experience(experience_to_record(e)), e)


def test_round_trip_keeps_other_dtypes_views_and_empty_responses():
    base = torch.arange(20)
    e = Experience(
        tokens=base[::2],  # a non-contiguous view of a larger tensor
        prompt_length=10,
        action_mask=torch.zeros(0, dtype=torch.bool),
        logprobs=torch.zeros(0, dtype=torch.bfloat16),
    )
    back = record_to_experience(experience_to_record(e))
    assert_same(back, e)
    assert back.logprobs.dtype == torch.bfloat16


def test_tuples_in_info_come_back_as_lists():
    e = rich_experience().replace(info={"pair": (1, 2)})
    assert record_to_experience(experience_to_record(e)).info == {"pair": [1, 2]}


@pytest.mark.parametrize(
    ("info", "named"),
    [({"scores": [0.5, torch.tensor(1.0)]}, "info['scores'][1]"), ({"by_turn": {3: "x"}}, "key 3")],
)
def test_values_json_cannot_hold_are_refused_naming_the_key(info, named):
    with pytest.raises(StorageError, match=r"Experience\.info") as error:
        experience_to_record(rich_experience().replace(info=info))
    assert named in str(error.value) and "задача:7" in str(error.value)


def test_records_from_another_version_are_refused_clearly():
    record = experience_to_record(rich_experience())
    with pytest.raises(StorageError, match="row 9 has format 2"):
        record_to_experience({**record, "format": 2}, where="row 9")
    with pytest.raises(StorageError, match=r"fields \['critic_values'\].*newer"):
        record_to_experience({**record, "fields": {**record["fields"], "critic_values": 1}})
    with pytest.raises(StorageError, match="damaged"):
        record_to_experience({**record, "tensors": b"junk"})
