"""Is this machine set up to train fast? The checks behind ``python -m lmtune.diagnose``: the device,
CUDA and driver, bf16/TF32, whether torch.compile works, free memory, the GPU's clocks, temperature,
power and throttle reasons sampled through NVML during a benchmark, and the verdict on its throughput.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import types
from dataclasses import dataclass
from pathlib import Path

import torch

from lmtune.tools.throughput.results import BenchResult
from lmtune.training.device import configure_backend

log = logging.getLogger(__name__)

# Data wait above this share of step time means the input pipeline, not the model, sets the pace.
DATA_STALL_FRACTION = 0.03
# Expected MFU range of the optimized step. CUDA: against the data-sheet dense bf16 peak, for the
# default config at a full-budget batch (30% of an H100 SXM's 989 TFLOP/s is ~2.6M tokens/s for the
# 112 MFLOP/token model); below the low end something is wrong. CPU: against the float32 matmul peak
# measured in the same run (benchmarks/README.md has the CPU figures these come from).
EXPECTED_MFU = {"cuda": (0.20, 0.60), "cpu": (0.10, 1.0), "mps": (0.05, 1.0)}

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


@dataclass(frozen=True)
class CudaEnvironment:
    """What the GPU offers, and what a run of lmtune turns on."""

    cuda: str | None
    """The CUDA version torch was built with."""
    capability: str
    """The compute capability, e.g. "9.0"."""
    bf16: bool
    """Native bf16 tensor cores (not the emulated bf16 of older GPUs)."""
    bf16_emulated: bool
    """bf16 only emulated: it would run slowly and uncompiled."""
    tf32: bool
    """TF32 tensor cores (compute capability 8.0 on)."""
    tf32_enabled: bool
    """Whether matmuls use TF32 once lmtune's backend settings are applied."""
    driver: str
    """The driver's version, or why NVML could not say."""


def cuda_environment(device: torch.device, cuda: types.ModuleType = torch.cuda) -> CudaEnvironment:
    """What the GPU offers, and what a run of lmtune turns on (its backend settings applied first, as
    ``train`` applies them). (``cuda``: a stand-in in the tests.)"""
    configure_backend(device)
    props = cuda.get_device_properties(device)
    try:
        import pynvml

        _nvml_handle(device)
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else driver
    except Exception as err:  # noqa: BLE001 - NVML missing or broken: report, do not fail the diagnosis
        driver = f"unknown (NVML: {err})"
    return CudaEnvironment(
        cuda=torch.version.cuda, capability=f"{props.major}.{props.minor}",
        # Native bf16 only: is_bf16_supported() also counts the emulated bf16 of older GPUs.
        bf16=cuda.is_bf16_supported(including_emulation=False),
        bf16_emulated=cuda.is_bf16_supported() and not cuda.is_bf16_supported(including_emulation=False),
        # TF32 tensor cores exist from Ampere (compute capability 8.0) on.
        tf32=props.major >= 8, tf32_enabled=torch.backends.cuda.matmul.allow_tf32, driver=driver)


@dataclass(frozen=True)
class NvmlSample:
    """One reading of the GPU."""

    sm_clock_mhz: float
    """The SM clock."""
    temperature_c: float
    """The GPU's temperature."""
    power_w: float
    """Its power draw."""
    reasons: int
    """NVML's clocks-event (throttle) reason bits."""
    utilization: float
    """GPU utilization, percent."""


@dataclass(frozen=True)
class NvmlSummary:
    """The GPU during a benchmark: ranges over the samples and the throttling seen."""

    samples: int
    """Readings taken (0: none, and every other field is empty)."""
    sm_clock_mhz_median: float | None = None
    """Median SM clock over the busy samples (utilization above 50%, or all)."""
    sm_clock_mhz_max: float | None = None
    """The GPU's maximum SM clock."""
    temperature_c_max: float | None = None
    """The highest temperature read."""
    power_w_max: float | None = None
    """The highest power draw read."""
    power_limit_w: float | None = None
    """The enforced power limit (None: NVML did not say)."""
    throttle_reasons: tuple[str, ...] = ()
    """Throttle reasons seen in at least 10% of the busy samples."""
    thermal_throttling: bool = False
    """One of them is thermal."""
    power_throttling: bool = False
    """One of them is about power."""
    throttle_kinds: tuple[str, ...] = ()
    """The kinds (thermal, power, ...) of every reason seen."""


