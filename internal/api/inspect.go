package api

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"

	jsonv2 "github.com/go-json-experiment/json"
	jsonv1 "github.com/go-json-experiment/json/v1"

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
	s.mux.HandleFunc("GET /meshes/{mesh}/dataplanes/{name}/_rules", s.limitInspect(s.handleRules))
	s.mux.HandleFunc("GET /meshes/{mesh}/dataplanes/{name}/_config", s.limitInspect(s.handleConfig))
	s.mux.HandleFunc("GET /meshes/{mesh}/dataplanes/{name}/_evaluate", s.limitInspect(s.handleEvaluate))
	s.mux.HandleFunc("GET /meshes/{mesh}/dataplanes/{name}/_explain", s.limitInspect(s.handleExplain))
	s.mux.HandleFunc("GET /meshes/{mesh}/{plural}/{name}/_resources/dataplanes", s.limitInspect(s.handlePolicyDataplanes))
}

// DefaultMaxInspectPerCaller bounds the inspect calls one caller has in
// flight: each may compute and encode a large result (unbounded, 30
// concurrent _config calls of one viewer take a zone to 2.1 GB).
const DefaultMaxInspectPerCaller = 4

// limitInspect answers 429 to a caller with MaxInspectPerCaller inspect
// calls in flight already.
func (s *Server) limitInspect(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		key := "anonymous"
		if p := PrincipalFrom(r.Context()); p != nil {
			key = p.Via + ":" + p.Name
		}
		if !s.inspecting.acquire(key, s.cfg.MaxInspectPerCaller) {
			w.Header().Set("Retry-After", "1")
			s.writeError(w, r, newError(http.StatusTooManyRequests, "Too Many Requests",
				"%d inspect calls of this caller are in flight already; retry when one is answered", s.cfg.MaxInspectPerCaller))
			return
		}
		defer s.inspecting.release(key)
		h(w, r)
	}
}

// callerSlots counts each caller's calls in flight.
type callerSlots struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *callerSlots) acquire(key string, limit int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	if c.n[key] >= limit {
		return false
	}
	c.n[key]++
	return true
}

func (c *callerSlots) release(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n[key]--; c.n[key] <= 0 {
		delete(c.n, key)
	}
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
	name, ns := r.PathValue("name"), s.namespaceParam(r)
	res, err := snap.Config(name, ns)
	if err == nil && s.cfg.XDS != nil {
		// What the Dataplane's proxy is not given (docs/dataplane.md#not-enforceable).
		var warnings []string
		if warnings, err = s.cfg.XDS.ConfigWarnings(r.Context(), r.PathValue("mesh"), name, ns); err == nil {
			res.Warnings = append(res.Warnings, warnings...)
		}
	}
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
	if q.Get("route") != "" && outbound == "" {
		s.writeError(w, r, fieldError("route", "is only meaningful with outbound=SERVICE"))
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
	target := policy.ExplainTarget{Outbound: outbound, Route: q.Get("route"), Inbound: port, Client: client}
	res, err := snap.Explain(r.PathValue("name"), s.namespaceParam(r), d.Name, target)
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

// JSON is written as it is encoded (a large response is never held whole
// beside the result); YAML is converted from the whole JSON document.
func (s *Server) writeResult(w http.ResponseWriter, r *http.Request, v any, err error) {
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if wantsYAML(r) {
		if a, ok := v.(jsonAppender); ok {
			s.writeJSONBytes(w, r, http.StatusOK, a.AppendJSON(nil))
			return
		}
		s.writeValue(w, r, http.StatusOK, v)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriterSize(w, 32<<10)
	if a, ok := v.(jsonStreamer); ok {
		err = a.WriteJSON(bw)
	} else {
		err = jsonv2.MarshalWrite(bw, v, jsonv1.DefaultOptionsV1())
	}
	if err == nil {
		err = bw.WriteByte('\n')
	}
	if err == nil {
		err = bw.Flush()
	}
	if err != nil {
		s.logger.Debug("inspect response cut", "path", r.URL.Path, "error", err)
	}
}

// jsonStreamer is a result that writes itself as JSON faster than
// encoding/json (policy.RulesResult).
type jsonStreamer interface {
	WriteJSON(w io.Writer) error
}
