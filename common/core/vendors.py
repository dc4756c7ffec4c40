"""What the core knows of a card vendor, said once: the names HAMi gives the vendor's cards
in annotations, resources and the device configuration, and the rule for a card's type.

HAMi keeps one package per vendor behind one interface; pyhami's core keeps one
``Vendor`` per vendor, and reads every vendor name through it. ``NVIDIA`` is the first
(and, today, the only) one. The agent's side of the seam is ``agent.vendors``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ResourceNames:
    """The extended resources a pod asks for cards with (HAMi's ``resource*Name`` keys of
    ``device-config.yaml``); each defaults to the name HAMi's chart gives NVIDIA's cards,
    which a vendor's ``resources`` and the device configuration may replace."""

    count: str = "nvidia.com/gpu"
    """``resourceCountName``: how many cards."""
    memory: str = "nvidia.com/gpumem"
    """``resourceMemoryName``: MiB of each card (times ``memoryFactor``)."""
    memory_percentage: str = "nvidia.com/gpumem-percentage"
    """``resourceMemoryPercentageName``: a share of each card's memory."""
    cores: str = "nvidia.com/gpucores"
    """``resourceCoreName``: percent of each card's SMs."""
    priority: str = "nvidia.com/priority"
    """``resourcePriorityName``: the task priority HAMi-core reads."""


@dataclass(frozen=True, slots=True)
class PodAnnotations:
    """The annotations a pod chooses the vendor's cards with (HAMi's names)."""

    use_uuid: str
    """The cards a pod may use, by UUID, comma-separated."""
    nouse_uuid: str
    """The cards it may not use, by UUID."""
    use_type: str
    """The card types it may use (a type matches when it contains one, any case)."""
    nouse_type: str
    """The card types it may not use."""
    numa_bind: str
    """``true``: every card of a container on one NUMA node."""
    mode: str
    """The card modes it may use (``hami-core``, ``mig``)."""


@dataclass(frozen=True, slots=True)
class Vendor:
    """One card vendor as HAMi names it on the wire. Pure data and one rule: nothing here
    reads hardware."""

    name: str
    """The vendor's word in the allocation annotations (``UUID,NVIDIA,mem,cores:``) and in
    the decision document's ``type``."""
    type_prefix: str
    """What every registered card type starts with: a name without it gets
    ``<type_prefix>-`` before it (``card_type``)."""
    register_annotation: str
    """The Node annotation registering the node's cards (HAMi's device plugin writes it,
    pyhami's leader writes it for HAMi-WebUI)."""
    config_section: str
    """The key of the vendor's section in HAMi's ``device-config.yaml``."""
    resources: ResourceNames
    """The resources a pod asks with where the device configuration names none."""
    pod_annotations: PodAnnotations
    """What a pod chooses the vendor's cards with."""
    visible_devices_env: str
    """The container variable naming the cards a container may see (the webhook writes it
    ``none`` for a container asking for no card, under ``overwriteEnv``)."""

    @property
    def added_prefix(self) -> str:
        """What is put before a model name that lacks ``type_prefix``."""
        return f"{self.type_prefix}-"

    def card_type(self, model: str) -> str:
        """The ``type`` HAMi's device plugin registers for a card the vendor's library
        names ``model``: the name, with ``<type_prefix>-`` before it only when it does not
        start with ``type_prefix`` (NVIDIA: ``Tesla T4`` is ``NVIDIA-Tesla T4``, ``NVIDIA
        H200`` stays as it is). Every card type made from a model name is made here (the
        agent's inventory, its simulated cards); the node monitor's ``device_type`` label
        follows another rule of HAMi's (``agent.monitor.exporter``)."""
        return model if model.startswith(self.type_prefix) else f"{self.added_prefix}{model}"

    def registered_type(self, card_type: str) -> str:
        """The ``type`` written for a card reported (or given in a cluster file) as
        ``card_type``: the card's type as ``card_type`` makes it, the same for any type the
        rule made; an older pyhami agent's ``NVIDIA-NVIDIA A100-SXM4-80GB`` (it put the
        prefix before every name) is written ``NVIDIA A100-SXM4-80GB``, a bare ``Tesla T4``
        ``NVIDIA-Tesla T4``."""
        return self.card_type(card_type.removeprefix(self.added_prefix))


NVIDIA = Vendor(
    name="NVIDIA",
    type_prefix="NVIDIA",
    register_annotation="hami.io/node-nvidia-register",
    config_section="nvidia",
    resources=ResourceNames(),
    pod_annotations=PodAnnotations(
        use_uuid="nvidia.com/use-gpuuuid",
        nouse_uuid="nvidia.com/nouse-gpuuuid",
        use_type="nvidia.com/use-gputype",
        nouse_type="nvidia.com/nouse-gputype",
        numa_bind="nvidia.com/numa-bind",
        mode="nvidia.com/vgpu-mode"),
    visible_devices_env="NVIDIA_VISIBLE_DEVICES",
)
"""NVIDIA's cards as HAMi v2.10 names them: the vendor pyhami schedules."""
