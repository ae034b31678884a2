package resource

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	yamlv2 "go.yaml.in/yaml/v2"
	"sigs.k8s.io/yaml"
)

// Documents come in two shapes (docs/resources.md):
//   - Universal: type, mesh, name, namespace, labels, spec (+ read-only
//     creationTime, modificationTime, version, status); for types with
//     UniversalTopLevel the spec fields may also sit at the top level, as in
//     Kuma's Universal format (Dataplane's networking, legacy policies'
//     sources/destinations/conf).
//   - Kubernetes: apiVersion, kind, metadata{name, namespace, labels,
//     annotations}, spec, and for legacy types a top-level mesh.

// utf8BOM is stripped: editors on some systems prepend it.
const utf8BOM = "\xef\xbb\xbf"

// syntaxError is input that is not valid YAML or JSON.
type syntaxError struct {
	format string // "YAML" or "JSON"
	msg    string
	err    error
}

func (e *syntaxError) Error() string { return "invalid " + e.format + ": " + e.msg }
func (e *syntaxError) Unwrap() error { return e.err }

// SplitDocuments splits an input into its documents: a JSON array of
// documents, a stream of JSON objects, or YAML documents separated by "---".
// Documents holding only comments are skipped; an input with no document at
// all is an error.
func SplitDocuments(data []byte) ([][]byte, error) {
	data = bytes.TrimPrefix(data, []byte(utf8BOM))
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 {
		return nil, errors.New("no documents: the input is empty")
	}
	switch trimmed[0] {
	case '[':
		return splitJSONArray(trimmed)
	case '{':
		// A JSON stream, unless it is YAML that starts with a flow mapping.
		if docs, err := splitJSONStream(trimmed); err == nil {
			return docs, nil
		}
	}
	docs := splitYAML(data)
	if len(docs) == 0 {
		return nil, errors.New("no documents: the input holds only comments and separators")
	}
	return docs, nil
}

func splitJSONArray(data []byte) ([][]byte, error) {
	var items []json.RawMessage
	if err := json.Unmarshal(data, &items); err != nil {
		return nil, jsonSyntaxError(data, err)
	}
	if len(items) == 0 {
		return nil, errors.New("no documents: the JSON array is empty")
	}
	docs := make([][]byte, len(items))
	for i, item := range items {
		docs[i] = item
	}
	return docs, nil
}

func splitJSONStream(data []byte) ([][]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	var docs [][]byte
	for dec.More() {
		var doc json.RawMessage
		if err := dec.Decode(&doc); err != nil {
			return nil, fmt.Errorf("JSON stream: %w", err)
		}
		docs = append(docs, doc)
	}
	return docs, nil
}

// splitYAML cuts at "---" and "..." marker lines. Text after "--- " on the
// marker line belongs to the next document, as YAML allows.
func splitYAML(data []byte) [][]byte {
	var docs [][]byte
	var cur []byte
	flush := func() {
		if hasYAMLContent(cur) {
			docs = append(docs, cur)
		}
		cur = nil
	}
	for _, line := range bytes.SplitAfter(data, []byte("\n")) {
		if isYAMLMarker(line) {
			flush()
			if bytes.HasPrefix(line, []byte("---")) {
				cur = append(cur, line[3:]...)
			}
			continue
		}
		cur = append(cur, line...)
	}
	flush()
	return docs
}

func isYAMLMarker(line []byte) bool {
	if !bytes.HasPrefix(line, []byte("---")) && !bytes.HasPrefix(line, []byte("...")) {
		return false
	}
	return len(line) == 3 || strings.ContainsRune(" \t\r\n", rune(line[3]))
}

// hasYAMLContent: anything but blank lines, comments and directives.
func hasYAMLContent(doc []byte) bool {
	for _, line := range bytes.Split(doc, []byte("\n")) {
		t := bytes.TrimSpace(line)
		if len(t) > 0 && t[0] != '#' && t[0] != '%' {
			return true
		}
	}
	return false
}

