from enum import StrEnum


class TensorConfigDtype(StrEnum):
    BOOL = "bool"
    FLOAT16 = "float16"
    FLOAT32 = "float32"
    FLOAT64 = "float64"
    INT16 = "int16"
    INT32 = "int32"
    INT64 = "int64"
    INT8 = "int8"
    UINT8 = "uint8"

    def __str__(self) -> str:
        return str(self.value)
