"""Is this machine training as fast as it should? Also ``python -m lmtune.diagnose``.

Without arguments: checks the environment (device, CUDA and driver, bf16/TF32, torch.compile, free
memory), runs a short benchmark of the real training step while sampling the GPU's clocks,
temperature, power and throttle reasons through NVML, and says whether throughput is in the range
expected for the device and what to change if not.

With a sweep directory (``python -m lmtune.diagnose results/NAME``): each trial's status, progress,
tokens/s and ETA, and the ETA of the whole sweep; works while the sweep runs.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import math
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lmtune.errors import LmtuneError, cli_entry, setup_cli_logging
from lmtune.sweep_files import SWEEP_FILE, is_sweep_dir, read_outcomes, trial_id_of

log = logging.getLogger(__name__)

# Data wait above this share of step time means the input pipeline, not the model, sets the pace.
DATA_STALL_FRACTION = 0.03
# Expected MFU range of the optimized step. CUDA: against the data-sheet dense bf16 peak, for the
# default config at a full-budget batch (REFERENCE.md: 30% on an H100 is ~2.1M tokens/s); below
# the low end something is wrong. CPU: against the float32 matmul peak measured in the same run
# (benchmarks/README.md has the CPU figures these come from).
EXPECTED_MFU = {"cuda": (0.20, 0.60), "cpu": (0.10, 1.0), "mps": (0.05, 1.0)}
# A trial without summary.json whose metrics.csv changed this recently counts as running.
RUNNING_IF_UPDATED_WITHIN_S = 600.0

_THROTTLE_BITS = {  # NVML clocks-event (throttle) reason bits, as documented in nvml.h
    0x4: ("SW power cap", "power"),
    0x8: ("HW slowdown", "thermal or power"),
    0x20: ("SW thermal slowdown", "thermal"),
    0x40: ("HW thermal slowdown", "thermal"),
    0x80: ("HW power brake", "power"),
}


# ---------------------------------------------------------------------------------------------
# Environment


def check_compile(device: torch.device) -> tuple[bool, str]:
    """Compile and run a tiny function on ``device``: does torch.compile work here at all?"""
    backend = "aot_eager" if device.type == "mps" else "inductor"

    def tiny(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x @ x.T) * 2 + 1

    x = torch.randn(16, 16, device=device)
    t0 = time.perf_counter()
    try:
        compiled = torch.compile(tiny, backend=backend)
        got = compiled(x)
        ok = torch.allclose(got, tiny(x), atol=1e-4, rtol=1e-4)
    except Exception as err:  # noqa: BLE001 - any failure is the answer to "does compile work"
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return False, f"FAILED ({type(err).__name__}: {first[:200]})"
    if not ok:
        return False, "FAILED (compiled result differs from eager)"
    return True, f"ok ({backend}, {time.perf_counter() - t0:.1f} s for a tiny function)"


def free_memory_bytes(device: torch.device) -> tuple[int | None, int | None]:
    """(free, total) bytes of device memory; host memory for CPU."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return int(free), int(total)
    try:
        info = {}
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info[key] = int(value.split()[0]) * 1024
        return info.get("MemAvailable"), info.get("MemTotal")
    except (OSError, ValueError, IndexError):
        return None, None


def _nvml_handle(device: torch.device):
    """The NVML handle of the torch CUDA device (by UUID, so CUDA_VISIBLE_DEVICES cannot mismatch)."""
    import pynvml

    pynvml.nvmlInit()
    props = torch.cuda.get_device_properties(device)
    uuid = getattr(props, "uuid", None)
    if uuid is not None:
        try:
            return pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
        except pynvml.NVMLError:
            pass
    return pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)


def cuda_environment(device: torch.device) -> dict[str, Any]:
    props = torch.cuda.get_device_properties(device)
    info: dict[str, Any] = {
        "cuda": torch.version.cuda, "capability": f"{props.major}.{props.minor}",
        "bf16": torch.cuda.is_bf16_supported(),
        # TF32 tensor cores exist from Ampere (compute capability 8.0) on.
        "tf32": props.major >= 8, "tf32_enabled": torch.backends.cuda.matmul.allow_tf32,
        "driver": None,
    }
    try:
        import pynvml

        _nvml_handle(device)
        driver = pynvml.nvmlSystemGetDriverVersion()
        info["driver"] = driver.decode() if isinstance(driver, bytes) else driver
    except Exception as err:  # noqa: BLE001 - NVML missing or broken: report, do not fail the diagnosis
        info["driver"] = f"unknown (NVML: {err})"
    return info


