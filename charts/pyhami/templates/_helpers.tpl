{{/* The release's base name: the release name when it holds the chart's name (release
pyhami gives pyhami-scheduler, pyhami-agent, ...), else release-chart. */}}
{{- define "pyhami.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "pyhami.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "pyhami.scheduler" -}}{{ include "pyhami.fullname" . }}-scheduler{{- end -}}
{{- define "pyhami.agent" -}}{{ include "pyhami.fullname" . }}-agent{{- end -}}
{{- define "pyhami.nats" -}}{{ include "pyhami.fullname" . }}-nats{{- end -}}

{{/* The Secret the daemon keeps its own webhook CA and certificate in. */}}
{{- define "pyhami.webhookSecret" -}}{{ include "pyhami.scheduler" . }}-webhook-tls{{- end -}}

{{/* The profile kube-scheduler runs, the name the daemon serves (--scheduler-name: the
webhook writes it, /bind takes only pods naming it, Events come from it): schedulerName,
HAMi's chart value of the same name. */}}
{{- define "pyhami.schedulerName" -}}{{ .Values.schedulerName }}{{- end -}}

{{/* labels: the dict (root, component). */}}
{{- define "pyhami.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pyhami.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "pyhami.labels" -}}
{{ include "pyhami.selectorLabels" . }}
app.kubernetes.io/part-of: pyhami
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "pyhami.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The webhook is served with the daemon's own certificate (no Secret given). */}}
{{- define "pyhami.webhookSelfManaged" -}}
{{- if and .Values.webhook.enabled (not .Values.webhook.tls.existingSecret) -}}true{{- end -}}
{{- end -}}

{{/* The bundled NATS servers' stable DNS names, one per StatefulSet pod (NAME-0, NAME-1,
...), through the headless Service; printed as a JSON list. */}}
{{- define "pyhami.natsHosts" -}}
{{- $nats := include "pyhami.nats" . -}}
{{- $hosts := list -}}
{{- range $index := until (int .Values.nats.replicas) -}}
{{- $hosts = append $hosts (printf "%s-%d.%s-headless.%s.svc" $nats $index $nats $.Release.Namespace) -}}
{{- end -}}
{{- toJson $hosts -}}
{{- end -}}

{{/* The NATS URLs pyhami's pods connect to, comma-separated: every bundled server's own
address (a client that loses its server goes to the next at once, not to a Service that
may still route to the lost one), or the Service's when there is one server; else
nats.url, a string or a list. */}}
{{- define "pyhami.natsUrl" -}}
{{- if .Values.nats.enabled -}}
{{- $scheme := ternary "tls" "nats" (not (empty .Values.nats.serverTls.secretName)) -}}
{{- if gt (int .Values.nats.replicas) 1 -}}
{{- $urls := list -}}
{{- range include "pyhami.natsHosts" . | fromJsonArray -}}
{{- $urls = append $urls (printf "%s://%s:4222" $scheme .) -}}
{{- end -}}
{{- join "," $urls -}}
{{- else -}}
{{ $scheme }}://{{ include "pyhami.nats" . }}.{{ .Release.Namespace }}.svc:4222
{{- end -}}
{{- else -}}
{{- $url := .Values.nats.url -}}
{{- if kindIs "slice" $url -}}{{- $url = join "," $url -}}{{- end -}}
{{- required "nats.url is required when nats.enabled is false (the NATS pyhami should use)" $url -}}
{{- end -}}
{{- end -}}

{{/* The Secret the daemon keeps the NATS issuer key and passwords in (auth callout). */}}
{{- define "pyhami.natsAuthSecret" -}}{{ include "pyhami.fullname" . }}-nats-auth{{- end -}}
{{- define "pyhami.natsTokenDir" -}}/var/run/secrets/pyhami/nats{{- end -}}

{{/* HAMi's device configuration: device-config.yaml (the scheduler and the agents read
it) and the device plugin's config.json (the agents), each a ConfigMap mounted as a folder. */}}
{{- define "pyhami.deviceConfig" -}}{{ include "pyhami.fullname" . }}-device-config{{- end -}}
{{- define "pyhami.deviceConfigDir" -}}/etc/pyhami/device-config{{- end -}}
{{- define "pyhami.nodeConfig" -}}
{{- .Values.devicePlugin.nodeConfiguration.externalConfigName | default (printf "%s-node-config" (include "pyhami.fullname" .)) -}}
{{- end -}}
{{- define "pyhami.nodeConfigDir" -}}/etc/pyhami/node-config{{- end -}}

{{/* The device-config.yaml pyhami reads: device-config.content whole when set (as HAMi's
chart takes it), else the nvidia: section HAMi's chart renders from the values under HAMi's
names. Keys left out (migProfileAllowlist) read as HAMi's chart defaults. */}}
{{- define "pyhami.deviceConfigYaml" -}}
{{- $content := (index .Values "device-config").content -}}
{{- if $content -}}
{{ $content }}
{{- else -}}
{{- $plugin := .Values.devicePlugin -}}
{{- $scheduler := .Values.scheduler -}}
nvidia:
  resourceCountName: {{ .Values.resourceName | toJson }}
  resourceMemoryName: {{ .Values.resourceMem | toJson }}
  resourceMemoryPercentageName: {{ .Values.resourceMemPercentage | toJson }}
  resourceCoreName: {{ .Values.resourceCores | toJson }}
  resourcePriorityName: {{ .Values.resourcePriority | toJson }}
  overwriteEnv: false
  defaultMemory: {{ $scheduler.defaultMem | toJson }}
  defaultCores: {{ $scheduler.defaultCores | toJson }}
  defaultGPUNum: {{ $scheduler.defaultGPUNum | toJson }}
  preConfiguredDeviceMemory: 0
  memoryFactor: 1
  deviceSplitCount: {{ $plugin.deviceSplitCount | toJson }}
  deviceMemoryScaling: {{ $plugin.deviceMemoryScaling | toJson }}
  deviceCoreScaling: {{ $plugin.deviceCoreScaling | toJson }}
  enableNumaTopology: false
  gpuCorePolicy: default
  libCudaLogLevel: 1
  runtimeClassName: {{ $plugin.runtimeClassName | toJson }}
{{- end -}}
{{- end -}}

{{/* The config.json pyhami's agents read: devicePlugin.nodeConfiguration.config, or no
node entries (every node on device-config.yaml's values). */}}
{{- define "pyhami.nodeConfigJson" -}}
{{- .Values.devicePlugin.nodeConfiguration.config | default "{\"nodeconfig\": []}" -}}
{{- end -}}

{{/* The extender over HTTPS: the daemon's files, and kube-scheduler's (one Secret volume
each, holding only the keys that container needs). */}}
{{- define "pyhami.extenderTlsDir" -}}/etc/pyhami/extender-tls{{- end -}}
{{- define "pyhami.extenderClientCaDir" -}}/etc/pyhami/extender-client-ca{{- end -}}
{{- define "pyhami.extenderCaDir" -}}/etc/pyhami/extender-ca{{- end -}}
{{- define "pyhami.extenderClientDir" -}}/etc/pyhami/extender-client{{- end -}}

{{- define "pyhami.natsAuthDir" -}}/etc/pyhami/nats-auth{{- end -}}
{{- define "pyhami.natsTlsDir" -}}/etc/pyhami/nats-tls{{- end -}}

{{/* The NATS flags of `pyhami scheduler` and `pyhami agent`, one list item a line. The
password and the token travel as variables (PYHAMI_NATS_PASSWORD, PYHAMI_NATS_TOKEN):
flags show in ps. */}}
{{- define "pyhami.natsArgs" -}}
{{- $auth := .Values.nats.auth -}}
{{- $tls := .Values.nats.tls -}}
- --nats={{ include "pyhami.natsUrl" . }}
{{- with $auth.user }}
- --nats-user={{ . }}
{{- end }}
{{- if $auth.credsKey }}
- --nats-creds={{ include "pyhami.natsAuthDir" . }}/{{ $auth.credsKey }}
{{- end }}
{{- if $auth.nkeySeedKey }}
- --nats-nkey-seed={{ include "pyhami.natsAuthDir" . }}/{{ $auth.nkeySeedKey }}
{{- end }}
{{- if $tls.caKey }}
- --nats-ca={{ include "pyhami.natsTlsDir" . }}/{{ $tls.caKey }}
{{- end }}
{{- if $tls.certKey }}
- --nats-cert={{ include "pyhami.natsTlsDir" . }}/{{ $tls.certKey }}
{{- end }}
{{- if $tls.keyKey }}
- --nats-key={{ include "pyhami.natsTlsDir" . }}/{{ $tls.keyKey }}
{{- end }}
{{- end -}}

{{- define "pyhami.natsEnv" -}}
{{- $auth := .Values.nats.auth -}}
{{- if $auth.passwordKey }}
- name: PYHAMI_NATS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $auth.existingSecret }}
      key: {{ $auth.passwordKey }}
{{- end }}
{{- if $auth.tokenKey }}
- name: PYHAMI_NATS_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ $auth.existingSecret }}
      key: {{ $auth.tokenKey }}
{{- end }}
{{- end -}}

