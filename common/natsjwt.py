"""The JWTs of nats-server's auth callout, and pyhami's node tokens, signed with NKeys.

nats-server sends an authorization request (a JWT it signs) for every client that
is not one of its configured ``auth_users``; the responder answers with an
authorization response JWT carrying a user JWT: the user's permissions, bound to
the user key the server made for that one connection and to that server, so the
answer cannot be replayed elsewhere. Both are signed by the account NKey whose
public key the server's ``auth_callout { issuer }`` names.

A node token is pyhami's own credential for an agent outside Kubernetes: a JWT
of type ``pyhami-node`` naming its node, signed by the same issuer key and
checked by the responder. The JWT layout (a JSON header naming ``ed25519-nkey``,
the JSON claims, an Ed25519 signature, each base64url without padding) is the
one NATS uses. Times are given by the caller: nothing here reads a clock.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import nacl.exceptions
import nacl.signing
import nkeys

from common.core.errors import InvalidInput
from common.core.names import InvalidName, check_subdomain, shown

ALGORITHM = "ed25519-nkey"
_HEADER = {"typ": "JWT", "alg": ALGORITHM}
NATS_CLAIMS_VERSION = 2
NODE_TOKEN_TYPE = "pyhami-node"
NODE_TOKEN_AUDIENCE = "pyhami-agent"
# Unlimited subscriptions, data and payload: the server's own limits apply.
_NO_LIMIT = -1


class JwtError(InvalidInput):
    """A JWT or NKey that cannot be used; the text says why."""


@dataclass(frozen=True, slots=True)
class Permissions:
    """What one NATS user may publish and subscribe to; an empty allow list allows nothing."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]

    def claims(self) -> dict[str, Any]:
        return {"pub": _permission(self.publish), "sub": _permission(self.subscribe)}


def _permission(allowed: Sequence[str]) -> dict[str, list[str]]:
    # No allow list would allow everything: deny everything instead.
    return {"allow": list(allowed)} if allowed else {"deny": [">"]}


# NKeys -------------------------------------------------------------------------------


def signer_from_seed(seed: bytes, what: str) -> nkeys.KeyPair:
    """The account key pair of an NKey seed (``SA...``); ``what`` names its source."""
    text = seed.strip()
    try:
        prefix, _ = nkeys.decode_seed(text)
        pair = nkeys.from_seed(text)
    except (nkeys.NkeysError, ValueError, binascii.Error):
        raise JwtError(f"{what}: not an NKey seed") from None
    if prefix != nkeys.PREFIX_BYTE_ACCOUNT:
        raise JwtError(f"{what}: an NKey seed for an account (SA...) is needed, "
                       f"not {text[:2].decode(errors='replace')}...")
    return pair


def seed_from_random(random_bytes: bytes) -> bytes:
    """An account NKey seed made from 32 random bytes the caller drew."""
    return bytes(nkeys.encode_seed(random_bytes, nkeys.PREFIX_BYTE_ACCOUNT))


def public_key(pair: nkeys.KeyPair) -> str:
    return bytes(pair.public_key).decode()


def _verify_key(public: str) -> nacl.signing.VerifyKey:
    """The Ed25519 key of an encoded NKey public key (a prefix byte, 32 bytes, a CRC)."""
    try:
        raw = base64.b32decode(public + "=" * (-len(public) % 8))
    except (binascii.Error, ValueError):
        raise JwtError(f"issuer {shown(public)} is not an NKey public key") from None
    if len(raw) != 35 or raw[0] not in (nkeys.PREFIX_BYTE_ACCOUNT, nkeys.PREFIX_BYTE_SERVER):
        raise JwtError(f"issuer {shown(public)} is not an account or server NKey")
    if nkeys.crc16(bytearray(raw[:-2])) != int.from_bytes(raw[-2:], "little"):
        raise JwtError(f"issuer {shown(public)} fails its checksum")
    return nacl.signing.VerifyKey(raw[1:33])


# JWT encoding ------------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def encode(claims: Mapping[str, Any], signer: nkeys.KeyPair, issued_at: int) -> str:
    """A signed JWT of ``claims``, issued by ``signer`` at ``issued_at`` (Unix seconds)."""
    body = {**claims, "iss": public_key(signer), "iat": issued_at}
    body["jti"] = base64.b32encode(
        hashlib.sha256(json.dumps(body, sort_keys=True).encode()).digest()).decode().rstrip("=")
    signed = _b64(json.dumps(_HEADER).encode()) + "." + _b64(json.dumps(body).encode())
    return signed + "." + _b64(signer.sign(signed.encode()))


