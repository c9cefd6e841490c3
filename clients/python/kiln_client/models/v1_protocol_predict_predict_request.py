from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypeVar, cast

from attrs import define as _attrs_define

from ..types import UNSET, Unset

T = TypeVar("T", bound="V1ProtocolPredictPredictRequest")


@_attrs_define
class V1ProtocolPredictPredictRequest:
    """
    Attributes:
        inputs (Any | Unset): The columnar form: the input's whole batch, or for a model of several inputs an object of
            input name -> batch.
        instances (list[Any] | None | Unset): One item per batch row: the input's value, or for a model of several
            inputs an object of input name -> value.
        signature_name (Literal['serving_default'] | None | Unset):
    """

    inputs: Any | Unset = UNSET
    instances: list[Any] | None | Unset = UNSET
    signature_name: Literal["serving_default"] | None | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        inputs = self.inputs

        instances: list[Any] | None | Unset
        if isinstance(self.instances, Unset):
            instances = UNSET
        elif isinstance(self.instances, list):
            instances = self.instances

        else:
            instances = self.instances

        signature_name: Literal["serving_default"] | None | Unset
        if isinstance(self.signature_name, Unset):
            signature_name = UNSET
        else:
            signature_name = self.signature_name

        field_dict: dict[str, Any] = {}

        field_dict.update({})
        if inputs is not UNSET:
            field_dict["inputs"] = inputs
        if instances is not UNSET:
            field_dict["instances"] = instances
        if signature_name is not UNSET:
            field_dict["signature_name"] = signature_name

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
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

        def _parse_signature_name(data: object) -> Literal["serving_default"] | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            signature_name_type_0 = cast(Literal["serving_default"], data)
            if signature_name_type_0 != "serving_default":
                raise ValueError(
                    f"signature_name_type_0 must match const 'serving_default', got '{signature_name_type_0}'"
                )
            return signature_name_type_0
            return cast(Literal["serving_default"] | None | Unset, data)

        signature_name = _parse_signature_name(d.pop("signature_name", UNSET))

        v1_protocol_predict_predict_request = cls(
            inputs=inputs,
            instances=instances,
            signature_name=signature_name,
        )

        return v1_protocol_predict_predict_request
