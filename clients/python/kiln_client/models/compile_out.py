from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

if TYPE_CHECKING:
    from ..models.skipped_out import SkippedOut
    from ..models.variant_out import VariantOut


T = TypeVar("T", bound="CompileOut")


@_attrs_define
class CompileOut:
    """
    Attributes:
        name (str):
        queued (list[VariantOut]): Variants queued to compile, new or retried, with their jobs.
        skipped (list[SkippedOut]):
        unserved_targets (list[str]): Targets of queued variants that no live `kiln worker` has announced (Redis mode):
            their jobs wait in the target's queue until a worker there starts.
        version (int):
    """

    name: str
    queued: list[VariantOut]
    skipped: list[SkippedOut]
    unserved_targets: list[str]
    version: int
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        name = self.name

        queued = []
        for queued_item_data in self.queued:
            queued_item = queued_item_data.to_dict()
            queued.append(queued_item)

        skipped = []
        for skipped_item_data in self.skipped:
            skipped_item = skipped_item_data.to_dict()
            skipped.append(skipped_item)

        unserved_targets = self.unserved_targets

        version = self.version

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "name": name,
                "queued": queued,
                "skipped": skipped,
                "unserved_targets": unserved_targets,
                "version": version,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.skipped_out import SkippedOut  # noqa: PLC0415
        from ..models.variant_out import VariantOut  # noqa: PLC0415

        d = dict(src_dict)
        name = d.pop("name")

        queued = []
        _queued = d.pop("queued")
        for queued_item_data in _queued:
            queued_item = VariantOut.from_dict(queued_item_data)

            queued.append(queued_item)

        skipped = []
        _skipped = d.pop("skipped")
        for skipped_item_data in _skipped:
            skipped_item = SkippedOut.from_dict(skipped_item_data)

            skipped.append(skipped_item)

        unserved_targets = cast(list[str], d.pop("unserved_targets"))

        version = d.pop("version")

        compile_out = cls(
            name=name,
            queued=queued,
            skipped=skipped,
            unserved_targets=unserved_targets,
            version=version,
        )

        compile_out.additional_properties = d
        return compile_out

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