def decode(token: str, *, issuer: str | None, now: int) -> dict[str, Any]:
    """The claims of a JWT whose signature matches its ``iss`` (which must be ``issuer``
    when given) and that is valid at ``now``; ``JwtError`` says why not."""
    parts = token.split(".")
    if len(parts) != 3:
        raise JwtError("not a JWT: expected three dot-separated parts")
    try:
        header = json.loads(_unb64(parts[0]))
        claims = json.loads(_unb64(parts[1]))
        signature = _unb64(parts[2])
    except (ValueError, binascii.Error):
        raise JwtError("not a JWT: a part is not base64url-encoded JSON") from None
    if not isinstance(header, dict) or header.get("alg") != ALGORITHM:
        raise JwtError(f"JWT algorithm must be {ALGORITHM}")
    if not isinstance(claims, dict) or not isinstance(claims.get("iss"), str):
        raise JwtError("JWT claims name no issuer")
    if issuer is not None and claims["iss"] != issuer:
        raise JwtError(f"JWT issued by {shown(claims['iss'])}, not by the expected key")
    try:
        _verify_key(claims["iss"]).verify(f"{parts[0]}.{parts[1]}".encode(), signature)
    except (nacl.exceptions.BadSignatureError, ValueError):
        raise JwtError("JWT signature does not match its issuer") from None
    expires, not_before = claims.get("exp"), claims.get("nbf")
    if isinstance(expires, int) and expires and now > expires:
        raise JwtError("JWT has expired")
    if isinstance(not_before, int) and now < not_before:
        raise JwtError("JWT is not valid yet")
    return claims


# Auth callout ------------------------------------------------------------------------


class ServerIdentity(msgspec.Struct, frozen=True):
    id: str
    name: str = ""


class ConnectOptions(msgspec.Struct, frozen=True):
    user: str = ""
    auth_token: str = ""
    name: str = ""


class ClientInfo(msgspec.Struct, frozen=True):
    host: str = ""
    name: str = ""


class AuthorizationRequest(msgspec.Struct, frozen=True):
    """The parts of nats-server's request that the responder reads."""

    server_id: ServerIdentity
    user_nkey: str
    connect_opts: ConnectOptions = ConnectOptions()
    client_info: ClientInfo = ClientInfo()


def authorization_request(token: str, now: int) -> AuthorizationRequest:
    """The request inside the JWT nats-server sent, signed by the server's own key."""
    claims = decode(token, issuer=None, now=now)
    nats = claims.get("nats")
    if not isinstance(nats, dict) or nats.get("type") != "authorization_request":
        raise JwtError("not an authorization request")
    try:
        request = msgspec.convert(nats, AuthorizationRequest)
    except msgspec.ValidationError as error:
        raise JwtError(f"authorization request: {error}") from None
    if not request.user_nkey.startswith("U") or not request.server_id.id.startswith("N"):
        raise JwtError("authorization request: the user or server key is malformed")
    return request


def user_jwt(request: AuthorizationRequest, *, account: str, name: str,
             permissions: Permissions, signer: nkeys.KeyPair, issued_at: int,
             expires: int | None) -> str:
    """A user for the connection ``request`` is about, placed in ``account``."""
    claims: dict[str, Any] = {
        "sub": request.user_nkey,
        "aud": account,
        "name": name,
        "nats": {**permissions.claims(), "subs": _NO_LIMIT, "data": _NO_LIMIT,
                 "payload": _NO_LIMIT, "type": "user", "version": NATS_CLAIMS_VERSION},
    }
    if expires is not None:
        claims["exp"] = expires
    return encode(claims, signer, issued_at)


def authorization_response(request: AuthorizationRequest, *, user: str | None,
                           error: str | None, signer: nkeys.KeyPair, issued_at: int) -> str:
    """The answer: the user JWT, or the reason for refusing (exactly one of them)."""
    if (user is None) == (error is None):
        raise ValueError("an authorization response carries a user or an error")
    nats: dict[str, Any] = {"type": "authorization_response", "version": NATS_CLAIMS_VERSION}
    if user is not None:
        nats["jwt"] = user
    else:
        nats["error"] = error
    return encode({"sub": request.user_nkey, "aud": request.server_id.id, "nats": nats},
                  signer, issued_at)


# Node tokens -------------------------------------------------------------------------


def node_token(node: str, signer: nkeys.KeyPair, issued_at: int, expires: int) -> str:
    """A credential for the agent of ``node``: it may publish that node's inventory only."""
    check_subdomain("node", node)
    return encode({"sub": node, "aud": NODE_TOKEN_AUDIENCE, "exp": expires,
                   "nats": {"type": NODE_TOKEN_TYPE}}, signer, issued_at)


def node_of_token(token: str, issuer: str, now: int) -> str:
    """The node a node token was minted for, if ``issuer`` signed it and it is valid now."""
    claims = decode(token, issuer=issuer, now=now)
    nats = claims.get("nats")
    if (not isinstance(nats, dict) or nats.get("type") != NODE_TOKEN_TYPE
            or claims.get("aud") != NODE_TOKEN_AUDIENCE):
        raise JwtError("not a pyhami node token")
    node = claims.get("sub")
    if not isinstance(node, str):
        raise JwtError("node token names no node")
    try:
        check_subdomain("node token subject", node)
    except InvalidName as error:
        raise JwtError(str(error)) from None
    return node
