package api

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
)

const (
	defaultPageSize = 100
	maxPageSize     = 10000
	// OutcomeHeader tells a PUT's caller whether the resource was created,
	// updated or unchanged (meridianctl apply reports it).
	OutcomeHeader = "Meridian-Outcome"
)

func jsonToYAML(b []byte) ([]byte, error) {
	y, err := yaml.JSONToYAML(b)
	if err != nil {
		return nil, fmt.Errorf("render yaml: %w", err)
	}
	return y, nil
}

// writeList writes a list page. YAML is rendered one item at a time:
// converting a 10,000-item document at once costs hundreds of MiB, one item
// at a time costs one item.
func (s *Server) writeList(w http.ResponseWriter, r *http.Request, page listPage) {
	if !wantsYAML(r) {
		s.writeValue(w, r, http.StatusOK, page)
		return
	}
	w.Header().Set("Content-Type", "application/yaml")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriterSize(w, 64<<10)
	fmt.Fprintf(bw, "total: %d\n", page.Total)
	if len(page.Items) == 0 {
		bw.WriteString("items: []\n")
	} else {
		bw.WriteString("items:\n")
	}
	for _, item := range page.Items {
		y, err := jsonToYAML(item)
		if err != nil {
			// Headers are gone; the client sees a truncated document.
			s.logger.Error("rendering a list item as YAML", "path", r.URL.Path, "error", err)
			return
		}
		writeIndentedItem(bw, y)
	}
	if page.Next == nil {
		bw.WriteString("next: null\n")
	} else {
		next, _ := json.Marshal(*page.Next) // a JSON string is a YAML string
		fmt.Fprintf(bw, "next: %s\n", next)
	}
	_ = bw.Flush()
}

// writeIndentedItem writes one YAML document as a list item: "- " before
// its first line, two spaces before the others.
func writeIndentedItem(w *bufio.Writer, y []byte) {
	lines := bytes.Split(bytes.TrimRight(y, "\n"), []byte("\n"))
	for i, line := range lines {
		if i == 0 {
			w.WriteString("- ")
		} else if len(line) > 0 {
			w.WriteString("  ")
		}
		w.Write(line)
		w.WriteByte('\n')
	}
}

// meshScopedType resolves {plural} to a mesh-scoped descriptor.
func (s *Server) meshScopedType(plural string) (*resource.TypeDescriptor, error) {
	d, ok := s.reg.LookupPlural(plural)
	if !ok || d.Scope != resource.ScopeMesh || d.Internal {
		return nil, notFound("unknown resource type %q", plural)
	}
	return d, nil
}

// globalScopedType resolves {plural} to a global-scoped descriptor.
func (s *Server) globalScopedType(plural string) (*resource.TypeDescriptor, error) {
	d, ok := s.reg.LookupPlural(plural)
	if !ok || d.Scope != resource.ScopeGlobal || d.Internal {
		return nil, notFound("unknown path /%s", plural)
	}
	return d, nil
}

// namespaceParam reads ?namespace=, mapping the system namespace to "".
func (s *Server) namespaceParam(r *http.Request) string {
	ns := r.URL.Query().Get("namespace")
	if ns == s.cfg.Plane.SystemNamespace {
		return ""
	}
	return ns
}

// meshScopedKey reads /meshes/{mesh}/{plural}/{name}?namespace= .
func (s *Server) meshScopedKey(r *http.Request) (*resource.TypeDescriptor, resource.Key, error) {
	d, err := s.meshScopedType(r.PathValue("plural"))
	if err != nil {
		return nil, resource.Key{}, err
	}
	key := resource.Key{Type: d.Name, Mesh: r.PathValue("mesh"), Namespace: s.namespaceParam(r), Name: r.PathValue("name")}
	if err := checkKey(key); err != nil {
		return nil, resource.Key{}, err
	}
	return d, key, nil
}

// maxKeyPart bounds every part of a resource key in a URL: no valid name
// (DNS-1123 subdomain), mesh or namespace is longer, so a longer one is the
// caller's mistake (400), never a storage error.
const maxKeyPart = 253