class NvmlSampler(threading.Thread):
    """Samples SM clock, temperature, power and throttle reasons every ``interval_s`` on a background thread."""

    def __init__(self, device: torch.device, interval_s: float = 0.2):
        super().__init__(name="lmtune-nvml", daemon=True)
        import pynvml

        self.pynvml = pynvml
        self.handle = _nvml_handle(device)
        self.interval_s = interval_s
        self.samples: list[NvmlSample] = []
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
                self.samples.append(NvmlSample(
                    sm_clock_mhz=nv.nvmlDeviceGetClockInfo(self.handle, nv.NVML_CLOCK_SM),
                    temperature_c=nv.nvmlDeviceGetTemperature(self.handle, nv.NVML_TEMPERATURE_GPU),
                    power_w=nv.nvmlDeviceGetPowerUsage(self.handle) / 1000,
                    reasons=self._reasons(),
                    utilization=nv.nvmlDeviceGetUtilizationRates(self.handle).gpu,
                ))
            except nv.NVMLError as err:
                log.warning("NVML sampling stopped: %s", err)
                return
            self._stop_event.wait(self.interval_s)

    def stop(self) -> NvmlSummary:
        self._stop_event.set()
        self.join(timeout=2)
        return summarize_nvml(self.samples, self.max_sm_clock, self.power_limit_w)


def summarize_nvml(samples: list[NvmlSample], max_sm_clock: float, power_limit_w: float | None) -> NvmlSummary:
    """Clock/temperature/power ranges and the throttle reasons seen in at least 10% of samples."""
    if not samples:
        return NvmlSummary(samples=0)
    busy = [s for s in samples if s.utilization > 50] or samples
    counts: dict[str, int] = {}
    kinds: set[str] = set()
    for s in busy:
        for bit, (label, kind) in _THROTTLE_BITS.items():
            if int(s.reasons) & bit:
                counts[label] = counts.get(label, 0) + 1
                kinds.add(kind)
    frequent = tuple(sorted(label for label, n in counts.items() if n >= 0.1 * len(busy)))
    return NvmlSummary(
        samples=len(samples),
        sm_clock_mhz_median=sorted(s.sm_clock_mhz for s in busy)[len(busy) // 2],
        sm_clock_mhz_max=max_sm_clock,
        temperature_c_max=max(s.temperature_c for s in samples),
        power_w_max=max(s.power_w for s in samples), power_limit_w=power_limit_w,
        throttle_reasons=frequent,
        thermal_throttling=any("thermal" in label.lower() for label in frequent),
        power_throttling=any("power" in label.lower() for label in frequent),
        throttle_kinds=tuple(sorted(kinds)),
    )


def verdict(result: BenchResult, device_type: str, nvml: NvmlSummary | None,
            compile_ok: bool) -> tuple[bool, list[str]]:
    """(in the expected range?, what to change) for a bench result."""
    advice: list[str] = []
    low, _high = EXPECTED_MFU.get(device_type, (0.0, 1.0))
    in_range = result.mfu >= low
    if not in_range:
        advice.append(f"MFU {100 * result.mfu:.1f}% is below the {100 * low:.0f}% expected on {device_type}")
        if not compile_ok:
            advice.append("torch.compile does not work here: install a C++ compiler (and Triton on CUDA); "
                          "eager mode is much slower")
        if device_type == "cuda":
            if result.precision != "bfloat16":
                advice.append("training is not in bf16: leave precision=auto on a GPU that supports bf16")
            if result.optimized_variant != "compiled":
                advice.append("the step ran eager: leave compile=auto (or compile=on) on CUDA")
            advice.append("check for other processes on the GPU (nvidia-smi) and try a larger --batch-size")
        elif device_type == "cpu":
            load = result.load_avg_1m
            if load is not None and load > (os.cpu_count() or 1):
                advice.append(f"the CPU is oversubscribed (load average {load:.1f} on {os.cpu_count()} cores): "
                              "stop other jobs or run fewer trials at once")
            if result.optimized_variant == "eager" and result.flops_per_token >= 50e6:
                advice.append("this model ran eager: at 50+ MFLOP/token compile=on measured faster on CPU "
                              "(benchmarks/README.md)")
    if result.data_wait_fraction > DATA_STALL_FRACTION:
        advice.append(f"data-loader stall: {100 * result.data_wait_fraction:.1f}% of each step waits for "
                      f"data (over {100 * DATA_STALL_FRACTION:.0f}%); keep the data dir on local disk, "
                      "and leave CPU cores free for the prefetch thread")
    if nvml and nvml.thermal_throttling:
        advice.append(f"THERMAL THROTTLING: the GPU slowed its clocks for heat ({', '.join(nvml.throttle_reasons)}, "
                      f"max {nvml.temperature_c_max} C); check cooling and airflow")
    if nvml and nvml.power_throttling:
        advice.append(f"POWER THROTTLING: the GPU hit its power limit ({', '.join(nvml.throttle_reasons)}, "
                      f"max {nvml.power_w_max:.0f} W of {nvml.power_limit_w or '?'} W); "
                      "check the power cap (nvidia-smi -q -d POWER)")
    return in_range and not advice, advice
