from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

if TYPE_CHECKING:
    from ..models.output_info import OutputInfo
    from ..models.serving_config import ServingConfig
    from ..models.tensor_config import TensorConfig
    from ..models.variant_out import VariantOut


T = TypeVar("T", bound="VersionOut")


@_attrs_define
class VersionOut:
    """
    Attributes:
        created_at (float):
        inputs (list[TensorConfig]):
        max_batch_size (int):
        outputs (list[OutputInfo]):
        serving (ServingConfig): The settings of a version that change how it is served, not what was compiled: set at
            upload, and changed later without a recompile (PATCH /v1/models/{name}/versions/{v}/serving).
        sha256 (str):
        variants (list[VariantOut]):
        version (int):
    """

    created_at: float
    inputs: list[TensorConfig]
    max_batch_size: int
    outputs: list[OutputInfo]
    serving: ServingConfig
    sha256: str
    variants: list[VariantOut]
    version: int
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        created_at = self.created_at

        inputs = []
        for inputs_item_data in self.inputs:
            inputs_item = inputs_item_data.to_dict()
            inputs.append(inputs_item)

        max_batch_size = self.max_batch_size

        outputs = []
        for outputs_item_data in self.outputs:
            outputs_item = outputs_item_data.to_dict()
            outputs.append(outputs_item)

        serving = self.serving.to_dict()

        sha256 = self.sha256

        variants = []
        for variants_item_data in self.variants:
            variants_item = variants_item_data.to_dict()
            variants.append(variants_item)

        version = self.version

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "created_at": created_at,
                "inputs": inputs,
                "max_batch_size": max_batch_size,
                "outputs": outputs,
                "serving": serving,
                "sha256": sha256,
                "variants": variants,
                "version": version,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.output_info import OutputInfo  # noqa: PLC0415
        from ..models.serving_config import ServingConfig  # noqa: PLC0415
        from ..models.tensor_config import TensorConfig  # noqa: PLC0415
        from ..models.variant_out import VariantOut  # noqa: PLC0415

        d = dict(src_dict)
        created_at = d.pop("created_at")

        inputs = []
        _inputs = d.pop("inputs")
        for inputs_item_data in _inputs:
            inputs_item = TensorConfig.from_dict(inputs_item_data)

            inputs.append(inputs_item)

        max_batch_size = d.pop("max_batch_size")

        outputs = []
        _outputs = d.pop("outputs")
        for outputs_item_data in _outputs:
            outputs_item = OutputInfo.from_dict(outputs_item_data)

            outputs.append(outputs_item)

        serving = ServingConfig.from_dict(d.pop("serving"))

        sha256 = d.pop("sha256")

        variants = []
        _variants = d.pop("variants")
        for variants_item_data in _variants:
            variants_item = VariantOut.from_dict(variants_item_data)

            variants.append(variants_item)

        version = d.pop("version")

        version_out = cls(
            created_at=created_at,
            inputs=inputs,
            max_batch_size=max_batch_size,
            outputs=outputs,
            serving=serving,
            sha256=sha256,
            variants=variants,
            version=version,
        )

        version_out.additional_properties = d
        return version_out

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
