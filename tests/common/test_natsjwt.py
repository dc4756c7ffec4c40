"""NATS JWTs and node tokens: signed, checked, refused when tampered with."""

from __future__ import annotations

import base64
import json

import nkeys
import pytest

from common.busaccess import agent_permissions
from common.core.names import InvalidName
from common.natsjwt import (
    JwtError,
    decode,
    encode,
    node_of_token,
    node_token,
    public_key,
    seed_from_random,
    signer_from_seed,
)

NOW = 1_800_000_000


def _signer(fill: int) -> nkeys.KeyPair:
    return signer_from_seed(seed_from_random(bytes([fill]) * 32), "test seed")


def _replace_claims(token: str, **changes: object) -> str:
    header, claims, signature = token.split(".")
    body = json.loads(base64.urlsafe_b64decode(claims + "=" * (-len(claims) % 4)))
    body.update(changes)
    forged = base64.urlsafe_b64encode(json.dumps(body).encode()).rstrip(b"=").decode()
    return f"{header}.{forged}.{signature}"


def test_a_signed_jwt_decodes_to_its_claims_with_issuer_and_time() -> None:
    signer = _signer(1)
    token = encode({"sub": "UABC", "custom": [1, 2]}, signer, NOW)
    claims = decode(token, issuer=public_key(signer), now=NOW)
    assert claims["sub"] == "UABC" and claims["custom"] == [1, 2]
    assert claims["iss"] == public_key(signer) and claims["iat"] == NOW
    assert public_key(signer).startswith("A")


def test_a_changed_claim_breaks_the_signature() -> None:
    signer = _signer(2)
    token = encode({"sub": "node-a"}, signer, NOW)
    with pytest.raises(JwtError, match="signature"):
        decode(_replace_claims(token, sub="node-b"), issuer=None, now=NOW)


def test_another_issuer_and_expiry_are_refused() -> None:
    signer, other = _signer(3), _signer(4)
    token = encode({"sub": "x", "exp": NOW + 10}, signer, NOW)
    with pytest.raises(JwtError, match="not by the expected key"):
        decode(token, issuer=public_key(other), now=NOW)
    with pytest.raises(JwtError, match="expired"):
        decode(token, issuer=public_key(signer), now=NOW + 11)
    # Claiming the other issuer while signed by the first: the signature gives it away.
    with pytest.raises(JwtError, match="signature"):
        decode(_replace_claims(token, iss=public_key(other)), issuer=public_key(other), now=NOW)


@pytest.mark.parametrize("text", ["", "a.b", "x.y.z", "e30.e30.e30"])
def test_malformed_jwts_are_refused_by_name(text: str) -> None:
    with pytest.raises(JwtError):
        decode(text, issuer=None, now=NOW)


def test_a_node_token_names_its_node_only_for_its_issuer_and_while_valid() -> None:
    signer = _signer(5)
    token = node_token("gpu-node-1", signer, NOW, NOW + 3600)
    assert node_of_token(token, public_key(signer), NOW + 1) == "gpu-node-1"
    with pytest.raises(JwtError):
        node_of_token(token, public_key(_signer(6)), NOW + 1)
    with pytest.raises(JwtError, match="expired"):
        node_of_token(token, public_key(signer), NOW + 3601)


def test_a_jwt_of_the_issuer_that_is_no_node_token_is_refused() -> None:
    signer = _signer(7)
    other_kind = encode({"sub": "gpu-node-1", "nats": {"type": "user"}}, signer, NOW)
    with pytest.raises(JwtError, match="not a pyhami node token"):
        node_of_token(other_kind, public_key(signer), NOW)


def test_a_node_token_is_only_minted_for_a_valid_node_name() -> None:
    # A wildcard in a node name would become a wildcard in the agent's permissions.
    for bad in (">", "*", "node.>", "Upper"):
        with pytest.raises(InvalidName):
            node_token(bad, _signer(8), NOW, NOW + 1)


def test_only_an_account_seed_signs() -> None:
    user_seed = bytes(nkeys.encode_seed(bytes(32), nkeys.PREFIX_BYTE_USER))
    with pytest.raises(JwtError, match="account"):
        signer_from_seed(user_seed, "seed.txt")
    with pytest.raises(JwtError, match=r"seed\.txt: not an NKey seed"):
        signer_from_seed(b"not a seed", "seed.txt")


def test_an_agent_may_speak_for_its_own_node_hear_resyncs_and_read_its_own_inbox() -> None:
    claims = agent_permissions("gpu-node-1").claims()
    assert claims == {"pub": {"allow": ["pyhami.inventory.gpu-node-1",
                                        "pyhami.allocations.gpu-node-1",
                                        "pyhami.allocated.gpu-node-1"]},
                      "sub": {"allow": ["pyhami.resync", "_INBOX.pyhami-agent.gpu-node-1.>"]}}
