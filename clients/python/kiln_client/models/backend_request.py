from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.backend_request_options import BackendRequestOptions


T = TypeVar("T", bound="BackendRequest")


@_attrs_define
class BackendRequest:
    """A backend with options, e.g. {"name": "tensorrt", "options": {"precision": "fp16"}}.

    Attributes:
        name (str):
        options (BackendRequestOptions | Unset):
    """

    name: str
    options: BackendRequestOptions | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        name = self.name

        options: dict[str, Any] | Unset = UNSET
        if not isinstance(self.options, Unset):
            options = self.options.to_dict()

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "name": name,
            }
        )
        if options is not UNSET:
            field_dict["options"] = options

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.backend_request_options import BackendRequestOptions  # noqa: PLC0415

        d = dict(src_dict)
        name = d.pop("name")

        _options = d.pop("options", UNSET)
        options: BackendRequestOptions | Unset
        if isinstance(_options, Unset):
            options = UNSET
        else:
            options = BackendRequestOptions.from_dict(_options)

        backend_request = cls(
            name=name,
            options=options,
        )

        backend_request.additional_properties = d
        return backend_request

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