class NvmlSampler(threading.Thread):
    """Samples SM clock, temperature, power and throttle reasons every ``interval_s`` on a background thread."""

    def __init__(self, device: torch.device, interval_s: float = 0.2):
        super().__init__(name="lmtune-nvml", daemon=True)
        import pynvml

        self.pynvml = pynvml
        self.handle = _nvml_handle(device)
        self.interval_s = interval_s
        self.samples: list[dict[str, float]] = []
        self._stop_event = threading.Event()
        self.max_sm_clock = pynvml.nvmlDeviceGetMaxClockInfo(self.handle, pynvml.NVML_CLOCK_SM)
        try:
            self.power_limit_w = pynvml.nvmlDeviceGetEnforcedPowerLimit(self.handle) / 1000
        except pynvml.NVMLError:
            self.power_limit_w = None

    def _reasons(self) -> int:
        nv = self.pynvml
        getter = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            nv.nvmlDeviceGetCurrentClocksThrottleReasons
        return int(getter(self.handle))

    def run(self) -> None:
        nv = self.pynvml
        while not self._stop_event.is_set():
            try:
                self.samples.append({
                    "sm_clock_mhz": nv.nvmlDeviceGetClockInfo(self.handle, nv.NVML_CLOCK_SM),
                    "temperature_c": nv.nvmlDeviceGetTemperature(self.handle, nv.NVML_TEMPERATURE_GPU),
                    "power_w": nv.nvmlDeviceGetPowerUsage(self.handle) / 1000,
                    "reasons": self._reasons(),
                    "utilization": nv.nvmlDeviceGetUtilizationRates(self.handle).gpu,
                })
            except nv.NVMLError as err:
                log.warning("NVML sampling stopped: %s", err)
                return
            self._stop_event.wait(self.interval_s)

    def stop(self) -> dict[str, Any]:
        self._stop_event.set()
        self.join(timeout=2)
        return summarize_nvml(self.samples, self.max_sm_clock, self.power_limit_w)


