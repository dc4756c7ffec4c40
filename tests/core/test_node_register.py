"""``hami.io/node-nvidia-register`` as pyhami writes it: HAMi's JSON byte for byte, and
read back by HAMi's and HAMi-WebUI's rules (reference 3.1 and 3.5) to the same cards."""

from __future__ import annotations

import pytest

from common.core import AnnotationError, Card, Node
from common.core.registration import (
    RegisteredCard,
    decode_register,
    decode_register_json,
    encode_register,
    node_register,
)
from common.core.vendors import NVIDIA

NODE = Node(name="gpu-1", cards=[
    # Listed out of order: the annotation lists the cards by index.
    Card(uuid="GPU-b", index=1, type="NVIDIA-Tesla V100-PCIE-32GB", memory=32768, cores=100,
         count=10, numa=1, health=False),
    Card(uuid="GPU-a", index=0, type="NVIDIA A100-SXM4-80GB", memory=163840,
         cores=200, count=20, numa=0, physical_memory=81920, physical_cores=100),
    Card(uuid="GPU-c", index=2, type="NVIDIA H100 80GB HBM3", memory=81559,
         cores=100, count=4, numa=-1),
])
# Written by hand from HAMi's MarshalNodeDevices: index 0, numa 0 and health false left out.
EXPECTED = (
    '[{"id":"GPU-a","count":20,"devmem":163840,"devcore":200,'
    '"type":"NVIDIA A100-SXM4-80GB","mode":"hami-core","health":true},'
    '{"id":"GPU-b","index":1,"count":10,"devmem":32768,"devcore":100,'
    '"type":"NVIDIA-Tesla V100-PCIE-32GB","numa":1,"mode":"hami-core"},'
    '{"id":"GPU-c","index":2,"count":4,"devmem":81559,"devcore":100,'
    '"type":"NVIDIA H100 80GB HBM3","mode":"hami-core","health":true}]')
CARDS = [
    RegisteredCard("GPU-a", 0, 20, 163840, 200, "NVIDIA A100-SXM4-80GB", 0, "hami-core", True),
    RegisteredCard("GPU-b", 1, 10, 32768, 100, "NVIDIA-Tesla V100-PCIE-32GB", 1, "hami-core",
                   False),
    RegisteredCard("GPU-c", 2, 4, 81559, 100, "NVIDIA H100 80GB HBM3", 0, "hami-core", True),
]


def test_a_node_is_written_as_hami_writes_it() -> None:
    assert node_register(NODE) == EXPECTED


def test_hami_and_webui_read_it_back_to_the_same_cards() -> None:
    assert decode_register(EXPECTED) == CARDS  # HAMi-WebUI: colons first, then JSON
    assert decode_register_json(EXPECTED) == CARDS  # HAMi's scheduler: JSON only


def test_a_node_without_cards_gets_no_annotation() -> None:
    assert node_register(Node(name="empty", cards=[])) is None


@pytest.mark.parametrize(("nvml_name", "card_type"), [
    ("Tesla T4", "NVIDIA-Tesla T4"),
    ("Tesla V100-PCIE-32GB", "NVIDIA-Tesla V100-PCIE-32GB"),
    ("NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB"),
    ("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"),
    ("NVIDIA H200", "NVIDIA H200"),
], ids=["t4", "v100", "a100", "h100", "h200"])
def test_a_cards_type_is_its_nvml_name_prefixed_only_where_it_lacks_nvidia(
        nvml_name: str, card_type: str) -> None:
    assert NVIDIA.card_type(nvml_name) == card_type
    assert NVIDIA.registered_type(card_type) == card_type  # written as the agent reports it


@pytest.mark.parametrize(("card_type", "registered"), [
    ("NVIDIA-NVIDIA A10", "NVIDIA A10"),
    ("NVIDIA-A100", "NVIDIA-A100"),
    ("Tesla T4", "NVIDIA-Tesla T4"),
], ids=["older-agent-doubled-prefix", "cluster-file", "unprefixed"])
def test_a_type_not_made_by_the_rule_is_written_as_the_rule_would(card_type: str,
                                                                  registered: str) -> None:
    assert NVIDIA.registered_type(card_type) == registered


@pytest.mark.parametrize(("card_type", "written"), [
    ("A<B>&C", '"A\\u003cB\\u003e\\u0026C"'),
    ('say "hi"\\', '"say \\"hi\\"\\\\"'),
    ("tab\there\nnl\x01\b\f", '"tab\\there\\nnl\\u0001\\b\\f"'),
    ("line\u2028sep\u2029", '"line\\u2028sep\\u2029"'),
    ("é\x7f", '"é\x7f"'),
], ids=["html", "quotes", "controls", "line-separators", "unicode-and-del"])
def test_strings_are_escaped_as_go_escapes_them(card_type: str, written: str) -> None:
    card = RegisteredCard("GPU-x", 0, 0, 0, 0, card_type, 0, "", False)
    assert encode_register([card]) == '[{"id":"GPU-x","type":' + written + "}]"
    assert decode_register(encode_register([card])) == [card]


def test_every_zero_value_is_left_out() -> None:
    card = RegisteredCard("", 0, 0, 0, 0, "", 0, "", False)
    assert encode_register([card, card]) == "[{},{}]"


@pytest.mark.parametrize(("text", "cards"), [
    ("GPU-a,10,32768,100,NVIDIA-Tesla V100,0,true:GPU-b,10,32768,100,NVIDIA-Tesla V100,1,"
     "false:",
     [RegisteredCard("GPU-a", 0, 10, 32768, 100, "NVIDIA-Tesla V100", 0, "hami-core", True),
      RegisteredCard("GPU-b", 0, 10, 32768, 100, "NVIDIA-Tesla V100", 1, "hami-core",
                     False)]),
    ("GPU-a,10,32768,100,NVIDIA-T4,0,True,3,mig:",
     [RegisteredCard("GPU-a", 3, 10, 32768, 100, "NVIDIA-T4", 0, "mig", True)]),
], ids=["v2.4-seven-fields", "v2.7-nine-fields"])
def test_webui_still_reads_the_old_formats(text: str, cards: list[RegisteredCard]) -> None:
    assert decode_register(text) == cards


@pytest.mark.parametrize(("text", "says"), [
    ("[]", "no gpu found on node"),
    ("null", "no gpu found on node"),
    ("[{", "not JSON"),
    ('[{"index":"one","count":1}]', "Expected `int`"),
    ("GPU-a,10,x,100,T4,0,true:", "not JSON"),
], ids=["empty", "null", "broken", "wrong-type", "bad-number-old-format"])
def test_what_hami_refuses_is_refused(text: str, says: str) -> None:
    with pytest.raises(AnnotationError, match=says):
        decode_register(text)


def test_webui_reads_json_without_a_comma_between_two_colons_as_no_card() -> None:
    """HAMi-WebUI's colon reader skips pieces without a comma and fails only on one with
    the wrong number of fields: a card with its id alone reads as nothing there. pyhami's
    cards always carry more keys, so the piece after the id holds a comma."""
    alone = '[{"id":"GPU-a"}]'
    assert decode_register_json(alone) == [
        RegisteredCard("GPU-a", 0, 0, 0, 0, "", 0, "", False)]
    with pytest.raises(AnnotationError, match="no gpu found on node"):
        decode_register(alone)
