from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.active_out import ActiveOut
    from ..models.version_out import VersionOut


T = TypeVar("T", bound="ModelOut")


@_attrs_define
class ModelOut:
    """
    Attributes:
        active (ActiveOut | None): What serves batch-1 requests on this replica now.
        name (str):
        ready (bool): Whether requests naming no version are served on this replica now (active is set): KServe V1's
            model readiness.
        versions (list[VersionOut]):
        default_version (int | None | Unset): The version that serves requests naming none; null: the newest ready one.
        unloaded (bool | Unset): Unloaded through /v2/repository: it serves nothing until it is loaded again. Default:
            False.
    """

    active: ActiveOut | None
    name: str
    ready: bool
    versions: list[VersionOut]
    default_version: int | None | Unset = UNSET
    unloaded: bool | Unset = False
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        from ..models.active_out import ActiveOut  # noqa: PLC0415

        active: dict[str, Any] | None
        if isinstance(self.active, ActiveOut):
            active = self.active.to_dict()
        else:
            active = self.active

        name = self.name

        ready = self.ready

        versions = []
        for versions_item_data in self.versions:
            versions_item = versions_item_data.to_dict()
            versions.append(versions_item)

        default_version: int | None | Unset
        if isinstance(self.default_version, Unset):
            default_version = UNSET
        else:
            default_version = self.default_version

        unloaded = self.unloaded

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "active": active,
                "name": name,
                "ready": ready,
                "versions": versions,
            }
        )
        if default_version is not UNSET:
            field_dict["default_version"] = default_version
        if unloaded is not UNSET:
            field_dict["unloaded"] = unloaded

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.active_out import ActiveOut  # noqa: PLC0415
        from ..models.version_out import VersionOut  # noqa: PLC0415

        d = dict(src_dict)

        def _parse_active(data: object) -> ActiveOut | None:
            if data is None:
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                active_type_0 = ActiveOut.from_dict(data)

                return active_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(ActiveOut | None, data)

        active = _parse_active(d.pop("active"))

        name = d.pop("name")

        ready = d.pop("ready")

        versions = []
        _versions = d.pop("versions")
        for versions_item_data in _versions:
            versions_item = VersionOut.from_dict(versions_item_data)

            versions.append(versions_item)

        def _parse_default_version(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        default_version = _parse_default_version(d.pop("default_version", UNSET))

        unloaded = d.pop("unloaded", UNSET)

        model_out = cls(
            active=active,
            name=name,
            ready=ready,
            versions=versions,
            default_version=default_version,
            unloaded=unloaded,
        )

        model_out.additional_properties = d
        return model_out

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
