from enum import StrEnum


class V1ProtocolPredictPredictRequestSignatureNameType0(StrEnum):
    SERVING_DEFAULT = "serving_default"
    VALUE_1 = ""

    def __str__(self) -> str:
        return str(self.value)