// jsonSyntaxError locates a JSON decoding error by line and column.
func jsonSyntaxError(data []byte, err error) error {
	var (
		se     *json.SyntaxError
		te     *json.UnmarshalTypeError
		td     *trailingDataError
		offset int64 = -1
		cause  error = err
	)
	switch {
	case errors.As(err, &se):
		offset, cause = se.Offset, se
	case errors.As(err, &te):
		offset, cause = te.Offset, te
	case errors.As(err, &td):
		offset, cause = td.offset, td
	}
	if offset <= 0 || offset > int64(len(data)) {
		return &syntaxError{format: "JSON", msg: strings.TrimPrefix(err.Error(), "invalid JSON: "), err: err}
	}
	// Offset counts the bytes read, the offending one included.
	before := data[:offset]
	line := bytes.Count(before, []byte("\n")) + 1
	col := int(offset) - bytes.LastIndexByte(before, '\n') - 1
	return &syntaxError{format: "JSON", msg: fmt.Sprintf("line %d, column %d: %v", line, col, cause), err: err}
}

// parseDocument turns one YAML or JSON document into a JSON object with
// json.Number numbers. A document written as JSON (it opens with `{"` or
// `[`) must be valid JSON, so that a JSON mistake is reported as one, with
// its position, instead of being read as lenient YAML; other documents are
// YAML, flow style ({type: Mesh}) included.
func parseDocument(doc []byte, names internTable, s *scratch) (map[string]any, error) {
	trimmed := bytes.TrimSpace(bytes.TrimPrefix(doc, []byte(utf8BOM)))
	if len(trimmed) == 0 {
		return nil, errors.New("empty document")
	}
	jsonDoc := trimmed
	if !looksLikeJSON(trimmed) {
		out, err := yaml.YAMLToJSONStrict(trimmed)
		if err != nil {
			return nil, &syntaxError{format: "YAML", msg: strings.TrimPrefix(err.Error(), "yaml: "), err: err}
		}
		jsonDoc = out
	}
	v, err := parseJSONScratch(jsonDoc, names, s)
	if err != nil {
		return nil, jsonSyntaxError(jsonDoc, err)
	}
	obj, ok := v.(map[string]any)
	if !ok {
		s.recycle(v)
		return nil, fmt.Errorf("a document must be an object (a mapping), got %s", jsonType(v))
	}
	return obj, nil
}

func looksLikeJSON(doc []byte) bool {
	if doc[0] == '[' {
		return true
	}
	rest := bytes.TrimLeft(doc[1:], " \t\r\n")
	return doc[0] == '{' && (len(rest) == 0 || rest[0] == '"' || rest[0] == '}')
}

// Decode reads one document (YAML or JSON, Universal or Kubernetes shape).
// Problems with fields are a *ValidationError naming each field; input that
// is not YAML/JSON at all is a plain error saying where it breaks. Decode
// checks shapes only; Validate checks values.
func (reg *Registry) Decode(doc []byte) (*Resource, error) {
	// The document's tree is dropped once decoded: the resource holds its
	// strings, new label maps and canonical encodings, none of its maps or
	// arrays.
	s := reg.scratch.get()
	obj, err := parseDocument(doc, reg.vocab, s)
	defer func() { reg.scratch.put(s, obj) }()
	if err != nil {
		return nil, err
	}
	if obj["apiVersion"] != nil || obj["kind"] != nil {
		return reg.decodeKubernetes(obj)
	}
	return reg.decodeUniversal(obj)
}

// lookupType resolves the type named by field; nil (with the problem
// recorded in errs) when there is none.
func (reg *Registry) lookupType(field string, v any, errs *ValidationError) *TypeDescriptor {
	name, ok := v.(string)
	switch {
	case v != nil && !ok:
		errs.Add(field, "must be a string, got %s", jsonType(v))
		return nil
	case name == "":
		errs.Add(field, "must be set")
		return nil
	}
	d, ok := reg.Lookup(name)
	if !ok {
		errs.Add(field, "unknown resource type %q", name)
	}
	return d
}

