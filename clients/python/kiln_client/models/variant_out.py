from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..models.variant_status import VariantStatus

if TYPE_CHECKING:
    from ..models.variant_out_baseline_latency_ms_by_batch import VariantOutBaselineLatencyMsByBatch
    from ..models.variant_out_latency_ms_by_batch import VariantOutLatencyMsByBatch
    from ..models.variant_out_options import VariantOutOptions


T = TypeVar("T", bound="VariantOut")


@_attrs_define
class VariantOut:
    """
    Attributes:
        backend (str):
        baseline_latency_ms_by_batch (VariantOutBaselineLatencyMsByBatch): TorchScript's latency, timed in the same run
            as this variant.
        cache_hit (bool):
        error (None | str):
        id (str):
        job_id (None | str):
        latency_ms (float | None): Median latency at batch 1, measured by the worker.
        latency_ms_by_batch (VariantOutLatencyMsByBatch):
        max_abs_error (float | None):
        options (VariantOutOptions): Backend options it was built with, e.g. {"precision": "fp16"}.
        raced_at (float | None): When these latencies were measured in a race, side by side with the version's other
            ready variants for this target; null: only when it compiled.
        status (VariantStatus):
        target (str):
    """

    backend: str
    baseline_latency_ms_by_batch: VariantOutBaselineLatencyMsByBatch
    cache_hit: bool
    error: None | str
    id: str
    job_id: None | str
    latency_ms: float | None
    latency_ms_by_batch: VariantOutLatencyMsByBatch
    max_abs_error: float | None
    options: VariantOutOptions
    raced_at: float | None
    status: VariantStatus
    target: str
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        backend = self.backend

        baseline_latency_ms_by_batch = self.baseline_latency_ms_by_batch.to_dict()

        cache_hit = self.cache_hit

        error: None | str
        error = self.error

        id = self.id

        job_id: None | str
        job_id = self.job_id

        latency_ms: float | None
        latency_ms = self.latency_ms

        latency_ms_by_batch = self.latency_ms_by_batch.to_dict()

        max_abs_error: float | None
        max_abs_error = self.max_abs_error

        options = self.options.to_dict()

        raced_at: float | None
        raced_at = self.raced_at

        status = self.status.value

        target = self.target

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "backend": backend,
                "baseline_latency_ms_by_batch": baseline_latency_ms_by_batch,
                "cache_hit": cache_hit,
                "error": error,
                "id": id,
                "job_id": job_id,
                "latency_ms": latency_ms,
                "latency_ms_by_batch": latency_ms_by_batch,
                "max_abs_error": max_abs_error,
                "options": options,
                "raced_at": raced_at,
                "status": status,
                "target": target,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.variant_out_baseline_latency_ms_by_batch import VariantOutBaselineLatencyMsByBatch  # noqa: PLC0415
        from ..models.variant_out_latency_ms_by_batch import VariantOutLatencyMsByBatch  # noqa: PLC0415
        from ..models.variant_out_options import VariantOutOptions  # noqa: PLC0415

        d = dict(src_dict)
        backend = d.pop("backend")

        baseline_latency_ms_by_batch = VariantOutBaselineLatencyMsByBatch.from_dict(
            d.pop("baseline_latency_ms_by_batch")
        )

        cache_hit = d.pop("cache_hit")

        def _parse_error(data: object) -> None | str:
            if data is None:
                return data
            return cast(None | str, data)

        error = _parse_error(d.pop("error"))

        id = d.pop("id")

        def _parse_job_id(data: object) -> None | str:
            if data is None:
                return data
            return cast(None | str, data)

        job_id = _parse_job_id(d.pop("job_id"))

        def _parse_latency_ms(data: object) -> float | None:
            if data is None:
                return data
            return cast(float | None, data)

        latency_ms = _parse_latency_ms(d.pop("latency_ms"))

        latency_ms_by_batch = VariantOutLatencyMsByBatch.from_dict(d.pop("latency_ms_by_batch"))

        def _parse_max_abs_error(data: object) -> float | None:
            if data is None:
                return data
            return cast(float | None, data)

        max_abs_error = _parse_max_abs_error(d.pop("max_abs_error"))

        options = VariantOutOptions.from_dict(d.pop("options"))

        def _parse_raced_at(data: object) -> float | None:
            if data is None:
                return data
            return cast(float | None, data)

        raced_at = _parse_raced_at(d.pop("raced_at"))

        status = VariantStatus(d.pop("status"))

        target = d.pop("target")

        variant_out = cls(
            backend=backend,
            baseline_latency_ms_by_batch=baseline_latency_ms_by_batch,
            cache_hit=cache_hit,
            error=error,
            id=id,
            job_id=job_id,
            latency_ms=latency_ms,
            latency_ms_by_batch=latency_ms_by_batch,
            max_abs_error=max_abs_error,
            options=options,
            raced_at=raced_at,
            status=status,
            target=target,
        )

        variant_out.additional_properties = d
        return variant_out

    @property
    def additional_keys(self) -> list[str]:
        return list(self.additional_properties.keys())

    def __getitem__(self, key: str) -> Any:
        return self.additional_properties[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self.additional_properties[key] = value

    def __delitem__(self, key: str) -> None:
        del self.additional_properties[key]

    def __contains__(self, key: str) -> bool:
        return key in self.additional_properties
