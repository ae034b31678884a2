package resource

import (
	"reflect"
	"testing"
)

// mustParse decodes a JSON literal the way the validator sees values.
func mustParse(t *testing.T, s string) any {
	t.Helper()
	v, err := parseJSON([]byte(s))
	if err != nil {
		t.Fatalf("bad test JSON %s: %v", s, err)
	}
	return v
}

func renderCauses(cs []FieldError) []string {
	out := []string{}
	for _, c := range cs {
		out = append(out, c.Field+": "+c.Message)
	}
	return out
}

func TestSchemaValidate(t *testing.T) {
	conf := func() *Schema {
		return object(
			req("name", nonEmptyStr()),
			opt("timeout", positiveDuration()),
			opt("idle", duration()),
			opt("port", port()),
			opt("ratio", number()),
			opt("share", percent()),
			opt("mode", enum("A", "B")),
			opt("on", boolean()),
			opt("items", nonEmptyList(object(req("id", uint32Value())))),
			opt("tags", tagMap()),
			opt("meta", stringMap()),
			opt("raw", anyValue()),
			opt("open", openObject(opt("known", boolean()))),
		)
	}
	cases := []struct {
		name  string
		value string
		want  []string
	}{
		{"valid", `{"name":"x","timeout":"1m30s","idle":"0s","port":8080,"ratio":0.5,"share":"99.9",
			"mode":"B","on":true,"items":[{"id":0}],"tags":{"a":"b"},"meta":{"k":""},"raw":[1,{"x":null}],
			"open":{"known":false,"anything":{"deep":1}}}`, nil},
		{"null fields are unset", `{"name":"x","timeout":null,"items":null}`, nil},
		{"missing required", `{}`, []string{"spec.name: must be set"}},
		{"null required", `{"name":null}`, []string{"spec.name: must be set"}},
		{"not an object", `[1]`, []string{"spec: must be an object, got list"}},
		{"unknown field", `{"name":"x","nmae":"y","weird key":1}`,
			[]string{"spec.nmae: unknown field", `spec["weird key"]: unknown field`}},
		{"empty string", `{"name":""}`, []string{"spec.name: must not be empty"}},
		{"duration with space", `{"name":"x","timeout":"5 s"}`, []string{`spec.timeout: invalid duration "5 s"`}},
		{"duration number", `{"name":"x","idle":5}`, []string{`spec.idle: must be a duration string like "5s", got number`}},
		{"negative duration", `{"name":"x","idle":"-1s"}`, []string{"spec.idle: must not be negative"}},
		{"zero positive duration", `{"name":"x","timeout":"0s"}`, []string{"spec.timeout: must be greater than 0"}},
		{"port range", `{"name":"x","port":0}`, []string{"spec.port: must be between 1 and 65535"}},
		{"port fraction", `{"name":"x","port":80.5}`, []string{"spec.port: must be an integer"}},
		{"port string", `{"name":"x","port":"80"}`, []string{"spec.port: must be an integer, got string"}},
		{"integral float is an integer", `{"name":"x","port":80.0}`, nil},
		{"number type", `{"name":"x","ratio":"1"}`, []string{"spec.ratio: must be a number, got string"}},
		{"percent range", `{"name":"x","share":101}`, []string{"spec.share: must be between 0 and 100"}},
		{"percent junk", `{"name":"x","share":"lots"}`, []string{"spec.share: must be a number or a numeric string, got string"}},
		{"enum", `{"name":"x","mode":"C"}`, []string{`spec.mode: invalid value "C": must be one of A, B`}},
		{"bool", `{"name":"x","on":"yes"}`, []string{"spec.on: must be a boolean, got string"}},
		{"empty list", `{"name":"x","items":[]}`, []string{"spec.items: must have at least one item"}},
		{"list items", `{"name":"x","items":[{"id":-1},{},"x"]}`, []string{
			"spec.items[0].id: must be between 0 and 4294967295",
			"spec.items[1].id: must be set",
			"spec.items[2]: must be an object, got string"}},
		{"tag map", `{"name":"x","tags":{"kuma.io/zone":"","":"v","n":1}}`, []string{
			`spec.tags[""]: key must not be empty`,
			`spec.tags["kuma.io/zone"]: must not be empty`,
			"spec.tags.n: must be a string, got number"}},
		{"map type", `{"name":"x","meta":[]}`, []string{"spec.meta: must be a map, got list"}},
		{"open object still checks known fields", `{"name":"x","open":{"known":"no"}}`,
			[]string{"spec.open.known: must be a boolean, got string"}},
		{"every problem reported", `{"name":"","port":0,"mode":"Z"}`, []string{
			`spec.mode: invalid value "Z": must be one of A, B`,
			"spec.name: must not be empty",
			"spec.port: must be between 1 and 65535"}},
	}
	s := conf()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := renderCauses(s.Validate("spec", mustParse(t, tc.value)))
			if len(got) == 0 && len(tc.want) == 0 {
				return
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %q\nwant %q", got, tc.want)
			}
		})
	}
}

