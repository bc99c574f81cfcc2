{{/*
The operator's permissions: one list of namespaced rules shared by the ClusterRole (cluster-wide
mode) and every Role (namespaced mode). tests/chart/test_rbac.py checks that the rendered rules
grant exactly retool_operator.permissions.RULES, the operator's record of the API calls it makes.
Children carry owner references, so the garbage collector removes them with their run, and
checkpoints on the PVC are never the operator's to delete. The one delete verb is on Ray objects:
a Ray cluster kept for a retry on the same cluster (KubeRay leaves it up), and the RayJob of an
attempt on such a cluster that spec.suspend stops. update on
retoolruns/finalizers is what the OwnerReferencesPermissionEnforcement admission plugin requires
to set blockOwnerDeletion on those references.
*/}}
{{- define "retool.rbac.namespacedRules" -}}
- apiGroups: ["retool.dev"]
  resources: ["retoolruns"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["retool.dev"]
  resources: ["retoolruns/status"]
  verbs: ["patch"]
- apiGroups: ["retool.dev"]
  resources: ["retoolruns/finalizers"]
  verbs: ["update"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "create", "patch"]
- apiGroups: [""]
  resources: ["services", "persistentvolumeclaims"]
  verbs: ["get", "create", "patch"]
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "create"]
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "create", "patch"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "create", "patch"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: ["ray.io"]
  resources: ["rayjobs"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["ray.io"]
  resources: ["rayclusters"]
  verbs: ["get", "delete"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "patch"]
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["get"]
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["list", "patch"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "list"]
{{- end }}

{{/* Cluster-scoped: a Role cannot grant these. kopf lists and watches the CRD it serves in both
modes (it watches namespaces only for glob patterns, which watchNamespaces does not allow); the
operator reads KubeRay's RayJob CRD once at start to refuse runs the installed version cannot run, and the
webhook reads the PriorityClass a run names to warn when the cluster lacks it; the nodes under a running rl
attempt are read for the signs that they are going (save on notice). */}}
{{- define "retool.rbac.clusterRules" -}}
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["scheduling.k8s.io"]
  resources: ["priorityclasses"]
  verbs: ["get"]
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["get"]
{{- end }}
