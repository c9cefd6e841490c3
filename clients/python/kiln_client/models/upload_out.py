from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

if TYPE_CHECKING:
    from ..models.variant_out import VariantOut


T = TypeVar("T", bound="UploadOut")


@_attrs_define
class UploadOut:
    """
    Attributes:
        deduplicated (bool): True when these bytes and config were already uploaded: nothing new is compiled.
        name (str):
        sha256 (str):
        unserved_targets (list[str]): Targets of queued variants that no live `kiln worker` has announced (Redis mode):
            their jobs wait in the target's queue until a worker there starts.
        variants (list[VariantOut]):
        version (int):
    """

    deduplicated: bool
    name: str
    sha256: str
    unserved_targets: list[str]
    variants: list[VariantOut]
    version: int
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        deduplicated = self.deduplicated

        name = self.name

        sha256 = self.sha256

        unserved_targets = self.unserved_targets

        variants = []
        for variants_item_data in self.variants:
            variants_item = variants_item_data.to_dict()
            variants.append(variants_item)

        version = self.version

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "deduplicated": deduplicated,
                "name": name,
                "sha256": sha256,
                "unserved_targets": unserved_targets,
                "variants": variants,
                "version": version,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.variant_out import VariantOut  # noqa: PLC0415

        d = dict(src_dict)
        deduplicated = d.pop("deduplicated")

        name = d.pop("name")

        sha256 = d.pop("sha256")

        unserved_targets = cast(list[str], d.pop("unserved_targets"))

        variants = []
        _variants = d.pop("variants")
        for variants_item_data in _variants:
            variants_item = VariantOut.from_dict(variants_item_data)

            variants.append(variants_item)

        version = d.pop("version")

        upload_out = cls(
            deduplicated=deduplicated,
            name=name,
            sha256=sha256,
            unserved_targets=unserved_targets,
            variants=variants,
            version=version,
        )

        upload_out.additional_properties = d
        return upload_out

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