func (reg *Registry) decodeUniversal(obj map[string]any) (*Resource, error) {
	errs := &ValidationError{}
	d := reg.lookupType("type", obj["type"], errs)
	if d == nil {
		return nil, errs.OrNil()
	}
	r := &Resource{Type: d.Name}
	topLevel := map[string]any{}
	for _, k := range sortedKeys(obj) {
		v := obj[k]
		switch k {
		case "type", "spec", "status", "creationTime", "modificationTime", "version":
		case "mesh":
			r.Mesh = stringField(k, v, errs)
		case "name":
			r.Name = stringField(k, v, errs)
		case "namespace":
			r.Namespace = stringField(k, v, errs)
		case "labels":
			r.Labels = labelsField(k, v, errs)
		default:
			if d.UniversalTopLevel && d.Spec.hasField(k) {
				topLevel[k] = v
			} else {
				errs.Add(joinPath("", k), "unknown field")
			}
		}
	}
	spec := obj["spec"]
	if len(topLevel) > 0 {
		if spec != nil {
			errs.Add("spec", "must not be set together with top-level spec fields (%s)", strings.Join(sortedKeys(topLevel), ", "))
		}
		spec = topLevel
	}
	r.Spec = objectField("spec", spec, errs)
	decodeReadOnly(obj, r, errs)
	if err := errs.OrNil(); err != nil {
		return nil, err
	}
	return r, nil
}

// decodeReadOnly reads the fields the control plane sets. They are accepted
// on input: version carries optimistic concurrency, the others round-trip.
func decodeReadOnly(obj map[string]any, r *Resource, errs *ValidationError) {
	r.CreationTime = timeField("creationTime", obj["creationTime"], errs)
	r.ModificationTime = timeField("modificationTime", obj["modificationTime"], errs)
	r.Version = versionField("version", obj["version"], errs)
	r.Status = jsonField("status", obj["status"], errs)
}

// kubernetesMetadata are metadata fields Kubernetes sets; they are accepted
// and ignored so that `kubectl get -o yaml` output can be applied.
func kubernetesMetadata() []string {
	return []string{"uid", "resourceVersion", "generation", "creationTimestamp", "deletionTimestamp",
		"deletionGracePeriodSeconds", "managedFields", "ownerReferences", "finalizers", "generateName", "selfLink"}
}

// KumaAPIVersion is the apiVersion of Kuma's Kubernetes resources.
const KumaAPIVersion = "kuma.io/v1alpha1"

func (reg *Registry) decodeKubernetes(obj map[string]any) (*Resource, error) {
	errs := &ValidationError{}
	// Every Kuma CRD is served as kuma.io/v1alpha1; anything else would be
	// refused by the Kubernetes API server before Kuma saw it.
	if api := stringField("apiVersion", obj["apiVersion"], errs); api != KumaAPIVersion {
		errs.Add("apiVersion", "unsupported apiVersion %q: must be %s", api, KumaAPIVersion)
	}
	d := reg.lookupType("kind", obj["kind"], errs)
	if d == nil {
		return nil, errs.OrNil()
	}
	r := &Resource{Type: d.Name}
	for _, k := range sortedKeys(obj) {
		switch k {
		case "apiVersion", "kind", "spec", "status":
		case "mesh":
			r.Mesh = stringField(k, obj[k], errs)
		case "metadata":
			decodeMetadata(obj[k], r, errs)
		default:
			errs.Add(joinPath("", k), "unknown field")
		}
	}
	if r.Mesh == "" && d.Scope == ScopeMesh {
		// Mesh as a label, else Kuma's webhook default.
		r.Mesh = r.Labels.Get(LabelMesh)
		if r.Mesh == "" {
			r.Mesh = "default"
		}
	}
	r.Spec = objectField("spec", obj["spec"], errs)
	r.Status = jsonField("status", obj["status"], errs)
	if err := errs.OrNil(); err != nil {
		return nil, err
	}
	return r, nil
}

func decodeMetadata(v any, r *Resource, errs *ValidationError) {
	if v == nil {
		return
	}
	meta, ok := v.(map[string]any)
	if !ok {
		errs.Add("metadata", "must be an object, got %s", jsonType(v))
		return
	}
	ignored := kubernetesMetadata()
	for _, k := range sortedKeys(meta) {
		p := joinPath("metadata", k)
		switch {
		case k == "name":
			r.Name = stringField(p, meta[k], errs)
		case k == "namespace":
			r.Namespace = stringField(p, meta[k], errs)
		case k == "labels":
			r.Labels = labelsField(p, meta[k], errs)
		case k == "annotations":
			labelsField(p, meta[k], errs) // checked for shape, not stored
		case !contains(ignored, k):
			errs.Add(p, "unknown field")
		}
	}
}

