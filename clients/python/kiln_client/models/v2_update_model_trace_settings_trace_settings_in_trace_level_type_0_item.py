from enum import StrEnum


class V2UpdateModelTraceSettingsTraceSettingsInTraceLevelType0Item(StrEnum):
    OFF = "OFF"
    TIMESTAMPS = "TIMESTAMPS"

    def __str__(self) -> str:
        return str(self.value)
