{{/* HAMi v2.10's chart values that pyhami's chart names otherwise, or has no use for: each
with what to set instead (docs/migrating-from-hami.md, "HAMi's chart values"). The schema
admits them so that a HAMi values file given to pyhami's chart is refused here, every such
key in one message with its pyhami name, rather than one unknown key at a time or, worse,
ignored. HAMi's values of the same names and meaning (schedulerName, resourceName and the
other resource names, scheduler.defaultSchedulerPolicy, scheduler.kubeScheduler.image.tag,
devicePlugin.deviceSplitCount, ...) are taken as they are. */}}
{{- define "pyhami.hamiValues" -}}
{{- $moved := list
  (list "namespaceOverride" "helm install --namespace (the docs use pyhami-system)")
  (list "podSecurityPolicy" "not needed: PodSecurityPolicy left Kubernetes in 1.25")
  (list "devices" "device-config.content for devices.nvidia.gpuCorePolicy and libCudaLogLevel (device-config.yaml's nvidia.gpuCorePolicy and nvidia.libCudaLogLevel), other vendors' devices not needed")
  (list "mockDevicePlugin" "not needed: pyhami agent --inventory sim:PROFILE simulates cards")
  (list "legacyMetrics" "not needed: pyhami serves HAMi's current metric names only")
  (list "prometheus" "serviceMonitor.enabled and prometheusRule.enabled")
  (list "scheduler.nodeName" "scheduler.nodeSelector: pyhami's kube-scheduler runs beside the cluster's, never in its place")
  (list "scheduler.nodeLabelSelector" "agent.nodeSelector: pyhami places pods on the nodes whose agent reports cards")
  (list "scheduler.overwriteEnv" "device-config.yaml's nvidia.overwriteEnv, through device-config.content")
  (list "scheduler.metricsBindAddress" "not needed: the daemon's metrics are on port 9395 of the Service <fullname>-scheduler")
  (list "scheduler.forceOverwriteDefaultScheduler" "not needed: pyhami's webhook always gives a GPU pod naming default-scheduler its schedulerName, as HAMi's default true does")
  (list "scheduler.livenessProbe" "not needed: the kubelet always probes the daemon's /healthz and /readyz")
  (list "scheduler.leaderElect" "not needed: leader election is always on (scheduler.leaderElection)")
  (list "scheduler.nodeLockExpire" "not needed: pyhami's daemon books cards itself and writes no node lock")
  (list "scheduler.admissionWebhook" "webhook.enabled, webhook.failurePolicy and webhook.timeoutSeconds (the hami.io/webhook=ignore labels work as in HAMi)")
  (list "scheduler.certManager" "webhook.tls.existingSecret (a cert-manager Secret) with webhook.tls.caBundle")
  (list "scheduler.patch" "not needed: the daemon makes and renews the webhook's certificate itself unless webhook.tls.existingSecret is set")
  (list "scheduler.service" "not needed: the Service <fullname>-scheduler (ClusterIP) serves the webhook on 443 and the metrics on 9395")
  (list "scheduler.kubeScheduler.enabled" "not needed: kube-scheduler always runs beside the daemon")
  (list "scheduler.kubeScheduler.extraNewArgs" "scheduler.kubeScheduler.extraArgs (the chart gives --config itself)")
  (list "scheduler.kubeScheduler.image.registry" "scheduler.kubeScheduler.image.repository, with the registry in it (registry.k8s.io/kube-scheduler)")
  (list "scheduler.kubeScheduler.image.pullSecrets" "imagePullSecrets")
  (list "scheduler.extender.image" "image (pyhami's image: image.repository, image.tag, image.pullPolicy)")
  (list "devicePlugin.gpuOperatorToolkitReady" "no pyhami counterpart: the agent does not wait for the GPU Operator's validations")
  (list "devicePlugin.image" "image (the agent runs pyhami's image)")
  (list "devicePlugin.monitor" "agent.monitor (the node monitor runs in the agent: agent.monitor.port, agent.monitor.hostPID)")
  (list "devicePlugin.enableNumaTopology" "device-config.yaml's nvidia.enableNumaTopology through device-config.content, or a node's enablenumatopology in devicePlugin.nodeConfiguration.config")
  (list "devicePlugin.preConfiguredDeviceMemory" "device-config.yaml's nvidia.preConfiguredDeviceMemory through device-config.content, or a node's preconfigureddevicememory in devicePlugin.nodeConfiguration.config")
  (list "devicePlugin.createRuntimeClass" "not made by the chart: create the RuntimeClass and name it in devicePlugin.runtimeClassName")
  (list "devicePlugin.disablecorelimit" "not needed: HAMi v2.10 reads no value of it either")
  (list "devicePlugin.passDeviceSpecsEnabled" "not needed: the agent's device plugin hands cards over NVIDIA_VISIBLE_DEVICES (docs/device-plugin.md)")
  (list "devicePlugin.deviceListStrategy" "not needed: the agent's device plugin hands cards over NVIDIA_VISIBLE_DEVICES, HAMi's envvar (docs/device-plugin.md)")
  (list "devicePlugin.nvidiaHookPath" "not needed: the agent's device plugin hands cards over NVIDIA_VISIBLE_DEVICES (docs/device-plugin.md)")
  (list "devicePlugin.nvidiaDriverRoot" "not needed: the agent's device plugin hands cards over NVIDIA_VISIBLE_DEVICES (docs/device-plugin.md)")
  (list "devicePlugin.gdrcopyEnabled" "not needed: the agent's device plugin hands cards over NVIDIA_VISIBLE_DEVICES (docs/device-plugin.md)")
  (list "devicePlugin.gdsEnabled" "not needed: the agent's device plugin hands cards over NVIDIA_VISIBLE_DEVICES (docs/device-plugin.md)")
  (list "devicePlugin.mofedEnabled" "not needed: the agent's device plugin hands cards over NVIDIA_VISIBLE_DEVICES (docs/device-plugin.md)")
  (list "devicePlugin.extraArgs" "agent.extraArgs (pyhami agent's flags, its verbosity --log-level)")
  (list "devicePlugin.extraEnvs" "agent.extraEnv (a list of variables)")
  (list "devicePlugin.service" "agent.monitor.port (the Service <fullname>-agent)")
  (list "devicePlugin.pluginPath" "devicePlugin.kubeletDir")
  (list "devicePlugin.libPath" "devicePlugin.hamiCoreDir")
  (list "devicePlugin.podAnnotations" "agent.podAnnotations")
  (list "devicePlugin.hostPID" "agent.monitor.hostPID")
  (list "devicePlugin.hostNetwork" "not needed: the agent needs no host network")
  (list "devicePlugin.securityContext" "agent.migPrivileged (the agent drops every capability, and is privileged only for nodes in MIG mode)")
  (list "devicePlugin.nvidiaNodeSelector" "agent.nodeSelector")
  (list "devicePlugin.tolerations" "agent.tolerations")
  (list "devicePlugin.updateStrategy" "not needed: the agent's DaemonSet updates one node at a time (RollingUpdate)")
  (list "devicePlugin.resources" "agent.resources")
-}}
{{- $found := list -}}
{{- range $moved -}}
{{- $node := $.Values -}}
{{- $present := true -}}
{{- range splitList "." (index . 0) -}}
{{- if and $present (kindIs "map" $node) (hasKey $node .) -}}
{{- $node = index $node . -}}
{{- else -}}
{{- $present = false -}}
{{- end -}}
{{- end -}}
{{- if $present -}}
{{- $found = append $found (printf "%s: %s" (index . 0) (index . 1)) -}}
{{- end -}}
{{- end -}}
{{- /* Other vendors' resource names, in one line. */ -}}
{{- $vendors := list -}}
{{- range list "mluResourceName" "mluResourceMem" "mluResourceCores" "dcuResourceName" "dcuResourceMem" "dcuResourceCores" "metaxResourceName" "metaxResourceCore" "metaxResourceMem" "metaxsGPUTopologyAware" "enflameResourceNameDRSGCU" "enflameResourceNameGCUMemory" "enflameResourceNameGCUCore" "kunlunResourceName" "kunlunResourceVCountName" "kunlunResourceVMemoryName" "vastaiResourceName" "birenResourceName" -}}
{{- if hasKey $.Values . -}}{{- $vendors = append $vendors . -}}{{- end -}}
{{- end -}}
{{- if $vendors -}}
{{- $found = append $found (printf "%s: not needed: pyhami schedules NVIDIA cards only" (join ", " $vendors)) -}}
{{- end -}}
{{- /* global: its known keys by name, any other as HAMi's. */ -}}
{{- $global := dict
  "imageRegistry" "image.repository, scheduler.kubeScheduler.image.repository and nats.image.repository, each with its registry"
  "imagePullSecrets" "imagePullSecrets"
  "imageTag" "image.tag (pyhami's image, not HAMi's)"
  "gpuHookPath" "devicePlugin.hamiCoreDir, which is <gpuHookPath>/vgpu"
  "labels" "not set by pyhami's chart: its objects carry the app.kubernetes.io labels"
  "annotations" "scheduler.podAnnotations and agent.podAnnotations"
  "managedNodeSelectorEnable" "agent.nodeSelector: pyhami places pods on the nodes whose agent reports cards"
  "managedNodeSelector" "agent.nodeSelector: pyhami places pods on the nodes whose agent reports cards"
-}}
{{- if kindIs "map" .Values.global -}}
{{- range $key, $value := .Values.global -}}
{{- $found = append $found (printf "global.%s: %s" $key (get $global $key | default "HAMi's value, with no pyhami counterpart")) -}}
{{- end -}}
{{- else if hasKey .Values "global" -}}
{{- $found = append $found "global: HAMi's values, with no pyhami counterpart" -}}
{{- end -}}
{{- with .Values.scheduler.kubeScheduler.extraArgs -}}
{{- range . -}}
{{- if hasPrefix "--policy-config-file" . -}}
{{- $found = append $found (printf "scheduler.kubeScheduler.extraArgs %s: HAMi's for Kubernetes before 1.22, which today's kube-scheduler refuses (the chart gives it its configuration)" .) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- range .Values.scheduler.extender.extraArgs -}}
{{- if or (eq . "--debug") (hasPrefix "-v=" .) (hasPrefix "--v=" .) -}}
{{- $found = append $found (printf "scheduler.extender.extraArgs %s: HAMi's scheduler flag, which pyhami scheduler refuses (its verbosity: --log-level=debug)" .) -}}
{{- end -}}
{{- end -}}
{{- if $found -}}
{{- fail (printf "HAMi's chart values, which pyhami's chart names otherwise (docs/migrating-from-hami.md, HAMi's chart values): %s" (join "; " $found)) -}}
{{- end -}}
{{- end -}}
