from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..models.job_status import JobStatus
from ..models.variant_status import VariantStatus
from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.job_out_options import JobOutOptions
    from ..models.job_out_tuning_type_0 import JobOutTuningType0


T = TypeVar("T", bound="JobOut")


@_attrs_define
class JobOut:
    """
    Attributes:
        attempts (int):
        backend (str):
        cache_hit (bool):
        created_at (float):
        error (None | str):
        finished_at (float | None):
        id (str):
        model (str):
        options (JobOutOptions):
        stage (VariantStatus):
        started_at (float | None):
        status (JobStatus):
        target (str):
        variant_id (str):
        version (int):
        worker (None | str): The worker (hostname-pid) that last started the job.
        tuning (JobOutTuningType0 | None | Unset): Tuned variants only: trials_done, trials_total, best_estimate_ms (the
            tuned kernels' summed best time), and when done `tasks`, each kernel's new_trials, the earlier_trials of its
            cached records, whether those were `reused` as they were, and how many of its fastest schedules were left out as
            `wrong_schedules` (they computed something else than the untuned kernel).
    """

    attempts: int
    backend: str
    cache_hit: bool
    created_at: float
    error: None | str
    finished_at: float | None
    id: str
    model: str
    options: JobOutOptions
    stage: VariantStatus
    started_at: float | None
    status: JobStatus
    target: str
    variant_id: str
    version: int
    worker: None | str
    tuning: JobOutTuningType0 | None | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        from ..models.job_out_tuning_type_0 import JobOutTuningType0  # noqa: PLC0415

        attempts = self.attempts

        backend = self.backend

        cache_hit = self.cache_hit

        created_at = self.created_at

        error: None | str
        error = self.error

        finished_at: float | None
        finished_at = self.finished_at

        id = self.id

        model = self.model

        options = self.options.to_dict()

        stage = self.stage.value

        started_at: float | None
        started_at = self.started_at

        status = self.status.value

        target = self.target

        variant_id = self.variant_id

        version = self.version

        worker: None | str
        worker = self.worker

        tuning: dict[str, Any] | None | Unset
        if isinstance(self.tuning, Unset):
            tuning = UNSET
        elif isinstance(self.tuning, JobOutTuningType0):
            tuning = self.tuning.to_dict()
        else:
            tuning = self.tuning

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "attempts": attempts,
                "backend": backend,
                "cache_hit": cache_hit,
                "created_at": created_at,
                "error": error,
                "finished_at": finished_at,
                "id": id,
                "model": model,
                "options": options,
                "stage": stage,
                "started_at": started_at,
                "status": status,
                "target": target,
                "variant_id": variant_id,
                "version": version,
                "worker": worker,
            }
        )
        if tuning is not UNSET:
            field_dict["tuning"] = tuning

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.job_out_options import JobOutOptions  # noqa: PLC0415
        from ..models.job_out_tuning_type_0 import JobOutTuningType0  # noqa: PLC0415

        d = dict(src_dict)
        attempts = d.pop("attempts")

        backend = d.pop("backend")

        cache_hit = d.pop("cache_hit")

        created_at = d.pop("created_at")

        def _parse_error(data: object) -> None | str:
            if data is None:
                return data
            return cast(None | str, data)

        error = _parse_error(d.pop("error"))

        def _parse_finished_at(data: object) -> float | None:
            if data is None:
                return data
            return cast(float | None, data)

        finished_at = _parse_finished_at(d.pop("finished_at"))

        id = d.pop("id")

        model = d.pop("model")

        options = JobOutOptions.from_dict(d.pop("options"))

        stage = VariantStatus(d.pop("stage"))

        def _parse_started_at(data: object) -> float | None:
            if data is None:
                return data
            return cast(float | None, data)

        started_at = _parse_started_at(d.pop("started_at"))

        status = JobStatus(d.pop("status"))

        target = d.pop("target")

        variant_id = d.pop("variant_id")

        version = d.pop("version")

        def _parse_worker(data: object) -> None | str:
            if data is None:
                return data
            return cast(None | str, data)

        worker = _parse_worker(d.pop("worker"))

        def _parse_tuning(data: object) -> JobOutTuningType0 | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                tuning_type_0 = JobOutTuningType0.from_dict(data)

                return tuning_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(JobOutTuningType0 | None | Unset, data)

        tuning = _parse_tuning(d.pop("tuning", UNSET))

        job_out = cls(
            attempts=attempts,
            backend=backend,
            cache_hit=cache_hit,
            created_at=created_at,
            error=error,
            finished_at=finished_at,
            id=id,
            model=model,
            options=options,
            stage=stage,
            started_at=started_at,
            status=status,
            target=target,
            variant_id=variant_id,
            version=version,
            worker=worker,
            tuning=tuning,
        )

        job_out.additional_properties = d
        return job_out

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
