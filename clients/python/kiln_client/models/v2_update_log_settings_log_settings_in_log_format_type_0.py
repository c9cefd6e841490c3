from enum import StrEnum


class V2UpdateLogSettingsLogSettingsInLogFormatType0(StrEnum):
    JSON = "json"
    TEXT = "text"

    def __str__(self) -> str:
        return str(self.value)
