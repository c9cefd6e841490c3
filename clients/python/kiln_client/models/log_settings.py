from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..models.log_settings_log_format import LogSettingsLogFormat
from ..types import UNSET, Unset

T = TypeVar("T", bound="LogSettings")


@_attrs_define
class LogSettings:
    """Triton's log settings document.

    Attributes:
        log_error (bool | Unset):  Default: True.
        log_file (Literal[''] | Unset):  Default: ''.
        log_format (LogSettingsLogFormat | Unset):  Default: LogSettingsLogFormat.JSON.
        log_info (bool | Unset):  Default: True.
        log_verbose_level (int | Unset):  Default: 0.
        log_warning (bool | Unset):  Default: True.
    """

    log_error: bool | Unset = True
    log_file: Literal[""] | Unset = ""
    log_format: LogSettingsLogFormat | Unset = LogSettingsLogFormat.JSON
    log_info: bool | Unset = True
    log_verbose_level: int | Unset = 0
    log_warning: bool | Unset = True
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        log_error = self.log_error

        log_file = self.log_file

        log_format: str | Unset = UNSET
        if not isinstance(self.log_format, Unset):
            log_format = self.log_format.value

        log_info = self.log_info

        log_verbose_level = self.log_verbose_level

        log_warning = self.log_warning

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update({})
        if log_error is not UNSET:
            field_dict["log_error"] = log_error
        if log_file is not UNSET:
            field_dict["log_file"] = log_file
        if log_format is not UNSET:
            field_dict["log_format"] = log_format
        if log_info is not UNSET:
            field_dict["log_info"] = log_info
        if log_verbose_level is not UNSET:
            field_dict["log_verbose_level"] = log_verbose_level
        if log_warning is not UNSET:
            field_dict["log_warning"] = log_warning

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        log_error = d.pop("log_error", UNSET)

        log_file = cast(Literal[""] | Unset, d.pop("log_file", UNSET))
        if log_file != "" and not isinstance(log_file, Unset):
            raise ValueError(f"log_file must match const '', got '{log_file}'")

        _log_format = d.pop("log_format", UNSET)
        log_format: LogSettingsLogFormat | Unset
        if isinstance(_log_format, Unset):
            log_format = UNSET
        else:
            log_format = LogSettingsLogFormat(_log_format)

        log_info = d.pop("log_info", UNSET)

        log_verbose_level = d.pop("log_verbose_level", UNSET)

        log_warning = d.pop("log_warning", UNSET)

        log_settings = cls(
            log_error=log_error,
            log_file=log_file,
            log_format=log_format,
            log_info=log_info,
            log_verbose_level=log_verbose_level,
            log_warning=log_warning,
        )

        log_settings.additional_properties = d
        return log_settings

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