{{- define "pyhami.natsMounts" -}}
{{- if or .Values.nats.auth.credsKey .Values.nats.auth.nkeySeedKey }}
- name: nats-auth
  mountPath: {{ include "pyhami.natsAuthDir" . }}
  readOnly: true
{{- end }}
{{- if .Values.nats.tls.existingSecret }}
- name: nats-tls
  mountPath: {{ include "pyhami.natsTlsDir" . }}
  readOnly: true
{{- end }}
{{- end -}}

{{- define "pyhami.natsVolumes" -}}
{{- if or .Values.nats.auth.credsKey .Values.nats.auth.nkeySeedKey }}
- name: nats-auth
  secret:
    secretName: {{ .Values.nats.auth.existingSecret }}
{{- end }}
{{- if .Values.nats.tls.existingSecret }}
- name: nats-tls
  secret:
    secretName: {{ .Values.nats.tls.existingSecret }}
{{- end }}
{{- end -}}

{{/* A workload's pod affinity: the dict (root, component, affinity, mode): affinity, with
a podAntiAffinity that keeps the component's pods on different nodes (mode soft: when the
nodes allow; hard: never two on one node; none) unless affinity has its own. */}}
{{- define "pyhami.spreadAffinity" -}}
{{- $affinity := deepCopy (.affinity | default dict) -}}
{{- if and (ne .mode "none") (not (hasKey $affinity "podAntiAffinity")) -}}
{{- $ours := include "pyhami.selectorLabels" (dict "root" .root "component" .component) | fromYaml -}}
{{- $term := dict "topologyKey" "kubernetes.io/hostname" "labelSelector" (dict "matchLabels" $ours) -}}
{{- if eq .mode "hard" -}}
{{- $_ := set $affinity "podAntiAffinity" (dict "requiredDuringSchedulingIgnoredDuringExecution" (list $term)) -}}
{{- else -}}
{{- $_ := set $affinity "podAntiAffinity" (dict "preferredDuringSchedulingIgnoredDuringExecution" (list (dict "weight" 100 "podAffinityTerm" $term))) -}}
{{- end -}}
{{- end -}}
{{- if $affinity }}{{ toYaml $affinity }}{{ end -}}
{{- end -}}

