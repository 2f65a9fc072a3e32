{{/* Names and labels. */}}
{{- define "mentis.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "mentis.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "mentis.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mentis.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "mentis.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "mentis.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: runtime
{{- end -}}

{{- define "mentis.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "mentis.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Images: local names, no registry. */}}
{{- define "mentis.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "mentis.executorImage" -}}
{{- printf "%s:%s" .Values.executorImage.repository .Values.executorImage.tag -}}
{{- end -}}

{{- define "mentis.dindImage" -}}
{{- printf "%s:%s" .Values.docker.dind.image.repository .Values.docker.dind.image.tag -}}
{{- end -}}

{{/* The Secret holding the admin key, and the key in it. */}}
{{- define "mentis.adminKeySecret" -}}
{{- default (printf "%s-admin-key" (include "mentis.fullname" .)) .Values.auth.existingSecret -}}
{{- end -}}

{{- define "mentis.adminKeyItem" -}}
{{- if .Values.auth.existingSecret -}}{{ .Values.auth.existingSecretKey }}{{- else -}}admin.key{{- end -}}
{{- end -}}

{{/* The backend: "true" when sandboxes are pods (backend kubernetes); "true" when they are containers of a
     Docker-in-Docker sidecar (backend docker, docker.mode dind). */}}
{{- define "mentis.kubernetes" -}}
{{- if eq .Values.backend "kubernetes" -}}true{{- end -}}
{{- end -}}

{{- define "mentis.dind" -}}
{{- if and (ne .Values.backend "kubernetes") (eq .Values.docker.mode "dind") -}}true{{- end -}}
{{- end -}}

{{/* The namespace of sandbox pods (MENTIS_K8S_NAMESPACE): kubernetes.namespace, else the release's. */}}
{{- define "mentis.sandboxNamespace" -}}
{{- default .Release.Namespace .Values.kubernetes.namespace -}}
{{- end -}}

{{/* The runtime's instance (MENTIS_INSTANCE, the runtime's default "default"): it labels every sandbox pod. */}}
{{- define "mentis.instance" -}}
{{- default "default" .Values.config.MENTIS_INSTANCE | toString -}}
{{- end -}}

{{/* The runtime pod's selector labels as k=v,k=v (MENTIS_K8S_RUNTIME_POD_LABELS): the runtime's ingress
     NetworkPolicy lets only pods with these labels reach sandbox pods. */}}
{{- define "mentis.runtimePodLabels" -}}
{{- $labels := include "mentis.selectorLabels" . | fromYaml -}}
{{- $pairs := list -}}
{{- range $k := keys $labels | sortAlpha -}}
{{- $pairs = append $pairs (printf "%s=%s" $k (index $labels $k)) -}}
{{- end -}}
{{- join "," $pairs -}}
{{- end -}}

{{/* "true" when workspaces are loop-mounted filesystems (MENTIS_DISK_LIMITS loop, the runtime's default). */}}
{{- define "mentis.loopDisks" -}}
{{- if eq (toString (default "loop" .Values.config.MENTIS_DISK_LIMITS)) "loop" -}}true{{- end -}}
{{- end -}}

{{/* Where things live inside the pod. The data volume is mounted at dataDir; with backend kubernetes the
     runtime (not root) keeps its data in a folder it makes inside it (its own, so it can make it 0700: the
     volume's root belongs to root, group fsGroup). */}}
{{- define "mentis.dataDir" -}}/var/lib/mentis{{- end -}}
{{- define "mentis.runtimeDataDir" -}}
{{- if eq .Values.backend "kubernetes" -}}/var/lib/mentis/data{{- else -}}/var/lib/mentis{{- end -}}
{{- end -}}
{{- define "mentis.dockerRunDir" -}}/run/mentis-docker{{- end -}}

{{/* An environment value as a string: numbers from values files arrive as floats (1e+09), so whole numbers
     are printed as integers. */}}
{{- define "mentis.envValue" -}}
{{- if or (kindIs "float64" .) (kindIs "int64" .) (kindIs "int" .) -}}
{{- . | int64 | toString -}}
{{- else -}}
{{- toString . -}}
{{- end -}}
{{- end -}}
