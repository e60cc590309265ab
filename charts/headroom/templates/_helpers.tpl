{{/* The chart's name, or nameOverride. */}}
{{- define "headroom.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name: fullnameOverride, else the release name, or release-name when they differ. */}}
{{- define "headroom.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "headroom.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "headroom.labels" -}}
app.kubernetes.io/name: {{ include "headroom.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "headroom.selectorLabels" -}}
app.kubernetes.io/name: {{ include "headroom.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The decision key's Secret: existingSecret, else <fullname>-decision-key (the
operator creates it, labelled as the release). */}}
{{- define "headroom.decisionKeySecret" -}}
{{- default (printf "%s-decision-key" (include "headroom.fullname" .)) .Values.decisionKey.existingSecret -}}
{{- end -}}

{{/* The scheduler's client certificate for the extender, written by the operator. */}}
{{- define "headroom.schedulerClientSecret" -}}
{{- printf "%s-scheduler-client" (include "headroom.fullname" .) -}}
{{- end -}}

{{- define "headroom.serviceAccountName" -}}
{{- default (include "headroom.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{/* The subjects of a ClusterRoleBinding from a value {groups, users, serviceAccounts}. */}}
{{- define "headroom.subjects" -}}
{{- range .groups }}
- kind: Group
  apiGroup: rbac.authorization.k8s.io
  name: {{ . | quote }}
{{- end }}
{{- range .users }}
- kind: User
  apiGroup: rbac.authorization.k8s.io
  name: {{ . | quote }}
{{- end }}
{{- range .serviceAccounts }}
- kind: ServiceAccount
  name: {{ .name | quote }}
  namespace: {{ .namespace | quote }}
{{- end }}
{{- end -}}

{{/* The second kube-scheduler's labels (scheduler.enabled): another name, so that no
selector of the operator's pods matches its pods. */}}
{{- define "headroom.schedulerSelectorLabels" -}}
app.kubernetes.io/name: {{ include "headroom.name" . }}-scheduler
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "headroom.schedulerLabels" -}}
{{ include "headroom.schedulerSelectorLabels" . }}
app.kubernetes.io/component: scheduler
app.kubernetes.io/version: {{ .Values.scheduler.image.tag | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}