func checkKey(key resource.Key) error {
	for _, part := range []struct{ field, value string }{{"mesh", key.Mesh}, {"namespace", key.Namespace}, {"name", key.Name}} {
		if len(part.value) > maxKeyPart {
			return fieldError(part.field, "%d characters; at most %d", len(part.value), maxKeyPart)
		}
		if strings.IndexByte(part.value, 0) >= 0 {
			return fieldError(part.field, "must not contain a NUL byte")
		}
	}
	return nil
}

func (s *Server) handleGet(w http.ResponseWriter, r *http.Request) {
	_, key, err := s.meshScopedKey(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.getAndWrite(w, r, key)
}

func (s *Server) getAndWrite(w http.ResponseWriter, r *http.Request, key resource.Key) {
	res, err := s.store.Get(r.Context(), key)
	if errors.Is(err, storage.ErrNotFound) {
		s.writeError(w, r, notFound("%s not found", key))
		return
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	statuses, err := s.policyStatuses(r, key.Type, key.Mesh)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeResource(w, r, http.StatusOK, s.forReader(r, statuses.attach(res)))
}

func (s *Server) writeResource(w http.ResponseWriter, r *http.Request, status int, res *resource.Resource) {
	b, err := s.reg.EncodeJSON(res)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSONBytes(w, r, status, b)
}

func (s *Server) handleList(w http.ResponseWriter, r *http.Request) {
	d, err := s.meshScopedType(r.PathValue("plural"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.list(w, r, d, r.PathValue("mesh"))
}

func (s *Server) handleListGlobalScoped(typeName string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		d, _ := s.reg.Lookup(typeName)
		s.list(w, r, d, "")
	}
}

func (s *Server) handleListGlobalScopedPlural(w http.ResponseWriter, r *http.Request) {
	d, err := s.globalScopedType(r.PathValue("plural"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.list(w, r, d, "")
}

// listPage is a list response of stored resources.
type listPage = List[json.RawMessage]

func (s *Server) list(w http.ResponseWriter, r *http.Request, d *resource.TypeDescriptor, mesh string) {
	if p := PrincipalFrom(r.Context()); p != nil && p.Meshes != nil && d.Name == "Mesh" {
		s.listOwnMeshes(w, r, p)
		return
	}
	opts, err := s.listOptions(r, d, mesh)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	res, err := s.store.List(r.Context(), opts)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	statuses, err := s.policyStatuses(r, d.Name, mesh)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	page := listPage{Total: res.Total, Items: make([]json.RawMessage, 0, len(res.Items))}
	for _, item := range res.Items {
		b, err := s.reg.EncodeJSON(s.forReader(r, statuses.attach(item)))
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		page.Items = append(page.Items, b)
	}
	if end := opts.Offset + len(res.Items); end < res.Total {
		next := nextURL(r, end, opts.Limit)
		page.Next = &next
	}
	s.writeList(w, r, page)
}

// listOwnMeshes lists the meshes a mesh-scoped principal may see (a short
// list: at most the meshes its token names), unpaginated.
func (s *Server) listOwnMeshes(w http.ResponseWriter, r *http.Request, p *Principal) {
	page := listPage{Items: []json.RawMessage{}}
	for _, m := range p.Meshes {
		res, err := s.store.Get(r.Context(), resource.Key{Type: "Mesh", Name: m})
		if errors.Is(err, storage.ErrNotFound) {
			continue
		}
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		b, err := s.reg.EncodeJSON(s.forReader(r, res))
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		page.Items = append(page.Items, b)
	}
	page.Total = len(page.Items)
	s.writeList(w, r, page)
}

func (s *Server) listOptions(r *http.Request, d *resource.TypeDescriptor, mesh string) (storage.ListOptions, error) {
	q := r.URL.Query()
	opts := storage.ListOptions{Type: d.Name, Mesh: mesh, Limit: defaultPageSize}
	if v := q.Get("size"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxPageSize {
			return opts, fieldError("size", "must be an integer from 1 to %d, got %q", maxPageSize, v)
		}
		opts.Limit = n
	}
	if v := q.Get("offset"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return opts, fieldError("offset", "must be a non-negative integer, got %q", v)
		}
		opts.Offset = n
	}
	if q.Has("namespace") {
		ns := s.namespaceParam(r)
		opts.Namespace = &ns
	}
	labels, err := labelFilter(q)
	if err != nil {
		return opts, err
	}
	opts.Labels = labels
	return opts, nil
}

// labelFilter accepts Kuma's filter[labels.KEY]=VALUE as well as
// labels=k=v,k2=v2 (k:v also accepted).
func labelFilter(q url.Values) (map[string]string, error) {
	out := map[string]string{}
	for param, values := range q {
		for _, prefix := range []string{"filter[labels.", "filter[label."} {
			if strings.HasPrefix(param, prefix) && strings.HasSuffix(param, "]") {
				out[strings.TrimSuffix(strings.TrimPrefix(param, prefix), "]")] = values[0]
			}
		}
	}
	for _, v := range q["labels"] {
		for _, pair := range strings.Split(v, ",") {
			k, val, ok := strings.Cut(pair, "=")
			if !ok {
				k, val, ok = strings.Cut(pair, ":")
			}
			if !ok || k == "" {
				return nil, fieldError("labels", "want key=value pairs separated by commas, got %q", pair)
			}
			out[k] = val
		}
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

func nextURL(r *http.Request, offset, size int) string {
	u := *r.URL
	q := u.Query()
	q.Set("offset", strconv.Itoa(offset))
	q.Set("size", strconv.Itoa(size))
	u.RawQuery = q.Encode()
	u.Host = r.Host
	u.Scheme = "http"
	if r.TLS != nil {
		u.Scheme = "https"
	}
	return u.String()
}

func (s *Server) handlePut(w http.ResponseWriter, r *http.Request) {
	d, key, err := s.meshScopedKey(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.put(w, r, d, key)
}

// put decodes the body, checks it against the URL, validates and stores it.
func (s *Server) put(w http.ResponseWriter, r *http.Request, d *resource.TypeDescriptor, key resource.Key) {
	dry, err := dryRunParam(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	res, err := s.decodeBody(r, d, key)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if dry {
		s.dryRunPut(w, r, res)
		return
	}
	result, err := s.store.Apply(r.Context(), s.adm.Put(res))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	stored, outcome := result.Stored[0], result.Outcomes[0]
	w.Header().Set(OutcomeHeader, outcome.String())
	status := http.StatusOK
	if outcome == storage.Created {
		status = http.StatusCreated
	}
	s.writeResource(w, r, status, stored)
}

// errDryRun aborts a dry run's transaction once every check passed.
var errDryRun = errors.New("dry run: nothing stored")

// dryRunParam reads ?dryRun=true|false.
func dryRunParam(r *http.Request) (bool, error) {
	v := r.URL.Query().Get("dryRun")
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fieldError("dryRun", "must be true or false, got %q", v)
	}
	return b, nil
}

// dryRunPut runs every check of a PUT — validation, and the admission
// preconditions inside the store's write transaction (owner, mesh, name
// squatting) — and stores nothing: the transaction is aborted once they
// pass. The response is the resource as it would be stored, with the
// outcome it would have in the Meridian-Outcome header ("created (dry run)").
func (s *Server) dryRunPut(w http.ResponseWriter, r *http.Request, res *resource.Resource) {
	batch := s.adm.Put(res)
	check, key := batch.Check, res.Key()
	var existing *resource.Resource
	batch.Check = func(tx storage.TxReader) ([]resource.Key, error) {
		if check != nil {
			if _, err := check(tx); err != nil {
				return nil, err
			}
		}
		existing = nil
		got, err := tx.Get(key)
		switch {
		case err == nil:
			existing = got
		case !errors.Is(err, storage.ErrNotFound):
			return nil, err
		}
		return nil, errDryRun
	}
	_, err := s.store.Apply(r.Context(), batch)
	if !errors.Is(err, errDryRun) {
		if err == nil {
			err = errors.New("dry run: the store did not run the checks")
		}
		s.writeError(w, r, err)
		return
	}
	outcome, status := storage.Created, http.StatusCreated
	if existing != nil {
		outcome, status = storage.Updated, http.StatusOK
		res.Version, res.CreationTime = existing.Version, existing.CreationTime
	}
	w.Header().Set(OutcomeHeader, outcome.String()+" (dry run)")
	s.writeResource(w, r, status, res)
}

// readBody reads the request body. A body cut short (the client went away
// or was too slow) is the client's problem: 400, logged at debug. A body
// over the limit is 413.
func (s *Server) readBody(r *http.Request) ([]byte, error) {
	body, err := io.ReadAll(r.Body)
	var maxErr *http.MaxBytesError
	switch {
	case err == nil:
		return body, nil
	case errors.As(err, &maxErr):
		return nil, err
	}
	s.logger.Debug("request body not received", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr, "error", err)
	return nil, badRequest("the request body could not be read: %v", err)
}

// decodeBody turns a request body into a validated resource whose identity
// matches the URL, with the labels the control plane owns set.
func (s *Server) decodeBody(r *http.Request, d *resource.TypeDescriptor, key resource.Key) (*resource.Resource, error) {
	body, err := s.readBody(r)
	if err != nil {
		return nil, err
	}
	if len(strings.TrimSpace(string(body))) == 0 {
		return nil, badRequest("request body is empty: send the resource as JSON or YAML")
	}
	// A JSON object followed by more fails to decode (trailing data), so
	// only then is it worth splitting to say why; YAML decodes its first
	// document alone, so it is split first.
	jsonObject := bytes.HasPrefix(bytes.TrimLeft(body, " \t\r\n"), []byte("{"))
	if !jsonObject {
		if err := checkOneDocument(body); err != nil {
			return nil, err
		}
	}
	res, err := s.reg.Decode(body)
	if err != nil {
		if jsonObject {
			if err := checkOneDocument(body); err != nil {
				return nil, err
			}
		}
		var verr *resource.ValidationError
		if errors.As(err, &verr) {
			return nil, err
		}
		return nil, badRequest("cannot parse body: %v", err)
	}
	if err := matchURL(res, key, r.URL.Query(), s.cfg.Plane.SystemNamespace); err != nil {
		return nil, err
	}
	if err := s.adm.Prepare(res); err != nil {
		return nil, err
	}
	return res, nil
}

// checkOneDocument refuses a body of several documents.
func checkOneDocument(body []byte) error {
	if docs, err := resource.SplitDocuments(body); err == nil && len(docs) > 1 {
		return badRequest("the body holds %d documents; PUT takes exactly one resource (meridianctl apply splits multi-document files)", len(docs))
	}
	return nil
}

// matchURL fills identity fields the body left out from the URL and rejects
// a body that names another resource than the URL. The system namespace is
// stored as "" (as the URL's ?namespace= is read), so the body's is mapped
// the same way before comparing; messages quote what the caller sent.
func matchURL(res *resource.Resource, key resource.Key, query url.Values, systemNS string) error {
	if systemNS != "" && res.Namespace == systemNS {
		if u := query.Get("namespace"); u != "" && u != systemNS {
			return fieldError("namespace", "%q in the body does not match %q in the URL", systemNS, query.Get("namespace"))
		}
		res.Namespace = ""
	}
	checks := []struct {
		field    string
		body     *string
		url      string
		shown    string // the URL's value as sent
		optional bool
	}{
		{"type", &res.Type, key.Type, key.Type, false},
		{"mesh", &res.Mesh, key.Mesh, key.Mesh, false},
		{"name", &res.Name, key.Name, key.Name, false},
		{"namespace", &res.Namespace, key.Namespace, query.Get("namespace"), !query.Has("namespace")},
	}
	for _, c := range checks {
		switch {
		case *c.body == "":
			*c.body = c.url
		case *c.body != c.url && !c.optional:
			return fieldError(c.field, "%q in the body does not match %q in the URL", *c.body, c.shown)
		}
	}
	return nil
}

func (s *Server) handleDelete(w http.ResponseWriter, r *http.Request) {
	_, key, err := s.meshScopedKey(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.delete(w, r, key)
}

func (s *Server) delete(w http.ResponseWriter, r *http.Request, key resource.Key) {
	var version uint64
	if v := r.URL.Query().Get("version"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			s.writeError(w, r, fieldError("version", "must be a non-negative integer, got %q", v))
			return
		}
		version = n
	}
	_, err := s.store.Apply(r.Context(), s.adm.Delete(key, version))
	if errors.Is(err, storage.ErrNotFound) {
		s.writeError(w, r, notFound("%s not found", key))
		return
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeValue(w, r, http.StatusOK, map[string]string{})
}
