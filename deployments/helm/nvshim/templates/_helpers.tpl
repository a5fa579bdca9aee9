{{/*
Names, labels and the pieces every pod of the chart shares. The templates use only what
crates/device-plugin/tests/foreign/helm_render provides (sprig, and Helm's include, tpl,
toYaml, fromYaml, toJson, required, fail, lookup): see README.md.
*/}}

{{- define "nvshim.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release name, with the chart name unless it holds it already (Helm's convention). */}}
{{- define "nvshim.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "nvshim.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The namespace of every namespaced object; `default` only when allowed. */}}
{{- define "nvshim.namespace" -}}
{{- $namespace := default .Release.Namespace .Values.namespaceOverride -}}
{{- if and (eq $namespace "default") (not .Values.allowDefaultNamespace) -}}
{{- fail "nvshim: namespace \"default\" is refused; install into its own namespace (-n nvshim --create-namespace) or set allowDefaultNamespace=true" -}}
{{- end -}}
{{- $namespace -}}
{{- end -}}

{{/* Selector labels of one component: (dict "root" $ "component" "device-plugin"). */}}
{{- define "nvshim.selectorLabels" -}}
app.kubernetes.io/name: {{ include "nvshim.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* All labels of one component's objects. */}}
{{- define "nvshim.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "nvshim.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- end -}}

{{/* The node agents deployed, as component names (each has its own service account). */}}
{{- define "nvshim.agents" -}}
{{- $agents := list -}}
{{- if .Values.installer.enabled }}{{ $agents = append $agents "toolkit" }}{{ end -}}
{{- if .Values.devicePlugin.enabled }}{{ $agents = append $agents "device-plugin" }}{{ end -}}
{{- if and .Values.devicePlugin.enabled (include "nvshim.configKey" .) }}{{ $agents = append $agents "mps-control-daemon" }}{{ end -}}
{{- if .Values.gfd.enabled }}{{ $agents = append $agents "labels" }}{{ end -}}
{{- if .Values.exporter.enabled }}{{ $agents = append $agents "exporter" }}{{ end -}}
{{- join " " $agents -}}
{{- end -}}

{{/* The plugin image (plugin, labels, exporter, readiness wait, validation). */}}
{{- define "nvshim.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "nvshim.installerImage" -}}
{{- printf "%s:%s" .Values.installer.image.repository (default .Chart.AppVersion .Values.installer.image.tag) -}}
{{- end -}}

{{/* The runtime class of the GPU pods: runtimeClassName, else the chart's class when the
installer adds the runtime without making it the default, else none (empty). */}}
{{- define "nvshim.runtimeClassName" -}}
{{- if .Values.runtimeClassName -}}
{{- .Values.runtimeClassName -}}
{{- else if and .Values.installer.enabled (not .Values.installer.setAsDefault) (not (include "nvshim.crioHook" .)) -}}
{{- .Values.runtimeClass.name -}}
{{- end -}}
{{- end -}}

{{/* "true" when the installer puts the OCI hook into CRI-O's hooks.d instead of registering a
runtime (installer.crioConfigMode hook): every container runs the hook, there is no runtime
handler for a RuntimeClass to name. */}}
{{- define "nvshim.crioHook" -}}
{{- $mode := .Values.installer.crioConfigMode | default "" }}
{{- if not (has $mode (list "" "config" "hook")) }}
{{- fail (printf "installer.crioConfigMode %q is not valid (valid: config, hook, or null)" $mode) }}
{{- end }}
{{- if and .Values.installer.enabled (eq $mode "hook") }}
{{- if ne .Values.installer.runtime "crio" }}
{{- fail (printf "installer.crioConfigMode hook is CRI-O's, but installer.runtime is %q (set installer.runtime=crio, or leave installer.crioConfigMode null)" .Values.installer.runtime) }}
{{- end -}}
true
{{- end }}
{{- end -}}

{{/* The host's driver root ("/" unless nvidiaDriverRoot says otherwise). */}}
{{- define "nvshim.driverRoot" -}}
{{- default "/" .Values.nvidiaDriverRoot -}}
{{- end -}}

{{/* Where the toolkit installer marks the node ready (NVIDIA's validator's path). */}}
{{- define "nvshim.readyFile" -}}
/run/nvidia/validations/toolkit-ready
{{- end -}}

{{/* The ConfigMap of the plugin's config files: config.name, the chart's own for
config.map, or "" for none. */}}
{{- define "nvshim.configMapName" -}}
{{- if and .Values.config.name .Values.config.map -}}
{{- fail (printf "nvshim: config.name (%q) and config.map (keys %s) are both set; set one of them" .Values.config.name (keys .Values.config.map | sortAlpha | join ", ")) -}}
{{- else if .Values.config.name -}}
{{- .Values.config.name -}}
{{- else if .Values.config.map -}}
{{- printf "%s-config" (include "nvshim.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* The key of that ConfigMap every node uses; "" for none (no config, or the `empty`
fallback). config.fallbackStrategies as NVIDIA's config-manager tries them. */}}
{{- define "nvshim.configKey" -}}
{{- if include "nvshim.configMapName" . -}}
{{- $keys := keys .Values.config.map | sortAlpha -}}
{{- $strategies := .Values.config.fallbackStrategies -}}
{{- if .Values.config.default -}}
{{- if and .Values.config.map (not (has .Values.config.default $keys)) -}}
{{- fail (printf "nvshim: config.default %q is not a key of config.map (keys: %s)" .Values.config.default (join ", " $keys)) -}}
{{- end -}}
{{- .Values.config.default -}}
{{- else if and (has "named" $strategies) (or .Values.config.name (has "default" $keys)) -}}
default
{{- else if and (has "single" $strategies) (eq (len $keys) 1) -}}
{{- first $keys -}}
{{- else if not (has "empty" $strategies) -}}
{{- fail (printf "nvshim: no config.default, and config.fallbackStrategies [%s] pick no key of config.map (keys: %s); set config.default, or add the \"empty\" strategy" (join ", " $strategies) (join ", " $keys)) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* An env list item per dict entry whose value is not null, names sorted. */}}
{{- define "nvshim.optionalEnv" -}}
{{- range $name, $value := . }}
{{- if not (kindIs "invalid" $value) }}
- name: {{ $name }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* True ("true") when a MIG strategy other than none is set. */}}
{{- define "nvshim.migEnabled" -}}
{{- if and .Values.migStrategy (ne (toString .Values.migStrategy) "none") -}}
true
{{- end -}}
{{- end -}}

{{/* Placement shared by the node agents: priority, node choice, tolerations, pull
secrets. (dict "root" $ "nodeSelector" MAP) replaces the chart's nodeSelector. */}}
{{- define "nvshim.placement" -}}
{{- $root := . -}}
{{- if hasKey . "root" }}{{ $root = .root }}{{ end -}}
{{- $nodeSelector := $root.Values.nodeSelector -}}
{{- if hasKey . "nodeSelector" }}{{ $nodeSelector = .nodeSelector }}{{ end -}}
{{- with $root.Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with $nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The init container that waits for the installer's ready file (installer enabled). */}}
{{- define "nvshim.waitForToolkit" -}}
{{- if .Values.installer.enabled }}
initContainers:
  - name: toolkit-ready
    image: {{ include "nvshim.image" . }}
    imagePullPolicy: {{ .Values.image.pullPolicy }}
    command: ["/usr/bin/nvshim", "doctor", "--wait-for", {{ include "nvshim.readyFile" . | quote }}, "--timeout", "0"]
    securityContext:
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      capabilities:
        drop: ["ALL"]
    volumeMounts:
      - name: validations
        mountPath: /run/nvidia/validations
        readOnly: true
{{- end }}
{{- end -}}

{{/* "true" when only an allocation gives an unprivileged container GPUs: the installer sets the
toolkit's accept-nvidia-visible-devices-envvar-when-unprivileged = false and
accept-nvidia-visible-devices-as-volume-mounts = true, so an image's NVIDIA_VISIBLE_DEVICES=all
(every CUDA image's) is no request. */}}
{{- define "nvshim.allocationOnly" -}}
{{- if and .Values.installer.enabled (not .Values.installer.acceptEnvvarWhenUnprivileged) }}true{{ end }}
{{- end -}}

{{/* The device plugin's DEVICE_LIST_STRATEGY: deviceListStrategy, else volume-mounts when only
an allocation counts (else empty: the plugin's default, envvar). envvar cannot allocate then. */}}
{{- define "nvshim.deviceListStrategy" -}}
{{- $strategy := .Values.deviceListStrategy | default "" }}
{{- if include "nvshim.allocationOnly" . }}
{{- $strategy = $strategy | default "volume-mounts" }}
{{- if has "envvar" (splitList "," $strategy) }}
{{- fail (printf "deviceListStrategy %q lists envvar: the runtime refuses NVIDIA_VISIBLE_DEVICES from unprivileged containers while installer.acceptEnvvarWhenUnprivileged is false (valid then: volume-mounts, cdi-annotations, cdi-cri; or set installer.acceptEnvvarWhenUnprivileged=true)" $strategy) }}
{{- end }}
{{- end }}
{{- $strategy -}}
{{- end -}}

{{/* Our own GPU pods (plugin, labels, exporter, MPS daemon, validation) ask for every GPU the
way an allocation does when only an allocation counts: /dev/null at
/var/run/nvidia-container-devices/all (hostPath, which only who may mount host paths can). */}}
{{- define "nvshim.allGpusMount" -}}
{{- if include "nvshim.allocationOnly" . }}
- name: nvidia-all-gpus
  mountPath: /var/run/nvidia-container-devices/all
  readOnly: true
{{- end }}
{{- end -}}

{{- define "nvshim.allGpusVolume" -}}
{{- if include "nvshim.allocationOnly" . }}
- name: nvidia-all-gpus
  hostPath:
    path: /dev/null
    type: CharDevice
{{- end }}
{{- end -}}

{{- define "nvshim.validationsVolume" -}}
{{- if .Values.installer.enabled }}
- name: validations
  hostPath:
    path: /run/nvidia/validations
    type: DirectoryOrCreate
{{- end }}
{{- end -}}

{{/* The pod annotations: the config's checksum (a change rolls the pods) and podAnnotations. */}}
{{- define "nvshim.podAnnotations" -}}
checksum/config: {{ printf "%s %s %s" (toYaml .Values.config.map) .Values.config.name .Values.config.default | sha256sum }}
{{- with .Values.podAnnotations }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The config volume, when a config file is chosen. */}}
{{- define "nvshim.configVolume" -}}
{{- if include "nvshim.configKey" . }}
- name: config
  configMap:
    name: {{ include "nvshim.configMapName" . }}
{{- end }}
{{- end -}}
