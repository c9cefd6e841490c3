"""Export's guards, checked on a request's shapes without eval: the forms torch writes, as Python
computes them, and nothing else."""

from __future__ import annotations

import pytest

from compiler.guards import MAX_CODE, Guard

NAMES = {"x_1": "x", "y_1": "y"}


@pytest.mark.parametrize(
    ("code", "shapes", "holds"),
    [
        ("L['y_1'].size()[1] > L['x_1'].size()[1]", {"x": (2, 8), "y": (2, 16)}, True),
        ("L['y_1'].size()[1] > L['x_1'].size()[1]", {"x": (2, 8), "y": (2, 8)}, False),
        # Pooling's output sizes: floor division, max.
        ("(max(1, 1 + (((-1) + (L['x_1'].size()[1] // 2)) // 2))) != 1", {"x": (1, 8)}, True),
        ("(max(1, 1 + (((-1) + (L['x_1'].size()[1] // 2)) // 2))) != 1", {"x": (1, 3)}, False),
        ("((-7) // 2) == -4 and ((-7) % 3) == 2", {}, True),
        ("2 <= L['x_1'].size()[1] <= 512", {"x": (1, 600)}, False),
        ("not (L['x_1'].size()[0] == 1)", {"x": (1, 4)}, False),
        ("(L['x_1'].size()[1] >= 2) & (L['x_1'].size()[1] <= 4)", {"x": (1, 3)}, True),
        ("math.floor(L['x_1'].size()[1] / 2) == 1", {"x": (1, 3)}, True),
        # A size of 0 in a division: not to be told, so refused rather than raised.
        ("(8 // L['x_1'].size()[1]) > 1", {"x": (1, 0)}, False),
    ],
)
def test_a_guard_is_computed_as_python_would(
    code: str, shapes: dict[str, tuple[int, ...]], holds: bool
) -> None:
    assert Guard(code, NAMES).holds(shapes) is holds


@pytest.mark.parametrize(
    "code",
    [
        "__import__('os').system('true')",
        "L['x_1'].size()[1].__class__",
        "open('/etc/passwd')",
        "L['z_1'].size()[1] > 1",  # no input of the program's
        "L['x_1'].size()[1] ** 100000",
        "lambda: 1",
        "1 +" + " 1 +" * MAX_CODE + " 1",
    ],
)
def test_any_other_form_is_refused_when_it_is_read(code: str) -> None:
    with pytest.raises(ValueError):
        Guard(code, NAMES)


def test_it_reads_as_the_spec_names_the_inputs() -> None:
    assert str(Guard("L['y_1'].size()[1] > L['x_1'].size()[1]", NAMES)) == "y.shape[1] > x.shape[1]"
