"""Verification: a candidate runner must reproduce the reference runner's outputs within tolerance."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from compiler.runner import Runner
from compiler.spec import InputSpec


@dataclass(frozen=True)
class VerifyReport:
    passed: bool
    max_abs_error: float
    max_rel_error: float
    cases: int
    reason: str | None = None


def verification_batches(spec: InputSpec) -> list[int]:
    """Batch 1, the largest batch, and an odd size in between: padding bugs hide at round sizes."""
    if not spec.batched:
        return [1]
    top = spec.max_batch_size
    return sorted({1, max(1, min(top, 3)), top})


def verify(
    candidate: Runner,
    reference: Runner,
    spec: InputSpec,
    rtol: float,
    atol: float,
    samples: Sequence[Mapping[str, np.ndarray]] = (),
    seed: int = 0,
) -> VerifyReport:
    rng = np.random.default_rng(seed)
    cases = [spec.random_inputs(b, rng) for b in verification_batches(spec)] + list(samples)
    max_abs = 0.0
    max_rel = 0.0
    for case in cases:
        want = reference.run(case)
        got = candidate.run(case)
        if sorted(want) != sorted(got):
            return VerifyReport(
                False,
                float("inf"),
                float("inf"),
                len(cases),
                f"outputs differ: expected {sorted(want)}, got {sorted(got)}",
            )
        for name, expected in want.items():
            actual = got[name]
            if actual.shape != expected.shape:
                return VerifyReport(
                    False,
                    float("inf"),
                    float("inf"),
                    len(cases),
                    f"{name}: expected shape {list(expected.shape)}, got {list(actual.shape)}",
                )
            exp = expected.astype(np.float64)
            act = actual.astype(np.float64)
            if not np.all(np.isfinite(act) == np.isfinite(exp)):
                return VerifyReport(
                    False,
                    float("inf"),
                    float("inf"),
                    len(cases),
                    f"{name}: non-finite values where the reference has none",
                )
            diff = np.abs(act - exp)
            finite = np.isfinite(diff)
            if finite.any():
                max_abs = max(max_abs, float(diff[finite].max()))
                rel = diff[finite] / np.maximum(np.abs(exp[finite]), np.finfo(np.float64).tiny)
                max_rel = max(max_rel, float(rel.max()))
            if not np.allclose(act, exp, rtol=rtol, atol=atol, equal_nan=True):
                return VerifyReport(
                    False,
                    max_abs,
                    max_rel,
                    len(cases),
                    f"{name}: max abs error {max_abs:.3g} exceeds atol={atol:g} + rtol={rtol:g}",
                )
    return VerifyReport(True, max_abs, max_rel, len(cases))
