"""Backend registry. Modules are imported lazily: TVM alone takes seconds to import."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping

from compiler.artifact import Artifact
from compiler.backends.base import Backend
from compiler.dims import Bounded, Dims
from compiler.errors import BackendUnavailableError
from compiler.hardware import cuda_capability
from compiler.runner import Runner

# name -> module holding a module-level `backend` object.
REGISTRY: dict[str, str] = {
    "torchscript": "compiler.backends.torchscript",
    "tvm": "compiler.backends.tvm",
    "onnxruntime": "compiler.backends.onnxruntime",
    "inductor": "compiler.backends.inductor",
    "openvino": "compiler.backends.openvino",
    "tensorrt": "compiler.backends.tensorrt",
}

REFERENCE = "torchscript"
# The target of the upload's own TorchScript on the CPU, which every version serves first.
ANY_TARGET = "any"


def reference_target(target: str) -> str:
    """The target of the TorchScript variant that `target`'s variants are timed against: a GPU
    target's own (the upload on that GPU), else `any` (the upload on the CPU)."""
    return target if cuda_capability(target) is not None else ANY_TARGET


# Target families (a target's text before its first "-") each backend builds for on some host.
# An API rejects any other pairing at upload; whether a worker has the library or the device
# for a target of the right family is for that worker to say. Unlisted: every family.
FAMILIES: dict[str, tuple[str, ...]] = {
    "tvm": ("cpu", "cuda"),
    "onnxruntime": ("cpu",),
    "inductor": ("cpu",),
    "openvino": ("cpu",),
    "tensorrt": ("cuda",),
}


# What each option an upload may give a backend accepts, given the largest batch a call may have.
# Anything else is refused before any compile: a backend would ignore it, yet it would name a
# variant of its own and could set its verification tolerance (`precision`). Intra-op threads
# are the server's (KILN_THREADS).
# The most MetaSchedule trials one tuned variant may ask for.
MAX_TUNING_TRIALS = 20_000
OPTIONS: dict[str, dict[str, tuple[str, Callable[[object, int], bool]]]] = {
    "tvm": {
        "tuning_trials": (
            f"an integer in 1..{MAX_TUNING_TRIALS}",
            lambda v, _: _whole(v, 1, MAX_TUNING_TRIALS),
        )
    },
    "onnxruntime": {},
    "inductor": {},
    "openvino": {"precision": ("fp32 or bf16", lambda v, _: v in ("fp32", "bf16"))},
    "tensorrt": {
        "precision": ("fp32 or fp16", lambda v, _: v in ("fp32", "fp16")),
        # The batch TensorRT tunes its kernels for: one that calls can have.
        "opt_batch_size": ("an integer in 1..{top} (the largest batch)", lambda v, top: _whole(v, 1, top)),
    },
}


def _whole(value: object, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def option_problems(name: str, options: Mapping[str, object], largest_batch: int) -> list[str]:
    """What is wrong with a backend's options, one line each; empty when nothing is."""
    known = OPTIONS.get(name, {})
    unknown = sorted(set(options) - set(known))
    problems = [f"{name}: unknown option(s) {unknown}; known: {sorted(known) or 'none'}"] if unknown else []
    for key, (accepts, valid) in known.items():
        if key in options and not valid(options[key], largest_batch):
            must = accepts.format(top=largest_batch)
            problems.append(f"{name}: option {key} must be {must}; got {options[key]!r}")
    return problems


def get_backend(name: str) -> Backend:
    module_name = REGISTRY.get(name)
    if module_name is None:
        raise BackendUnavailableError(f"unknown backend {name!r}; known: {sorted(REGISTRY)}")
    backend: Backend = importlib.import_module(module_name).backend
    return backend


def load_artifact(artifact: Artifact) -> Runner:
    """The artifact's backend's runner for it; a compiled one refuses the inputs it was not
    built or verified for (compiler.dims), which TorchScript, the model as uploaded, answers."""
    runner = get_backend(artifact.backend).load(artifact)
    if artifact.backend == REFERENCE:
        return runner
    dims = artifact.meta.get("dims")
    return Bounded(runner, None if dims is None else Dims.from_dict(dims))


def family_reason(name: str, target: str) -> str | None:
    """Why `name` can never build for `target` on any host, or None when some host might."""
    families = FAMILIES.get(name)
    family = target.partition("-")[0]
    if families is None or family in families:
        return None
    return f"{name}: {family} targets are not supported (only {', '.join(families)})"


def options_reason(name: str, options: Mapping[str, object], target: str) -> str | None:
    """Why `name` with these options can never build for `target`, or None."""
    if name == "tvm" and options.get("tuning_trials") and not target.startswith("cpu-"):
        return "tvm: tuning_trials is for cpu targets; cuda builds use dlight's default GPU schedules"
    return None


def pads_batches(name: str, options: Mapping[str, object]) -> bool:
    """Whether a variant runs a batch padded up to the next size it was built for (a tuned tvm
    build's static functions): at any batch between two sizes, it costs what the larger does."""
    return name == "tvm" and bool(options.get("tuning_trials"))


def availability(target: str) -> dict[str, str | None]:
    """Every registered backend -> None when it can build for `target` on this host, else why not."""
    found: dict[str, str | None] = {}
    for name in REGISTRY:
        try:
            found[name] = get_backend(name).unavailable_reason(target)
        except Exception as exc:  # one broken backend module must not hide the others
            found[name] = f"{name}: cannot load its module ({type(exc).__name__}: {exc})"
    return found
