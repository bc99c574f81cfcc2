{{/*
The operator's permissions, one list shared by the ClusterRole (cluster-wide mode) and every
Role (namespaced mode). tests/chart/test_rbac.py compares it with the operator's own list
(retool_operator.permissions.RULES), which names exactly the API calls the operator makes.
Rules on cluster-scoped resources are listed separately: a Role cannot grant them, so in
namespaced mode they go to a small ClusterRole.
*/}}
{{- define "retool.rbac.namespacedRules" -}}
- apiGroups: ["retool.dev"]
  resources: ["retoolruns"]
  verbs: ["get", "list", "watch", "patch", "update"]
- apiGroups: ["retool.dev"]
  resources: ["retoolruns/status"]
  verbs: ["get", "patch", "update"]
- apiGroups: ["retool.dev"]
  resources: ["retoolruns/finalizers"]
  verbs: ["update"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: ["ray.io"]
  resources: ["rayjobs"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
{{- end }}

{{- define "retool.rbac.clusterRules" -}}
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
{{- end }}
