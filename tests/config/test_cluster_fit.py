"""validation/cluster_fit.py: whether a stage's Ray actors fit a cluster (pure: totals and nodes given);
the Ray runs and check-config against real clusters are in tests/launch/test_ray_nodes.py."""

import pytest

from trivium.config.schema_run import ActorResources
from trivium.validation.cluster_fit import Request, describe, misfits

GIB = 2**30
NODES = [
    {"CPU": 1.0, "memory": 8 * GIB, "node:10.0.0.1": 1.0, "driver_node": 1.0},
    {"CPU": 4.0, "GPU": 2.0, "memory": 32 * GIB, "trainer_node": 2.0},
]
TOTAL = {"CPU": 5.0, "GPU": 2.0, "memory": 40 * GIB, "driver_node": 1.0, "trainer_node": 2.0}


def request(field, count, **resources):
    return Request(field, ActorResources(**resources), count)


def test_requests_that_fit_the_totals_and_a_node_each_pass():
    fits = [
        request("cluster.engine", 2, num_cpus=0.5),
        request("cluster.trainer_rank", 2, num_cpus=1, num_gpus=1, resources={"trainer_node": 1}),
    ]
    assert misfits(fits, TOTAL, NODES) == []


def test_one_actor_larger_than_every_node_names_its_field():
    m, over_total = misfits([request("cluster.trainer_rank", 1, num_gpus=4)], TOTAL, NODES)
    assert over_total.message.startswith("the run asks for 4 GPU in all")
    assert m.field == "cluster.trainer_rank"
    assert m.message.startswith("each actor asks for 4 GPU, but no node of the cluster has that much")
    assert (
        "(the largest has 2 GPU; the cluster: 5 CPU, 2 GPU, 40.0 GiB memory, 1 driver_node, 2 trainer_node)"
        in (m.message)
    )


def test_the_sum_over_the_requests_is_checked_and_named_by_parts():
    found = misfits(
        [request("cluster.engine", 4, num_cpus=1), request("cluster.trainer_rank", 4, num_cpus=0.5)],
        TOTAL,
        NODES,
        where="the cluster at 10.0.0.1:6379",
    )
    assert [m.field for m in found] == ["cluster.trainer_rank"]
    assert found[0].message.startswith(
        "the run asks for 6 CPU in all (cluster.engine 4 x 1 CPU, cluster.trainer_rank 4 x 0.5 CPU), the "
        "cluster at 10.0.0.1:6379 has 5 CPU (5 CPU, 2 GPU, 40.0 GiB memory"
    )


def test_a_custom_resource_no_node_has_is_a_misfit_of_its_own_field():
    found = misfits([request("cluster.engine", 1, resources={"rollout_node": 1})], TOTAL, NODES)
    assert [(m.field, m.message.split(",")[0]) for m in found] == [
        ("cluster.engine", "each actor asks for 1 rollout_node"),
        ("cluster.engine", "the run asks for 1 rollout_node in all (cluster.engine 1 x 1 rollout_node)"),
    ]


def test_describe_leaves_out_what_ray_adds_per_node():
    assert describe(NODES[0]) == "1 CPU, 8.0 GiB memory, 1 driver_node"


@pytest.mark.parametrize("name", ["CPU", "GPU", "memory", "object_store_memory"])
def test_the_built_in_resources_are_not_custom(name):
    with pytest.raises(ValueError, match="is set by num_cpus / num_gpus / memory_gb"):
        ActorResources(resources={name: 1})