def summarize_nvml(samples: list[dict[str, float]], max_sm_clock: float, power_limit_w: float | None) -> dict[str, Any]:
    """Clock/temperature/power ranges and the throttle reasons seen in at least 10% of samples."""
    if not samples:
        return {"samples": 0}
    busy = [s for s in samples if s["utilization"] > 50] or samples
    counts: dict[str, int] = {}
    kinds: set[str] = set()
    for s in busy:
        for bit, (label, kind) in _THROTTLE_BITS.items():
            if int(s["reasons"]) & bit:
                counts[label] = counts.get(label, 0) + 1
                kinds.add(kind)
    frequent = sorted(label for label, n in counts.items() if n >= 0.1 * len(busy))
    return {
        "samples": len(samples),
        "sm_clock_mhz_median": sorted(s["sm_clock_mhz"] for s in busy)[len(busy) // 2],
        "sm_clock_mhz_max": max_sm_clock,
        "temperature_c_max": max(s["temperature_c"] for s in samples),
        "power_w_max": max(s["power_w"] for s in samples), "power_limit_w": power_limit_w,
        "throttle_reasons": frequent,
        "thermal_throttling": any("thermal" in label.lower() for label in frequent),
        "power_throttling": any("power" in label.lower() for label in frequent),
        "throttle_kinds": sorted(kinds),
    }


def verdict(result: dict[str, Any], device_type: str, nvml: dict[str, Any] | None,
            compile_ok: bool) -> tuple[bool, list[str]]:
    """(in the expected range?, what to change) for a bench result."""
    advice: list[str] = []
    low, _high = EXPECTED_MFU.get(device_type, (0.0, 1.0))
    in_range = result["mfu"] >= low
    if not in_range:
        advice.append(f"MFU {100 * result['mfu']:.1f}% is below the {100 * low:.0f}% expected on {device_type}")
        if not compile_ok:
            advice.append("torch.compile does not work here: install a C++ compiler (and Triton on CUDA); "
                          "eager mode is much slower")
        if device_type == "cuda":
            if result.get("precision") != "bfloat16":
                advice.append("training is not in bf16: leave precision=auto on a GPU that supports bf16")
            if result.get("optimized_variant") != "compiled":
                advice.append("the step ran eager: leave compile=auto (or compile=on) on CUDA")
            advice.append("check for other processes on the GPU (nvidia-smi) and try a larger --batch-size")
        elif device_type == "cpu":
            load = result.get("load_avg_1m")
            if load is not None and load > (os.cpu_count() or 1):
                advice.append(f"the CPU is oversubscribed (load average {load:.1f} on {os.cpu_count()} cores): "
                              "stop other jobs or run fewer trials at once")
            if result.get("optimized_variant") == "eager" and result.get("flops_per_token", 0) >= 50e6:
                advice.append("this model ran eager: at 50+ MFLOP/token compile=on measured faster on CPU "
                              "(benchmarks/README.md)")
    if result["data_wait_fraction"] > DATA_STALL_FRACTION:
        advice.append(f"data-loader stall: {100 * result['data_wait_fraction']:.1f}% of each step waits for "
                      f"data (over {100 * DATA_STALL_FRACTION:.0f}%); keep the data dir on local disk, "
                      "and leave CPU cores free for the prefetch thread")
    if nvml and nvml.get("thermal_throttling"):
        advice.append(f"THERMAL THROTTLING: the GPU slowed its clocks for heat ({', '.join(nvml['throttle_reasons'])}, "
                      f"max {nvml['temperature_c_max']} C); check cooling and airflow")
    if nvml and nvml.get("power_throttling"):
        advice.append(f"POWER THROTTLING: the GPU hit its power limit ({', '.join(nvml['throttle_reasons'])}, "
                      f"max {nvml['power_w_max']:.0f} W of {nvml['power_limit_w'] or '?'} W); "
                      "check the power cap (nvidia-smi -q -d POWER)")
    return in_range and not advice, advice


def diagnose_environment(device_arg: str, config_name: str | None, batch_size: int | None, steps: int,
                         repeats: int) -> int:
    from lmtune import bench
    from lmtune.hardware import resolve_device

    device = resolve_device(device_arg)
    print(f"device: {bench.full_device_name(device)} ({device})")
    print(f"torch: {torch.__version__}")
    if device.type == "cuda":
        env = cuda_environment(device)
        print(f"CUDA: {env['cuda']}, driver {env['driver']}, compute capability {env['capability']}")
        print(f"bf16: {'supported' if env['bf16'] else 'NOT supported (training falls back to float32)'}")
        print(f"TF32: {'supported' if env['tf32'] else 'not supported'}"
              + (f", enabled for matmuls: {env['tf32_enabled']}" if env["tf32"] else ""))
    else:
        print("CUDA: n/a (no CUDA device)")
        print("bf16: n/a (no CUDA device)")
        print("TF32: n/a (no CUDA device)")
    if device.type == "cpu":
        print(f"CPU: {os.cpu_count()} logical cores, torch uses {torch.get_num_threads()} threads")
    compile_ok, compile_msg = check_compile(device)
    print(f"torch.compile: {compile_msg}")
    free, total = free_memory_bytes(device)
    kind = "GPU" if device.type == "cuda" else "host"
    print(f"free {kind} memory: " + (f"{free / 2**30:.1f} of {total / 2**30:.1f} GiB" if free and total else "unknown"))

    config_name = config_name or ("default" if device.type == "cuda" else "quick")
    config = bench.bench_config(config_name, batch_size, {}, device_arg, "auto")
    sampler = None
    if device.type == "cuda":
        try:
            sampler = NvmlSampler(device)
            sampler.start()
        except Exception as err:  # noqa: BLE001 - NVML is optional: diagnose without it
            print(f"NVML: unavailable ({err}); no clock/thermal/power readings")
            sampler = None
    try:
        result = bench.run_bench(config, steps=steps, repeats=repeats, warmup=2, naive=False, measure_eval=False,
                                 config_name=config_name)
    finally:
        nvml = sampler.stop() if sampler is not None else None
    print(f"benchmark ({config_name}, batch {result['batch_size']}, {result['optimized_variant']}, "
          f"{result['precision']}): {result['tokens_per_s']:,.0f} tokens/s, MFU {100 * result['mfu']:.1f}% "
          f"(peak {result['peak_flops'] / 1e12:.3g} TFLOP/s, {result['peak_flops_source']})")
    print(f"step: {result['step_s'] * 1e3:.1f} ms, data wait {100 * result['data_wait_fraction']:.1f}%, "
          f"attention {result['attention_kernel']}")
    if nvml is None:
        print("GPU clocks/temperature/power: n/a (no CUDA device)" if device.type != "cuda" else
              "GPU clocks/temperature/power: not read")
    elif nvml.get("samples"):
        print(f"GPU during the benchmark: SM clock {nvml['sm_clock_mhz_median']} MHz (max {nvml['sm_clock_mhz_max']}), "
              f"up to {nvml['temperature_c_max']} C, up to {nvml['power_w_max']:.0f} W"
              + (f" of {nvml['power_limit_w']:.0f} W" if nvml["power_limit_w"] else "")
              + f"; throttle reasons: {', '.join(nvml['throttle_reasons']) or 'none'}")
    low, high = EXPECTED_MFU.get(device.type, (0.0, 1.0))
    ok, advice = verdict(result, device.type, nvml, compile_ok)
    expected = f"expected MFU {100 * low:.0f}-{100 * high:.0f}% on {device.type}"
    print(f"data loading: {'STALL' if result['data_wait_fraction'] > DATA_STALL_FRACTION else 'ok'}")
    print(f"verdict: {'OK' if ok else 'CHECK'}: throughput "
          f"{'in' if result['mfu'] >= low else 'BELOW'} the expected range ({expected})")
    for line in advice:
        print(f"  - {line}")
    return 0


# ---------------------------------------------------------------------------------------------
# Sweep progress


@dataclass
class TrialStatus:
    name: str
    lr: float | None
    status: str
    tokens_done: int
    tokens_total: int
    tokens_per_s: float | None

    @property
    def progress(self) -> float:
        return min(1.0, self.tokens_done / self.tokens_total) if self.tokens_total else 0.0

    @property
    def remaining_tokens(self) -> int:
        return max(0, self.tokens_total - self.tokens_done) if self.status == "running" else 0

    @property
    def eta_s(self) -> float | None:
        if self.status != "running" or not self.tokens_per_s:
            return None
        return self.remaining_tokens / self.tokens_per_s


def find_trial_dirs(sweep_dir: Path) -> list[Path]:
    """Directories up to two levels below ``sweep_dir`` holding config.json and metrics.csv."""
    found = []
    for pattern in ("*", "*/*"):
        for path in sorted(sweep_dir.glob(pattern)):
            if path.is_dir() and (path / "config.json").is_file() and (path / "metrics.csv").is_file():
                found.append(path)
    return found


def _last_metrics_row(path: Path) -> dict[str, str] | None:
    last = None
    try:
        with open(path, newline="") as handle:
            for row in csv.DictReader(handle):
                if row.get("step"):
                    last = row
    except (OSError, csv.Error):
        return None
    return last


def _float(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def read_trial(trial_dir: Path, sweep_dir: Path, now: float | None = None) -> TrialStatus:
    now = time.time() if now is None else now
    try:
        config = json.loads((trial_dir / "config.json").read_text())
        train, model = config["train"], config["model"]
        total = int(train["steps"]) * int(train["batch_size"]) * int(model["context_length"])
        lr = _float(train.get("lr"))
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise LmtuneError(f"{trial_dir / 'config.json'} is unreadable ({type(err).__name__}: {err}); "
                          "it must hold a RunConfig (train.steps, train.batch_size, model.context_length)") from None
    row = _last_metrics_row(trial_dir / "metrics.csv")
    tokens_done = int(_float(row.get("tokens")) or 0) if row else 0
    rate = _float(row.get("tokens_per_s")) if row else None
    summary_path = trial_dir / "summary.json"
    status = None
    if summary_path.is_file():
        try:
            summary = json.loads(summary_path.read_text())
            status = str(summary.get("status") or "finished")
            tokens_done = int(_float(summary.get("tokens")) or tokens_done)
        except (OSError, ValueError):
            status = None  # being written: fall back to the metrics
    if status is None:
        recent = now - (trial_dir / "metrics.csv").stat().st_mtime < RUNNING_IF_UPDATED_WITHIN_S
        status = "running" if recent else "stopped"
    name = str(trial_dir.relative_to(sweep_dir))
    return TrialStatus(name, lr, status, tokens_done, total, rate)


def sweep_status(sweep_dir: Path) -> tuple[list[TrialStatus], dict[str, Any]]:
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise LmtuneError(f"{sweep_dir} is not a directory; pass the results dir of a sweep, e.g. results/NAME")
    trials_dirs = find_trial_dirs(sweep_dir)
    has_meta = is_sweep_dir(sweep_dir)
    if not has_meta and not trials_dirs:
        raise LmtuneError(f"{sweep_dir} is not a sweep dir (no sweep.json and no trial dirs with config.json + "
                          "metrics.csv); pass the directory a sweep wrote, e.g. results/NAME")
    meta: dict[str, Any] = {}
    if has_meta:
        try:
            meta = json.loads((sweep_dir / SWEEP_FILE).read_text())
        except ValueError:
            meta = {}
    trials = [read_trial(d, sweep_dir) for d in trials_dirs]
    # The ledger says why a trial ended (ASHA, divergence, too slow) where the trial could not.
    try:
        outcomes = read_outcomes(sweep_dir)
    except ValueError:  # being written
        outcomes = {}
    for trial, trial_dir in zip(trials, trials_dirs, strict=True):
        entry = outcomes.get(trial_id_of(trial_dir, list(outcomes)))
        if entry:
            trial.status = str(entry.get("outcome", trial.status))
    return trials, meta if isinstance(meta, dict) else {}


def expected_trials(meta: dict[str, Any]) -> int | None:
    """How many trials the sweep will run, where sweep.json says (a list of lrs or a count)."""
    space = meta.get("space")
    if isinstance(space, dict) and isinstance(space.get("num_trials"), int):
        return space["num_trials"]
    for key in ("lrs", "learning_rates", "grid"):
        if isinstance(meta.get(key), list):
            return len(meta[key])
    for key in ("num_trials", "num_samples", "trials"):
        value = meta.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, list):
            return len(value)
    return None


def sweep_eta(trials: list[TrialStatus], meta: dict[str, Any]) -> tuple[float | None, int, int]:
    """(seconds, remaining tokens, trials not started): remaining tokens of running trials plus those not
    yet started (sized like the started ones), over the running trials' aggregate tokens/s, i.e.
    assuming the sweep keeps running as many trials at once as it does now."""
    running = [t for t in trials if t.status == "running"]
    remaining = sum(t.remaining_tokens for t in running)
    expected = expected_trials(meta)
    pending = max(0, expected - len(trials)) if expected is not None else 0
    if pending and trials:
        remaining += pending * sorted(t.tokens_total for t in trials)[len(trials) // 2]
    rate = sum(t.tokens_per_s or 0.0 for t in running)
    if remaining == 0:
        return 0.0, 0, pending
    return (remaining / rate if rate > 0 else None), remaining, pending


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


def format_sweep(sweep_dir: Path, trials: list[TrialStatus], meta: dict[str, Any]) -> str:
    width = max([5, *(len(t.name) for t in trials)])
    lines = [f"sweep {sweep_dir}: {len(trials)} trials",
             f"{'trial':<{width}}  {'lr':>9}  {'status':<13} {'progress':>8}  {'tokens/s':>10}  {'ETA':>8}"]
    for t in sorted(trials, key=lambda t: (t.lr is None, t.lr or 0.0, t.name)):
        lr = f"{t.lr:.3g}" if t.lr is not None else "?"
        rate = f"{t.tokens_per_s:,.0f}" if t.tokens_per_s else "-"
        lines.append(f"{t.name:<{width}}  {lr:>9}  {t.status:<13} {100 * t.progress:>7.1f}%  {rate:>10}  "
                     f"{format_duration(t.eta_s):>8}")
    eta, remaining, pending = sweep_eta(trials, meta)
    running = sum(t.status == "running" for t in trials)
    rate = sum(t.tokens_per_s or 0.0 for t in trials if t.status == "running")
    if remaining == 0:
        lines.append("sweep ETA: done (no trial running or pending)")
    elif eta is None:
        lines.append(f"sweep ETA: unknown ({remaining:,} tokens left, {pending} trials not started, nothing running)")
    else:
        lines.append(f"sweep ETA: {format_duration(eta)} ({remaining:,} tokens left"
                     + (f" incl. {pending} trials not started" if pending else "")
                     + f", {running} running at {rate:,.0f} tokens/s together)")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# CLI


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lmtune.diagnose",
                                description="Check this machine's training speed, or show a sweep's progress.")
    p.add_argument("sweep_dir", nargs="?", type=Path, help="a sweep's results dir: show its trials and ETA")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps (default auto)")
    p.add_argument("--config", choices=["default", "full", "low-resource", "quick"],
                   help="config to benchmark (default: default on CUDA, quick elsewhere)")
    p.add_argument("--batch-size", type=int, help="batch size of the benchmark (default: the config's)")
    p.add_argument("--steps", type=int, default=10, help="timed steps per repeat (default 10)")
    p.add_argument("--repeats", type=int, default=2, help="timed repeats (default 2)")
    p.add_argument("--watch", type=float, metavar="SECONDS", help="with a sweep dir: refresh every SECONDS")
    return p


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_cli_logging(logging.WARNING)
    if args.sweep_dir is None:
        return diagnose_environment(args.device, args.config, args.batch_size, args.steps, args.repeats)
    while True:
        trials, meta = sweep_status(args.sweep_dir)
        print(format_sweep(args.sweep_dir, trials, meta), flush=True)
        if not args.watch or not any(t.status == "running" for t in trials):
            return 0
        time.sleep(args.watch)
        print()


if __name__ == "__main__":
    raise SystemExit(main())
