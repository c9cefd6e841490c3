from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.serving_config_labels import ServingConfigLabels


T = TypeVar("T", bound="ServingConfig")


@_attrs_define
class ServingConfig:
    """The settings of a version that change how it is served, not what was compiled: set at
    upload, and changed later without a recompile (PATCH /v1/models/{name}/versions/{v}/serving).

        Attributes:
            adaptive_queue_delay (bool | Unset):  Default: True.
            default_priority_level (int | None | Unset):
            default_timeout_us (int | None | Unset):
            dynamic_batching (bool | Unset):  Default: True.
            instances (int | Unset):  Default: 1.
            labels (ServingConfigLabels | Unset):
            max_queue_delay_us (int | None | Unset):
            max_queue_size (int | None | Unset):
            preferred_batch_sizes (list[int] | Unset):
            priority_levels (int | Unset):  Default: 0.
            response_cache (bool | Unset):  Default: False.
    """

    adaptive_queue_delay: bool | Unset = True
    default_priority_level: int | None | Unset = UNSET
    default_timeout_us: int | None | Unset = UNSET
    dynamic_batching: bool | Unset = True
    instances: int | Unset = 1
    labels: ServingConfigLabels | Unset = UNSET
    max_queue_delay_us: int | None | Unset = UNSET
    max_queue_size: int | None | Unset = UNSET
    preferred_batch_sizes: list[int] | Unset = UNSET
    priority_levels: int | Unset = 0
    response_cache: bool | Unset = False
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        adaptive_queue_delay = self.adaptive_queue_delay

        default_priority_level: int | None | Unset
        if isinstance(self.default_priority_level, Unset):
            default_priority_level = UNSET
        else:
            default_priority_level = self.default_priority_level

        default_timeout_us: int | None | Unset
        if isinstance(self.default_timeout_us, Unset):
            default_timeout_us = UNSET
        else:
            default_timeout_us = self.default_timeout_us

        dynamic_batching = self.dynamic_batching

        instances = self.instances

        labels: dict[str, Any] | Unset = UNSET
        if not isinstance(self.labels, Unset):
            labels = self.labels.to_dict()

        max_queue_delay_us: int | None | Unset
        if isinstance(self.max_queue_delay_us, Unset):
            max_queue_delay_us = UNSET
        else:
            max_queue_delay_us = self.max_queue_delay_us

        max_queue_size: int | None | Unset
        if isinstance(self.max_queue_size, Unset):
            max_queue_size = UNSET
        else:
            max_queue_size = self.max_queue_size

        preferred_batch_sizes: list[int] | Unset = UNSET
        if not isinstance(self.preferred_batch_sizes, Unset):
            preferred_batch_sizes = self.preferred_batch_sizes

        priority_levels = self.priority_levels

        response_cache = self.response_cache

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update({})
        if adaptive_queue_delay is not UNSET:
            field_dict["adaptive_queue_delay"] = adaptive_queue_delay
        if default_priority_level is not UNSET:
            field_dict["default_priority_level"] = default_priority_level
        if default_timeout_us is not UNSET:
            field_dict["default_timeout_us"] = default_timeout_us
        if dynamic_batching is not UNSET:
            field_dict["dynamic_batching"] = dynamic_batching
        if instances is not UNSET:
            field_dict["instances"] = instances
        if labels is not UNSET:
            field_dict["labels"] = labels
        if max_queue_delay_us is not UNSET:
            field_dict["max_queue_delay_us"] = max_queue_delay_us
        if max_queue_size is not UNSET:
            field_dict["max_queue_size"] = max_queue_size
        if preferred_batch_sizes is not UNSET:
            field_dict["preferred_batch_sizes"] = preferred_batch_sizes
        if priority_levels is not UNSET:
            field_dict["priority_levels"] = priority_levels
        if response_cache is not UNSET:
            field_dict["response_cache"] = response_cache

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.serving_config_labels import ServingConfigLabels  # noqa: PLC0415

        d = dict(src_dict)
        adaptive_queue_delay = d.pop("adaptive_queue_delay", UNSET)

        def _parse_default_priority_level(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        default_priority_level = _parse_default_priority_level(d.pop("default_priority_level", UNSET))

        def _parse_default_timeout_us(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        default_timeout_us = _parse_default_timeout_us(d.pop("default_timeout_us", UNSET))

        dynamic_batching = d.pop("dynamic_batching", UNSET)

        instances = d.pop("instances", UNSET)

        _labels = d.pop("labels", UNSET)
        labels: ServingConfigLabels | Unset
        if isinstance(_labels, Unset):
            labels = UNSET
        else:
            labels = ServingConfigLabels.from_dict(_labels)

        def _parse_max_queue_delay_us(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        max_queue_delay_us = _parse_max_queue_delay_us(d.pop("max_queue_delay_us", UNSET))

        def _parse_max_queue_size(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        max_queue_size = _parse_max_queue_size(d.pop("max_queue_size", UNSET))

        preferred_batch_sizes = cast(list[int], d.pop("preferred_batch_sizes", UNSET))

        priority_levels = d.pop("priority_levels", UNSET)

        response_cache = d.pop("response_cache", UNSET)

        serving_config = cls(
            adaptive_queue_delay=adaptive_queue_delay,
            default_priority_level=default_priority_level,
            default_timeout_us=default_timeout_us,
            dynamic_batching=dynamic_batching,
            instances=instances,
            labels=labels,
            max_queue_delay_us=max_queue_delay_us,
            max_queue_size=max_queue_size,
            preferred_batch_sizes=preferred_batch_sizes,
            priority_levels=priority_levels,
            response_cache=response_cache,
        )

        serving_config.additional_properties = d
        return serving_config

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
