"""How a Ray cluster's nodes become the layout's, a worker's planned positions its node's cores,
and the Ray settings' checks: pure parts, no cluster."""

import pytest

from ggbatch.runner.config.schema import build_config
from ggbatch.runner.errors import ConfigError
from ggbatch.runner.plan.nodes import nodes_from_ray
from ggbatch.workers.ray_actor import own_cores


def test_nodes_from_ray_keeps_live_nodes_with_cpus_head_first():
    infos = [
        {"NodeID": "b" * 56, "Alive": True, "NodeManagerAddress": "10.0.0.2",
         "Resources": {"CPU": 16.0, "memory": 64 * 2**30}},
        {"NodeID": "a" * 56, "Alive": True, "NodeManagerAddress": "10.0.0.9",
         "Resources": {"CPU": 2.0, "memory": 8 * 2**30, "node:__internal_head__": 1.0}},
        {"NodeID": "c" * 56, "Alive": False, "NodeManagerAddress": "10.0.0.3", "Resources": {"CPU": 16.0}},
        {"NodeID": "d" * 56, "Alive": True, "NodeManagerAddress": "10.0.0.4", "Resources": {"GPU": 1.0}},
    ]
    nodes = nodes_from_ray(infos)
    assert [n.ip for n in nodes] == ["10.0.0.9", "10.0.0.2"]
    assert nodes[1].cores == tuple(range(16)) and nodes[1].memory == 64 * 2**30


def test_a_worker_maps_its_planned_positions_onto_its_node_usable_cores():
    assert own_cores((0, 1), [4, 5, 6, 7]) == (4, 5)
    assert own_cores((2, 3), [7, 6, 5, 4]) == (6, 7)
    assert own_cores((2,), [3, 9]) == (3,)  # Ray counted more CPUs than the process may use: wraps


def test_ray_settings_are_checked():
    base = {"model": "m.gguf", "input": "q.jsonl", "output": "a.json"}
    config = build_config([("t", {**base, "backend": "ray", "ray_address": "10.0.0.1:6379"})])
    assert config.ray_address == "10.0.0.1:6379"
    with pytest.raises(ConfigError, match="backend: must be local or ray"):
        build_config([("t", {**base, "backend": "spark"})])
    with pytest.raises(ConfigError, match="ray_address: must be auto or HOST:PORT"):
        build_config([("t", {**base, "backend": "ray", "ray_address": "10.0.0.1"})])
    # its host:port looks like one; ray.init would say only `Invalid address format`
    with pytest.raises(ConfigError, match=r"^t: ray_address: is a Ray Client \(ray://\) address, which ggbatch "
                                          "does not join: give the head's HOST:PORT"):
        build_config([("t", {**base, "backend": "ray", "ray_address": "ray://10.0.0.1:10001"})])
    with pytest.raises(ConfigError, match="ray_address: auto is for backend: ray"):
        build_config([("t", {**base, "ray_address": "auto"})])