func TestSchemaChecks(t *testing.T) {
	u := union{typeField: "type", blocks: map[string]string{"Tcp": "tcp", "File": "file", "None": ""}, required: true}
	s := object(
		req("type", enum(u.types()...)),
		opt("tcp", object()),
		opt("file", object()),
	).with(u.check)
	cases := []struct {
		value string
		want  []string
	}{
		{`{"type":"Tcp","tcp":{}}`, nil},
		{`{"type":"None"}`, nil},
		{`{"type":"Tcp"}`, []string{"spec.tcp: must be set when type is Tcp"}},
		{`{"type":"File","file":{},"tcp":{}}`, []string{"spec.tcp: must not be set when type is File"}},
		{`{"type":"Udp"}`, []string{`spec.type: invalid value "Udp": must be one of File, None, Tcp`}},
	}
	for _, tc := range cases {
		got := renderCauses(s.Validate("spec", mustParse(t, tc.value)))
		if len(got) != len(tc.want) || (len(got) > 0 && !reflect.DeepEqual(got, tc.want)) {
			t.Errorf("%s: got %q, want %q", tc.value, got, tc.want)
		}
	}
	one := object(opt("a", str()), opt("b", str())).with(exactlyOneOf("a", "b"))
	if got := renderCauses(one.Validate("x", mustParse(t, `{"a":"1","b":"2"}`))); len(got) != 1 || got[0] != "x: exactly one of a, b must be set" {
		t.Errorf("exactlyOneOf: %q", got)
	}
}

func TestSchemaHasPath(t *testing.T) {
	s := meshTimeoutConf()
	for path, want := range map[string]bool{
		"connectionTimeout":    true,
		"http":                 true,
		"http.requestTimeout":  true,
		"http.nope":            false,
		"connectionTimeout.x":  false,
		"":                     false,
		"http.":                false,
		"idleTimeout":          true,
		"nonsense":             false,
		"http.requestTimeout.": false,
	} {
		if got := s.HasPath(path); got != want {
			t.Errorf("HasPath(%q) = %v, want %v", path, got, want)
		}
	}
	opaque := object(opt("raw", anyValue()), opt("tags", tagMap()), opt("open", openObject()))
	for _, p := range []string{"raw.any.thing", "tags.some/key", "open.whatever"} {
		if !opaque.HasPath(p) {
			t.Errorf("HasPath(%q) = false in an opaque block", p)
		}
	}
}

func TestJoinPath(t *testing.T) {
	for _, tc := range [][3]string{
		{"spec", "to", "spec.to"},
		{"", "name", "name"},
		{"labels", "kuma.io/zone", `labels["kuma.io/zone"]`},
		{"spec", "a b", `spec["a b"]`},
		{"spec", "9lives", `spec["9lives"]`},
		{"spec", "", `spec[""]`},
	} {
		if got := joinPath(tc[0], tc[1]); got != tc[2] {
			t.Errorf("joinPath(%q, %q) = %q, want %q", tc[0], tc[1], got, tc[2])
		}
	}
}
