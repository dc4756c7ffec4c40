"""``PodBinder``: a pod bound to its node with its allocation annotations, only when it is
pyhami's to bind, in as few requests as that allows."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from scheduler.cluster.kube import _client
from scheduler.cluster.kube._requests import (
    annotation_patch,
    annotations_set,
    bind_refusal,
    binding_body,
)
from scheduler.cluster.kube._transport import (
    API_FAILURES,
    CONFLICT,
    NOT_FOUND,
    ApiTransport,
    answered_with,
    describe_failure,
)
from scheduler.cluster.kube._wire import Pod, PodToBind, pod_to_bind
from scheduler.cluster.port import ClusterError, ClusterPod


class PodBinder:
    """Creates a pod's Binding once the pod is checked to be pyhami's to bind (pending, no
    node, its scheduler name, the uid asked for), with preconditions that make the API
    server refuse it for a pod changed since it was checked."""

    def __init__(self, api: ApiTransport, scheduler_name: str) -> None:
        self._api = api
        self._scheduler_name = scheduler_name

    async def bind(self, namespace: str, name: str, uid: str, node: str,
                   annotations: dict[str, str | None], *, watched: ClusterPod | None,
                   labels: Mapping[str, str] | None = None) -> None:
        """Bind the pod with its annotations in one write, checked first that it is
        pyhami's to bind: kube-apiserver copies a Binding's annotations onto the pod and
        sets its node in the same update. A failed Binding leaves nothing written.

        A pod the watch delivered (``watched``), the same uid, is checked as the watch has
        it and bound with its uid as the one precondition, in one request: a node once set,
        a phase past Pending and the scheduler name never change back, and the Binding
        itself refuses (409) a pod on a node, being deleted, or re-created (an unbound pod
        leaves Pending only as it is deleted). An annotation to remove (``None``) that the
        watched pod does not hold binds it so as well, with its resourceVersion a
        precondition too: a pod changed since, which might hold it now, is refused (409).
        Any other pod, a removal of an annotation the pod holds, or a 409 reads the pod
        first and binds it as read, its resourceVersion a precondition as well.
        """
        what = f"binding pod {namespace}/{name} to node {node}"
        # A removal needs the annotations the pod has now: the watched version is bound
        # only if it holds none of them, and only as that version (409 if it changed).
        removing = None in annotations.values()
        if (watched is not None and watched.uid and uid in ("", watched.uid)
                and not (removing and (watched.version is None or any(
                    value is None and key in watched.annotations
                    for key, value in annotations.items())))):
            refusal = bind_refusal(pod_to_bind(watched), uid, self._scheduler_name)
            if refusal is not None:
                raise ClusterError(f"{what}: {refusal}")
            # kube-apiserver's setPodNodeAndMetadata: wrong uid, deletionTimestamp, nodeName,
            # another resourceVersion than the one given: 409.
            try:
                await _client.create_binding(self._api, namespace, name, binding_body(
                    namespace, name, watched.uid, node,
                    resource_version=watched.version if removing else None,
                    annotations=annotations_set(annotations), labels=labels))
                return
            except API_FAILURES as error:
                if answered_with(error, NOT_FOUND):
                    raise ClusterError(f"{what}: the pod no longer exists") from error
                if not answered_with(error, CONFLICT):
                    raise ClusterError(f"{what}: creating the Binding failed: "
                                       f"{describe_failure(error)}") from error
        await self._bind_as_read(namespace, name, uid, node, annotations, labels=labels)

    async def _bind_as_read(self, namespace: str, name: str, uid: str, node: str,
                            annotations: dict[str, str | None], *,
                            labels: Mapping[str, str] | None) -> None:
        """Read the pod, check it is pyhami's to bind, then bind it as read: the API
        refuses (409) the Binding when the pod is no longer the uid and resourceVersion
        read."""
        what = f"binding pod {namespace}/{name} to node {node}"
        try:
            pod = msgspec.json.decode(await _client.read_pod(self._api, namespace, name),
                                      type=PodToBind)
        except API_FAILURES as error:
            if answered_with(error, NOT_FOUND):
                raise ClusterError(f"{what}: the pod no longer exists") from error
            raise ClusterError(f"{what}: reading the pod failed: "
                               f"{describe_failure(error)}") from error
        refusal = bind_refusal(pod, uid, self._scheduler_name)
        if refusal is not None:
            raise ClusterError(f"{what}: {refusal}")
        uid = uid or pod.metadata.uid or ""
        version = pod.metadata.resource_version
        present = pod.metadata.annotations or {}
        # A Binding sets annotations but cannot remove one: a removal (an allocation its
        # author wrote on a pod that asks for no GPU) is a patch first, as read.
        removals = {key: None for key, value in annotations.items()
                    if value is None and key in present}
        if removals:
            try:
                patched = msgspec.json.decode(await _client.patch_pod(
                    self._api, namespace, name, annotation_patch(uid, version, removals)),
                    type=Pod)
            except API_FAILURES as error:
                raise ClusterError(f"{what}: removing the allocation annotations failed: "
                                   f"{describe_failure(error)}") from error
            version = patched.metadata.resource_version
        try:
            await _client.create_binding(self._api, namespace, name, binding_body(
                namespace, name, uid, node, resource_version=version,
                annotations=annotations_set(annotations), labels=labels))
        except API_FAILURES as error:
            raise ClusterError(f"{what}: creating the Binding failed: "
                               f"{describe_failure(error)}") from error
