package controlplane

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane/controlstore"
	"github.com/talkide/talkide/internal/controlplane/mint"
	"github.com/talkide/talkide/internal/controlplane/provision"
	"github.com/talkide/talkide/internal/httpapi"
)

// KubeClient returns a client of the cluster: from the kubeconfig files in
// path (KUBECONFIG: one file or a list) when it is set, else the pod's
// in-cluster credentials.
func KubeClient(path string) (kubernetes.Interface, error) {
	var rc *rest.Config
	var err error
	if path != "" {
		// A list of files, as kubectl (and the worker) read KUBECONFIG.
		rc, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
			&clientcmd.ClientConfigLoadingRules{Precedence: filepath.SplitList(path)}, &clientcmd.ConfigOverrides{}).ClientConfig()
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes credentials (KUBECONFIG %q, else in-cluster): %w", path, err)
	}
	// Endpoints default/kubernetes (the API server's address) is read on
	// purpose: get by name needs the least right, where EndpointSlices
	// would need list cluster-wide. Its deprecation warning is noise.
	rc.WarningHandler = rest.NoWarnings{}
	return kubernetes.NewForConfig(rc)
}

// NewProvisioner returns the K8sWorkerProvisioner cfg configures (cfg must
// have passed Validate with Provisioner "kubernetes"), issuing identity
// tokens through the mint m over db.
func NewProvisioner(cfg Config, db *controlstore.DB, m *mint.Handler) (*provision.K8sWorkerProvisioner, error) {
	kube, err := KubeClient(cfg.Kubeconfig)
	if err != nil {
		return nil, err
	}
	return provision.New(cfg.Provision, kube, db, m, cfg.MasterKeys)
}

// registerWorkersAPI mounts the provisioning admin API
// (docs/provisioning.md): PUT provisions, DELETE deprovisions, GET reads
// the status of /api/admin/workers/{tenant}/{env}; POST
// .../rotate-identity rotates the identity token; GET /api/admin/workers
// lists every tenant-env with a record.
func (s *Server) registerWorkersAPI() {
	auth := adminAuth(s.cfg.AdminToken)
	h := func(f func(p *provision.K8sWorkerProvisioner, ctx context.Context, tenant, env string) (provision.Status, error)) http.Handler {
		return httpapi.Handle(s.log, auth(func(w http.ResponseWriter, r *http.Request) error {
			p, err := s.provisioner()
			if err != nil {
				return err
			}
			tenant, env := r.PathValue("tenant"), r.PathValue("env")
			if !provision.ValidName(tenant) || !provision.ValidName(env) {
				return httpapi.BadRequest("tenant %q, env %q: want DNS labels of at most 30 characters ([a-z0-9-])", tenant, env)
			}
			st, err := f(p, r.Context(), tenant, env)
			return s.writeProvisionResult(w, st, err)
		}))
	}
	s.mux.Handle("PUT /api/admin/workers/{tenant}/{env}", h((*provision.K8sWorkerProvisioner).Provision))
	s.mux.Handle("DELETE /api/admin/workers/{tenant}/{env}", h((*provision.K8sWorkerProvisioner).Deprovision))
	s.mux.Handle("GET /api/admin/workers/{tenant}/{env}", h(func(p *provision.K8sWorkerProvisioner, ctx context.Context, tenant, env string) (provision.Status, error) {
		st, err := p.Status(ctx, tenant, env)
		if err == nil {
			s.addContainment(ctx, &st)
		}
		return st, err
	}))
	s.mux.Handle("POST /api/admin/workers/{tenant}/{env}/rotate-identity", h((*provision.K8sWorkerProvisioner).RotateIdentity))
	s.mux.Handle("GET /api/admin/workers", httpapi.Handle(s.log, auth(func(w http.ResponseWriter, r *http.Request) error {
		p, err := s.provisioner()
		if err != nil {
			return err
		}
		recs, err := s.db.WorkerRecords(r.Context())
		if err != nil {
			return err
		}
		out := []provision.Status{}
		for _, rec := range recs {
			st, err := p.Status(r.Context(), rec.Tenant, rec.Env)
			if err != nil {
				return provisionError(err)
			}
			out = append(out, st)
		}
		httpapi.WriteJSON(w, http.StatusOK, map[string]any{"workers": out})
		return nil
	})))
}

// addContainment asks a worker with ready replicas what its agent
// containment guarantees where it runs (GET /v1/worker, 3 s at most); a
// worker that does not answer leaves the status without it.
func (s *Server) addContainment(ctx context.Context, st *provision.Status) {
	if st.ReadyReplicas == 0 {
		return
	}
	c, err := s.workers.client(st.Tenant, st.Env)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	info, err := c.Info(ctx)
	if err != nil {
		s.log.WarnContext(ctx, "worker containment unknown: the worker did not answer", "tenant", st.Tenant, "env", st.Env, "err", err)
		return
	}
	st.Containment = &info.Containment
}

func (s *Server) provisioner() (*provision.K8sWorkerProvisioner, error) {
	if p := s.prov.Load(); p != nil {
		return p, nil
	}
	return nil, httpapi.Errorf(http.StatusNotFound, contract.ErrTypeNotFound, "worker provisioning is off on this control plane: set TALKIDE_PROVISIONER=kubernetes")
}

// writeProvisionResult answers with the status: 200, or 202 when the
// request is recorded and waits for the cluster (a namespace or claim
// still being deleted; the resync goes on), or the error.
func (s *Server) writeProvisionResult(w http.ResponseWriter, st provision.Status, err error) error {
	var pe *provision.Error
	if err != nil && errors.As(err, &pe) && (pe.Reason == provision.ReasonNamespaceTerminating || pe.Reason == provision.ReasonPVCTerminating) {
		w.Header().Set("Retry-After", "30")
		httpapi.WriteJSON(w, http.StatusAccepted, st)
		return nil
	}
	if err != nil {
		return provisionError(err)
	}
	status := http.StatusOK
	if st.Phase == provision.PhaseDeprovisioning {
		status = http.StatusAccepted
		w.Header().Set("Retry-After", "30")
	}
	httpapi.WriteJSON(w, status, st)
	return nil
}

// provisionError maps a provisioner error to the API's error shape.
func provisionError(err error) error {
	var pe *provision.Error
	if !errors.As(err, &pe) {
		return err
	}
	switch pe.Reason {
	case provision.ReasonInvalid:
		return httpapi.Wrap(http.StatusBadRequest, contract.ErrTypeInvalidRequest, pe.Message, err)
	case provision.ReasonNamespaceConflict, provision.ReasonSuperseded:
		return httpapi.Wrap(http.StatusConflict, contract.ErrTypeConflict, pe.Error(), err)
	case provision.ReasonNotProvisioned:
		return httpapi.Wrap(http.StatusNotFound, contract.ErrTypeNotFound, pe.Message, err)
	case provision.ReasonPolicyMissing:
		return httpapi.Wrap(http.StatusServiceUnavailable, contract.ErrTypeUnavailable, pe.Message, err)
	case provision.ReasonOutdatedConfig:
		// A replica of the rollout being replaced: the request is
		// recorded, a replica of the new configuration applies it.
		e := httpapi.Wrap(http.StatusServiceUnavailable, contract.ErrTypeUnavailable, pe.Error()+"; the request is recorded and a newer replica applies it, retry to see its status", err)
		e.Header = http.Header{"Retry-After": {"5"}}
		return e
	case provision.ReasonAPIError:
		return httpapi.Wrap(http.StatusBadGateway, contract.ErrTypeUpstream, "the Kubernetes API refused or could not be reached: "+pe.Message, err)
	}
	return err
}
