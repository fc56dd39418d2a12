"""cluster.yaml (for `ray up`) passes Ray's own cluster-config validation and opens nothing to the world."""

from __future__ import annotations

import copy
import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
CLUSTER_YAML = REPO / "cluster.yaml"
LMTUNE_ON_NODE = "/home/ray/lmtune"  # the synced checkout, inside the container
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
    workers = _worker_types(config)
    assert workers, "at least one worker type"
    for spec in workers.values():
        assert spec["min_workers"] == 0 and spec["max_workers"] >= 1  # autoscaled from zero
        assert spec["node_config"]["InstanceType"].startswith(("g5.", "p4d.", "p5."))
    assert any("torch==" in c for c in config["setup_commands"])
    assert config["file_mounts"] == {LMTUNE_ON_NODE: "."}  # the checkout only: no data/ mount


def _worker_types(config: dict) -> dict[str, dict]:
    return {k: v for k, v in config["available_node_types"].items() if k != config["head_node_type"]}


def _all_setup_commands(config: dict) -> list[str]:
    commands = [*config.get("initialization_commands", []), *config["setup_commands"],
                *config["head_setup_commands"], *config["worker_setup_commands"]]
    for spec in config["available_node_types"].values():
        commands += spec.get("initialization_commands", []) + spec.get("worker_setup_commands", [])
    return commands


def test_file_mounts_exist_in_a_fresh_clone(config: dict):
    # `ray up` hashes every file_mounts source before it starts a node (ray.autoscaler._private.util.
    # hash_runtime_conf) and stops on a missing one: each must be in the repository as git holds it,
    # not something made locally (data/, results/ are git-ignored).
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    for remote, source in config["file_mounts"].items():
        path = (REPO / source).resolve()
        assert path == REPO or REPO in path.parents, f"{remote}: {source} is outside the repository"
        rel = path.relative_to(REPO).as_posix() if path != REPO else "."
        ignored = subprocess.run(["git", "check-ignore", "-q", rel], cwd=REPO).returncode == 0
        assert not ignored, f"{remote}: {source} is git-ignored, so a fresh clone lacks it"
        tracked = subprocess.run(["git", "ls-files", "--", rel], cwd=REPO, capture_output=True, text=True,
                                 check=True).stdout.split()
        assert tracked, f"{remote}: git tracks nothing at {source}, so a fresh clone lacks it"


def test_rsync_keeps_local_state_out_and_the_package_in(config: dict):
    excludes = config["rsync_exclude"]
    for top in ("/data/", "/results/", "/.venv/"):
        assert top in excludes, top
    assert "**/.git" in excludes
    # Unanchored, rsync matches a pattern against the end of every path: "data/" or "data/**" would also
    # drop lmtune/data/, a package lmtune cannot import without.
    for pattern in excludes:
        assert pattern.startswith(("/", "**/")), f"{pattern}: anchor it with a leading /"


def test_setup_installs_lmtune_the_same_way_on_every_node(config: dict):
    install = f"python -m pip install -q {LMTUNE_ON_NODE}"
    assert install in config["setup_commands"]  # setup_commands: every node, head and workers
    # Not editable (the packaged install ships the search spaces), and nowhere else: no node type
    # replaces the common setup with its own worker_setup_commands.
    assert not any("-e " in c and "lmtune" in c for c in _all_setup_commands(config))
    assert not any("lmtune" in c for c in config["head_setup_commands"] + config["worker_setup_commands"])
    for name, spec in config["available_node_types"].items():
        assert "worker_setup_commands" not in spec, f"{name} overrides the common setup"
    # Only the container's `python -m pip`: never a bare `python`/`python3`/`pip` that may be another
    # interpreter than the image's Python 3.11 (Ray's own default setup on the host calls such a python).
    for command in _all_setup_commands(config):
        rest = command.replace("python -m pip ", " ")
        assert not re.search(r"(?<![\w./-])(python[\d.]*|pip[\d.]*)(?![\w.-])", rest), f"not `python -m pip`: {command}"


def test_torch_installed_before_lmtune(config: dict):
    commands = config["setup_commands"]
    torch = next(i for i, c in enumerate(commands) if '"torch==' in c)
    lmtune = next(i for i, c in enumerate(commands) if LMTUNE_ON_NODE in c)
    assert torch < lmtune  # lmtune's own torch pin must find the CUDA build, not pull PyPI's first


