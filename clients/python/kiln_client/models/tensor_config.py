from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..models.tensor_config_dtype import TensorConfigDtype

T = TypeVar("T", bound="TensorConfig")


@_attrs_define
class TensorConfig:
    """
    Attributes:
        dtype (TensorConfigDtype):
        name (str):
        shape (list[int]):
    """

    dtype: TensorConfigDtype
    name: str
    shape: list[int]
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        dtype = self.dtype.value

        name = self.name

        shape = self.shape

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "dtype": dtype,
                "name": name,
                "shape": shape,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        dtype = TensorConfigDtype(d.pop("dtype"))

        name = d.pop("name")

        shape = cast(list[int], d.pop("shape"))

        tensor_config = cls(
            dtype=dtype,
            name=name,
            shape=shape,
        )

        tensor_config.additional_properties = d
        return tensor_config

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
