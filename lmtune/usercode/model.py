"""Building the user's model: its callable (``--model``) called with CS336's constructor arguments from lmtune's
config, plus the user's own (``--model-set``), and ``device``/``dtype`` where its signature takes them.

    TransformerLM(vocab_size=, context_length=, d_model=, num_layers=, num_heads=, d_ff=, rope_theta=,
                  device=, dtype=, **model_args)

A callable shaped otherwise (other names, other order, a config object) is refused in one line that names the
argument, before anything is built: its user writes a small factory that maps these arguments to theirs, as CS336's
``tests/adapters.py`` does. A model that leaves its weights elsewhere than the ``device``/``dtype`` it was given is
moved there, and told once.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import logging
from dataclasses import asdict

import torch
from torch import nn

from lmtune.errors import LmtuneError, shown
from lmtune.training.device import available_memory_bytes
from lmtune.training.model import count_parameters
from lmtune.training.model_config import ModelConfig
from lmtune.usercode.config import UserCode
from lmtune.usercode.guard import guarded
from lmtune.usercode.imports import load

log = logging.getLogger(__name__)

# CS336's constructor arguments, and the ModelConfig field each takes its value from.
CONSTRUCTOR_ARGS = {"vocab_size": "vocab_size", "context_length": "context_length", "d_model": "d_model",
                    "num_layers": "n_layers", "num_heads": "n_heads", "d_ff": "d_ff", "rope_theta": "rope_theta"}
PLACEMENT_ARGS = ("device", "dtype")
FACTORY_FIX = "write a factory in your module that takes lmtune's arguments and builds your model (README: Your model)"

_told: set[tuple[str, str]] = set()
"""(spec, what) already said in this process: a model moved to its device or dtype is told once."""


def constructor_kwargs(code: UserCode, model: ModelConfig) -> dict[str, object]:
    """The keyword arguments the model's callable gets (without device and dtype)."""
    clash = sorted(set(code.model_args) & (set(CONSTRUCTOR_ARGS) | set(PLACEMENT_ARGS)))
    if clash:
        raise LmtuneError(f"--model-set {clash[0]}: lmtune passes {clash[0]} itself; set the model's shape with "
                          f"--set {CONSTRUCTOR_ARGS.get(clash[0], clash[0])}=VALUE")
    return {**{arg: getattr(model, field) for arg, field in CONSTRUCTOR_ARGS.items()}, **code.model_args}


