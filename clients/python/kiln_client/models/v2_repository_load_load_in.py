from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.v2_repository_load_load_in_parameters import V2RepositoryLoadLoadInParameters


T = TypeVar("T", bound="V2RepositoryLoadLoadIn")


@_attrs_define
class V2RepositoryLoadLoadIn:
    """
    Attributes:
        parameters (V2RepositoryLoadLoadInParameters | Unset): config: the JSON of Triton's model configuration;
            file:<version>/model.pt: the TorchScript file in base64, which uploads a new version; file:<name>: a label file
            an output's label_filename names.
    """

    parameters: V2RepositoryLoadLoadInParameters | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        parameters: dict[str, Any] | Unset = UNSET
        if not isinstance(self.parameters, Unset):
            parameters = self.parameters.to_dict()

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update({})
        if parameters is not UNSET:
            field_dict["parameters"] = parameters

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.v2_repository_load_load_in_parameters import V2RepositoryLoadLoadInParameters  # noqa: PLC0415

        d = dict(src_dict)
        _parameters = d.pop("parameters", UNSET)
        parameters: V2RepositoryLoadLoadInParameters | Unset
        if isinstance(_parameters, Unset):
            parameters = UNSET
        else:
            parameters = V2RepositoryLoadLoadInParameters.from_dict(_parameters)

        v2_repository_load_load_in = cls(
            parameters=parameters,
        )

        v2_repository_load_load_in.additional_properties = d
        return v2_repository_load_load_in

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
