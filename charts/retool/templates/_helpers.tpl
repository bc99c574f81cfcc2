{{/* Names, labels and derived settings shared by every template. */}}

{{- define "retool.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: 63-character limit of DNS labels, minus room for the longest suffix ("-operator-config" is 16). */}}
{{- define "retool.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 47 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 47 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 47 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "retool.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels never change across upgrades (a Deployment's selector is immutable). */}}
{{- define "retool.selectorLabels" -}}
app.kubernetes.io/name: {{ include "retool.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels of every object; call with (dict "ctx" $ "component" "operator"). */}}
{{- define "retool.labels" -}}
{{- $ctx := .ctx -}}
helm.sh/chart: {{ include "retool.chart" $ctx }}
{{ include "retool.selectorLabels" $ctx }}
app.kubernetes.io/version: {{ $ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ $ctx.Release.Service }}
app.kubernetes.io/part-of: retool
app.kubernetes.io/component: {{ .component }}
{{- with $ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "retool.componentSelector" -}}
{{ include "retool.selectorLabels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "retool.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (printf "%s-operator" (include "retool.fullname" .)) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* A ReTool image reference: (dict "ctx" $ "image" .Values.operator.image). */}}
{{- define "retool.image" -}}
{{- $tag := default .ctx.Chart.AppVersion .image.tag -}}
{{- if .ctx.Values.global.imageRegistry -}}
{{ printf "%s/%s:%s" (trimSuffix "/" .ctx.Values.global.imageRegistry) .image.repository $tag }}
{{- else -}}
{{ printf "%s:%s" .image.repository $tag }}
{{- end -}}
{{- end }}

{{- define "retool.imagePullSecrets" -}}
{{- with .Values.global.imagePullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end }}

{{/* Pod-level restricted security context (Pod Security Standard "restricted"). */}}
{{- define "retool.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .uid }}
runAsGroup: {{ .uid }}
fsGroup: {{ .uid }}
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "retool.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end }}

{{/* Webhook certificate source after resolving "auto": certManager, secret or off. */}}
{{- define "retool.webhook.mode" -}}
{{- $w := .Values.webhook -}}
{{- $c := $w.certificates -}}
{{- if not $w.enabled -}}
off
{{- else if eq $c.source "certManager" -}}
certManager
{{- else if eq $c.source "secret" -}}
{{- if not (and $c.secretName $c.caBundle) -}}
{{- fail "webhook.certificates.source=secret needs webhook.certificates.secretName (a kubernetes.io/tls Secret you created) and webhook.certificates.caBundle (base64 PEM of its CA); or set webhook.enabled=false" -}}
{{- end -}}
secret
{{- else if .Capabilities.APIVersions.Has "cert-manager.io/v1" -}}
certManager
{{- else if and $c.secretName $c.caBundle -}}
secret
{{- else -}}
off
{{- end -}}
{{- end }}

{{- define "retool.webhook.secretName" -}}
{{- if eq (include "retool.webhook.mode" .) "certManager" -}}
{{ include "retool.fullname" . }}-webhook-tls
{{- else -}}
{{ .Values.webhook.certificates.secretName }}
{{- end -}}
{{- end }}

{{- define "retool.mlflow.fullname" -}}
{{ include "retool.fullname" . }}-mlflow
{{- end }}

{{/* The default tracking URI handed to the operator: the chart's tracker, else the external one, else empty. */}}
{{- define "retool.mlflow.trackingUri" -}}
{{- if .Values.mlflow.enabled -}}
{{ printf "http://%s.%s.svc:%v" (include "retool.mlflow.fullname" .) .Release.Namespace .Values.mlflow.service.port }}
{{- else -}}
{{ .Values.mlflow.externalTrackingUri }}
{{- end -}}
{{- end }}

{{/* Does MLflow need a volume (sqlite file or artifacts on the PVC)? Returns "true" or "". */}}
{{- define "retool.mlflow.needsVolume" -}}
{{- if or (eq .Values.mlflow.backend.type "sqlite") (eq .Values.mlflow.artifacts.type "pvc") -}}true{{- end -}}
{{- end }}

{{- define "retool.mlflow.claimName" -}}
{{- default (include "retool.mlflow.fullname" .) .Values.mlflow.persistence.existingClaim -}}
{{- end }}

{{/* Host headers MLflow accepts: every in-cluster name of its Service, loopback (probes), Ingress hosts, extras. */}}
{{- define "retool.mlflow.allowedHosts" -}}
{{- $svc := include "retool.mlflow.fullname" . -}}
{{- $ns := .Release.Namespace -}}
{{- $hosts := list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) "localhost" "127.0.0.1" -}}
{{- range .Values.mlflow.ingress.hosts }}{{- $hosts = append $hosts . -}}{{- end -}}
{{- $out := list -}}
{{- range $hosts }}{{- $out = append $out . -}}{{- $out = append $out (printf "%s:*" .) -}}{{- end -}}
{{- range .Values.mlflow.allowedHosts }}{{- $out = append $out . -}}{{- end -}}
{{- join "," $out -}}
{{- end }}

{{/* "k=v,k2=v2" in key order, the form RETOOL_OPERATOR_ASCEND_NODE_SELECTOR expects. */}}
{{- define "retool.selectorString" -}}
{{- $pairs := list -}}
{{- range $k, $v := . }}{{- $pairs = append $pairs (printf "%s=%s" $k $v) -}}{{- end -}}
{{- join "," $pairs -}}
{{- end }}

{{/* KubeRay is a prerequisite, not a dependency: every RetoolRun stage is a RayJob or needs the
operator that creates them, so an install on a cluster without the ray.io/v1 RayJob API fails here
with the fix. `helm template` and `--dry-run=client` have no cluster: pass
`--api-versions ray.io/v1/RayJob` or `--set kuberay.checkInstalled=false`. */}}
{{- define "retool.kuberay.check" -}}
{{- if and .Values.kuberay.checkInstalled (not (.Capabilities.APIVersions.Has "ray.io/v1/RayJob")) -}}
{{- fail "KubeRay is not installed: this cluster serves no ray.io/v1 RayJob API, which every RetoolRun stage needs. Install the KubeRay operator with its own chart first: helm repo add kuberay https://ray-project.github.io/kuberay-helm/ && helm install kuberay-operator kuberay/kuberay-operator --version 1.6.1 --namespace kuberay-system --create-namespace (see docs/install.md). Rendering without a cluster (helm template, --dry-run=client)? Add --api-versions ray.io/v1/RayJob or --set kuberay.checkInstalled=false." -}}
{{- end -}}
{{- end }}

{{/* Rules spanning several values, checked once (schema covers single values). */}}
{{- define "retool.validate" -}}
{{- include "retool.kuberay.check" . -}}
{{- range $key, $_ := .Values.commonLabels -}}
{{- if or (hasPrefix "app.kubernetes.io/" $key) (hasPrefix "helm.sh/" $key) -}}
{{- fail (printf "commonLabels.%s: the chart sets app.kubernetes.io/* and helm.sh/* labels itself; use another key" $key) -}}
{{- end -}}
{{- end -}}
{{- $images := dict "operator.image" .Values.operator.image "defaults.images.trainerNvidia" .Values.defaults.images.trainerNvidia "defaults.images.trainerAscend" .Values.defaults.images.trainerAscend "defaults.images.sandbox" .Values.defaults.images.sandbox "mlflow.image" .Values.mlflow.image "tests.image" .Values.tests.image -}}
{{- range $key, $image := $images -}}
{{- if eq (toString $image.tag) "latest" -}}
{{- fail (printf "%s.tag: 'latest' is not allowed; pin a version so every node runs the same image" $key) -}}
{{- end -}}
{{- end -}}
{{- $m := .Values.mlflow -}}
{{- if $m.enabled -}}
{{- if and (eq $m.backend.type "postgresql") (not $m.backend.postgresql.existingSecret) -}}
{{- fail "mlflow.backend.type=postgresql needs mlflow.backend.postgresql.existingSecret: a Secret whose key mlflow.backend.postgresql.uriKey holds the PostgreSQL URI" -}}
{{- end -}}
{{- if and (eq $m.artifacts.type "s3") (not $m.artifacts.s3.uri) -}}
{{- fail "mlflow.artifacts.type=s3 needs mlflow.artifacts.s3.uri, e.g. s3://bucket/mlflow-artifacts" -}}
{{- end -}}
{{- if and $m.ingress.enabled (not $m.ingress.hosts) -}}
{{- fail "mlflow.ingress.enabled=true needs at least one host in mlflow.ingress.hosts" -}}
{{- end -}}
{{- else if $m.ingress.enabled -}}
{{- fail "mlflow.ingress.enabled=true needs mlflow.enabled=true (the Ingress routes to the chart's tracker)" -}}
{{- end -}}
{{- if and $m.enabled $m.externalTrackingUri -}}
{{- fail "mlflow.externalTrackingUri is only used with mlflow.enabled=false; set one or the other" -}}
{{- end -}}
{{- if and (eq .Values.webhook.certificates.source "secret") (not .Values.webhook.enabled) -}}
{{- fail "webhook.certificates.source=secret has no effect with webhook.enabled=false" -}}
{{- end -}}
{{- end }}
