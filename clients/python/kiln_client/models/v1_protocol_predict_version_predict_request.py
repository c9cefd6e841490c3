from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from attrs import define as _attrs_define

from ..models.v1_protocol_predict_version_predict_request_signature_name_type_0 import (
    V1ProtocolPredictVersionPredictRequestSignatureNameType0,
)
from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.v1_protocol_predict_version_predict_request_parameters_type_0 import (
        V1ProtocolPredictVersionPredictRequestParametersType0,
    )


T = TypeVar("T", bound="V1ProtocolPredictVersionPredictRequest")


@_attrs_define
class V1ProtocolPredictVersionPredictRequest:
    """
    Attributes:
        inputs (Any | Unset): The columnar form: the input's whole batch, or for a model of several inputs an object of
            input name -> batch.
        instances (list[Any] | None | Unset): One item per batch row: the input's value, or for a model of several
            inputs an object of input name -> value.
        parameters (None | Unset | V1ProtocolPredictVersionPredictRequestParametersType0): Accepted and not used: Vertex
            AI passes its own through.
        signature_name (None | Unset | V1ProtocolPredictVersionPredictRequestSignatureNameType0):
    """

    inputs: Any | Unset = UNSET
    instances: list[Any] | None | Unset = UNSET
    parameters: None | Unset | V1ProtocolPredictVersionPredictRequestParametersType0 = UNSET
    signature_name: None | Unset | V1ProtocolPredictVersionPredictRequestSignatureNameType0 = UNSET

    def to_dict(self) -> dict[str, Any]:
        from ..models.v1_protocol_predict_version_predict_request_parameters_type_0 import (
            V1ProtocolPredictVersionPredictRequestParametersType0,  # noqa: PLC0415
        )

        inputs = self.inputs

        instances: list[Any] | None | Unset
        if isinstance(self.instances, Unset):
            instances = UNSET
        elif isinstance(self.instances, list):
            instances = self.instances

        else:
            instances = self.instances

        parameters: dict[str, Any] | None | Unset
        if isinstance(self.parameters, Unset):
            parameters = UNSET
        elif isinstance(self.parameters, V1ProtocolPredictVersionPredictRequestParametersType0):
            parameters = self.parameters.to_dict()
        else:
            parameters = self.parameters

        signature_name: None | str | Unset
        if isinstance(self.signature_name, Unset):
            signature_name = UNSET
        elif isinstance(self.signature_name, V1ProtocolPredictVersionPredictRequestSignatureNameType0):
            signature_name = self.signature_name.value
        else:
            signature_name = self.signature_name

        field_dict: dict[str, Any] = {}

        field_dict.update({})
        if inputs is not UNSET:
            field_dict["inputs"] = inputs
        if instances is not UNSET:
            field_dict["instances"] = instances
        if parameters is not UNSET:
            field_dict["parameters"] = parameters
        if signature_name is not UNSET:
            field_dict["signature_name"] = signature_name

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.v1_protocol_predict_version_predict_request_parameters_type_0 import (
            V1ProtocolPredictVersionPredictRequestParametersType0,  # noqa: PLC0415
        )

        d = dict(src_dict)
        inputs = d.pop("inputs", UNSET)

        def _parse_instances(data: object) -> list[Any] | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, list):
                    raise TypeError()
                instances_type_0 = cast(list[Any], data)

                return instances_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(list[Any] | None | Unset, data)

        instances = _parse_instances(d.pop("instances", UNSET))

        def _parse_parameters(data: object) -> None | Unset | V1ProtocolPredictVersionPredictRequestParametersType0:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                parameters_type_0 = V1ProtocolPredictVersionPredictRequestParametersType0.from_dict(data)

                return parameters_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(None | Unset | V1ProtocolPredictVersionPredictRequestParametersType0, data)

        parameters = _parse_parameters(d.pop("parameters", UNSET))

        def _parse_signature_name(
            data: object,
        ) -> None | Unset | V1ProtocolPredictVersionPredictRequestSignatureNameType0:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                signature_name_type_0 = V1ProtocolPredictVersionPredictRequestSignatureNameType0(data)

                return signature_name_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(None | Unset | V1ProtocolPredictVersionPredictRequestSignatureNameType0, data)

        signature_name = _parse_signature_name(d.pop("signature_name", UNSET))

        v1_protocol_predict_version_predict_request = cls(
            inputs=inputs,
            instances=instances,
            parameters=parameters,
            signature_name=signature_name,
        )

        return v1_protocol_predict_version_predict_request
