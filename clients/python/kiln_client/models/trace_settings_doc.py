from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

T = TypeVar("T", bound="TraceSettingsDoc")


@_attrs_define
class TraceSettingsDoc:
    """Triton's trace settings response: every value a string, the level a list of them.

    Attributes:
        log_frequency (str):
        trace_count (str): The traces this process takes yet; -1: no end.
        trace_file (str):
        trace_level (list[str]):
        trace_mode (str):
        trace_rate (str):
    """

    log_frequency: str
    trace_count: str
    trace_file: str
    trace_level: list[str]
    trace_mode: str
    trace_rate: str
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        log_frequency = self.log_frequency

        trace_count = self.trace_count

        trace_file = self.trace_file

        trace_level = self.trace_level

        trace_mode = self.trace_mode

        trace_rate = self.trace_rate

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "log_frequency": log_frequency,
                "trace_count": trace_count,
                "trace_file": trace_file,
                "trace_level": trace_level,
                "trace_mode": trace_mode,
                "trace_rate": trace_rate,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        log_frequency = d.pop("log_frequency")

        trace_count = d.pop("trace_count")

        trace_file = d.pop("trace_file")

        trace_level = cast(list[str], d.pop("trace_level"))

        trace_mode = d.pop("trace_mode")

        trace_rate = d.pop("trace_rate")

        trace_settings_doc = cls(
            log_frequency=log_frequency,
            trace_count=trace_count,
            trace_file=trace_file,
            trace_level=trace_level,
            trace_mode=trace_mode,
            trace_rate=trace_rate,
        )

        trace_settings_doc.additional_properties = d
        return trace_settings_doc

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
