{{/* Names, labels and the settings checks every template shares. */}}

{{/* The chart name, or nameOverride. */}}
{{- define "vgpud.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The prefix of every object's name: fullnameOverride, or <release>-<name> (the release name alone
when it already contains the chart name). 52 characters leave room for the longest suffix. */}}
{{- define "vgpud.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* chart-version, for the helm.sh/chart label. */}}
{{- define "vgpud.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The labels on every object. */}}
{{- define "vgpud.labels" -}}
helm.sh/chart: {{ include "vgpud.chart" . }}
{{ include "vgpud.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: vgpud
{{- end }}

{{/* The labels that select this release's objects. */}}
{{- define "vgpud.selectorLabels" -}}
app.kubernetes.io/name: {{ include "vgpud.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels and selector labels of one component: (dict "ctx" $ "component" "node"|"webhook"). */}}
{{- define "vgpud.componentLabels" -}}
{{ include "vgpud.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "vgpud.componentSelectorLabels" -}}
{{ include "vgpud.selectorLabels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Object names. */}}
{{- define "vgpud.node.name" -}}
{{- printf "%s-node" (include "vgpud.fullname" .) }}
{{- end }}

{{- define "vgpud.webhook.name" -}}
{{- printf "%s-webhook" (include "vgpud.fullname" .) }}
{{- end }}

{{- define "vgpud.webhook.tlsSecret" -}}
{{- printf "%s-webhook-tls" (include "vgpud.fullname" .) }}
{{- end }}

{{- define "vgpud.metrics.name" -}}
{{- printf "%s-metrics" (include "vgpud.fullname" .) }}
{{- end }}

{{/* The image reference; the tag defaults to the chart's appVersion. */}}
{{- define "vgpud.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* FEATURE_GATES from the featureGates map, in the Kubernetes syntax (sorted by name). */}}
{{- define "vgpud.featureGates" -}}
{{- $gates := list }}
{{- range $name, $on := .Values.featureGates }}
{{- $gates = append $gates (printf "%s=%t" $name $on) }}
{{- end }}
{{- join "," $gates }}
{{- end }}

{{/* The webhook Service's DNS names, the serving certificate's SANs. */}}
{{- define "vgpud.webhook.dnsNames" -}}
{{- $svc := include "vgpud.webhook.name" . }}
{{- list (printf "%s.%s.svc" $svc .Release.Namespace) (printf "%s.%s.svc.cluster.local" $svc .Release.Namespace) | toJson }}
{{- end }}

{{/* KUBERNETES_SERVICE_HOST/PORT when kubernetesServiceHost is set (both workloads). */}}
{{- define "vgpud.apiServerEnv" -}}
{{- if .Values.kubernetesServiceHost }}
- name: KUBERNETES_SERVICE_HOST
  value: {{ .Values.kubernetesServiceHost | quote }}
- name: KUBERNETES_SERVICE_PORT
  value: {{ .Values.kubernetesServicePort | toString | quote }}
{{- end }}
{{- end }}

{{/* Settings that are valid one by one (the schema checks those) but not together: refused with a
message that names them, as vgpud refuses them at start, so a bad release never rolls out. */}}
{{/* "true" when host path .path lies under hostPaths.nodeRoot .root, which mounts it; "" otherwise. */}}
{{- define "vgpud.underNodeRoot" -}}
{{- if and .root (hasPrefix (printf "%s/" (trimSuffix "/" .root)) .path) }}true{{ end }}
{{- end }}

{{- define "vgpud.validateNodeRoot" -}}
{{- $v := .Values }}
{{- $root := $v.hostPaths.nodeRoot }}
{{- $paths := dict "node.driverRoot" $v.node.driverRoot }}
{{- range $key := list "managerDir" "cdiRoot" "nriRoot" "kubeletRegistrarDir" "kubeletPluginsDir" }}
{{- $_ := set $paths (printf "hostPaths.%s" $key) (index $v.hostPaths $key) }}
{{- end }}
{{- $under := list }}
{{- range $name, $path := $paths }}
{{- if include "vgpud.underNodeRoot" (dict "root" $root "path" $path) }}
{{- $under = append $under $name }}
{{- else if contains "$(" $path }}
{{- fail (printf "%s (%s) names a variable: only a path under hostPaths.nodeRoot may (each pod resolves $(NODE_NAME) in its environment; a hostPath volume cannot)" $name $path) }}
{{- end }}
{{- end }}
{{- if contains "$(" $v.node.devRoot }}
{{- fail (printf "node.devRoot (%s) names a variable: it is always mounted by itself, and a hostPath volume cannot expand one" $v.node.devRoot) }}
{{- end }}
{{- if $root }}
{{- if or (not (hasPrefix "/" $root)) (eq (trimSuffix "/" $root) "") (contains "$(" $root) }}
{{- fail (printf "hostPaths.nodeRoot (%s) must be an absolute directory other than / and name no variable" $root) }}
{{- end }}
{{- if not $under }}
{{- fail (printf "hostPaths.nodeRoot (%s) is set but no host path lies under it: it would mount a directory vgpud does not use" $root) }}
{{- end }}
{{- end }}
{{- end }}

{{- define "vgpud.validate" -}}
{{- $v := .Values }}
{{- include "vgpud.validateNodeRoot" . }}
{{- if and $v.kubernetesServiceHost (not $v.kubernetesServicePort) }}
{{- fail "kubernetesServiceHost is set without kubernetesServicePort: give both" }}
{{- end }}
{{- if and $v.kubernetesServicePort (not $v.kubernetesServiceHost) }}
{{- fail "kubernetesServicePort is set without kubernetesServiceHost: give both" }}
{{- end }}
{{- if and (eq $v.node.gpu.backend "mock") (not $v.node.gpu.profile) }}
{{- fail "node.gpu.backend=mock needs node.gpu.profile (a built-in profile name or a YAML file in the image)" }}
{{- end }}
{{- if and (eq $v.node.gpu.backend "nvml") $v.node.gpu.profile }}
{{- fail "node.gpu.profile is only used with node.gpu.backend=mock" }}
{{- end }}
{{- if and (eq $v.node.gpu.backend "mock") $v.node.gpu.nvmlLibrary }}
{{- fail "node.gpu.nvmlLibrary is only used with node.gpu.backend=nvml" }}
{{- end }}
{{- if and $v.node.cgroupDriver (not (or $v.featureGates.DevicePluginClientMode $v.featureGates.NRISupport)) }}
{{- fail "node.cgroupDriver is only used with featureGates.DevicePluginClientMode=true or featureGates.NRISupport=true" }}
{{- end }}
{{- if and $v.node.hotplug.enabled (not $v.featureGates.NRISupport) }}
{{- fail "node.hotplug.enabled needs featureGates.NRISupport=true: the hot-plug API finds its target containers through the NRI plugin" }}
{{- end }}
{{- if le (int $v.node.terminationGracePeriodSeconds) (int $v.node.shutdownTimeoutSeconds) }}
{{- fail (printf "node.terminationGracePeriodSeconds (%v) must exceed node.shutdownTimeoutSeconds (%v): the kubelet would kill vgpud before it closed" $v.node.terminationGracePeriodSeconds $v.node.shutdownTimeoutSeconds) }}
{{- end }}
{{- if and $v.webhook.enabled (le (float64 $v.webhook.terminationGracePeriodSeconds) (addf $v.webhook.shutdownDelaySeconds 10)) }}
{{- fail (printf "webhook.terminationGracePeriodSeconds (%v) must exceed webhook.shutdownDelaySeconds (%v) + 10: the kubelet would kill the webhook before it drained and closed" $v.webhook.terminationGracePeriodSeconds $v.webhook.shutdownDelaySeconds) }}
{{- end }}
{{- if and (not $v.webhook.enabled) (or $v.webhook.relaxations.multipleClaimsPerContainer $v.webhook.relaxations.claimsAcrossPods) }}
{{- fail "webhook.relaxations lift webhook rules: they need webhook.enabled" }}
{{- end }}
{{- if and $v.metrics.serviceMonitor.enabled (not $v.metrics.enabled) }}
{{- fail "metrics.serviceMonitor.enabled needs metrics.enabled" }}
{{- end }}
{{- if and $v.prometheusRule.enabled (not (or $v.metrics.enabled $v.webhook.enabled)) }}
{{- fail "prometheusRule.enabled needs metrics.enabled or webhook.enabled: its alerts are on their metrics" }}
{{- end }}
{{- if and $v.webhook.enabled (eq (int $v.webhook.port) (int $v.node.healthcheckPort)) $v.webhook.hostNetwork $v.node.hostNetwork }}
{{- fail "webhook.port and node.healthcheckPort are the same port on the node's network" }}
{{- end }}
{{- if and $v.metrics.enabled (eq (int $v.metrics.port) (int $v.node.healthcheckPort)) }}
{{- fail "metrics.port and node.healthcheckPort are the same port of one pod" }}
{{- end }}
{{- if and $v.webhook.enabled $v.webhook.hostNetwork $v.metrics.enabled $v.node.hostNetwork (eq (int $v.webhook.port) (int $v.metrics.port)) }}
{{- fail "webhook.port and metrics.port are the same port on the node's network" }}
{{- end }}
{{- end }}

{{/* VGPU_DEVICE_CLASSES: the names of the chart's DeviceClasses, comma-separated. */}}
{{- define "vgpud.deviceClassNames" -}}
{{- $names := list }}
{{- range .Values.deviceClasses }}
{{- $names = append $names .name }}
{{- end }}
{{- join "," $names }}
{{- end }}

{{/* The names of the nriOnly DeviceClasses, comma-separated (possibly none). */}}
{{- define "vgpud.nriDeviceClassNames" -}}
{{- $names := list }}
{{- range .Values.deviceClasses }}
{{- if .nriOnly }}
{{- $names = append $names .name }}
{{- end }}
{{- end }}
{{- join "," $names }}
{{- end }}

{{/* One alerting rule of the PrometheusRule: (dict "ctx" $ "name" "VgpudDown" "severity" "critical"
"expr" "..." "summary" "..." "description" "..."). Its `for` is prometheusRule.for.<name>; its
runbook is the section of docs/alerts.md whose anchor is the name in lower case. */}}
{{- define "vgpud.alert" -}}
{{- $p := .ctx.Values.prometheusRule -}}
- alert: {{ .name }}
  expr: |-
    {{- .expr | nindent 4 }}
  for: {{ required (printf "prometheusRule.for.%s is not set" .name) (index $p.for .name) }}
  labels:
    severity: {{ .severity }}
  annotations:
    summary: {{ .summary | quote }}
    description: {{ .description | quote }}
    {{- with $p.runbookBaseUrl }}
    runbook_url: {{ printf "%s#%s" . (lower $.name) | quote }}
    {{- end }}
{{- end }}

{{/* A ServiceMonitor endpoint's relabeling: the scraped pod's node as the `node` label, which the
alerts and dashboards group by. */}}
{{- define "vgpud.nodeRelabeling" -}}
- action: replace
  sourceLabels: [__meta_kubernetes_pod_node_name]
  targetLabel: node
{{- end }}
