from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypeVar, cast

from attrs import define as _attrs_define

from ..models.v2_update_trace_settings_trace_settings_in_trace_level_type_0_item import (
    V2UpdateTraceSettingsTraceSettingsInTraceLevelType0Item,
)
from ..types import UNSET, Unset

T = TypeVar("T", bound="V2UpdateTraceSettingsTraceSettingsIn")


@_attrs_define
class V2UpdateTraceSettingsTraceSettingsIn:
    """The settings to change, as Triton takes them: strings (numbers taken too), the level a
    string or a list of them; null clears a setting, back to the server's (for a model) or the
    default (for the server).

        Attributes:
            log_frequency (int | None | Unset): Only '0': each trace is written as it ends.
            trace_count (int | None | Unset): How many more traces to take, in each process; -1: no end.
            trace_file (None | str | Unset): Only '': traces go to stderr, in the log.
            trace_level (list[V2UpdateTraceSettingsTraceSettingsInTraceLevelType0Item] | None | Unset): ['OFF'], or
                ['TIMESTAMPS'] to trace; TENSORS is not offered.
            trace_mode (Literal['triton'] | None | Unset):
            trace_rate (int | None | Unset): One request traced in so many.
    """

    log_frequency: int | None | Unset = UNSET
    trace_count: int | None | Unset = UNSET
    trace_file: None | str | Unset = UNSET
    trace_level: list[V2UpdateTraceSettingsTraceSettingsInTraceLevelType0Item] | None | Unset = UNSET
    trace_mode: Literal["triton"] | None | Unset = UNSET
    trace_rate: int | None | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        log_frequency: int | None | Unset
        if isinstance(self.log_frequency, Unset):
            log_frequency = UNSET
        else:
            log_frequency = self.log_frequency

        trace_count: int | None | Unset
        if isinstance(self.trace_count, Unset):
            trace_count = UNSET
        else:
            trace_count = self.trace_count

        trace_file: None | str | Unset
        if isinstance(self.trace_file, Unset):
            trace_file = UNSET
        else:
            trace_file = self.trace_file

        trace_level: list[str] | None | Unset
        if isinstance(self.trace_level, Unset):
            trace_level = UNSET
        elif isinstance(self.trace_level, list):
            trace_level = []
            for trace_level_type_0_item_data in self.trace_level:
                trace_level_type_0_item = trace_level_type_0_item_data.value
                trace_level.append(trace_level_type_0_item)

        else:
            trace_level = self.trace_level

        trace_mode: Literal["triton"] | None | Unset
        if isinstance(self.trace_mode, Unset):
            trace_mode = UNSET
        else:
            trace_mode = self.trace_mode

        trace_rate: int | None | Unset
        if isinstance(self.trace_rate, Unset):
            trace_rate = UNSET
        else:
            trace_rate = self.trace_rate

        field_dict: dict[str, Any] = {}

        field_dict.update({})
        if log_frequency is not UNSET:
            field_dict["log_frequency"] = log_frequency
        if trace_count is not UNSET:
            field_dict["trace_count"] = trace_count
        if trace_file is not UNSET:
            field_dict["trace_file"] = trace_file
        if trace_level is not UNSET:
            field_dict["trace_level"] = trace_level
        if trace_mode is not UNSET:
            field_dict["trace_mode"] = trace_mode
        if trace_rate is not UNSET:
            field_dict["trace_rate"] = trace_rate

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)

        def _parse_log_frequency(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        log_frequency = _parse_log_frequency(d.pop("log_frequency", UNSET))

        def _parse_trace_count(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        trace_count = _parse_trace_count(d.pop("trace_count", UNSET))

        def _parse_trace_file(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        trace_file = _parse_trace_file(d.pop("trace_file", UNSET))

        def _parse_trace_level(
            data: object,
        ) -> list[V2UpdateTraceSettingsTraceSettingsInTraceLevelType0Item] | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, list):
                    raise TypeError()
                trace_level_type_0 = []
                _trace_level_type_0 = data
                for trace_level_type_0_item_data in _trace_level_type_0:
                    trace_level_type_0_item = V2UpdateTraceSettingsTraceSettingsInTraceLevelType0Item(
                        trace_level_type_0_item_data
                    )

                    trace_level_type_0.append(trace_level_type_0_item)

                return trace_level_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(list[V2UpdateTraceSettingsTraceSettingsInTraceLevelType0Item] | None | Unset, data)

        trace_level = _parse_trace_level(d.pop("trace_level", UNSET))

        def _parse_trace_mode(data: object) -> Literal["triton"] | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            trace_mode_type_0 = cast(Literal["triton"], data)
            if trace_mode_type_0 != "triton":
                raise ValueError(f"trace_mode_type_0 must match const 'triton', got '{trace_mode_type_0}'")
            return trace_mode_type_0
            return cast(Literal["triton"] | None | Unset, data)

        trace_mode = _parse_trace_mode(d.pop("trace_mode", UNSET))

        def _parse_trace_rate(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        trace_rate = _parse_trace_rate(d.pop("trace_rate", UNSET))

        v2_update_trace_settings_trace_settings_in = cls(
            log_frequency=log_frequency,
            trace_count=trace_count,
            trace_file=trace_file,
            trace_level=trace_level,
            trace_mode=trace_mode,
            trace_rate=trace_rate,
        )

        return v2_update_trace_settings_trace_settings_in
