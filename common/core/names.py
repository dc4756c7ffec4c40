"""Kubernetes object names, checked as the API server checks them.

A namespace is a DNS-1123 label; pod and node names are DNS-1123 subdomains.
Names that pass hold only ``[a-z0-9.-]`` and fit every place pyhami puts
them: NATS subjects and key-value keys, annotations, metric labels.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from common.core.errors import InvalidInput

LABEL_MAX = 63
SUBDOMAIN_MAX = 253
_SHOWN = 40


@dataclass(frozen=True, slots=True)
class _Rule:
    kind: str
    limit: int
    pattern: re.Pattern[str]
    alphabet: str


_LABEL = _Rule("DNS-1123 label", LABEL_MAX, re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"),
               "lower-case letters, digits and '-', starting and ending with a letter or digit")
_SUBDOMAIN = _Rule(
    "DNS-1123 subdomain", SUBDOMAIN_MAX,
    re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"),
    "lower-case letters, digits, '-' and '.', each dot-separated part starting and "
    "ending with a letter or digit")


_LABEL_VALUE = _Rule(
    "label value", LABEL_MAX, re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"),
    "letters, digits, '-', '_' and '.', starting and ending with a letter or digit")


class InvalidName(InvalidInput):
    """A name Kubernetes would refuse; the message names the field and what is wrong."""


def shown(value: str) -> str:
    """``value`` quoted for a message, cut short: a refused value may be megabytes long."""
    if len(value) <= _SHOWN:
        return repr(value)
    return f"{value[:_SHOWN]!r}... ({len(value)} characters)"


def check_label(field: str, value: str) -> None:
    """Raises ``InvalidName`` unless ``value`` is a DNS-1123 label (a namespace)."""
    _check(field, value, _LABEL)


def check_subdomain(field: str, value: str) -> None:
    """Raises ``InvalidName`` unless ``value`` is a DNS-1123 subdomain (a pod or node name)."""
    _check(field, value, _SUBDOMAIN)


def check_label_value(field: str, value: str) -> None:
    """Raises ``InvalidName`` unless ``value`` is a non-empty label value (a group's name,
    as Kueue's and the coscheduling plugin's labels carry it)."""
    _check(field, value, _LABEL_VALUE)


def _check(field: str, value: str, rule: _Rule) -> None:
    if not value:
        raise InvalidName(f"{field}: must not be empty")
    if len(value) > rule.limit:  # before the pattern, so a long value costs nothing more
        raise InvalidName(f"{field}: {shown(value)} is longer than {rule.limit} characters "
                          f"(a {rule.kind})")
    if rule.pattern.fullmatch(value) is None:
        raise InvalidName(f"{field}: {shown(value)} is not a valid {rule.kind}: {rule.alphabet}")
