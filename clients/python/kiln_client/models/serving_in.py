from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.serving_in_labels_type_0 import ServingInLabelsType0


T = TypeVar("T", bound="ServingIn")


@_attrs_define
class ServingIn:
    """The serving settings to change. Those left out keep their value; null restores what an
    upload that leaves a setting out gets (the server's default, no limit, [], false for
    response_cache, true for dynamic_batching and adaptive_queue_delay, 0 for priority_levels, 1
    for instances, {} for labels).

        Attributes:
            adaptive_queue_delay (bool | None | Unset):
            default_priority_level (int | None | Unset):
            default_timeout_us (int | None | Unset):
            dynamic_batching (bool | None | Unset):
            instances (int | None | Unset):
            labels (None | ServingInLabelsType0 | Unset):
            max_queue_delay_us (int | None | Unset):
            max_queue_size (int | None | Unset):
            preferred_batch_sizes (list[int] | None | Unset):
            priority_levels (int | None | Unset):
            response_cache (bool | None | Unset):
    """

    adaptive_queue_delay: bool | None | Unset = UNSET
    default_priority_level: int | None | Unset = UNSET
    default_timeout_us: int | None | Unset = UNSET
    dynamic_batching: bool | None | Unset = UNSET
    instances: int | None | Unset = UNSET
    labels: None | ServingInLabelsType0 | Unset = UNSET
    max_queue_delay_us: int | None | Unset = UNSET
    max_queue_size: int | None | Unset = UNSET
    preferred_batch_sizes: list[int] | None | Unset = UNSET
    priority_levels: int | None | Unset = UNSET
    response_cache: bool | None | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        from ..models.serving_in_labels_type_0 import ServingInLabelsType0  # noqa: PLC0415

        adaptive_queue_delay: bool | None | Unset
        if isinstance(self.adaptive_queue_delay, Unset):
            adaptive_queue_delay = UNSET
        else:
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

        dynamic_batching: bool | None | Unset
        if isinstance(self.dynamic_batching, Unset):
            dynamic_batching = UNSET
        else:
            dynamic_batching = self.dynamic_batching

        instances: int | None | Unset
        if isinstance(self.instances, Unset):
            instances = UNSET
        else:
            instances = self.instances

        labels: dict[str, Any] | None | Unset
        if isinstance(self.labels, Unset):
            labels = UNSET
        elif isinstance(self.labels, ServingInLabelsType0):
            labels = self.labels.to_dict()
        else:
            labels = self.labels

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

        preferred_batch_sizes: list[int] | None | Unset
        if isinstance(self.preferred_batch_sizes, Unset):
            preferred_batch_sizes = UNSET
        elif isinstance(self.preferred_batch_sizes, list):
            preferred_batch_sizes = self.preferred_batch_sizes

        else:
            preferred_batch_sizes = self.preferred_batch_sizes

        priority_levels: int | None | Unset
        if isinstance(self.priority_levels, Unset):
            priority_levels = UNSET
        else:
            priority_levels = self.priority_levels

        response_cache: bool | None | Unset
        if isinstance(self.response_cache, Unset):
            response_cache = UNSET
        else:
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
        from ..models.serving_in_labels_type_0 import ServingInLabelsType0  # noqa: PLC0415

        d = dict(src_dict)

        def _parse_adaptive_queue_delay(data: object) -> bool | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(bool | None | Unset, data)

        adaptive_queue_delay = _parse_adaptive_queue_delay(d.pop("adaptive_queue_delay", UNSET))

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

        def _parse_dynamic_batching(data: object) -> bool | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(bool | None | Unset, data)

        dynamic_batching = _parse_dynamic_batching(d.pop("dynamic_batching", UNSET))

        def _parse_instances(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        instances = _parse_instances(d.pop("instances", UNSET))

        def _parse_labels(data: object) -> None | ServingInLabelsType0 | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                labels_type_0 = ServingInLabelsType0.from_dict(data)

                return labels_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(None | ServingInLabelsType0 | Unset, data)

        labels = _parse_labels(d.pop("labels", UNSET))

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

        def _parse_preferred_batch_sizes(data: object) -> list[int] | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, list):
                    raise TypeError()
                preferred_batch_sizes_type_0 = cast(list[int], data)

                return preferred_batch_sizes_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(list[int] | None | Unset, data)

        preferred_batch_sizes = _parse_preferred_batch_sizes(d.pop("preferred_batch_sizes", UNSET))

        def _parse_priority_levels(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        priority_levels = _parse_priority_levels(d.pop("priority_levels", UNSET))

        def _parse_response_cache(data: object) -> bool | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(bool | None | Unset, data)

        response_cache = _parse_response_cache(d.pop("response_cache", UNSET))

        serving_in = cls(
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

        serving_in.additional_properties = d
        return serving_in

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