{{/* The scheduler pods' affinity (scheduler.affinity, scheduler.antiAffinity). */}}
{{- define "pyhami.schedulerAffinity" -}}
{{- include "pyhami.spreadAffinity" (dict "root" . "component" "scheduler" "affinity" .Values.scheduler.affinity "mode" .Values.scheduler.antiAffinity) -}}
{{- end -}}

{{/* The bundled NATS servers' affinity (nats.affinity, nats.antiAffinity). */}}
{{- define "pyhami.natsAffinity" -}}
{{- include "pyhami.spreadAffinity" (dict "root" . "component" "nats" "affinity" .Values.nats.affinity "mode" .Values.nats.antiAffinity) -}}
{{- end -}}

{{/* A duration as values.schema.json admits it (15s, 1m30s, 1.5s, 500ms), in
milliseconds. */}}
{{- define "pyhami.durationMs" -}}
{{- $factors := dict "h" 3600000 "m" 60000 "s" 1000 "ms" 1 -}}
{{- $ms := 0.0 -}}
{{- range regexFindAll "[0-9.]+(ms|h|m|s)" . -1 -}}
{{- $unit := regexFind "(ms|h|m|s)$" . -}}
{{- $ms = addf $ms (mulf (trimSuffix $unit . | float64) (get $factors $unit)) -}}
{{- end -}}
{{- $ms -}}
{{- end -}}

