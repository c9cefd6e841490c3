from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, cast

from attrs import define as _attrs_define

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

    def to_dict(self) -> dict[str, Any]:
        dtype = self.dtype.value

        name = self.name

        shape = self.shape

        field_dict: dict[str, Any] = {}

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

        return tensor_config
