from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from attrs import define as _attrs_define

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.backend_request import BackendRequest


T = TypeVar("T", bound="CompileIn")


@_attrs_define
class CompileIn:
    """What to compile of an existing version. An empty body compiles what its upload asked
    for on the targets that exist now.

        Attributes:
            backends (list[BackendRequest | str] | None | Unset): Backends to compile, each a name or {name, options}; null:
                the version's own, from its upload (its tuned tvm variant included).
            retry_failed (bool | Unset): Also compile again, under new jobs, the variants asked for that failed or were
                rejected; false: they are skipped, as most failures recur. Default: False.
            targets (list[str] | None | Unset): Targets to compile for; "auto": every target a live worker announces now,
                and this host's; null: the version's own, with "auto" read again now.
            tuning_trials (int | Unset): Also compile a tvm variant tuned with this many MetaSchedule trials (0: none).
                Default: 0.
    """

    backends: list[BackendRequest | str] | None | Unset = UNSET
    retry_failed: bool | Unset = False
    targets: list[str] | None | Unset = UNSET
    tuning_trials: int | Unset = 0

    def to_dict(self) -> dict[str, Any]:
        from ..models.backend_request import BackendRequest  # noqa: PLC0415

        backends: list[dict[str, Any] | str] | None | Unset
        if isinstance(self.backends, Unset):
            backends = UNSET
        elif isinstance(self.backends, list):
            backends = []
            for backends_type_0_item_data in self.backends:
                backends_type_0_item: dict[str, Any] | str
                if isinstance(backends_type_0_item_data, BackendRequest):
                    backends_type_0_item = backends_type_0_item_data.to_dict()
                else:
                    backends_type_0_item = backends_type_0_item_data
                backends.append(backends_type_0_item)

        else:
            backends = self.backends

        retry_failed = self.retry_failed

        targets: list[str] | None | Unset
        if isinstance(self.targets, Unset):
            targets = UNSET
        elif isinstance(self.targets, list):
            targets = self.targets

        else:
            targets = self.targets

        tuning_trials = self.tuning_trials

        field_dict: dict[str, Any] = {}

        field_dict.update({})
        if backends is not UNSET:
            field_dict["backends"] = backends
        if retry_failed is not UNSET:
            field_dict["retry_failed"] = retry_failed
        if targets is not UNSET:
            field_dict["targets"] = targets
        if tuning_trials is not UNSET:
            field_dict["tuning_trials"] = tuning_trials

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.backend_request import BackendRequest  # noqa: PLC0415

        d = dict(src_dict)

        def _parse_backends(data: object) -> list[BackendRequest | str] | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, list):
                    raise TypeError()
                backends_type_0 = []
                _backends_type_0 = data
                for backends_type_0_item_data in _backends_type_0:

                    def _parse_backends_type_0_item(data: object) -> BackendRequest | str:
                        try:
                            if not isinstance(data, dict):
                                raise TypeError()
                            backends_type_0_item_type_1 = BackendRequest.from_dict(data)

                            return backends_type_0_item_type_1
                        except (TypeError, ValueError, AttributeError, KeyError):
                            pass
                        return cast(BackendRequest | str, data)

                    backends_type_0_item = _parse_backends_type_0_item(backends_type_0_item_data)

                    backends_type_0.append(backends_type_0_item)

                return backends_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(list[BackendRequest | str] | None | Unset, data)

        backends = _parse_backends(d.pop("backends", UNSET))

        retry_failed = d.pop("retry_failed", UNSET)

        def _parse_targets(data: object) -> list[str] | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, list):
                    raise TypeError()
                targets_type_0 = cast(list[str], data)

                return targets_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(list[str] | None | Unset, data)

        targets = _parse_targets(d.pop("targets", UNSET))

        tuning_trials = d.pop("tuning_trials", UNSET)

        compile_in = cls(
            backends=backends,
            retry_failed=retry_failed,
            targets=targets,
            tuning_trials=tuning_trials,
        )

        return compile_in
