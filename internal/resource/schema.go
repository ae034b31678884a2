package resource

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// schemaKind says which JSON values a Schema accepts.
type schemaKind int

const (
	kindAny schemaKind = iota
	kindObject
	kindString
	kindDuration
	kindInt
	kindNumber
	kindDecimal
	kindBool
	kindList
	kindMap
)

// checkFunc is an extra rule run on a value that already has the right JSON
// type: cross-field constraints ("exactly one of"), formats, references.
type checkFunc func(path string, v any, errs *ValidationError)

// Schema describes the JSON values one field accepts. It is a small
// declarative tree rather than Go structs per type so that one walker can
// report every problem with its full path, and so that adding a policy type
// is a local change. Values are those encoding/json produces with UseNumber:
// map[string]any, []any, string, json.Number, bool and nil.
//
// A Schema is built once by the constructors below and never changed, so it
// is safe for concurrent use.
type Schema struct {
	kind     schemaKind
	fields   map[string]*Schema
	required []string
	open     bool // object: unknown keys allowed (deliberately opaque blocks)
	elem     *Schema
	enum     []string
	min, max float64 // int, number and decimal bounds
	bounded  bool
	nonEmpty bool // strings must not be "", lists must have an item
	positive bool // durations must be greater than zero
	checks   []checkFunc
	// def is the value an absent field takes (defaults.go); nil: none.
	def any
	// defaults: def is set here or below (markDefaults).
	defaults bool
}

// field is one member of an object schema, for the object constructor.
type field struct {
	name     string
	schema   *Schema
	required bool
}

func opt(name string, s *Schema) field { return field{name: name, schema: s} }
func req(name string, s *Schema) field { return field{name: name, schema: s, required: true} }

func object(fields ...field) *Schema {
	s := &Schema{kind: kindObject, fields: make(map[string]*Schema, len(fields))}
	for _, f := range fields {
		s.fields[f.name] = f.schema
		if f.required {
			s.required = append(s.required, f.name)
		}
	}
	return s
}

// openObject validates the fields it knows and lets any other key through:
// for blocks Kuma passes to Envoy or plugins verbatim.
func openObject(fields ...field) *Schema {
	s := object(fields...)
	s.open = true
	return s
}

func anyValue() *Schema    { return &Schema{kind: kindAny} }
func str() *Schema         { return &Schema{kind: kindString} }
func nonEmptyStr() *Schema { return &Schema{kind: kindString, nonEmpty: true} }
func boolean() *Schema     { return &Schema{kind: kindBool} }
func number() *Schema      { return &Schema{kind: kindNumber} }
func enum(values ...string) *Schema {
	return &Schema{kind: kindString, enum: values}
}

// duration is a Go/Kubernetes duration string ("5s", "1m30s"), never negative.
func duration() *Schema { return &Schema{kind: kindDuration} }

// positiveDuration is for timeouts and intervals Kuma rejects when zero.
func positiveDuration() *Schema { return &Schema{kind: kindDuration, positive: true} }

func integer(lo, hi int64) *Schema {
	return &Schema{kind: kindInt, bounded: true, min: float64(lo), max: float64(hi)}
}

func uint32Value() *Schema { return integer(0, math.MaxUint32) }
func port() *Schema        { return integer(1, 65535) }
func httpStatus() *Schema  { return integer(100, 599) }

// percent is Kuma's IntOrString percentage: 50, 99.9 or "99.9".
func percent() *Schema { return &Schema{kind: kindDecimal, bounded: true, min: 0, max: 100} }

// decimal is an IntOrString number without bounds (e.g. a deviation factor).
func decimal() *Schema { return &Schema{kind: kindDecimal} }

func listOf(elem *Schema) *Schema { return &Schema{kind: kindList, elem: elem} }

// nonEmptyList is a list that must have at least one item.
func nonEmptyList(elem *Schema) *Schema { return &Schema{kind: kindList, elem: elem, nonEmpty: true} }

// stringMap is a map of strings (labels, arbitrary metadata).
func stringMap() *Schema { return &Schema{kind: kindMap, elem: str()} }

// tagMap is a map of Kuma tags: keys and values must not be empty.
func tagMap() *Schema { return &Schema{kind: kindMap, elem: nonEmptyStr()} }

