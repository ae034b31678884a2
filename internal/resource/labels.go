package resource

import (
	"bytes"
	"encoding/json"
	"fmt"
	"iter"
	"slices"
	"strings"

	"github.com/meridian-mesh/meridian/internal/plane"
)

// Labels are a resource's labels: string keys, each with one string value.
//
// They are one slice of keys and values sorted by key, not a Go map: a map
// of the two to eight labels a resource carries takes a whole group of eight
// slots (about 340 bytes), and a zone holding 100,000 synced policies kept
// 31 MB of them. Lookups scan the few keys (binary search past
// linearLabels). A Labels value is never written in place: Set and Delete
// give the receiver a new slice, so a copy of a resource (which shares the
// slice) keeps its labels. The zero value has none.
type Labels struct {
	kv []string // k0, v0, k1, v1, ...: sorted by key, each key once
}

// linearLabels is how many labels a lookup scans in order; past it, it
// halves.
const linearLabels = 8

// NewLabels returns labels holding m's entries.
func NewLabels(m map[string]string) Labels {
	if len(m) == 0 {
		return Labels{}
	}
	kv := make([]string, 0, 2*len(m))
	for k, v := range m {
		kv = append(kv, k, v)
	}
	return LabelsFromPairs(kv)
}

// LabelsOf returns labels holding the key/value pairs kv (k1, v1, k2, v2,
// ...); a key given twice keeps its last value. It panics on an odd count.
func LabelsOf(kv ...string) Labels {
	if len(kv)%2 != 0 {
		panic("resource.LabelsOf: odd number of strings")
	}
	return LabelsFromPairs(slices.Clone(kv))
}

// LabelsFromPairs returns labels holding the key/value pairs kv (k1, v1,
// ...), taking kv over: the caller must not use it afterwards. Pairs already
// sorted by unique keys (as decoders of Labels' own output see them) are
// kept as they are; otherwise they are sorted, a key given twice keeping its
// last value. It panics on an odd count.
func LabelsFromPairs(kv []string) Labels {
	if len(kv)%2 != 0 {
		panic("resource.LabelsFromPairs: odd number of strings")
	}
	if len(kv) == 0 {
		return Labels{}
	}
	if !sortedPairs(kv) {
		kv = sortPairs(kv)
	}
	return Labels{kv: kv}
}

func sortedPairs(kv []string) bool {
	for i := 2; i < len(kv); i += 2 {
		if kv[i-2] >= kv[i] {
			return false
		}
	}
	return true
}

// sortPairs sorts kv's pairs by key, stably (of equal keys the last given
// comes last), and keeps the last value of each key. A few pairs are sorted
// in place by insertion; more (a peer may send thousands) by a sort of
// O(n log n).
func sortPairs(kv []string) []string {
	if len(kv) <= 2*insertionPairs {
		for i := 2; i < len(kv); i += 2 {
			for j := i; j > 0 && kv[j] < kv[j-2]; j -= 2 {
				kv[j], kv[j+1], kv[j-2], kv[j-1] = kv[j-2], kv[j-1], kv[j], kv[j+1]
			}
		}
	} else {
		type pair struct{ k, v string }
		ps := make([]pair, len(kv)/2)
		for i := range ps {
			ps[i] = pair{kv[2*i], kv[2*i+1]}
		}
		slices.SortStableFunc(ps, func(a, b pair) int { return strings.Compare(a.k, b.k) })
		for i, p := range ps {
			kv[2*i], kv[2*i+1] = p.k, p.v
		}
	}
	out := kv[:0]
	for i := 0; i < len(kv); i += 2 {
		if i+2 < len(kv) && kv[i+2] == kv[i] {
			continue
		}
		out = append(out, kv[i], kv[i+1])
	}
	return out
}

// insertionPairs is how many pairs sortPairs sorts by insertion.
const insertionPairs = 16

// Len is the number of labels.
func (l Labels) Len() int { return len(l.kv) / 2 }

// IsZero reports whether there are no labels (encoding/json's omitzero).
func (l Labels) IsZero() bool { return len(l.kv) == 0 }

// Get returns key's value, "" when absent.
func (l Labels) Get(key string) string {
	v, _ := l.Lookup(key)
	return v
}

// Lookup returns key's value and whether key is present.
func (l Labels) Lookup(key string) (string, bool) {
	if i, ok := l.index(key); ok {
		return l.kv[i+1], true
	}
	return "", false
}

