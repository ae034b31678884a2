package resource

import (
	"encoding/json"
	"fmt"
	"maps"
	"strings"
	"testing"
)

func TestLabels(t *testing.T) {
	many := map[string]string{}
	for i := range 20 {
		many[fmt.Sprintf("k%02d", 19-i)] = fmt.Sprint(i)
	}
	for _, tt := range []struct {
		name string
		l    Labels
		want map[string]string
	}{
		{"zero", Labels{}, nil},
		{"from a map", NewLabels(map[string]string{"b": "2", "a": "1", "c": ""}), map[string]string{"a": "1", "b": "2", "c": ""}},
		{"from an empty map", NewLabels(map[string]string{}), nil},
		{"pairs out of order, a key twice: the last value", LabelsOf("z", "1", "a", "2", "z", "3"), map[string]string{"a": "2", "z": "3"}},
		{"more than a scan's worth", NewLabels(many), many},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.l.Map(); !maps.Equal(got, tt.want) || (got == nil) != (len(tt.want) == 0) {
				t.Fatalf("Map() = %v, want %v", got, tt.want)
			}
			if tt.l.Len() != len(tt.want) || tt.l.IsZero() != (len(tt.want) == 0) {
				t.Errorf("Len() = %d, IsZero() = %v; want %d labels", tt.l.Len(), tt.l.IsZero(), len(tt.want))
			}
			prev := ""
			for k, v := range tt.l.All() {
				if k <= prev && prev != "" {
					t.Errorf("All() yields %q after %q", k, prev)
				}
				prev = k
				if got, ok := tt.l.Lookup(k); !ok || got != v || tt.l.Get(k) != v {
					t.Errorf("Lookup(%q) = %q, %v; want %q", k, got, ok, v)
				}
			}
			for _, absent := range []string{"", "0", "b0", "k", "k00a", "zz"} {
				if _, in := tt.want[absent]; in {
					continue
				}
				if v, ok := tt.l.Lookup(absent); ok || v != "" {
					t.Errorf("Lookup(%q) = %q, %v; want absent", absent, v, ok)
				}
			}
			if !tt.l.Equal(NewLabels(tt.want)) || !tt.l.Contains(tt.want) {
				t.Error("not Equal to, or not Containing, its own map")
			}
		})
	}
}

// TestLabelsSetAndDeleteLeaveCopies: a struct copy of a resource shares
// its labels; setting or deleting on one side never shows on the other.
func TestLabelsSetAndDeleteLeaveCopies(t *testing.T) {
	r := &Resource{Type: "MeshTimeout", Name: "a", Labels: LabelsOf("b", "1", "d", "2")}
	c := *r
	c.Labels.Set("a", "0")
	c.Labels.Set("d", "changed")
	c.Labels.Set("e", "3")
	c.Labels.Delete("b")
	c.Labels.Delete("absent")
	if got, want := c.Labels.Map(), map[string]string{"a": "0", "d": "changed", "e": "3"}; !maps.Equal(got, want) {
		t.Errorf("copy: %v, want %v", got, want)
	}
	if got, want := r.Labels.Map(), map[string]string{"b": "1", "d": "2"}; !maps.Equal(got, want) {
		t.Errorf("original changed: %v, want %v", got, want)
	}
	one := LabelsOf("x", "1")
	one.Delete("x")
	if !one.IsZero() {
		t.Errorf("deleting the last label leaves %v", one)
	}
	if c.Labels.Contains(map[string]string{"a": "0", "b": "1"}) || !c.Labels.Contains(map[string]string{"a": "0"}) {
		t.Error("Contains")
	}
}

func TestLabelsJSON(t *testing.T) {
	r := Resource{Type: "MeshTimeout", Name: "a"}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "labels") {
		t.Errorf("a resource without labels encodes them: %s", b)
	}
	r.Labels = LabelsOf("z", "<1>", "a", "é")
	if b, err = json.Marshal(r); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"labels":{"a":"é","z":"\u003c1\u003e"}`) {
		t.Errorf("encoded %s", b)
	}
	var back Resource
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !back.Labels.Equal(r.Labels) {
		t.Errorf("decoded %v, want %v", back.Labels, r.Labels)
	}
	if err := json.Unmarshal([]byte(`{"labels":null}`), &back); err != nil || !back.Labels.IsZero() {
		t.Errorf("null labels: %v, %v", back.Labels, err)
	}
	if err := json.Unmarshal([]byte(`{"labels":{"a":1}}`), &back); err == nil {
		t.Error("a number as a label value was accepted")
	}
	if b, _ := json.Marshal(struct{ L Labels }{}); string(b) != `{"L":{}}` {
		t.Errorf("empty labels outside a resource: %s, want {}", b)
	}
}

// FuzzLabels holds Labels built from pairs to a map built from the same
// pairs, through Set and Delete.
func FuzzLabels(f *testing.F) {
	f.Add("a,1,b,2,a,3", "b", "c,4")
	f.Add("k9,x,k1,y,k5,z,k3,w,k7,v,k2,u,k8,t,k4,s,k6,r,k0,q", "k4", "k10,p")
	f.Add(strings.Repeat("k3,a,k1,b,k2,c,k1,d,", 6), "k2", "k0,e") // past insertionPairs, keys repeated
	f.Fuzz(func(t *testing.T, pairs, del, set string) {
		kv := strings.Split(pairs, ",")
		if len(kv)%2 != 0 {
			kv = kv[:len(kv)-1]
		}
		want := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			want[kv[i]] = kv[i+1]
		}
		l := LabelsOf(kv...)
		before := l
		l.Delete(del)
		delete(want, del)
		if s := strings.SplitN(set, ",", 2); len(s) == 2 {
			l.Set(s[0], s[1])
			want[s[0]] = s[1]
		}
		if got := l.Map(); !maps.Equal(got, want) {
			t.Fatalf("labels %v, want %v", got, want)
		}
		for k, v := range want {
			if got, ok := l.Lookup(k); !ok || got != v {
				t.Fatalf("Lookup(%q) = %q, %v; want %q", k, got, ok, v)
			}
		}
		if !LabelsFromPairs(append([]string(nil), kv...)).Equal(before) {
			t.Fatal("LabelsFromPairs and LabelsOf differ")
		}
	})
}
