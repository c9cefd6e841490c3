"""Verification: a candidate runner must reproduce the reference runner's outputs within tolerance."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from compiler.dims import OutsideDimsError
from compiler.runner import Runner
from compiler.spec import DTYPES, TRACE_FILL, InputSpec


@dataclass(frozen=True)
class VerifyReport:
    passed: bool
    max_abs_error: float
    max_rel_error: float
    cases: int
    reason: str | None = None


def verification_batches(spec: InputSpec) -> list[int]:
    """Batch 1, the largest batch, and a size in between (`middle_batch`)."""
    return sorted({1, middle_batch(spec), spec.largest_batch})


def middle_batch(spec: InputSpec) -> int:
    """A size between 1 and the largest batch where there is one, odd where it can be: padding
    bugs hide at round sizes, and a tuned build, compiled at 1 and the largest, pads only those
    between (at a largest of 3, one wrong at 2 alone was verified at 1 and 3, and served)."""
    return max(1, min(spec.largest_batch - 1, 3))


# Dynamic dims besides the batch at an odd size too: an Inductor build traced at even sizes lost a
# ceil_mode pool's last row at odd ones (errors of 2e4 at 9x9), and every other case is even.
ODD_FILL = TRACE_FILL + 1


def edge_cases(spec: InputSpec, rng: np.random.Generator) -> list[dict[str, np.ndarray]]:
    """Inputs that random ones at round sizes almost never are, to verify where the reference
    takes them: odd dynamic dims, and bool inputs all true and all false (an attention mask
    padding a whole row, for which ONNX Runtime answered NaN where torch answers numbers)."""
    batch = middle_batch(spec)
    cases = [spec.random_inputs(batch, rng, ODD_FILL)] if spec.free_dims else []
    flags = [t.name for t in spec.inputs if DTYPES[t.dtype].kind == "b"]
    for value in (True, False) if flags else ():
        case = spec.random_inputs(batch, rng)
        cases.append(case | {name: np.full_like(case[name], value) for name in flags})
    return cases


# float16 keeps 11 significant bits, about 1e-3 of relative rounding per operation, which a
# model's sums pile up: a float16 output is checked at least this loosely, relative to its
# values and to its largest value (a build closer to exact than the float16 reference itself was
# rejected at 1e-4). Not absolutely: small probabilities all 0 would pass at an atol of 1e-2.
HALF_TOLERANCE = 1e-2


def verify(
    candidate: Runner,
    reference: Runner,
    spec: InputSpec,
    rtol: float,
    atol: float,
    samples: Sequence[Mapping[str, np.ndarray]] = (),
    seed: int = 0,
) -> VerifyReport:
    """Outputs must have the reference's dtypes. Integer and bool ones must be equal; float ones
    within `rtol` and `atol` (float16 ones
    within HALF_TOLERANCE at least). Each run gets inputs of its own: a model that writes to its
    inputs must not hand the other runner what it wrote. A sample of sizes the candidate was not
    built for is left out: TorchScript serves those (compiler.dims); a candidate that takes none
    of the inputs fails. The `edge_cases` count where the reference takes them: a model may
    refuse odd sizes, which it is then never served."""
    rng = np.random.default_rng(seed)
    required = [spec.random_inputs(b, rng) for b in verification_batches(spec)] + list(samples)
    cases = [(case, True) for case in required] + [(case, False) for case in edge_cases(spec, rng)]
    max_abs = 0.0
    max_rel = 0.0
    checked, refused = 0, ""

    def failed(reason: str, error: float = float("inf")) -> VerifyReport:
        lost = error == float("inf")
        return VerifyReport(False, max(max_abs, error), error if lost else max_rel, checked, reason)

    for case, needed in cases:
        try:
            want = reference.run({k: v.copy() for k, v in case.items()})
        except Exception:
            if needed:
                raise
            continue
        try:
            got = candidate.run({k: v.copy() for k, v in case.items()})
        except OutsideDimsError as exc:
            refused = str(exc)
            continue
        checked += 1
        if sorted(want) != sorted(got):
            return failed(f"outputs differ: expected {sorted(want)}, got {sorted(got)}")
        for name, expected in want.items():
            actual = got[name]
            if actual.shape != expected.shape:
                return failed(f"{name}: expected shape {list(expected.shape)}, got {list(actual.shape)}")
            # Served as the variant computes it: a narrower integer wraps where the model's does
            # not (a uint8 cumsum that torch widens to int64), past inputs verification reaches.
            if actual.dtype != expected.dtype:
                return failed(f"{name}: expected {expected.dtype}, got {actual.dtype}")
            exp = expected.astype(np.float64)
            act = actual.astype(np.float64)
            if not np.all(np.isfinite(act) == np.isfinite(exp)):
                return failed(f"{name}: non-finite values where the reference has none")
            diff = np.abs(act - exp)
            finite = np.isfinite(diff)
            error = float(diff[finite].max()) if finite.any() else 0.0
            if finite.any():
                rel = diff[finite] / np.maximum(np.abs(exp[finite]), np.finfo(np.float64).tiny)
                max_rel = max(max_rel, float(rel.max()))
            if expected.dtype.kind in "biu":  # compared as they are: int64 past 2**53 too
                if not np.array_equal(actual, expected):
                    wrong = actual != expected
                    by = max(
                        abs(int(a) - int(e)) for a, e in zip(actual[wrong], expected[wrong], strict=True)
                    )
                    return failed(
                        f"{name}: {wrong.sum()} of {exp.size} integer values differ (by up to {by})", by
                    )
            else:
                out_rtol, out_atol = rtol, atol
                if expected.dtype == np.float16:
                    largest = float(np.abs(exp[np.isfinite(exp)]).max(initial=0.0))
                    out_rtol, out_atol = max(rtol, HALF_TOLERANCE), max(atol, HALF_TOLERANCE * largest)
                if not np.allclose(act, exp, rtol=out_rtol, atol=out_atol, equal_nan=True):
                    return failed(
                        f"{name}: max abs error {error:.3g} exceeds atol={out_atol:g} + rtol={out_rtol:g}",
                        error,
                    )
            max_abs = max(max_abs, error)
    if not checked:
        return failed(f"no input it was verified on is of sizes it takes ({refused})")
    return VerifyReport(True, max_abs, max_rel, checked)
