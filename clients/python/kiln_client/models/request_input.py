from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.request_input_parameters import RequestInputParameters


T = TypeVar("T", bound="RequestInput")


@_attrs_define
class RequestInput:
    """An input tensor of a request.

    Attributes:
        datatype (str): BOOL, UINT8 to UINT64, INT8 to INT64, FP16, FP32, FP64 or BYTES.
        name (str):
        shape (list[int]):
        data (list[Any] | Unset): The values in row-major order (a request's flat or nested); none when binary or in
            shared memory.
        parameters (RequestInputParameters | Unset): binary_data_size: its bytes follow the JSON (the binary extension);
            shared_memory_region, shared_memory_byte_size and shared_memory_offset: where it lies, in a registered region.
    """

    datatype: str
    name: str
    shape: list[int]
    data: list[Any] | Unset = UNSET
    parameters: RequestInputParameters | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        datatype = self.datatype

        name = self.name

        shape = self.shape

        data: list[Any] | Unset = UNSET
        if not isinstance(self.data, Unset):
            data = self.data

        parameters: dict[str, Any] | Unset = UNSET
        if not isinstance(self.parameters, Unset):
            parameters = self.parameters.to_dict()

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "datatype": datatype,
                "name": name,
                "shape": shape,
            }
        )
        if data is not UNSET:
            field_dict["data"] = data
        if parameters is not UNSET:
            field_dict["parameters"] = parameters

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.request_input_parameters import RequestInputParameters  # noqa: PLC0415

        d = dict(src_dict)
        datatype = d.pop("datatype")

        name = d.pop("name")

        shape = cast(list[int], d.pop("shape"))

        data = cast(list[Any], d.pop("data", UNSET))

        _parameters = d.pop("parameters", UNSET)
        parameters: RequestInputParameters | Unset
        if isinstance(_parameters, Unset):
            parameters = UNSET
        else:
            parameters = RequestInputParameters.from_dict(_parameters)

        request_input = cls(
            datatype=datatype,
            name=name,
            shape=shape,
            data=data,
            parameters=parameters,
        )

        request_input.additional_properties = d
        return request_input

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
