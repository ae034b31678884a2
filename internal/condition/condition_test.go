package condition

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestCompileAndEval(t *testing.T) {
	env, err := New()
	if err != nil {
		t.Fatal(err)
	}
	conf := map[string]any{"http": map[string]any{"requestTimeout": "60s"}, "idleTimeout": "1m", "n": json.Number("3")}
	tests := []struct {
		expr    string
		conf    any
		want    bool
		evalErr string
	}{
		{expr: "duration(self.http.requestTimeout) > duration('30s')", conf: conf, want: true},
		{expr: "duration(self.http.requestTimeout) > duration('90s')", conf: conf, want: false},
		{expr: "self.n == 3", conf: conf, want: true},
		{expr: "has(self.http) && !has(self.connectionTimeout)", conf: conf, want: true},
		{expr: "has(self.http)", conf: nil, want: false},
		{expr: "self.connectionTimeout == '1s'", conf: conf, evalErr: "no such key"},
		{expr: "self.http", conf: conf, evalErr: "not a boolean"},
	}
	for _, tt := range tests {
		e, err := env.Compile(tt.expr)
		if err != nil {
			t.Fatalf("%s: %v", tt.expr, err)
		}
		got, err := e.Eval(tt.conf)
		if tt.evalErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.evalErr) {
				t.Errorf("%s: err %v, want %q", tt.expr, err, tt.evalErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("%s: %v, %v; want %v", tt.expr, got, err, tt.want)
		}
	}
}

func TestCompileRejects(t *testing.T) {
	env, err := New()
	if err != nil {
		t.Fatal(err)
	}
	for expr, want := range map[string]string{
		"self.a >":                               "Syntax error",
		"'text'":                                 "must evaluate to a boolean",
		"1 + 2":                                  "must evaluate to a boolean",
		"other == 1":                             "undeclared reference",
		strings.Repeat("true && ", 400) + "true": "bytes, at most",
		"self.a.all(x, self.b.all(y, self.c.all(z, z == x)))": "estimated cost",
	} {
		_, err := env.Compile(expr)
		if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("%.40s: err %v, want %q", expr, err, want)
		}
	}
}

func FuzzCompile(f *testing.F) {
	env, err := New()
	if err != nil {
		f.Fatal(err)
	}
	f.Add("duration(self.http.requestTimeout) > duration('30s')")
	f.Add("self.a.exists(x, x > 2)")
	f.Fuzz(func(t *testing.T, src string) {
		e, err := env.Compile(src)
		if err != nil {
			return
		}
		_, _ = e.Eval(map[string]any{"a": []any{json.Number("1")}, "http": map[string]any{}})
	})
}
