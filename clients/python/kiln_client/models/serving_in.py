from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, cast

from attrs import define as _attrs_define

from ..types import UNSET, Unset

T = TypeVar("T", bound="ServingIn")


@_attrs_define
class ServingIn:
    """The serving settings to change; those left out keep their value, and null restores the
    server default.

        Attributes:
            default_timeout_us (int | None | Unset):
            max_queue_delay_us (int | None | Unset):
            max_queue_size (int | None | Unset):
            preferred_batch_sizes (list[int] | Unset):
            response_cache (bool | Unset):  Default: False.
    """

    default_timeout_us: int | None | Unset = UNSET
    max_queue_delay_us: int | None | Unset = UNSET
    max_queue_size: int | None | Unset = UNSET
    preferred_batch_sizes: list[int] | Unset = UNSET
    response_cache: bool | Unset = False

    def to_dict(self) -> dict[str, Any]:
        default_timeout_us: int | None | Unset
        if isinstance(self.default_timeout_us, Unset):
            default_timeout_us = UNSET
        else:
            default_timeout_us = self.default_timeout_us

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

        response_cache = self.response_cache

        field_dict: dict[str, Any] = {}

        field_dict.update({})
        if default_timeout_us is not UNSET:
            field_dict["default_timeout_us"] = default_timeout_us
        if max_queue_delay_us is not UNSET:
            field_dict["max_queue_delay_us"] = max_queue_delay_us
        if max_queue_size is not UNSET:
            field_dict["max_queue_size"] = max_queue_size
        if preferred_batch_sizes is not UNSET:
            field_dict["preferred_batch_sizes"] = preferred_batch_sizes
        if response_cache is not UNSET:
            field_dict["response_cache"] = response_cache

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)

        def _parse_default_timeout_us(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        default_timeout_us = _parse_default_timeout_us(d.pop("default_timeout_us", UNSET))

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

        response_cache = d.pop("response_cache", UNSET)

        serving_in = cls(
            default_timeout_us=default_timeout_us,
            max_queue_delay_us=max_queue_delay_us,
            max_queue_size=max_queue_size,
            preferred_batch_sizes=preferred_batch_sizes,
            response_cache=response_cache,
        )

        return serving_in
