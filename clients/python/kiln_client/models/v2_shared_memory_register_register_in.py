from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

T = TypeVar("T", bound="V2SharedMemoryRegisterRegisterIn")


@_attrs_define
class V2SharedMemoryRegisterRegisterIn:
    """
    Attributes:
        byte_size (int): The region's size in bytes.
        key (str): The segment's shm_open name, such as `/input0`.
        offset (int | Unset): Where in the segment the region begins. Default: 0.
    """

    byte_size: int
    key: str
    offset: int | Unset = 0
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        byte_size = self.byte_size

        key = self.key

        offset = self.offset

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "byte_size": byte_size,
                "key": key,
            }
        )
        if offset is not UNSET:
            field_dict["offset"] = offset

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        byte_size = d.pop("byte_size")

        key = d.pop("key")

        offset = d.pop("offset", UNSET)

        v2_shared_memory_register_register_in = cls(
            byte_size=byte_size,
            key=key,
            offset=offset,
        )

        v2_shared_memory_register_register_in.additional_properties = d
        return v2_shared_memory_register_register_in

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
