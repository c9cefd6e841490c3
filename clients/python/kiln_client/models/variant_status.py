from enum import StrEnum


class VariantStatus(StrEnum):
    BENCHMARKING = "benchmarking"
    COMPILING = "compiling"
    FAILED = "failed"
    QUEUED = "queued"
    READY = "ready"
    REJECTED = "rejected"
    VERIFYING = "verifying"

    def __str__(self) -> str:
        return str(self.value)
