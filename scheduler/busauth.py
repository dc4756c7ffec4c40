"""Who may speak for a node on NATS: the daemon answers nats-server's auth callout.

nats-server asks, for every client that is not one of its own configured users
(the daemon's and the watchers'), who that client is. An agent connects with a
token; the daemon finds the node the token is bound to through an
``AgentIdentities`` port and answers with a user allowed to publish that node's
inventory subject and to hear resync requests, nothing else. Two ports, chosen
at start-up: on Kubernetes the token is the agent pod's projected ServiceAccount
token, checked with a TokenReview, whose answer names the node the pod runs on;
without Kubernetes it is a node token ``pyhami nats-auth agent-token`` minted
with the issuer key. A refused client gets the reason; every answer is counted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import nkeys
from nats.aio.msg import Msg

from common.busaccess import (
    ACCOUNT,
    DAEMON_USER,
    BusCredentials,
    CredentialsError,
    agent_permissions,
    agent_user,
)
from common.core.names import InvalidName, check_subdomain, shown
from common.messaging import Connection, RateLimitedLog
from common.natsjwt import (
    AuthorizationRequest,
    JwtError,
    authorization_request,
    authorization_response,
    node_of_token,
    public_key,
    user_jwt,
)
from scheduler.cluster import ClusterError
from scheduler.errors import SchedulerError, StartupError
from scheduler.retry import while_the_api_fails

logger = logging.getLogger(__name__)

AUTH_CALLOUT_SUBJECT = "$SYS.REQ.USER.AUTH"
# Every daemon answers from one queue group: each request is answered once.
AUTH_QUEUE = "pyhami-auth"
DEFAULT_TOKEN_AUDIENCE = "pyhami-nats"
DEFAULT_AGENT_SERVICE_ACCOUNT = "pyhami-agent"
# The claim kube-apiserver adds to a pod-bound token for the node its pod is on.
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
# How many requests are checked at once: a TokenReview is a call to the API server.
CONCURRENT_CHECKS = 16
# Beyond this many waiting, a request is refused at once: a flood of connection attempts
# must not queue without bound (nats-server gives up on an answer after its auth timeout).
WAITING_MAX = 512

AuthResult = Literal["accepted", "refused", "malformed"]


class IdentityRefused(SchedulerError):
    """A credential that names no node this daemon trusts; the text says why."""


class AgentIdentities(Protocol):
    async def node_for(self, token: str) -> str:
        """The node whose agent holds ``token``; raises ``IdentityRefused``."""
        ...


class NodeTokens:
    """Node tokens signed by the issuer key (``pyhami nats-auth agent-token``)."""

    def __init__(self, issuer: str, clock: Callable[[], float] = time.time) -> None:
        self._issuer = issuer
        self._clock = clock

    async def node_for(self, token: str) -> str:
        try:
            return node_of_token(token, self._issuer, int(self._clock()))
        except JwtError as error:
            raise IdentityRefused(f"node token refused: {error}") from None


@dataclass(frozen=True, slots=True)
class ReviewedToken:
    """What the API server said of a token (a TokenReview's status)."""

    authenticated: bool
    username: str = ""
    node: str | None = None
    error: str = ""


class TokenReviewer(Protocol):
    async def review_token(self, token: str, audiences: Sequence[str]) -> ReviewedToken: ...


class ServiceAccountTokens:
    """Projected ServiceAccount tokens of the agent's pods, checked by the API server."""

    def __init__(self, reviewer: TokenReviewer, *, audience: str, namespace: str,
                 service_account: str) -> None:
        self._reviewer = reviewer
        self._audience = audience
        self._username = f"system:serviceaccount:{namespace}:{service_account}"

    async def node_for(self, token: str) -> str:
        review = await self._reviewer.review_token(token, [self._audience])
        if not review.authenticated:
            raise IdentityRefused(f"token not authenticated for audience {self._audience}"
                                  + (f": {review.error}" if review.error else ""))
        if review.username != self._username:
            raise IdentityRefused(f"token of {shown(review.username)}, not of the agent's "
                                  f"ServiceAccount {self._username}")
        if review.node is None:
            raise IdentityRefused("token is not bound to a pod on a node (mount a projected "
                                  "ServiceAccount token in the agent's pod)")
        try:
            check_subdomain("node", review.node)
        except InvalidName as error:
            raise IdentityRefused(str(error)) from None
        return review.node


class SecretStore(Protocol):
    async def read_secret(self, namespace: str, name: str) -> dict[str, bytes] | None: ...

    async def create_opaque_secret(self, namespace: str, name: str,
                                   data: Mapping[str, bytes]) -> bool:
        """False when it exists already (another daemon made it first)."""
        ...


async def self_managed_credentials(store: SecretStore, namespace: str,
                                   name: str) -> BusCredentials:
    """The credentials in the Secret, made first when there is none. Raises
    ``ClusterError`` while the API fails, ``CredentialsError`` for an unusable Secret."""
    where = f"Secret {namespace}/{name}"
    data = await store.read_secret(namespace, name)
    if data is None:
        made = BusCredentials.new()
        if await store.create_opaque_secret(namespace, name, made.stored()):
            logger.info("made the NATS credentials in %s (issuer %s)", where, made.issuer)
            return made
        data = await store.read_secret(namespace, name)
        if data is None:
            raise ClusterError(f"{where} was created by another and is gone again")
    return BusCredentials.from_stored(data, where)



async def callout_signer(credentials: BusCredentials | None, connection: Connection, *,
                         secrets: SecretStore | None, namespace: str, secret: str | None,
                         phase: Callable[[str], None]) -> nkeys.KeyPair:
    """The issuer key, the daemon's password set on ``connection``: from ``credentials``
    (the files), or read (made first if need be) from the Secret ``namespace/secret``,
    tried again while the API fails; ``phase`` is told what the start waits on."""
    if credentials is not None:
        connection.authenticate(DAEMON_USER, credentials.daemon_password)
        return credentials.signer
    assert secret is not None, "checked by the CLI"
    assert secrets is not None, "checked by the CLI: the Secret is a Kubernetes one"
    phase(f"reading the NATS credentials from Secret {namespace}/{secret}")
    try:
        kept = await while_the_api_fails("NATS credentials", lambda: (
            self_managed_credentials(secrets, namespace, secret)))
    except CredentialsError as error:
        raise StartupError(f"--nats-auth-secret: {error}; delete the Secret to have the "
                           "daemon make a new one (and restart NATS)") from None
    connection.authenticate(DAEMON_USER, kept.daemon_password)
    return kept.signer

class AuthCallout:
    """Answers ``$SYS.REQ.USER.AUTH`` on the daemon's connection, in the daemon's account."""

    def __init__(self, connection: Connection, identities: AgentIdentities,
                 signer: nkeys.KeyPair, *, account: str = ACCOUNT,
                 count: Callable[[AuthResult], None] = lambda _result: None,
                 clock: Callable[[], float] = time.time) -> None:
        self._connection = connection
        self._identities = identities
        self._signer = signer
        self._account = account
        self._count = count
        self._clock = clock
        self._checks = asyncio.Semaphore(CONCURRENT_CHECKS)
        self._running: set[asyncio.Task[None]] = set()
        self._log = RateLimitedLog(clock, logger)

    @property
    def issuer(self) -> str:
        return public_key(self._signer)

    async def start(self) -> None:
        await self._connection.subscribe(AUTH_CALLOUT_SUBJECT, self._received, queue=AUTH_QUEUE)
        logger.info("answering NATS auth callout as issuer %s", self.issuer)

    async def _received(self, msg: Msg) -> None:
        if len(self._running) >= WAITING_MAX:
            self._count("refused")
            self._log.warning("busy", "NATS auth callout: %d requests waiting; refusing more",
                              len(self._running))
            return
        # A TokenReview takes a round trip to the API server: answer requests side by side.
        task = asyncio.create_task(self._answer(msg))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _answer(self, msg: Msg) -> None:
        now = int(self._clock())
        try:
            request = authorization_request(msg.data.decode(errors="replace"), now)
        except JwtError as error:
            self._count("malformed")
            self._log.warning("malformed", "NATS auth callout: request refused: %s", error)
            return
        async with self._checks:
            answer = await self.decide(request, now)
        await msg.respond(answer.encode())

    async def decide(self, request: AuthorizationRequest, now: int) -> str:
        """The signed answer to one request: an agent user for its node, or the refusal."""
        who = request.client_info.host or "?"
        token = request.connect_opts.auth_token
        try:
            if not token:
                raise IdentityRefused("no token given (agents connect with --nats-token-file)")
            node = await self._identities.node_for(token)
        except IdentityRefused as error:
            self._count("refused")
            self._log.warning("refused", "NATS client from %s refused: %s", who, error)
            return authorization_response(request, user=None, error=str(error),
                                          signer=self._signer, issued_at=now)
        except Exception as error:  # the API server failed: refuse, never crash the responder
            self._count("refused")
            self._log.warning("failed", "NATS client from %s refused: its token could not be "
                              "checked (%s)", who, error)
            return authorization_response(request, user=None,
                                          error="the token could not be checked now",
                                          signer=self._signer, issued_at=now)
        self._count("accepted")
        logger.info("NATS client from %s admitted as the agent of node %s", who, node)
        user = user_jwt(request, account=self._account, name=agent_user(node),
                        permissions=agent_permissions(node), signer=self._signer,
                        issued_at=now, expires=None)
        return authorization_response(request, user=user, error=None, signer=self._signer,
                                      issued_at=now)

    async def close(self) -> None:
        for task in list(self._running):
            task.cancel()
        await asyncio.gather(*self._running, return_exceptions=True)
