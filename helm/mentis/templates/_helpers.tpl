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

{{/* "true" when workspaces are loop-mounted filesystems (MENTIS_DISK_LIMITS loop, the runtime's default). */}}
{{- define "mentis.loopDisks" -}}
{{- if eq (toString (default "loop" .Values.config.MENTIS_DISK_LIMITS)) "loop" -}}true{{- end -}}
{{- end -}}

{{/* Where things live inside the pod. */}}
{{- define "mentis.dataDir" -}}/var/lib/mentis{{- end -}}
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
