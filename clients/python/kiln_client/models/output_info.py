from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

T = TypeVar("T", bound="OutputInfo")


@_attrs_define
class OutputInfo:
    """
    Attributes:
        dtype (str):
        name (str):
        shape (list[int]):
        batched (bool | Unset): Its first dimension is the batch's, along which a batch's outputs are split back into
            their requests'. False where that -1 follows an input's other dynamic dimension instead (`x.t()` of a `[-1, -1]`
            input, say). Default: True.
        rows_apart (bool | Unset): Each row depends on the request's own rows alone (checked at upload: the largest
            batch's first row stays the same whatever rows follow it). False: requests are never merged into one batch,
            which would give clients each other's data. Default: True.
    """

    dtype: str
    name: str
    shape: list[int]
    batched: bool | Unset = True
    rows_apart: bool | Unset = True
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        dtype = self.dtype

        name = self.name

        shape = self.shape

        batched = self.batched

        rows_apart = self.rows_apart

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "dtype": dtype,
                "name": name,
                "shape": shape,
            }
        )
        if batched is not UNSET:
            field_dict["batched"] = batched
        if rows_apart is not UNSET:
            field_dict["rows_apart"] = rows_apart

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        dtype = d.pop("dtype")

        name = d.pop("name")

        shape = cast(list[int], d.pop("shape"))

        batched = d.pop("batched", UNSET)

        rows_apart = d.pop("rows_apart", UNSET)

        output_info = cls(
            dtype=dtype,
            name=name,
            shape=shape,
            batched=batched,
            rows_apart=rows_apart,
        )

        output_info.additional_properties = d
        return output_info

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
