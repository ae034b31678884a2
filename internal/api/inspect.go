package api

import (
	"context"
	"net/http"
	"strconv"
	"strings"

	"github.com/meridian-mesh/meridian/internal/policy"
)

// Snapshots gives the zone's policy snapshots of a mesh: the current one
// (read-your-writes, for the inspect endpoints) and the latest one whose
// policy statuses are computed (never waits for a rebuild).
type Snapshots interface {
	Snapshot(ctx context.Context, mesh string) (*policy.MeshSnapshot, error)
	StatusSnapshot(ctx context.Context, mesh string) (*policy.MeshSnapshot, error)
}

// registerInspect adds the zone's inspect endpoints (docs/api.md).
func (s *Server) registerInspect() {
	s.mux.HandleFunc("GET /meshes/{mesh}/dataplanes/{name}/_rules", s.handleRules)
	s.mux.HandleFunc("GET /meshes/{mesh}/dataplanes/{name}/_config", s.handleConfig)
	s.mux.HandleFunc("GET /meshes/{mesh}/dataplanes/{name}/_evaluate", s.handleEvaluate)
	s.mux.HandleFunc("GET /meshes/{mesh}/dataplanes/{name}/_explain", s.handleExplain)
	s.mux.HandleFunc("GET /meshes/{mesh}/{plural}/{name}/_resources/dataplanes", s.handlePolicyDataplanes)
}

func (s *Server) snapshot(r *http.Request) (*policy.MeshSnapshot, error) {
	return s.cfg.Snapshots.Snapshot(r.Context(), r.PathValue("mesh"))
}

func (s *Server) handleRules(w http.ResponseWriter, r *http.Request) {
	snap, err := s.snapshot(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	res, err := snap.Rules(r.PathValue("name"), s.namespaceParam(r))
	s.writeResult(w, r, res, err)
}

func (s *Server) handleConfig(w http.ResponseWriter, r *http.Request) {
	snap, err := s.snapshot(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	res, err := snap.Config(r.PathValue("name"), s.namespaceParam(r))
	s.writeResult(w, r, res, err)
}

// handleEvaluate answers ?inbound=PORT&client=k:v,k2:v2 or ?outbound=SERVICE.
func (s *Server) handleEvaluate(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	inbound, outbound := q.Get("inbound"), q.Get("outbound")
	if (inbound == "") == (outbound == "") {
		s.writeError(w, r, fieldError("inbound", "give exactly one of ?inbound=PORT&client=k:v,... or ?outbound=SERVICE"))
		return
	}
	snap, err := s.snapshot(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	name, ns := r.PathValue("name"), s.namespaceParam(r)
	if outbound != "" {
		res, err := snap.EvaluateOutbound(name, ns, outbound)
		s.writeResult(w, r, res, err)
		return
	}
	port, err := strconv.Atoi(inbound)
	if err != nil || port < 1 || port > 65535 {
		s.writeError(w, r, fieldError("inbound", "must be a port number from 1 to 65535, got %q", inbound))
		return
	}
	client, err := parseTags(q.Get("client"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	res, err := snap.EvaluateInbound(name, ns, port, client)
	s.writeResult(w, r, res, err)
}

// handleExplain answers ?type=T&outbound=S, ?type=T&inbound=PORT&client=k:v,...
// or ?type=T alone for a proxy-wide type (docs/policy.md#provenance-and-explain).
func (s *Server) handleExplain(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	typ := q.Get("type")
	if typ == "" {
		s.writeError(w, r, fieldError("type", "must be set to a policy type, e.g. ?type=MeshTimeout"))
		return
	}
	d, ok := s.reg.Resolve(typ)
	if !ok || !d.IsPolicy() {
		s.writeError(w, r, fieldError("type", "unknown policy type %q", typ))
		return
	}
	inbound, outbound := q.Get("inbound"), q.Get("outbound")
	if inbound != "" && outbound != "" {
		s.writeError(w, r, fieldError("inbound", "give at most one of inbound and outbound"))
		return
	}
	port := 0
	if inbound != "" {
		p, err := strconv.Atoi(inbound)
		if err != nil || p < 1 || p > 65535 {
			s.writeError(w, r, fieldError("inbound", "must be a port number from 1 to 65535, got %q", inbound))
			return
		}
		port = p
	}
	client, err := parseTags(q.Get("client"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if q.Get("client") != "" && port == 0 {
		s.writeError(w, r, fieldError("client", "is only meaningful with inbound=PORT"))
		return
	}
	snap, err := s.snapshot(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	limit := 0
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			s.writeError(w, r, fieldError("limit", "must be a positive integer (blocks and losing values kept per field), got %q", v))
			return
		}
		limit = n
	}
	res, err := snap.Explain(r.PathValue("name"), s.namespaceParam(r), d.Name, outbound, port, client)
	if err == nil {
		res = res.Limit(limit)
	}
	s.writeResult(w, r, res, err)
}

// parseTags reads k:v,k2:v2 (k=v also accepted).
func parseTags(s string) (map[string]string, error) {
	tags := map[string]string{}
	if s == "" {
		return tags, nil
	}
	for _, pair := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(pair, ":")
		if !ok {
			k, v, ok = strings.Cut(pair, "=")
		}
		if !ok || k == "" {
			return nil, fieldError("client", "want key:value pairs separated by commas, got %q", pair)
		}
		tags[k] = v
	}
	return tags, nil
}

func (s *Server) handlePolicyDataplanes(w http.ResponseWriter, r *http.Request) {
	d, err := s.meshScopedType(r.PathValue("plural"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if !d.IsPolicy() {
		s.writeError(w, r, notFound("%s is not a policy type", d.Name))
		return
	}
	snap, err := s.snapshot(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	items, err := snap.MatchedDataplanes(d.Name, r.PathValue("name"), s.namespaceParam(r))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if items == nil {
		items = []policy.Meta{}
	}
	s.writeValue(w, r, http.StatusOK, newList(items))
}

// jsonAppender is a result that encodes itself faster than encoding/json
// (policy.RulesResult: large _rules responses).
type jsonAppender interface {
	AppendJSON(b []byte) []byte
}

func (s *Server) writeResult(w http.ResponseWriter, r *http.Request, v any, err error) {
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if a, ok := v.(jsonAppender); ok {
		s.writeJSONBytes(w, r, http.StatusOK, a.AppendJSON(nil))
		return
	}
	s.writeValue(w, r, http.StatusOK, v)
}
