from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

T = TypeVar("T", bound="PredictResponse")


@_attrs_define
class PredictResponse:
    """
    Attributes:
        outputs (Any | Unset): For "inputs": the output's batch, or an object of output name -> batch.
        predictions (list[Any] | None | Unset): For "instances": one item per batch row, the output's value, or for a
            model of several outputs an object of output name -> value.
    """

    outputs: Any | Unset = UNSET
    predictions: list[Any] | None | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        outputs = self.outputs

        predictions: list[Any] | None | Unset
        if isinstance(self.predictions, Unset):
            predictions = UNSET
        elif isinstance(self.predictions, list):
            predictions = self.predictions

        else:
            predictions = self.predictions

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update({})
        if outputs is not UNSET:
            field_dict["outputs"] = outputs
        if predictions is not UNSET:
            field_dict["predictions"] = predictions

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        outputs = d.pop("outputs", UNSET)

        def _parse_predictions(data: object) -> list[Any] | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, list):
                    raise TypeError()
                predictions_type_0 = cast(list[Any], data)

                return predictions_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(list[Any] | None | Unset, data)

        predictions = _parse_predictions(d.pop("predictions", UNSET))

        predict_response = cls(
            outputs=outputs,
            predictions=predictions,
        )

        predict_response.additional_properties = d
        return predict_response

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
