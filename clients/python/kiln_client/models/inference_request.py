from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.inference_request_parameters import InferenceRequestParameters
    from ..models.request_input import RequestInput
    from ..models.request_output import RequestOutput


T = TypeVar("T", bound="InferenceRequest")


@_attrs_define
class InferenceRequest:
    """
    Attributes:
        inputs (list[RequestInput]):
        id (None | str | Unset): Echoed in the response.
        outputs (list[RequestOutput] | Unset): The outputs to return, and how; none: every output.
        parameters (InferenceRequestParameters | Unset): binary_data_output: every output as binary; priority: 1 the
            highest, 0 the model's default; timeout: microseconds it may wait in the queue.
    """

    inputs: list[RequestInput]
    id: None | str | Unset = UNSET
    outputs: list[RequestOutput] | Unset = UNSET
    parameters: InferenceRequestParameters | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        inputs = []
        for inputs_item_data in self.inputs:
            inputs_item = inputs_item_data.to_dict()
            inputs.append(inputs_item)

        id: None | str | Unset
        if isinstance(self.id, Unset):
            id = UNSET
        else:
            id = self.id

        outputs: list[dict[str, Any]] | Unset = UNSET
        if not isinstance(self.outputs, Unset):
            outputs = []
            for outputs_item_data in self.outputs:
                outputs_item = outputs_item_data.to_dict()
                outputs.append(outputs_item)

        parameters: dict[str, Any] | Unset = UNSET
        if not isinstance(self.parameters, Unset):
            parameters = self.parameters.to_dict()

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "inputs": inputs,
            }
        )
        if id is not UNSET:
            field_dict["id"] = id
        if outputs is not UNSET:
            field_dict["outputs"] = outputs
        if parameters is not UNSET:
            field_dict["parameters"] = parameters

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.inference_request_parameters import InferenceRequestParameters  # noqa: PLC0415
        from ..models.request_input import RequestInput  # noqa: PLC0415
        from ..models.request_output import RequestOutput  # noqa: PLC0415

        d = dict(src_dict)
        inputs = []
        _inputs = d.pop("inputs")
        for inputs_item_data in _inputs:
            inputs_item = RequestInput.from_dict(inputs_item_data)

            inputs.append(inputs_item)

        def _parse_id(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        id = _parse_id(d.pop("id", UNSET))

        _outputs = d.pop("outputs", UNSET)
        outputs: list[RequestOutput] | Unset = UNSET
        if _outputs is not UNSET:
            outputs = []
            for outputs_item_data in _outputs:
                outputs_item = RequestOutput.from_dict(outputs_item_data)

                outputs.append(outputs_item)

        _parameters = d.pop("parameters", UNSET)
        parameters: InferenceRequestParameters | Unset
        if isinstance(_parameters, Unset):
            parameters = UNSET
        else:
            parameters = InferenceRequestParameters.from_dict(_parameters)

        inference_request = cls(
            inputs=inputs,
            id=id,
            outputs=outputs,
            parameters=parameters,
        )

        inference_request.additional_properties = d
        return inference_request

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
