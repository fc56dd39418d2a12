"""cluster.yaml (for `ray up`) passes Ray's own cluster-config validation and opens nothing to the world."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

CLUSTER_YAML = Path(__file__).resolve().parent.parent / "cluster.yaml"
WORLD = ("0.0.0.0/0", "::/0")


@pytest.fixture(scope="module")
def config() -> dict:
    return yaml.safe_load(CLUSTER_YAML.read_text())


def test_passes_rays_validator(config: dict):
    from ray.autoscaler._private.util import prepare_config, validate_config

    # What `ray up` does before touching the cloud: merge the provider's defaults, then validate
    # against Ray's JSON schema and its cross-field rules (head type, min/max workers, ...).
    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    assert prepared["provider"]["type"] == "aws"
    assert prepared["head_node_type"] in prepared["available_node_types"]


def test_raw_file_matches_rays_schema(config: dict):
    import json

    import jsonschema
    import ray.autoscaler

    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    jsonschema.validate(config, schema)  # the file as written, before defaults are merged


def test_layout_head_cpu_and_autoscaled_gpu_workers(config: dict):
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    assert head["node_config"]["InstanceType"].startswith("m5.")
    workers = {k: v for k, v in types.items() if k != config["head_node_type"]}
    assert workers, "at least one worker type"
    for spec in workers.values():
        assert spec["min_workers"] == 0 and spec["max_workers"] >= 1  # autoscaled from zero
        assert spec["node_config"]["InstanceType"].startswith(("g5.", "p4d.", "p5."))
    assert any("pip install" in c and "-e /home/ubuntu/lmtune" in c for c in config["setup_commands"])
    assert any("torch==" in c for c in config["setup_commands"])
    assert config["file_mounts"]["/home/ubuntu/lmtune"] == "."
    assert "/home/ubuntu/lmtune/data" in config["file_mounts"]


def _ingress_rules(config: dict) -> list[dict]:
    rules = list(config["provider"].get("security_group", {}).get("IpPermissions", []))
    for spec in config["available_node_types"].values():
        rules += spec["node_config"].get("SecurityGroupRules", [])
    return rules


def test_no_port_open_to_the_world(config: dict):
    for rule in _ingress_rules(config):
        cidrs = [r.get("CidrIp") for r in rule.get("IpRanges", [])] + \
                [r.get("CidrIpv6") for r in rule.get("Ipv6Ranges", [])]
        assert not set(cidrs) & set(WORLD), f"ingress rule open to the world: {rule}"
    # Anywhere in the file, not only where we looked: no world CIDR at all (comments aside).
    text = yaml.safe_dump(config)
    assert not any(w in text for w in WORLD)
    # Ray's AWS bootstrap adds SSH from 0.0.0.0/0 to every security group it creates itself
    # (ray/autoscaler/_private/aws/config.py, _create_default_ssh_inbound_rules), so every node
    # type must name a user-made, restricted group and Ray must create none.
    for name, spec in config["available_node_types"].items():
        assert spec["node_config"].get("SecurityGroupIds"), f"{name}: Ray would create a group with SSH open to all"


def test_dashboard_and_gcs_not_exposed(config: dict):
    head_start = " ".join(config["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head_start
    assert "0.0.0.0" not in head_start
    text = CLUSTER_YAML.read_text()
    assert "ray dashboard cluster.yaml" in text