func stringField(path string, v any, errs *ValidationError) string {
	if v == nil {
		return ""
	}
	s, ok := v.(string)
	if !ok {
		errs.Add(path, "must be a string, got %s", jsonType(v))
	}
	return s
}

func labelsField(path string, v any, errs *ValidationError) Labels {
	if v == nil {
		return Labels{}
	}
	m, ok := v.(map[string]any)
	if !ok {
		errs.Add(path, "must be a map of strings, got %s", jsonType(v))
		return Labels{}
	}
	kv := make([]string, 0, 2*len(m))
	for _, k := range sortedKeys(m) {
		s, ok := m[k].(string)
		if !ok {
			errs.Add(path+"["+strconv.Quote(k)+"]", "must be a string, got %s", jsonType(m[k]))
			continue
		}
		kv = append(kv, k, s)
	}
	return LabelsFromPairs(kv)
}

// objectField stores a decoded object as canonical JSON; null is absent.
func objectField(path string, v any, errs *ValidationError) json.RawMessage {
	if v == nil {
		return nil
	}
	if _, ok := v.(map[string]any); !ok {
		errs.Add(path, "must be an object, got %s", jsonType(v))
		return nil
	}
	return jsonField(path, v, errs)
}

// jsonField stores any decoded value as canonical JSON; null is absent.
func jsonField(path string, v any, errs *ValidationError) json.RawMessage {
	if v == nil {
		return nil
	}
	out, err := canonicalJSON(v)
	if err != nil {
		errs.Add(path, "%v", err)
		return nil
	}
	return out
}

func timeField(path string, v any, errs *ValidationError) time.Time {
	s := stringField(path, v, errs)
	if s == "" {
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		errs.Add(path, "invalid time %q: must be RFC 3339, e.g. 2024-01-02T15:04:05Z", s)
	}
	return t
}

// versionField accepts a JSON number or a numeric string, since clients
// (and YAML quoting) produce both.
func versionField(path string, v any, errs *ValidationError) uint64 {
	var text string
	switch x := v.(type) {
	case nil:
		return 0
	case json.Number:
		text = x.String()
	case string:
		text = strings.TrimSpace(x)
	default:
		errs.Add(path, "must be a non-negative integer, got %s", jsonType(v))
		return 0
	}
	n, err := strconv.ParseUint(text, 10, 64)
	if err != nil {
		errs.Add(path, "invalid version %q: must be a non-negative integer", text)
	}
	return n
}

// member is one top-level field of an encoded document, in output order.
type member struct {
	key   string
	value any // decoded JSON (json.Number numbers)
}

// universalMembers lays a resource out in the Universal shape, flattening
// the spec of UniversalTopLevel types the way Kuma's Universal format does.
// universalMembers lists the document's top-level members. With raw, spec and
// status may be json.RawMessage values (for JSON output); else plain values.
func (reg *Registry) universalMembers(r *Resource, raw bool) ([]member, error) {
	var spec, status any
	if d, ok := reg.Lookup(r.Type); raw && ok && !d.UniversalTopLevel && json.Valid(r.Spec) {
		// The spec goes out as it is stored (compact JSON): no need to parse
		// it into values and encode them again, the bulk of a PUT's response.
		spec = json.RawMessage(r.Spec)
	} else if v, err := parseJSON(r.Spec); err != nil {
		return nil, fmt.Errorf("encode %s: spec: %w", r.Key(), err)
	} else {
		spec = v
	}
	if v, err := parseJSON(r.Status); err != nil {
		return nil, fmt.Errorf("encode %s: status: %w", r.Key(), err)
	} else if v != nil && raw {
		status = json.RawMessage(r.Status)
	} else {
		status = v
	}
	ms := []member{{"type", r.Type}}
	ms = appendIf(ms, r.Mesh != "", "mesh", r.Mesh)
	ms = append(ms, member{"name", r.Name})
	ms = appendIf(ms, r.Namespace != "", "namespace", r.Namespace)
	ms = appendIf(ms, r.Labels.Len() > 0, "labels", labelsValue(r.Labels))
	ms = append(ms, reg.specMembers(r.Type, spec)...)
	ms = appendIf(ms, !r.CreationTime.IsZero(), "creationTime", r.CreationTime.Format(time.RFC3339Nano))
	ms = appendIf(ms, !r.ModificationTime.IsZero(), "modificationTime", r.ModificationTime.Format(time.RFC3339Nano))
	ms = appendIf(ms, r.Version != 0, "version", json.Number(strconv.FormatUint(r.Version, 10)))
	ms = appendIf(ms, status != nil, "status", status)
	return ms, nil
}

