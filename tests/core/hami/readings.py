"""What the request and webhook tables share: a row's device configuration, a container
of its limits and requests, and the part of an answer a row asserts."""

from __future__ import annotations

from typing import Any

from common.core.deviceconfig import DeviceConfig, parse_device_config
from common.core.pod import Container, ResourceRequirements

GO_CONFIG = "the Go test's NvidiaConfig"


def device_of(given: dict[str, Any]) -> DeviceConfig:
    """The device configuration of a row: the ``nvidia:`` keys ``given["device"]`` sets,
    HAMi's chart defaults for the rest (which read alike for every row here)."""
    return parse_device_config({"nvidia": given.get("device", {})}, GO_CONFIG).value


def container_of(limits: dict[str, Any] | None = None,
                 requests: dict[str, Any] | None = None, name: str = "") -> Container:
    return Container(name=name, resources=ResourceRequirements(limits=limits,
                                                               requests=requests))


def asserted(answer: Any, expected: Any) -> Any:
    """``answer`` cut to the fields ``expected`` names (a test asserting some fields of
    a request); an empty ``expected`` (HAMi's empty request) is compared whole."""
    if isinstance(answer, dict) and isinstance(expected, dict) and expected \
            and set(expected) <= set(answer):
        return {key: answer[key] for key in expected}
    return answer
