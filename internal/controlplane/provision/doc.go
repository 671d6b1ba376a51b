// Package provision is the control plane's K8sWorkerProvisioner: for a
// (tenant, env) it reconciles, level-based and idempotently, the worker's
// objects in namespace "{tenant}-{env}" (Namespace, Secret
// talkide-worker-token, ServiceAccount/Role/RoleBinding talkide-worker, PVC
// claude-sessions, Deployment and Service talkide-worker, NetworkPolicy),
// rotates the worker's identity token with a grace period, reports status
// from what the cluster shows, and deprovisions (namespace deleted, identity
// tokens revoked).
//
// Desired state (present or absent, with a generation) is a row in the
// control-plane database (controlstore.WorkerRecord); everything else is
// read from the cluster, found by name and by the labels in labels.go, so a
// control plane restarted mid-provision carries on from what exists. The
// rights it needs are ClusterRole; the worker's are WorkerRules.
//
// Run is its controller (controller.go): informers on the objects it makes
// queue a tenant-env on any change, and queue workers reconcile it;
// Provision, Deprovision and RotateIdentity reconcile at once for the
// admin API, under the same per-tenant-env lock.
//
// It runs in the control plane only (it holds the master keys' identity
// signer through Issuer).
package provision