func appendIf(ms []member, cond bool, key string, value any) []member {
	if !cond {
		return ms
	}
	return append(ms, member{key, value})
}

func labelsValue(labels Labels) map[string]any {
	m := make(map[string]any, labels.Len())
	for k, v := range labels.All() {
		m[k] = v
	}
	return m
}

// specMembers returns "spec", or the spec's fields when the type keeps them
// at the top level and every key is one Decode would read back as such.
func (reg *Registry) specMembers(typeName string, spec any) []member {
	if spec == nil {
		return nil
	}
	obj, isObj := spec.(map[string]any)
	d, ok := reg.Lookup(typeName)
	if !ok || !d.UniversalTopLevel || !isObj || len(obj) == 0 {
		return []member{{"spec", spec}}
	}
	ms := make([]member, 0, len(obj))
	for _, k := range sortedKeys(obj) {
		if !d.Spec.hasField(k) || isEnvelopeKey(k) {
			return []member{{"spec", spec}}
		}
		ms = append(ms, member{k, obj[k]})
	}
	return ms
}

func isEnvelopeKey(k string) bool {
	return contains([]string{"type", "mesh", "name", "namespace", "labels", "spec",
		"creationTime", "modificationTime", "version", "status"}, k)
}

// EncodeJSON writes a resource as one compact JSON document in the Universal
// shape, read-only fields included; Decode reads it back unchanged.
func (reg *Registry) EncodeJSON(r *Resource) ([]byte, error) {
	ms, err := reg.universalMembers(r, true)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, 256+len(r.Spec)+len(r.Status))
	out = append(out, '{')
	for i, m := range ms {
		if i > 0 {
			out = append(out, ',')
		}
		out, _ = appendJSON(out, m.key) // a field name: a string, which always encodes
		out = append(out, ':')
		if out, err = appendJSON(out, m.value); err != nil {
			return nil, fmt.Errorf("encode %s: %s: %w", r.Key(), m.key, err)
		}
	}
	return append(out, '}'), nil
}

// appendJSON appends v's canonical JSON: appendCanonical, or encoding/json
// for what it leaves.
func appendJSON(dst []byte, v any) ([]byte, error) {
	if out, ok := appendCanonical(dst, v); ok {
		return out, nil
	}
	enc, err := canonicalJSON(v)
	return append(dst, enc...), err
}

// EncodeYAML writes a resource as a YAML document in the Universal shape,
// fields in the envelope's order (type, mesh, name, ...) for people to read.
func (reg *Registry) EncodeYAML(r *Resource) ([]byte, error) {
	ms, err := reg.universalMembers(r, false)
	if err != nil {
		return nil, err
	}
	doc := make(yamlv2.MapSlice, len(ms))
	for i, m := range ms {
		doc[i] = yamlv2.MapItem{Key: m.key, Value: toYAMLValue(m.value)}
	}
	out, err := yamlv2.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("encode %s as YAML: %w", r.Key(), err)
	}
	return out, nil
}

// toYAMLValue converts decoded JSON for the YAML encoder: objects keep
// sorted keys and numbers become integers where they are integers, so the
// YAML reads back to the same JSON.
func toYAMLValue(v any) any {
	switch x := v.(type) {
	case map[string]any:
		m := make(yamlv2.MapSlice, 0, len(x))
		for _, k := range sortedKeys(x) {
			m = append(m, yamlv2.MapItem{Key: k, Value: toYAMLValue(x[k])})
		}
		return m
	case []any:
		out := make([]any, len(x))
		for i, item := range x {
			out[i] = toYAMLValue(item)
		}
		return out
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return i
		}
		if u, err := strconv.ParseUint(x.String(), 10, 64); err == nil {
			return u
		}
		f, _ := x.Float64()
		return f
	default:
		return v
	}
}
