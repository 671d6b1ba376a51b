{{/*
The control plane's objects have fixed names: the provisioner's admission policy matches the
ServiceAccount by its name (talkide-controlplane), and workers reach the Service by its name.
One release per namespace.
*/}}
{{- define "talkide.name" -}}talkide-controlplane{{- end -}}

{{- define "talkide.selectorLabels" -}}
app.kubernetes.io/name: talkide-controlplane
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "talkide.labels" -}}
{{ include "talkide.selectorLabels" . }}
app.kubernetes.io/part-of: talkide
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* An image reference: repository@digest when a digest is given, else repository:tag. */}}
{{- define "talkide.image" -}}
{{- $img := index . 0 -}}{{- $root := index . 1 -}}
{{- if $img.digest -}}
{{- if not (hasPrefix "sha256:" $img.digest) -}}{{- fail (printf "image digest %q: want sha256:<hex>" $img.digest) -}}{{- end -}}
{{- printf "%s@%s" $img.repository $img.digest -}}
{{- else -}}
{{- printf "%s:%s" $img.repository (default $root.Chart.AppVersion $img.tag) -}}
{{- end -}}
{{- end -}}

{{- define "talkide.secretEnv" -}}
- name: {{ .name }}
  valueFrom:
    secretKeyRef:
      name: {{ .secret | quote }}
      key: {{ .key | quote }}
      {{- if .optional }}
      optional: true
      {{- end }}
{{- end -}}