// index returns the position of key in kv, or where it would go.
func (l Labels) index(key string) (int, bool) {
	n := len(l.kv) / 2
	if n <= linearLabels {
		for i := 0; i < len(l.kv); i += 2 {
			switch {
			case l.kv[i] == key:
				return i, true
			case l.kv[i] > key:
				return i, false
			}
		}
		return len(l.kv), false
	}
	lo, hi := 0, n
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if l.kv[2*m] < key {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return 2 * lo, lo < n && l.kv[2*lo] == key
}

// All yields the labels in key order.
func (l Labels) All() iter.Seq2[string, string] {
	return func(yield func(string, string) bool) {
		for i := 0; i < len(l.kv); i += 2 {
			if !yield(l.kv[i], l.kv[i+1]) {
				return
			}
		}
	}
}

// Map returns the labels as a new map (nil when there are none).
func (l Labels) Map() map[string]string {
	if len(l.kv) == 0 {
		return nil
	}
	m := make(map[string]string, len(l.kv)/2)
	for i := 0; i < len(l.kv); i += 2 {
		m[l.kv[i]] = l.kv[i+1]
	}
	return m
}

// Equal reports whether l and o hold the same labels.
func (l Labels) Equal(o Labels) bool { return slices.Equal(l.kv, o.kv) }

// Contains reports whether every label of want is among l with its value.
func (l Labels) Contains(want map[string]string) bool {
	for k, v := range want {
		if got, ok := l.Lookup(k); !ok || got != v {
			return false
		}
	}
	return true
}

// Set sets key to value, in a new slice (see Labels).
func (l *Labels) Set(key, value string) {
	i, ok := l.index(key)
	if ok && l.kv[i+1] == value {
		return
	}
	kv := make([]string, 0, len(l.kv)+2)
	kv = append(kv, l.kv[:i]...)
	kv = append(kv, key, value)
	if ok {
		i += 2
	}
	l.kv = append(kv, l.kv[i:]...)
}

// Delete removes key, in a new slice (see Labels).
func (l *Labels) Delete(key string) {
	i, ok := l.index(key)
	if !ok {
		return
	}
	if len(l.kv) == 2 {
		l.kv = nil
		return
	}
	kv := make([]string, 0, len(l.kv)-2)
	kv = append(kv, l.kv[:i]...)
	l.kv = append(kv, l.kv[i+2:]...)
}

// String writes the labels as fmt writes a map of them.
func (l Labels) String() string { return fmt.Sprint(l.Map()) }

// MarshalJSON writes the labels as a JSON object in key order ({} when
// there are none). It does not escape HTML characters itself: an encoder
// that does (json.Marshal) escapes what it returns, one that does not
// (SetEscapeHTML(false)) leaves them.
func (l Labels) MarshalJSON() ([]byte, error) {
	if len(l.kv) == 0 {
		return []byte("{}"), nil
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(l.Map()); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// UnmarshalJSON reads a JSON object of strings, or null (no labels).
func (l *Labels) UnmarshalJSON(b []byte) error {
	var m map[string]string
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	*l = NewLabels(m)
	return nil
}

// Owner is who owns a stored resource: the global, or one zone.
type Owner struct {
	Global bool
	// Zone is the owning zone when not Global ("" for a zone-originated
	// resource on the global that names no zone).
	Zone string
}

// OwnerOf reads who owns r from its labels as plane p sees it; it is the
// one ownership rule for writes (internal/admission) and for what a zone
// sends (internal/kds/mapping), see docs/security.md#who-may-write-what:
//   - kuma.io/origin: zone → the zone its kuma.io/zone label names (on a
//     zone, an empty label is this zone);
//   - no origin → the plane that stores it (written to its store
//     directly; on a zone, the zone a kuma.io/zone label names, if any);
//   - any other origin → the global.
func OwnerOf(r *Resource, p plane.Plane) Owner {
	origin, z := r.Labels.Get(LabelOrigin), r.Labels.Get(LabelZone)
	switch {
	case origin != "" && origin != OriginZone:
		return Owner{Global: true}
	case origin == "" && p.IsGlobal():
		return Owner{Global: true}
	case z == "" && p.IsZone():
		return Owner{Zone: p.Zone}
	}
	return Owner{Zone: z}
}
