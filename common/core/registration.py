"""The Node annotation HAMi's device plugin writes to register a node's cards (the
vendor's ``register_annotation``: ``hami.io/node-nvidia-register``), as pyhami's leader
daemon writes it for HAMi-WebUI, and reading it back by the rules HAMi and HAMi-WebUI read it with.

HAMi v2.8 and later write JSON: Go's ``json.Marshal`` of a list of ``DeviceInfo``, only
some fields copied, keys in the struct's order, zero values left out (``omitempty``),
no spaces, and Go's escaping of strings (``<``, ``>``, ``&``, U+2028 and U+2029 as
``\\u`` escapes). HAMi's scheduler reads only that JSON; HAMi-WebUI first tries the colon
and comma format of HAMi v2.7 and before, then the JSON (docs/scheduler.md, "HAMi-WebUI
and the node annotation").
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

import msgspec

from common.core.annotations import AnnotationError
from common.core.mig import MIG_MODE, MigProfile
from common.core.model import Card, Node
from common.core.names import shown
from common.core.vendors import NVIDIA, Vendor

OPERATING_MODE = "hami-core"
"""The node's ``operatingmode`` as HAMi names it for a shared card (a card in MIG mode
registers ``mig``)."""
# Go's encoding/json escapes these even in a valid string (its HTML-safe default).
_GO_ESCAPES = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026",
                             "\u2028": "\\u2028", "\u2029": "\\u2029"})
# HAMi v2.5 to v2.7 wrote 9 fields a card, v2.4 and before 7.
_OLD_FIELDS = (7, 9)
_GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_GO_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


@dataclass(frozen=True, slots=True)
class RegisteredCard:
    """One card as the register annotation states it (HAMi's ``DeviceInfo``, the fields
    HAMi-WebUI shows)."""

    id: str
    index: int
    count: int
    devmem: int
    """Registered MiB: the card's own times HAMi's ``deviceMemoryScaling``."""
    devcore: int
    type: str
    numa: int
    mode: str
    health: bool
    mig_profiles: tuple[MigProfile, ...] = ()
    """A MIG card's profiles (HAMi's ``migProfiles``), none on a shared card."""


def registered_card(card: Card, mode: str = OPERATING_MODE,
                    vendor: Vendor = NVIDIA) -> RegisteredCard:
    """What HAMi's device plugin would register for ``card``: the registered (scaled)
    figures, a NUMA node of -1 (unknown) as 0; a card in MIG mode with ``mig`` and its
    profiles, whatever ``mode``."""
    mig = card.mode == MIG_MODE
    return RegisteredCard(id=card.uuid, index=card.index, count=card.count,
                          devmem=card.memory, devcore=card.cores,
                          type=vendor.registered_type(card.type), numa=max(card.numa, 0),
                          mode=MIG_MODE if mig else mode, health=card.health,
                          mig_profiles=card.mig_profiles if mig else ())


def node_register(node: Node, mode: str = OPERATING_MODE,
                  vendor: Vendor = NVIDIA) -> str | None:
    """The annotation's value for ``node``, its cards in index order; None for a node
    without cards (HAMi's scheduler reads an empty list as an error)."""
    cards = sorted(node.cards, key=lambda card: card.index)
    if not cards:
        return None
    return encode_register(registered_card(card, mode, vendor) for card in cards)


def _go_string(text: str) -> str:
    """``text`` as Go's ``json.Marshal`` writes a string: Python's escapes of quotes,
    backslashes and control characters are Go's (``\\b``, ``\\f``, ``\\n``, ``\\r``,
    ``\\t``, else ``\\u00xx`` in lower case); Go also escapes the HTML characters and the
    two line separators."""
    return json.dumps(text, ensure_ascii=False).translate(_GO_ESCAPES)


def encode_register(cards: Iterable[RegisteredCard]) -> str:
    """The JSON list byte for byte as HAMi's ``MarshalNodeDevices``: keys in the order
    id, index, count, devmem, devcore, type, numa, mode, migProfiles, health; each left
    out at its zero value (``migProfiles`` on a shared card). A MIG profile's keys are all
    written: name, memoryMB, core, sliceCount, placements (start, size)."""
    entries = []
    for card in cards:
        fields = [f'"id":{_go_string(card.id)}'] if card.id else []
        fields.extend(f'"{key}":{value}' for key, value in (
            ("index", card.index), ("count", card.count), ("devmem", card.devmem),
            ("devcore", card.devcore)) if value)
        if card.type:
            fields.append(f'"type":{_go_string(card.type)}')
        if card.numa:
            fields.append(f'"numa":{card.numa}')
        if card.mode:
            fields.append(f'"mode":{_go_string(card.mode)}')
        if card.mig_profiles:
            profiles = ",".join(
                f'{{"name":{_go_string(p.name)},"memoryMB":{p.memory},"core":{p.cores},'
                f'"sliceCount":{p.slices},"placements":['
                + ",".join(f'{{"start":{q.start},"size":{q.size}}}' for q in p.placements)
                + "]}" for p in card.mig_profiles)
            fields.append(f'"migProfiles":[{profiles}]')
        if card.health:
            fields.append('"health":true')
        entries.append("{" + ",".join(fields) + "}")
    return "[" + ",".join(entries) + "]"


# Reading it back ------------------------------------------------------------------------


class _JsonCard(msgspec.Struct):
    """A card of the JSON format; absent keys are Go's zero values, unknown ones ignored."""

    id: str = ""
    index: int = 0
    count: int = 0
    devmem: int = 0
    devcore: int = 0
    type: str = ""
    numa: int = 0
    mode: str = ""
    health: bool = False


def decode_register(text: str, vendor: Vendor = NVIDIA) -> list[RegisteredCard]:
    """The cards of a register annotation, read as HAMi-WebUI reads it: the colon and comma
    format first (HAMi's ``DecodeNodeDevices``), the JSON when that fails (HAMi's
    ``UnMarshalNodeDevices``, which HAMi's scheduler alone uses). Raises ``AnnotationError``
    when neither reads it, or it lists no card (HAMi: "no gpu found on node")."""
    try:
        cards = _decode_colons(text, vendor.register_annotation)
    except AnnotationError:
        cards = decode_register_json(text, vendor)
    if not cards:
        raise AnnotationError(f"{vendor.register_annotation}: no gpu found on node")
    return cards


def decode_register_json(text: str, vendor: Vendor = NVIDIA) -> list[RegisteredCard]:
    """The JSON format alone, as HAMi's scheduler reads it. Raises ``AnnotationError``."""
    try:
        decoded = msgspec.json.decode(text, type=list[_JsonCard] | None) or []
    except msgspec.ValidationError as error:
        raise AnnotationError(f"{vendor.register_annotation}: {shown(text)}: {error}") from None
    except msgspec.DecodeError as error:
        raise AnnotationError(f"{vendor.register_annotation}: {shown(text)} is not JSON: "
                              f"{error}") from None
    return [RegisteredCard(id=card.id, index=card.index, count=card.count,
                           devmem=card.devmem, devcore=card.devcore, type=card.type,
                           numa=card.numa, mode=card.mode, health=card.health)
            for card in decoded]


def _decode_colons(text: str, annotation: str) -> list[RegisteredCard]:
    """HAMi v2.7's format: ``ID,count,devmem,devcore,type,numa,health[,index,mode]:`` a
    card; a piece between colons without a comma is skipped, one with another number of
    fields fails the whole annotation."""
    if ":" not in text:
        raise AnnotationError(f"{annotation}: no ':' in {shown(text)}")
    cards = []
    for piece in text.split(":"):
        if "," not in piece:
            continue
        fields = piece.split(",")
        if len(fields) not in _OLD_FIELDS:
            raise AnnotationError(f"{annotation}: {shown(piece)} has {len(fields)} "
                                  "fields, not 7 or 9")
        index, mode = ((_go_int(fields[7], annotation), fields[8]) if len(fields) == 9
                       else (0, OPERATING_MODE))
        cards.append(RegisteredCard(
            id=fields[0], index=index, count=_go_int(fields[1], annotation),
            devmem=_go_int(fields[2], annotation),
            devcore=_go_int(fields[3], annotation), type=fields[4],
            numa=_go_int(fields[5], annotation), mode=mode,
            health=_go_bool(fields[6], annotation)))
    return cards


def _go_int(text: str, annotation: str) -> int:
    """Go's ``strconv.Atoi``: an optional sign, then decimal digits only."""
    digits = text[1:] if text[:1] in ("+", "-") else text
    if not (digits.isascii() and digits.isdigit()):
        raise AnnotationError(f"{annotation}: {shown(text)} is not an integer")
    return int(text)


def _go_bool(text: str, annotation: str) -> bool:
    """Go's ``strconv.ParseBool``."""
    if text in _GO_TRUE:
        return True
    if text in _GO_FALSE:
        return False
    raise AnnotationError(f"{annotation}: {shown(text)} is not a boolean")
