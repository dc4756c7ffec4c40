"""The trunk of pyhami's error tree: the root and its families.

Every exception pyhami raises derives from ``PyhamiError``, so a caller can catch
the project's errors apart from programming mistakes. Below the root, a family
says what kind of trouble it is; each concrete class sits in the module that
raises it, and the agent and the scheduler each add a package root
(``agent.errors.AgentError``, ``scheduler.errors.SchedulerError``)::

    PyhamiError
    ├── InvalidInput (ValueError)        input refused; the message names the field
    │   ├── InvalidName                  common.core.names
    │   ├── AnnotationError              common.core.annotations
    │   ├── MigReservationError          common.core.mig (hami.io/vgpu-mig-allocations)
    │   ├── PodRejected                  common.core.policy
    │   ├── ClusterFileError             common.core.cluster (a cluster description)
    │   ├── InputFileError               common.files
    │   ├── WireError > WrongSubject     common.wire
    │   ├── JwtError                     common.natsjwt (a JWT, NKey or node token)
    │   ├── CredentialsError             common.busaccess (stored NATS credentials)
    │   └── BadReview                    scheduler.web.webhook (also a SchedulerError)
    ├── SettingsError (ValueError)       a flag or PYHAMI_* variable that cannot be used
    ├── ExternalFailure                  NATS, the Kubernetes API or NVML failed or refused
    │   ├── NatsServerError              pyhami.natsserver
    │   ├── CardReadError                agent.vendors.nvidia.nvml (also an AgentError)
    │   └── ClusterError > StoreUnavailable  scheduler.cluster (also a SchedulerError)
    ├── AgentError                       agent.errors
    │   └── InventoryError               agent.vendors.port
    ├── SchedulerError                   scheduler.errors
    │   ├── TlsError                     scheduler.tls.webhook
    │   ├── IdentityRefused              scheduler.busauth (an agent's token)
    │   └── StartupError                 scheduler.errors
    └── ScenarioError                    pyhami.demo

Errors of other libraries (nats-py, kubernetes, pynvml, cryptography, yaml, msgspec)
are mapped to one of these where pyhami calls them, with a message that names what
failed. The families that refuse input keep ``ValueError`` as a base, which callers
rely on. The trunk lives in the core, which does no I/O, so the core can raise it.
"""

from __future__ import annotations


class PyhamiError(Exception):
    """The root: every exception pyhami raises derives from it."""


class InvalidInput(PyhamiError, ValueError):
    """Input refused (a name, file, pod, annotation or message); the text says where."""


class SettingsError(PyhamiError, ValueError):
    """A setting that cannot be used; the text names the flag or variable."""


class ExternalFailure(PyhamiError):
    """A service pyhami depends on (NATS, the Kubernetes API, NVML) failed or refused."""
