"""The cluster-wide cache of MetaSchedule tuning records, in the store.

One document per tuned kernel, under `<target>.t<threads>:<workload hash>`: a schedule is only
valid for the CPU it was measured on and the thread count it was tuned with. Any model whose
kernel is structurally identical reuses it, so its compile skips that kernel's trials, unless it
asks for more trials per kernel than the document's `trials`: it then tunes the kernel again from
the cached schedule and saves the faster of the two with the trials added up.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from service.store.base import Store

KIND = "tuning_record"


def _prefix(target: str, threads: int) -> str:
    return f"{target}.t{threads}:"


def records_for(store: Store, target: str, threads: int) -> list[dict[str, Any]]:
    return store.list_docs(KIND, _prefix(target, threads))


def save_records(store: Store, target: str, threads: int, records: Iterable[dict[str, Any]]) -> None:
    for record in records:
        store.put_doc(KIND, _prefix(target, threads) + record["workload_hash"], record)