def accepted_placement(factory: object, kwargs: dict[str, object], spec: str) -> tuple[str, ...]:
    """Which of device and dtype the callable takes; refuses, naming it, an argument lmtune passes that it does not
    take, or one it requires that lmtune does not pass."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # a builtin or C extension: nothing to read, the call itself will tell
        return ()
    params = signature.parameters
    open_ended = any(p.kind is p.VAR_KEYWORD for p in params.values())
    for name in kwargs:
        if name not in params and not open_ended:
            if name in CONSTRUCTOR_ARGS:
                raise LmtuneError(f"--model {spec}: its callable takes no argument {name!r}, which lmtune passes "
                                  f"(it takes: {', '.join(params) or 'nothing'}); {FACTORY_FIX}")
            raise LmtuneError(f"--model-set {name}: {spec} takes no argument {name!r} (it takes: "
                              f"{', '.join(params) or 'nothing'}); drop it or correct its name")
    for name, param in params.items():
        required = param.default is param.empty and param.kind not in (param.VAR_POSITIONAL, param.VAR_KEYWORD)
        if required and (name not in kwargs or param.kind is param.POSITIONAL_ONLY) and name not in PLACEMENT_ARGS:
            raise LmtuneError(f"--model {spec}: its callable requires {name!r}, which lmtune does not pass (it passes "
                              f"{', '.join(kwargs)}, device and dtype by keyword); {FACTORY_FIX}")
    return tuple(name for name in PLACEMENT_ARGS if name in params or open_ended)


def build_user_model(code: UserCode, model: ModelConfig, device: torch.device,
                     dtype: torch.dtype = torch.float32) -> nn.Module:
    """The user's model at ``model``'s shape on ``device``, built (and so initialised) in float32 as it trains, its
    parameters then converted to ``dtype`` where another is asked for (float64 to check arithmetic): the same
    weights whatever the dtype, as lmtune's own model's."""
    factory = load(code.model, "--model")
    if isinstance(factory, nn.Module) or not callable(factory):
        raise LmtuneError(f"--model {code.model}: names a {type(factory).__name__}, not a class or function; name "
                          "the callable that builds your model (lmtune builds a fresh one per run)")
    kwargs = constructor_kwargs(code, model)
    placement = {"device": device, "dtype": torch.float32}
    extra = {name: placement[name] for name in accepted_placement(factory, kwargs, code.model)}
    args = ", ".join(f"{k}={shown(v)}" for k, v in kwargs.items())
    with guarded("--model", code.model, f"building it with ({args})", "check the model's code or its arguments"):
        built = factory(**kwargs, **extra)
    if not isinstance(built, nn.Module):
        raise LmtuneError(f"--model {code.model}: returned a {type(built).__name__}, not a torch.nn.Module; "
                          "name the class (or a function returning an instance) of your model")
    built = placed(built, code.model, device, torch.float32)
    return built if dtype == torch.float32 else built.to(dtype)


def placed(model: nn.Module, spec: str, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """``model`` with every parameter and buffer on ``device`` and its floating-point ones in ``dtype``: moved when
    its constructor left them elsewhere (it ignored, or did not take, the device/dtype it was given), said once."""
    tensors = [*model.parameters(), *model.buffers()]
    elsewhere = any(not same_device(t.device, device) for t in tensors)
    other_dtype = any(t.is_floating_point() and t.dtype != dtype for t in model.parameters())
    if elsewhere:
        tell(spec, "device", f"{spec} built its weights off {device}: lmtune moved them there")
        model = model.to(device)
    if other_dtype:
        tell(spec, "dtype", f"{spec} built parameters in a dtype other than {dtype}: lmtune converted them "
                            "(it trains in float32, with bf16 autocast where the device has it)")
        model = model.to(dtype)
    return model


def same_device(a: torch.device, b: torch.device) -> bool:
    """Whether ``a`` is ``b`` (``cuda`` without an index meaning the current device)."""
    if a.type != b.type:
        return False
    if a.type != "cuda" or a.index is None or b.index is None:
        return True
    return a.index == b.index


def tell(spec: str, what: str, message: str) -> None:
    if (spec, what) not in _told:
        _told.add((spec, what))
        log.warning("%s", message)


def check_host_memory(code: UserCode, model: ModelConfig, builds: int = 3) -> None:
    """Refuse, in one line, a shape at which building the user's model ``builds`` times on the CPU (lmtune's checks
    do, and its size is counted from a build) would not fit in the host's memory, judged by what a CS336-shaped
    model of that shape holds (the user's model is not built to find out)."""
    params = count_parameters(model)["total"]
    need, have = builds * 4 * params, available_memory_bytes(torch.device("cpu"))
    if have is not None and need > have:
        raise LmtuneError(f"--model {code.model}: at d_model {model.d_model}, {model.n_layers} layers, d_ff "
                          f"{model.d_ff} and vocab {model.vocab_size}, a model of this shape has about {params:,} "
                          f"parameters; lmtune builds it on the CPU to check and count it, which needs about "
                          f"{need / 2**30:.1f} GiB of the {have / 2**30:.1f} GiB free; use a smaller d_model, "
                          "n_layers, d_ff or vocab_size")


@functools.lru_cache(maxsize=64)
def _named_shapes(code_key: tuple, model_key: tuple) -> tuple[tuple[str, tuple[int, ...]], ...]:
    code, model = UserCode(code_key[0], dict(code_key[1])), ModelConfig(**dict(model_key))
    check_host_memory(code, model)
    # Built for real on the CPU, not on the meta device: a module-level cache of the user's (a shared RoPE) would
    # keep meta tensors and break every later build.
    built = build_user_model(code, model, torch.device("cpu"))
    return tuple((name, tuple(p.shape)) for name, p in built.named_parameters())


def named_parameter_shapes(code: UserCode, model: ModelConfig) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """(name, shape) of each of the user's model's parameters at ``model``'s shape (a tied one once), from one build
    on the CPU, cached per process."""
    return _named_shapes((code.model, tuple(sorted(code.model_args.items()))), tuple(sorted(asdict(model).items())))


def parameter_shapes(code: UserCode, model: ModelConfig) -> tuple[tuple[int, ...], ...]:
    """The shapes of the user's model's parameters at ``model``'s shape (each tied parameter once)."""
    return tuple(shape for _, shape in named_parameter_shapes(code, model))


def parameter_fingerprint(code: UserCode, model: ModelConfig) -> str:
    """A digest of the user's model's parameter names and shapes: it changes when its code builds another model."""
    text = ";".join(f"{name}:{'x'.join(map(str, shape))}" for name, shape in named_parameter_shapes(code, model))
    return hashlib.sha256(text.encode()).hexdigest()[:16]