{{/* Refuse settings that cannot work, naming the value. */}}
{{- define "pyhami.validate" -}}
{{- include "pyhami.hamiValues" . -}}
{{- if eq .Values.schedulerName "default-scheduler" -}}
{{- fail "schedulerName default-scheduler is the cluster's own scheduler: it and pyhami's would race for every pod; pyhami runs under a name of its own (pyhami-scheduler, or hami-scheduler once HAMi is removed)" -}}
{{- end -}}
{{- $servers := int .Values.nats.replicas -}}
{{- if and .Values.nats.enabled (eq (mod $servers 2) 0) -}}
{{- fail (printf "nats.replicas (%d) must be odd: the servers decide by majority, so %d of them ride out no more server losses than %d would (use 1, 3 or 5)" $servers $servers (sub $servers 1)) -}}
{{- end -}}
{{- $auth := .Values.nats.auth -}}
{{- if and .Values.nats.authCallout.enabled (or $auth.user $auth.existingSecret) -}}
{{- fail "nats.auth is for authCallout.enabled=false: with the auth callout the daemon and the agents get their credentials from it" -}}
{{- end -}}
{{- $tls := .Values.nats.tls -}}
{{- if and (or $auth.passwordKey $auth.tokenKey $auth.credsKey $auth.nkeySeedKey) (not $auth.existingSecret) -}}
{{- fail "nats.auth.existingSecret is required when a key of it (passwordKey, tokenKey, credsKey, nkeySeedKey) is named" -}}
{{- end -}}
{{- if and (or $tls.caKey $tls.certKey $tls.keyKey) (not $tls.existingSecret) -}}
{{- fail "nats.tls.existingSecret is required when a key of it (caKey, certKey, keyKey) is named" -}}
{{- end -}}
{{- $server := .Values.nats.serverTls -}}
{{- if and $server.secretName (not .Values.nats.enabled) -}}
{{- fail "nats.serverTls is for the bundled server (nats.enabled=true)" -}}
{{- end -}}
{{- if and $server.secretName (not $tls.caKey) -}}
{{- fail "nats.serverTls.secretName needs nats.tls.existingSecret and nats.tls.caKey: pyhami's pods must verify the server (its Secret's ca.crt will do)" -}}
{{- end -}}
{{- if and $server.verifyClients (not (and $server.secretName $tls.certKey)) -}}
{{- fail "nats.serverTls.verifyClients needs nats.serverTls.secretName and a client certificate for pyhami's pods (nats.tls.certKey and keyKey)" -}}
{{- end -}}
{{- if ne (empty $tls.certKey) (empty $tls.keyKey) -}}
{{- fail "nats.tls.certKey and nats.tls.keyKey go together (the client certificate and its key)" -}}
{{- end -}}
{{- with .Values.devicePlugin.nodeConfiguration.config -}}
{{- if hasKey (fromJson .) "Error" -}}
{{- fail "devicePlugin.nodeConfiguration.config is not JSON: HAMi's config.json, {\"nodeconfig\": [...]}" -}}
{{- end -}}
{{- end -}}
{{- $extenderTls := .Values.scheduler.extender.tls -}}
{{- if and $extenderTls.enabled (not $extenderTls.secretName) -}}
{{- fail "scheduler.extender.tls.secretName is required when scheduler.extender.tls.enabled is true: the kubernetes.io/tls Secret with the daemon's certificate" -}}
{{- end -}}
{{- if and $extenderTls.clientSecretName (not $extenderTls.enabled) -}}
{{- fail "scheduler.extender.tls.clientSecretName needs scheduler.extender.tls.enabled: client certificates are asked for over HTTPS only" -}}
{{- end -}}
{{- $election := .Values.scheduler.leaderElection -}}
{{- $lease := include "pyhami.durationMs" $election.leaseDuration | float64 -}}
{{- $renew := include "pyhami.durationMs" $election.renewDeadline | float64 -}}
{{- $retry := include "pyhami.durationMs" $election.retryPeriod | float64 -}}
{{- if le $retry 0.0 -}}
{{- fail "scheduler.leaderElection.retryPeriod must be longer than 0" -}}
{{- end -}}
{{- if le $lease $renew -}}
{{- fail (printf "scheduler.leaderElection.renewDeadline (%s) must be shorter than scheduler.leaderElection.leaseDuration (%s): kube-scheduler refuses it otherwise" $election.renewDeadline $election.leaseDuration) -}}
{{- end -}}
{{- if le $renew (mulf 1.2 $retry) -}}
{{- fail (printf "scheduler.leaderElection.renewDeadline (%s) must be longer than 1.2 x scheduler.leaderElection.retryPeriod (%s): kube-scheduler exits otherwise" $election.renewDeadline $election.retryPeriod) -}}
{{- end -}}
{{- if and .Values.webhook.enabled .Values.webhook.tls.existingSecret (not .Values.webhook.tls.caBundle) -}}
{{- fail "webhook.tls.caBundle is required with webhook.tls.existingSecret: the base64 PEM CA that signed its certificate" -}}
{{- end -}}
{{- end -}}
