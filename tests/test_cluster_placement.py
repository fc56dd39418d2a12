"""Placement on an autoscaling cluster: trials ask for GPU shares of what the cluster scales to, not of what is up
when the sweep starts; storage every node reaches is required before any trial starts."""

from __future__ import annotations

import pytest

from lmtune.errors import LmtuneError
from lmtune.sweep.placement import ClusterCapacity, place_trials
from lmtune.sweep.runner import on_network_filesystem
from lmtune.sweep.storage import SweepStorage

AUTOSCALER_CONFIG = {
    "max_workers": 3, "head_node_type": "ray.head.default",
    "available_node_types": {
        "ray.head.default": {"resources": {"CPU": 0}, "max_workers": 0},
        "gpu_worker": {"resources": {"CPU": 4, "GPU": 1}, "min_workers": 0, "max_workers": 2},
        "cpu_worker": {"resources": {"CPU": 8}, "min_workers": 0, "max_workers": 5},
    },
}


def test_capacity_at_full_scale_counts_each_worker_type_up_to_the_clusters_max_workers_gpu_types_first():
    capacity = ClusterCapacity.from_config(AUTOSCALER_CONFIG, "cfg.yaml")
    assert (capacity.gpus, capacity.workers) == (2.0, 3)
    assert capacity.cpus == 2 * 4 + 1 * 8


def test_a_config_without_node_types_is_refused_in_one_line():
    with pytest.raises(LmtuneError, match="--cluster-config cfg.yaml: no available_node_types"):
        ClusterCapacity.from_config({"max_workers": 2}, "cfg.yaml")


def test_trials_on_a_cluster_with_no_gpu_worker_up_yet_ask_for_gpu_shares_and_run_as_many_as_it_holds(
        tiny_config):
    capacity = ClusterCapacity.from_config(AUTOSCALER_CONFIG, "cfg.yaml")
    now_up = place_trials(tiny_config, 1, 1.0, None, None, cluster_cpus=0, cluster_gpus=0, gpu_memory_bytes=None)
    scaled = place_trials(tiny_config, 1, 1.0, None, None, capacity.cpus, capacity.gpus, None)
    assert now_up.gpu == 0 and now_up.max_concurrent == 1
    assert scaled.gpu == 0.25  # four tiny trials share a GPU
    assert scaled.max_concurrent == 8  # the two GPUs' eight shares, though the CPUs would hold sixteen


def test_gpus_per_trial_and_max_concurrent_still_override(tiny_config):
    placed = place_trials(tiny_config, 1, 1.0, 0.5, 3, 16, 2, None)
    assert (placed.gpu, placed.max_concurrent) == (0.5, 3)


def test_a_sweeps_uri_keeps_an_endpoint_query_after_its_name_as_tunes_restore_takes_it():
    storage = SweepStorage("s3://bucket/sweeps?endpoint_override=127.0.0.1:9000&scheme=http", "edge1")
    assert storage.remote
    assert storage.uri == "s3://bucket/sweeps/edge1?endpoint_override=127.0.0.1:9000&scheme=http"
    assert not SweepStorage("/tmp/results", "edge1").remote


def test_a_local_disk_is_not_a_network_filesystem(tmp_path):
    assert not on_network_filesystem(tmp_path)


def test_a_sweep_on_an_autoscaling_cluster_with_storage_on_the_heads_own_disk_is_refused_in_one_line(tmp_path):
    from lmtune.sweep.options import SweepOptions
    from lmtune.sweep.runner import check_storage_reach

    options = SweepOptions(space="quick", name="s", results=tmp_path, address="auto",
                           cluster_config=tmp_path / "cluster.yaml")
    with pytest.raises(LmtuneError, match=r"^--storage .*: a path on this machine's own disk, which the workers "
                                          r"the autoscaler starts cannot reach; give --storage s3://"):
        check_storage_reach(options, SweepStorage(options.storage_path, "s"))
    remote = SweepOptions(space="quick", name="s", results=tmp_path, address="auto", storage="s3://b/p",
                          cluster_config=tmp_path / "cluster.yaml")
    check_storage_reach(remote, SweepStorage(remote.storage_path, "s"))  # object storage: every node reaches it


# ---------------------------------------------------------------------------------------------
# A sweep in object storage (here file://, the same pyarrow code path as s3:// and gs://)


def test_records_written_under_a_mirrored_folder_reach_the_storage_as_they_are_written(tmp_path):
    from lmtune.files import atomic_write_json, mirrored

    storage = SweepStorage(f"file://{tmp_path / 'bucket'}", "s")
    local = tmp_path / "results" / "s"
    with mirrored(local, storage.upload):
        atomic_write_json(local / "decisions" / "trial_outcomes.json", {"t1": {"outcome": "completed"}})
    atomic_write_json(local / "after.json", {})  # no longer mirrored
    assert (tmp_path / "bucket" / "s" / "decisions" / "trial_outcomes.json").is_file()
    assert not (tmp_path / "bucket" / "s" / "after.json").exists()


def test_a_sweep_fetched_from_storage_brings_records_and_trial_files_but_no_checkpoints(tmp_path):
    remote = tmp_path / "bucket" / "s"
    for name in ("sweep.json", "decisions/trial_outcomes.json", "t1/metrics.csv", "t1/checkpoints/best.pt",
                 "t1/checkpoint_000003/step_00000030.pt", "tuner.pkl"):
        (remote / name).parent.mkdir(parents=True, exist_ok=True)
        (remote / name).write_text('{"start_time": "T"}' if name == "sweep.json" else "x")
    local = SweepStorage.of_uri(f"file://{tmp_path / 'bucket'}/s").fetch(tmp_path / "results")
    assert sorted(str(p.relative_to(local)) for p in local.rglob("*") if p.is_file()) == [
        "decisions/trial_outcomes.json", "sweep.json", "t1/metrics.csv"]
    records = SweepStorage(f"file://{tmp_path / 'bucket'}", "s").download(tmp_path / "new", records_only=True)
    assert sorted(str(p.relative_to(records)) for p in records.rglob("*") if p.is_file()) == [
        "decisions/trial_outcomes.json", "sweep.json"]


def test_fetching_a_sweep_over_another_of_the_same_name_is_refused_in_one_line(tmp_path):
    (tmp_path / "bucket" / "s").mkdir(parents=True)
    (tmp_path / "bucket" / "s" / "sweep.json").write_text('{"start_time": "A"}')
    (tmp_path / "results" / "s").mkdir(parents=True)
    (tmp_path / "results" / "s" / "sweep.json").write_text('{"start_time": "B"}')
    with pytest.raises(LmtuneError, match="holds another sweep named s"):
        SweepStorage.of_uri(f"file://{tmp_path / 'bucket'}/s").fetch(tmp_path / "results")
