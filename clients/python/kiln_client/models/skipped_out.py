from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

if TYPE_CHECKING:
    from ..models.skipped_out_options import SkippedOutOptions


T = TypeVar("T", bound="SkippedOut")


@_attrs_define
class SkippedOut:
    """
    Attributes:
        backend (str):
        options (SkippedOutOptions):
        reason (str): Why nothing was queued for it: "already ready", or why it cannot be built.
        target (str):
    """

    backend: str
    options: SkippedOutOptions
    reason: str
    target: str
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        backend = self.backend

        options = self.options.to_dict()

        reason = self.reason

        target = self.target

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "backend": backend,
                "options": options,
                "reason": reason,
                "target": target,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.skipped_out_options import SkippedOutOptions  # noqa: PLC0415

        d = dict(src_dict)
        backend = d.pop("backend")

        options = SkippedOutOptions.from_dict(d.pop("options"))

        reason = d.pop("reason")

        target = d.pop("target")

        skipped_out = cls(
            backend=backend,
            options=options,
            reason=reason,
            target=target,
        )

        skipped_out.additional_properties = d
        return skipped_out

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
