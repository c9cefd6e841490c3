"""The response cache's keys and its memory budget."""

from __future__ import annotations

import numpy as np

from service.records import VariantRecord, VariantStatus
from service.response_cache import ResponseCache, response_key


def test_the_response_cache_keeps_copies_within_its_budget() -> None:
    variant = VariantRecord(
        id="v", model="m", version=1, backend="torchscript", target="any", status=VariantStatus.ready
    )
    cache = ResponseCache(max_bytes=3 * 4000)
    batch = np.zeros((4, 1000), np.float32)
    keys = [response_key("m", 1, {"x": np.full((1, 2), i, np.float32)}) for i in range(4)]
    assert len(set(keys)) == 4
    assert keys[0] != response_key("m", 2, {"x": np.full((1, 2), 0, np.float32)})
    assert keys[0] != response_key("m", 1, {"x": np.full((2,), 0, np.float32)})  # shape counts
    for i, key in enumerate(keys):
        cache.put(key, {"y": batch[i]}, variant)  # a view of the batch: copied, 4000 bytes
    assert cache.get(keys[0]) is None  # the oldest went for the fourth
    kept = cache.get(keys[1])
    assert kept is not None and kept.outputs["y"].base is None and not kept.outputs["y"].flags.writeable
    assert cache.size_bytes == 3 * 4000
    cache.put(response_key("m", 1, {"x": np.ones(1)}), {"y": np.zeros(4000, np.float32)}, variant)
    assert cache.size_bytes == 3 * 4000  # one bigger than the whole budget is not kept
    cache.drop("m", 1)
    assert cache.size_bytes == 0 and cache.get(keys[2]) is None
