package condition

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
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
		got, err := e.Eval(tt.conf, nil)
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
		_, _ = e.Eval(map[string]any{"a": []any{json.Number("1")}, "http": map[string]any{}}, nil)
	})
}

// TestRegexCostIsBounded: matches() takes literal patterns whose compiled
// program is small; a nested repetition (1 KB of expression that cost
// 270 ms per evaluation) is refused at write time.
func TestRegexCostIsBounded(t *testing.T) {
	e, err := New()
	if err != nil {
		t.Fatal(err)
	}
	for name, src := range map[string]string{
		"nested repetition": `self.hosts.all(h, h.matches('((a{1,100}){1,100}){1,100}'))`,
		"large repetition":  `self.host.matches('[a-z]{1000}')`,
		"pattern from data": `self.host.matches(self.pattern)`,
		"function style":    `matches(self.host, '(x{1,1000}){1,1000}')`,
	} {
		if _, err := e.Compile(src); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want refused", name, err)
		}
	}
	ok, err := e.Compile(`self.host.matches('^[a-z0-9-]+\\.example\\.com$')`)
	if err != nil {
		t.Fatalf("a plain regex refused: %v", err)
	}
	if got, err := ok.Eval(map[string]any{"host": "api.example.com"}, nil); err != nil || !got {
		t.Errorf("plain regex: %v %v", got, err)
	}
}

// TestEvalIsBounded: an evaluation stops at MaxEvalTime or the runtime
// cost limit, and a used-up Budget fails every evaluation at once.
func TestEvalIsBounded(t *testing.T) {
	e, err := New()
	if err != nil {
		t.Fatal(err)
	}
	// The checker assumes at most 1,000 elements; a conf with more runs
	// into the deadline (or the runtime cost limit) instead.
	x, err := e.Compile(`self.list.all(a, a >= 0 && a < 1000000000)`)
	if err != nil {
		t.Fatal(err)
	}
	list := make([]any, 200000)
	for i := range list {
		list[i] = int64(i)
	}
	conf := map[string]any{"list": list}
	start := time.Now()
	_, err = x.Eval(conf, nil)
	took := time.Since(start)
	if err == nil {
		t.Error("200,000 iterations evaluated without an error")
	}
	if took > 200*time.Millisecond {
		t.Errorf("a runaway evaluation took %s: %v", took, err)
	}
	budget := NewBudget(0)
	cheap, _ := e.Compile(`true`)
	if _, err := cheap.Eval(nil, budget); !errors.Is(err, ErrBudget) {
		t.Errorf("with the budget used up: %v", err)
	}
	budget = NewBudget(time.Second)
	if got, err := cheap.Eval(nil, budget); err != nil || !got {
		t.Errorf("within budget: %v %v", got, err)
	}
}
