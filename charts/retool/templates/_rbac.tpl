{{/*
The operator's permissions: one list of namespaced rules shared by the ClusterRole (cluster-wide
mode) and every Role (namespaced mode). tests/chart/test_rbac.py checks that the rendered rules
grant exactly retool_operator.permissions.RULES, the operator's record of the API calls it makes.
No delete verb: children carry owner references, so the garbage collector removes them with
their run, and checkpoints on the PVC are never the operator's to delete.
*/}}
{{- define "retool.rbac.namespacedRules" -}}
- apiGroups: ["retool.dev"]
  resources: ["retoolruns"]
  verbs: ["get", "list", "watch", "patch", "update"]
- apiGroups: ["retool.dev"]
  resources: ["retoolruns/status"]
  verbs: ["get", "patch", "update"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "update"]
- apiGroups: [""]
  resources: ["services", "configmaps", "persistentvolumeclaims"]
  verbs: ["get", "list", "watch", "create", "patch", "update"]
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch", "create", "patch", "update"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "patch", "update"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "patch", "update"]
- apiGroups: ["ray.io"]
  resources: ["rayjobs"]
  verbs: ["get", "list", "watch", "create", "patch", "update"]
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end }}

{{/* Cluster-scoped: a Role cannot grant these. kopf reads the CRD in both modes, and observes
namespaces only when it watches all of them. */}}
{{- define "retool.rbac.clusterRules" -}}
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["get", "list", "watch"]
{{- if not .Values.watchNamespaces }}
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
{{- end }}
{{- end }}