// with adds extra rules. Schemas are built fresh by each constructor call, so
// appending here never affects another schema.
func (s *Schema) with(checks ...checkFunc) *Schema {
	s.checks = append(s.checks, checks...)
	return s
}

// Validate checks v against the schema and returns every problem, each named
// by its path below path (e.g. "spec.to[1].default.connectionTimeout").
func (s *Schema) Validate(path string, v any) []FieldError {
	var errs ValidationError
	s.validate(path, v, &errs)
	return errs.Causes
}

func (s *Schema) validate(path string, v any, errs *ValidationError) {
	if !s.validateKind(path, v, errs) {
		return
	}
	for _, c := range s.checks {
		c(path, v, errs)
	}
}

// validateKind checks the JSON type and the kind's own constraints; it
// reports whether the value had the right type, so extra rules can rely on it.
func (s *Schema) validateKind(path string, v any, errs *ValidationError) bool {
	switch s.kind {
	case kindObject:
		return s.validateObject(path, v, errs)
	case kindString:
		return s.validateString(path, v, errs)
	case kindDuration:
		return s.validateDuration(path, v, errs)
	case kindInt, kindNumber, kindDecimal:
		return s.validateNumber(path, v, errs)
	case kindBool:
		return expectType[bool](path, v, "a boolean", errs)
	case kindList:
		return s.validateList(path, v, errs)
	case kindMap:
		return s.validateMap(path, v, errs)
	default:
		return true
	}
}

func (s *Schema) validateObject(path string, v any, errs *ValidationError) bool {
	obj, ok := v.(map[string]any)
	if !ok {
		errs.Add(path, "must be an object, got %s", jsonType(v))
		return false
	}
	for _, name := range s.required {
		if obj[name] == nil {
			errs.Add(joinPath(path, name), "must be set")
		}
	}
	// Causes come in key order. The fields are checked in map order and
	// the causes each key produced are put in key order afterwards, so a
	// valid object (every policy a zone receives) pays no sort, and an
	// invalid one is still validated once.
	var spans []causeSpan
	for k, v := range obj {
		from := len(errs.Causes)
		s.validateField(path, k, v, errs)
		if to := len(errs.Causes); to > from {
			spans = append(spans, causeSpan{k, from, to})
		}
	}
	orderCauses(errs, spans)
	return true
}

// causeSpan is the run of causes (from, to) one key of an object produced.
type causeSpan struct {
	key      string
	from, to int
}

// orderCauses rearranges the causes of spans, which are adjacent and end
// the list, into key order; each key's own causes keep their order.
func orderCauses(errs *ValidationError, spans []causeSpan) {
	if len(spans) < 2 {
		return
	}
	start := spans[0].from
	tail := append([]FieldError(nil), errs.Causes[start:]...)
	slices.SortFunc(spans, func(a, b causeSpan) int { return strings.Compare(a.key, b.key) })
	out := errs.Causes[:start]
	for _, sp := range spans {
		out = append(out, tail[sp.from-start:sp.to-start]...)
	}
	errs.Causes = out
}

func (s *Schema) validateField(path, k string, v any, errs *ValidationError) {
	fs, known := s.fields[k]
	switch {
	case known && v != nil: // null means "not set", as in a merge patch
		fs.validate(joinPath(path, k), v, errs)
	case !known && !s.open:
		errs.Add(joinPath(path, k), "unknown field")
	}
}

func (s *Schema) validateString(path string, v any, errs *ValidationError) bool {
	str, ok := v.(string)
	if !ok {
		errs.Add(path, "must be a string, got %s", jsonType(v))
		return false
	}
	switch {
	case len(s.enum) > 0 && !contains(s.enum, str):
		errs.Add(path, "invalid value %q: must be one of %s", str, strings.Join(s.enum, ", "))
	case s.nonEmpty && str == "":
		errs.Add(path, "must not be empty")
	}
	return true
}

func (s *Schema) validateDuration(path string, v any, errs *ValidationError) bool {
	str, ok := v.(string)
	if !ok {
		errs.Add(path, "must be a duration string like \"5s\", got %s", jsonType(v))
		return false
	}
	d, err := time.ParseDuration(str)
	switch {
	case err != nil:
		errs.Add(path, "invalid duration %q", str)
	case d < 0:
		errs.Add(path, "must not be negative")
	case d == 0 && s.positive:
		errs.Add(path, "must be greater than 0")
	}
	return true
}

