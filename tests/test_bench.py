"""bench runs on CPU with few steps and prints every field with sane values (not that it is fast)."""

from __future__ import annotations

import json
import math

import pytest
from conftest import BENCH_MODEL, EXAMPLE, assert_refused, set_args

from lmtune import bench
from lmtune.errors import LmtuneError
from lmtune.sweep import placement
from lmtune.tools.throughput import benchmark
from lmtune.tools.throughput.results import REQUIRED_FIELDS
from lmtune.training.memory import estimate_trial_memory_bytes
from lmtune.training.model_config import ModelConfig

# The benchmarks' tiny model timed for 2 steps of 2 sequences.
TINY = ["--config", "quick", "--batch-size", "2", "--steps", "2", "--repeats", "2", "--warmup", "1",
        "--device", "cpu", *set_args(BENCH_MODEL)]


def _json_out(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def _positive_finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


@pytest.mark.slow
def test_bench_json_has_every_field(capsys, tmp_path):
    results = tmp_path / "results.jsonl"
    assert bench.main([*TINY, "--json", "--record", "--results-file", str(results)]) == 0
    out = _json_out(capsys)
    for key in REQUIRED_FIELDS:
        assert key in out, key
    for key in ("batch_size", "context_length", "tokens_per_s", "mfu", "naive_tokens_per_s", "speedup_vs_naive",
                "peak_memory_bytes", "step_s", "compute_s", "flops_per_token", "peak_flops"):
        assert _positive_finite(out[key]), (key, out[key])
    assert 0 <= out["data_wait_fraction"] < 1
    assert out["speedup_vs_naive"] == pytest.approx(out["tokens_per_s"] / out["naive_tokens_per_s"])
    assert _positive_finite(out["speedup_vs_naive_paired"])
    assert out["device"] and out["torch"] and out["commit"] and out["config"] == "quick"
    assert out["context_length"] == 16 and out["batch_size"] == 2
    lines = results.read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["tokens_per_s"] == out["tokens_per_s"]


def test_bench_text_output(capsys):
    assert bench.main([*TINY, "--compile", "off", "--no-eval"]) == 0
    text = capsys.readouterr().out
    for needle in ("tokens/s", "MFU", "tokens/s x FLOPs/token / peak", "data wait", "compute", "peak memory",
                   "naive", "optimized / naive:"):
        assert needle in text, needle


def test_bench_rejects_bad_input(capsys):
    assert bench.main([*TINY, "--concurrency", "0,x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and len(err.splitlines()) == 1
    with pytest.raises(LmtuneError):
        benchmark.bench_config("nope")


def test_estimate_trial_memory_grows_with_batch_and_amp_saves():
    cfg = ModelConfig()
    small = estimate_trial_memory_bytes(cfg, 8, True)
    large = estimate_trial_memory_bytes(cfg, 128, True)
    assert 0 < small < large
    assert estimate_trial_memory_bytes(cfg, 128, False) > large
    # 17.6M + 5.1M embedding params x 16 bytes of weights, grads and Adam moments at the least.
    assert small > 16 * 22e6


def test_recommend_trials_per_gpu():
    gib = 2**30
    # Memory-bound estimate, capped without measurements.
    assert placement.recommend_trials_per_gpu(2 * gib, 80 * gib, None) == placement.UNMEASURED_MAX_TRIALS
    assert placement.recommend_trials_per_gpu(30 * gib, 80 * gib, None) == 2
    assert placement.recommend_trials_per_gpu(100 * gib, 80 * gib, None) == 1
    # Best aggregate that fits; a bigger K must gain more than 5%.
    measured = {1: 100.0, 2: 180.0, 4: 300.0, 8: 310.0}
    assert placement.recommend_trials_per_gpu(2 * gib, 80 * gib, measured) == 4
    assert placement.recommend_trials_per_gpu(20 * gib, 80 * gib, measured) == 2
    assert placement.recommend_trials_per_gpu(2 * gib, 80 * gib, {1: 100.0, 2: 99.0}) == 1


def test_shared_compile_cache_sets_env(tmp_path, monkeypatch):
    import os

    from lmtune.training.compile import enable_shared_compile_cache

    for key in ("TORCHINDUCTOR_CACHE_DIR", "TORCHINDUCTOR_FX_GRAPH_CACHE", "TORCHINDUCTOR_AUTOGRAD_CACHE",
                "TRITON_CACHE_DIR"):
        monkeypatch.setenv(key, "")  # so the fixture restores the original state afterwards

    enable_shared_compile_cache(tmp_path / "cache")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str((tmp_path / "cache").resolve())
    assert os.environ["TORCHINDUCTOR_FX_GRAPH_CACHE"] == "1" and os.environ["TORCHINDUCTOR_AUTOGRAD_CACHE"] == "1"
    assert (tmp_path / "cache").is_dir()


def test_the_projection_is_labelled_an_estimate_and_keeps_below_its_roofline(capsys):
    assert bench.main(["--config", "default", "--project", "all"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("ESTIMATE, not a measurement") and "| H100 |" in text and "| Apple M3 Max |" in text
    assert bench.main(["--config", "default", "--project", "h100", "--json"]) == 0
    (h100,) = _json_out(capsys)
    low, high = h100["tokens_per_s"]
    assert 0 < low < high <= h100["bound_tokens_per_s"]
    assert high == pytest.approx(0.33 * 989e12 / h100["flops_per_token"])  # the published 1/3 of the peak
    assert bench.main(["--project", "tpu"]) == 2


def test_bench_times_a_users_model_in_lmtunes_loop_against_the_naive_loop_on_the_same_model(capsys):
    assert bench.main([*TINY, "--model", EXAMPLE, "--no-eval", "--json"]) == 0
    out = _json_out(capsys)
    # its FLOPs counted by FlopCounterMode, not estimated by formula
    assert out["model"] == EXAMPLE and not out["flops_estimated"] and out["attention_kernel"] == "the model's own"
    assert _positive_finite(out["tokens_per_s"]) and _positive_finite(out["naive_tokens_per_s"])
    assert out["speedup_vs_naive"] == pytest.approx(out["tokens_per_s"] / out["naive_tokens_per_s"])


@pytest.mark.parametrize("flag", [["--coord-check"], ["--concurrency", "1,2"], ["--fuse", "2"], ["--project", "h100"]])
def test_bench_refuses_a_users_model_with_a_measurement_of_lmtunes_own(capsys, flag):
    assert_refused(bench.main, [*TINY, "--model", EXAMPLE, *flag], capsys, flag[0], "lmtune's own model")
