from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

if TYPE_CHECKING:
    from ..models.predict_out_outputs import PredictOutOutputs
    from ..models.variant_ref import VariantRef


T = TypeVar("T", bound="PredictOut")


@_attrs_define
class PredictOut:
    """
    Attributes:
        model_version (int):
        outputs (PredictOutOutputs):
        variant (VariantRef):
    """

    model_version: int
    outputs: PredictOutOutputs
    variant: VariantRef
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        model_version = self.model_version

        outputs = self.outputs.to_dict()

        variant = self.variant.to_dict()

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "model_version": model_version,
                "outputs": outputs,
                "variant": variant,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.predict_out_outputs import PredictOutOutputs  # noqa: PLC0415
        from ..models.variant_ref import VariantRef  # noqa: PLC0415

        d = dict(src_dict)
        model_version = d.pop("model_version")

        outputs = PredictOutOutputs.from_dict(d.pop("outputs"))

        variant = VariantRef.from_dict(d.pop("variant"))

        predict_out = cls(
            model_version=model_version,
            outputs=outputs,
            variant=variant,
        )

        predict_out.additional_properties = d
        return predict_out

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
