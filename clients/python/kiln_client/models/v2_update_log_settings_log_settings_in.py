from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, cast

from attrs import define as _attrs_define

from ..models.v2_update_log_settings_log_settings_in_log_format_type_0 import (
    V2UpdateLogSettingsLogSettingsInLogFormatType0,
)
from ..types import UNSET, Unset

T = TypeVar("T", bound="V2UpdateLogSettingsLogSettingsIn")


@_attrs_define
class V2UpdateLogSettingsLogSettingsIn:
    """The settings to change; those left out or null keep their value. Strict, as Triton's parser
    is: no `1` taken for `true`.

        Attributes:
            log_error (bool | None | Unset):
            log_file (None | str | Unset): Only '': Kiln logs to stderr.
            log_format (None | Unset | V2UpdateLogSettingsLogSettingsInLogFormatType0):
            log_info (bool | None | Unset):
            log_verbose_level (int | None | Unset): 0: none; 1: Kiln's DEBUG lines; 2 and above: every library's too.
            log_warning (bool | None | Unset):
    """

    log_error: bool | None | Unset = UNSET
    log_file: None | str | Unset = UNSET
    log_format: None | Unset | V2UpdateLogSettingsLogSettingsInLogFormatType0 = UNSET
    log_info: bool | None | Unset = UNSET
    log_verbose_level: int | None | Unset = UNSET
    log_warning: bool | None | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        log_error: bool | None | Unset
        if isinstance(self.log_error, Unset):
            log_error = UNSET
        else:
            log_error = self.log_error

        log_file: None | str | Unset
        if isinstance(self.log_file, Unset):
            log_file = UNSET
        else:
            log_file = self.log_file

        log_format: None | str | Unset
        if isinstance(self.log_format, Unset):
            log_format = UNSET
        elif isinstance(self.log_format, V2UpdateLogSettingsLogSettingsInLogFormatType0):
            log_format = self.log_format.value
        else:
            log_format = self.log_format

        log_info: bool | None | Unset
        if isinstance(self.log_info, Unset):
            log_info = UNSET
        else:
            log_info = self.log_info

        log_verbose_level: int | None | Unset
        if isinstance(self.log_verbose_level, Unset):
            log_verbose_level = UNSET
        else:
            log_verbose_level = self.log_verbose_level

        log_warning: bool | None | Unset
        if isinstance(self.log_warning, Unset):
            log_warning = UNSET
        else:
            log_warning = self.log_warning

        field_dict: dict[str, Any] = {}

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

        def _parse_log_error(data: object) -> bool | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(bool | None | Unset, data)

        log_error = _parse_log_error(d.pop("log_error", UNSET))

        def _parse_log_file(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        log_file = _parse_log_file(d.pop("log_file", UNSET))

        def _parse_log_format(data: object) -> None | Unset | V2UpdateLogSettingsLogSettingsInLogFormatType0:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                log_format_type_0 = V2UpdateLogSettingsLogSettingsInLogFormatType0(data)

                return log_format_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(None | Unset | V2UpdateLogSettingsLogSettingsInLogFormatType0, data)

        log_format = _parse_log_format(d.pop("log_format", UNSET))

        def _parse_log_info(data: object) -> bool | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(bool | None | Unset, data)

        log_info = _parse_log_info(d.pop("log_info", UNSET))

        def _parse_log_verbose_level(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        log_verbose_level = _parse_log_verbose_level(d.pop("log_verbose_level", UNSET))

        def _parse_log_warning(data: object) -> bool | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(bool | None | Unset, data)

        log_warning = _parse_log_warning(d.pop("log_warning", UNSET))

        v2_update_log_settings_log_settings_in = cls(
            log_error=log_error,
            log_file=log_file,
            log_format=log_format,
            log_info=log_info,
            log_verbose_level=log_verbose_level,
            log_warning=log_warning,
        )

        return v2_update_log_settings_log_settings_in
