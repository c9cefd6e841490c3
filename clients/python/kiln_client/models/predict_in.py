from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

if TYPE_CHECKING:
    from ..models.predict_in_inputs import PredictInInputs


T = TypeVar("T", bound="PredictIn")


@_attrs_define
class PredictIn:
    """
    Attributes:
        inputs (PredictInInputs): Input name -> nested lists.
    """

    inputs: PredictInInputs
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        inputs = self.inputs.to_dict()

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "inputs": inputs,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.predict_in_inputs import PredictInInputs  # noqa: PLC0415

        d = dict(src_dict)
        inputs = PredictInInputs.from_dict(d.pop("inputs"))

        predict_in = cls(
            inputs=inputs,
        )

        predict_in.additional_properties = d
        return predict_in

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