func (s *Schema) validateNumber(path string, v any, errs *ValidationError) bool {
	f, ok := s.numberValue(v)
	if !ok {
		errs.Add(path, "must be %s, got %s", s.numberNoun(), jsonType(v))
		return false
	}
	if s.kind == kindInt && f != math.Trunc(f) {
		errs.Add(path, "must be an integer")
		return true
	}
	if s.bounded && (f < s.min || f > s.max) {
		errs.Add(path, "must be between %s and %s", formatBound(s.min), formatBound(s.max))
	}
	return true
}

// numberValue reads a JSON number, and for IntOrString decimals also a
// numeric string, as Kuma accepts "99.9" for percentages.
func (s *Schema) numberValue(v any) (float64, bool) {
	switch n := v.(type) {
	case json.Number:
		f, err := n.Float64()
		return f, err == nil
	case string:
		if s.kind != kindDecimal {
			return 0, false
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(n), 64)
		return f, err == nil && !math.IsNaN(f) && !math.IsInf(f, 0)
	default:
		return 0, false
	}
}

func (s *Schema) numberNoun() string {
	switch s.kind {
	case kindInt:
		return "an integer"
	case kindDecimal:
		return "a number or a numeric string"
	default:
		return "a number"
	}
}

func (s *Schema) validateList(path string, v any, errs *ValidationError) bool {
	list, ok := v.([]any)
	if !ok {
		errs.Add(path, "must be a list, got %s", jsonType(v))
		return false
	}
	if s.nonEmpty && len(list) == 0 {
		errs.Add(path, "must have at least one item")
	}
	for i, item := range list {
		s.elem.validate(indexPath(path, i), item, errs)
	}
	return true
}

func (s *Schema) validateMap(path string, v any, errs *ValidationError) bool {
	m, ok := v.(map[string]any)
	if !ok {
		errs.Add(path, "must be a map, got %s", jsonType(v))
		return false
	}
	for _, k := range sortedKeys(m) {
		p := joinPath(path, k)
		if k == "" {
			errs.Add(p, "key must not be empty")
		}
		s.elem.validate(p, m[k], errs)
	}
	return true
}

// HasPath reports whether a dotted path (e.g. "http.requestTimeout") names a
// field the schema defines, as `unset` requires. A path may end anywhere:
// at a scalar, a list or an object. Opaque blocks and maps accept any rest.
func (s *Schema) HasPath(dotted string) bool {
	if dotted == "" {
		return false
	}
	cur := s
	for _, part := range strings.Split(dotted, ".") {
		if part == "" {
			return false
		}
		switch {
		case cur.kind == kindAny || cur.kind == kindMap:
			return true
		case cur.kind != kindObject:
			return false
		}
		next, ok := cur.fields[part]
		if !ok {
			return cur.open
		}
		cur = next
	}
	return true
}

// hasField reports whether an object schema defines the top-level key.
func (s *Schema) hasField(name string) bool {
	if s == nil || s.kind != kindObject {
		return false
	}
	_, ok := s.fields[name]
	return ok
}

// expectType checks that v has Go type T (as encoding/json decodes it).
func expectType[T any](path string, v any, noun string, errs *ValidationError) bool {
	if _, ok := v.(T); !ok {
		errs.Add(path, "must be %s, got %s", noun, jsonType(v))
		return false
	}
	return true
}

// jsonType names a decoded JSON value's type for messages.
func jsonType(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case map[string]any:
		return "object"
	case []any:
		return "list"
	case string:
		return "string"
	case bool:
		return "boolean"
	case json.Number, float64:
		return "number"
	default:
		return fmt.Sprintf("%T", v)
	}
}

func formatBound(f float64) string {
	return strconv.FormatFloat(f, 'f', -1, 64)
}

// joinPath appends an object key: ".name" for identifiers, `["a/b"]` for
// anything else (label and tag keys), so paths stay unambiguous.
func joinPath(path, key string) string {
	if !isIdentifier(key) {
		return path + "[" + strconv.Quote(key) + "]"
	}
	if path == "" {
		return key
	}
	return path + "." + key
}

func indexPath(path string, i int) string { return path + "[" + strconv.Itoa(i) + "]" }

func isIdentifier(s string) bool {
	if s == "" {
		return false
	}
	for i, c := range s {
		letter := c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
		if !letter && (i == 0 || c < '0' || c > '9') {
			return false
		}
	}
	return true
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
