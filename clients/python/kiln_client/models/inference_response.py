from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.inference_response_parameters import InferenceResponseParameters
    from ..models.response_output import ResponseOutput


T = TypeVar("T", bound="InferenceResponse")


@_attrs_define
class InferenceResponse:
    """
    Attributes:
        model_name (str):
        model_version (str):
        outputs (list[ResponseOutput]):
        id (None | str | Unset): The request's, when it gave one.
        parameters (InferenceResponseParameters | Unset):
    """

    model_name: str
    model_version: str
    outputs: list[ResponseOutput]
    id: None | str | Unset = UNSET
    parameters: InferenceResponseParameters | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        model_name = self.model_name

        model_version = self.model_version

        outputs = []
        for outputs_item_data in self.outputs:
            outputs_item = outputs_item_data.to_dict()
            outputs.append(outputs_item)

        id: None | str | Unset
        if isinstance(self.id, Unset):
            id = UNSET
        else:
            id = self.id

        parameters: dict[str, Any] | Unset = UNSET
        if not isinstance(self.parameters, Unset):
            parameters = self.parameters.to_dict()

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "model_name": model_name,
                "model_version": model_version,
                "outputs": outputs,
            }
        )
        if id is not UNSET:
            field_dict["id"] = id
        if parameters is not UNSET:
            field_dict["parameters"] = parameters

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.inference_response_parameters import InferenceResponseParameters  # noqa: PLC0415
        from ..models.response_output import ResponseOutput  # noqa: PLC0415

        d = dict(src_dict)
        model_name = d.pop("model_name")

        model_version = d.pop("model_version")

        outputs = []
        _outputs = d.pop("outputs")
        for outputs_item_data in _outputs:
            outputs_item = ResponseOutput.from_dict(outputs_item_data)

            outputs.append(outputs_item)

        def _parse_id(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        id = _parse_id(d.pop("id", UNSET))

        _parameters = d.pop("parameters", UNSET)
        parameters: InferenceResponseParameters | Unset
        if isinstance(_parameters, Unset):
            parameters = UNSET
        else:
            parameters = InferenceResponseParameters.from_dict(_parameters)

        inference_response = cls(
            model_name=model_name,
            model_version=model_version,
            outputs=outputs,
            id=id,
            parameters=parameters,
        )

        inference_response.additional_properties = d
        return inference_response

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