def test_head_setup_installs_boto3(config: dict):
    # Ray's AWS defaults install it on the head (ray/autoscaler/aws/defaults.yaml): the autoscaler there
    # calls EC2 through it. A head_setup_commands of our own replaces that default, so it must say it again.
    assert any("python -m pip install" in c and "boto3>=1.4.8" in c for c in config["head_setup_commands"])


def test_every_worker_type_can_write_the_bucket(config: dict):
    # Ray's AWS bootstrap gives an instance profile to the head only (aws/config.py, _configure_iam_role);
    # a worker gets one only if its node_config names it, and without one a trial cannot write to S3.
    for name, spec in _worker_types(config).items():
        profile = spec["node_config"].get("IamInstanceProfile")
        assert profile and (profile.get("Arn") or profile.get("Name")), f"{name}: no IamInstanceProfile"
        assert "lmtune-ray-worker" in (profile.get("Arn") or profile.get("Name"))
    # The head keeps Ray's own profile (EC2 to launch workers, S3): naming one would replace it.
    assert "IamInstanceProfile" not in config["available_node_types"][config["head_node_type"]]["node_config"]


def test_docker_image_matches_ray_and_python(config: dict):
    import ray

    docker = config["docker"]
    assert docker["container_name"] and docker["pull_before_run"] is True
    images = {docker["image"], docker.get("head_image", docker["image"]), docker.get("worker_image", docker["image"])}
    for spec in config["available_node_types"].values():
        images.add(spec.get("docker", {}).get("worker_image", docker["image"]))
    for image in images:
        repo, _, tag = image.partition(":")
        assert repo == "rayproject/ray", image
        version, *rest = tag.split("-")
        assert version == ray.__version__, f"{image}: the cluster's Ray must be the Ray here ({ray.__version__})"
        assert "py311" in rest, f"{image}: lmtune needs Python 3.11"
        assert "gpu" in rest or any(re.fullmatch(r"cu\d+", r) for r in rest), f"{image}: not a GPU build"
    # GPUs into the GPU workers' containers only: `--gpus all` fails on the CPU head.
    assert "--gpus all" in docker["worker_run_options"]
    assert not any("--gpus" in o for o in docker.get("run_options", []) + docker.get("head_run_options", []))
    # The host needs an AMI with the NVIDIA driver and Docker: Ray 2.60's latest_dlami is an Ubuntu 18.04
    # Deep Learning AMI with CUDA 11.2, older than the image's and torch's CUDA.
    for name, spec in config["available_node_types"].items():
        assert spec["node_config"]["ImageId"].lower() not in ("", "latest_dlami"), name


def _header_commands(text: str) -> list[str]:
    """The shell commands of the file's leading comment block, backslash continuations joined."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[1:].strip())
    joined, current = [], ""
    for line in lines:
        if line.endswith("\\"):
            current += line[:-1] + " "
        else:
            joined.append(current + line)
            current = ""
    return joined


def test_sample_sweep_command_parses_and_stores_in_s3():
    from lmtune.run import build_parser, sweep_options

    submits = [c for c in _header_commands(CLUSTER_YAML.read_text()) if c.startswith("ray job submit")]
    assert submits, "the header shows how to submit a sweep"
    for submit in submits:
        ray_words, sep, entrypoint = submit.partition(" -- ")
        assert sep, submit
        assert "--address http://127.0.0.1:8265" in ray_words  # through `ray dashboard`'s tunnel
        env = json.loads(shlex.split(ray_words)[shlex.split(ray_words).index("--runtime-env-json") + 1])
        assert env["env_vars"]["AWS_DEFAULT_REGION"]
        words = shlex.split(entrypoint.split("  #")[0])
        assert words[:3] == ["python", "-m", "lmtune.run"], entrypoint
        words = words[3:]
        options = sweep_options(build_parser().parse_args(words), words)
        assert options.storage and options.storage.startswith("s3://"), "the workers must reach the results"
        assert options.address == "auto"
    commands = _header_commands(CLUSTER_YAML.read_text())
    assert any(c.startswith("ray up cluster.yaml") for c in commands)
    assert any(c.startswith("ray down cluster.yaml") for c in commands)


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
