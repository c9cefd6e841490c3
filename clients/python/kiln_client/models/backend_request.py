from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define as _attrs_define

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

    def to_dict(self) -> dict[str, Any]:
        name = self.name

        options: dict[str, Any] | Unset = UNSET
        if not isinstance(self.options, Unset):
            options = self.options.to_dict()

        field_dict: dict[str, Any] = {}

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

        return backend_request
