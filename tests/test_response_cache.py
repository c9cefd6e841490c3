"""The response cache's keys and its memory budget."""

from __future__ import annotations

import numpy as np

from service.records import VariantRecord, VariantStatus
from service.response_cache import ENTRY_OVERHEAD_BYTES, ResponseCache, response_key

VARIANT = VariantRecord(
    id="v", model="m", version=1, backend="torchscript", target="any", status=VariantStatus.ready
)


def test_keys_tell_apart_every_input_that_differs() -> None:
    x = np.zeros((1, 2), np.float32)
    keys = {
        response_key("m", 1, {"x": x}),
        response_key("m", 2, {"x": x}),  # another version
        response_key("n", 1, {"x": x}),  # another model
        response_key("m", 1, {"x": np.zeros(2, np.float32)}),  # another shape, the same bytes
        response_key("m", 1, {"x": np.zeros((1, 2), np.int32)}),  # another dtype, the same bytes
        response_key("m", 1, {"y": x}),  # another name
        response_key("m", 1, {"x": x + 1}),
    }
    assert len(keys) == 7
    a, b = np.ones((1, 2), np.float32), np.zeros((1, 3), np.int64)
    assert response_key("m", 1, {"a": a, "b": b}) == response_key("m", 1, {"b": b, "a": a})
    assert response_key("m", 1, {"x": np.asfortranarray(np.eye(3))}) == response_key("m", 1, {"x": np.eye(3)})


def test_the_cache_keeps_copies_within_its_budget() -> None:
    entry = ENTRY_OVERHEAD_BYTES + 4000  # one row of 1000 float32, and what holds it
    cache = ResponseCache(max_bytes=3 * entry)
    batch = np.zeros((4, 1000), np.float32)
    keys = [response_key("m", 1, {"x": np.full((1, 2), i, np.float32)}) for i in range(4)]
    for i, key in enumerate(keys):
        cache.put(key, {"y": batch[i]}, VARIANT, cache.epoch("m"))  # a view of the batch: copied
    assert cache.get(keys[0]) is None  # the oldest went for the fourth
    kept = cache.get(keys[1])
    assert kept is not None and kept.outputs["y"].base is None and not kept.outputs["y"].flags.writeable
    assert cache.size_bytes == 3 * entry
    cache.put(
        response_key("m", 1, {"x": np.ones(1)}), {"y": np.zeros(4000, np.float32)}, VARIANT, cache.epoch("m")
    )
    assert cache.size_bytes == 3 * entry  # one bigger than the whole budget is not kept
    cache.put(keys[1], {"y": batch[1]}, VARIANT, cache.epoch("m"))  # again: replaced, not counted twice
    assert cache.size_bytes == 3 * entry


def test_dropping_a_version_leaves_the_others() -> None:
    cache = ResponseCache(max_bytes=1 << 20)
    y = {"y": np.zeros(1, np.float32)}
    keys = {
        (name, version): response_key(name, version, {"x": np.zeros(1)})
        for name in ("m", "n")
        for version in (1, 2)
    }
    for key in keys.values():
        cache.put(key, y, VARIANT, cache.epoch(key[0]))
    cache.drop("m", 1)
    assert [k for k, key in keys.items() if cache.get(key)] == [("m", 2), ("n", 1), ("n", 2)]
    cache.drop("n")
    assert [k for k, key in keys.items() if cache.get(key)] == [("m", 2)]
    assert cache.size_bytes == ENTRY_OVERHEAD_BYTES + 4


def test_an_answer_computed_across_a_drop_is_not_kept() -> None:
    """The cache turned off by a PATCH (or the model unloaded) while a miss ran: its answer was
    put after the drop, held against the budget and served once the cache was on again."""
    cache = ResponseCache(max_bytes=1 << 20)
    key = response_key("m", 1, {"x": np.zeros(1)})
    epoch = cache.epoch("m")
    cache.drop("m", 1)
    cache.put(key, {"y": np.zeros(1, np.float32)}, VARIANT, epoch)
    assert (cache.get(key), cache.size_bytes) == (None, 0)
    cache.put(key, {"y": np.zeros(1, np.float32)}, VARIANT, cache.epoch("m"))
    assert cache.get(key) is not None
