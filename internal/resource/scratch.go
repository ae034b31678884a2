package resource

import (
	"bytes"
	"sync"

	"github.com/go-json-experiment/json/jsontext"
)

// scratch lends the JSON reader the maps and arrays of a tree that its
// caller reads and drops (a spec parsed to be validated or re-encoded), and
// a decoder to reuse. Such trees were most of the allocation on the paths
// every resource takes: a cold zone validating 100,000 policies spent a
// quarter of its CPU there, most of it in creating small maps (profile of
// the bench's cold zone: Validate 24%, map creation and growth within it).
//
// Contract: a tree parsed with a scratch is handed back with recycle once
// its caller is done with it, and nothing of it (a map, an array) may be
// kept: recycle clears them for the next tree. Strings and numbers are
// immutable and may be kept. A nil *scratch allocates everything afresh.
// Not safe for concurrent use; scratchPool lends one per caller.
type scratch struct {
	dec  *jsontext.Decoder
	idle bytes.Buffer // what dec reads between parses: nothing
	maps []map[string]any
	arrs [][]any
}

const (
	// scratchKeep bounds the free maps and arrays a scratch keeps: a spec
	// has tens of objects, a large one (a MeshTrafficPermission with
	// hundreds of items) hundreds.
	scratchKeep = 512
	// scratchBigMap and scratchBigArray: larger ones are left to the
	// collector, so that one outsized spec does not pin its memory.
	scratchBigMap   = 32
	scratchBigArray = 256
)

func (s *scratch) decoder(buf *bytes.Buffer) *jsontext.Decoder {
	if s == nil {
		return jsontext.NewDecoder(buf, jsontext.AllowDuplicateNames(true))
	}
	if s.dec == nil {
		s.dec = jsontext.NewDecoder(buf, jsontext.AllowDuplicateNames(true))
	} else {
		s.dec.Reset(buf, jsontext.AllowDuplicateNames(true))
	}
	return s.dec
}

func (s *scratch) object() map[string]any {
	if s == nil || len(s.maps) == 0 {
		return map[string]any{}
	}
	m := s.maps[len(s.maps)-1]
	s.maps = s.maps[:len(s.maps)-1]
	return m
}

func (s *scratch) array() []any {
	if s == nil || len(s.arrs) == 0 {
		return []any{}
	}
	a := s.arrs[len(s.arrs)-1]
	s.arrs = s.arrs[:len(s.arrs)-1]
	return a
}

// recycle takes back v's maps and arrays, cleared.
func (s *scratch) recycle(v any) {
	switch v := v.(type) {
	case map[string]any:
		for _, e := range v {
			s.recycle(e)
		}
		if v != nil && len(v) <= scratchBigMap && len(s.maps) < scratchKeep {
			clear(v)
			s.maps = append(s.maps, v)
		}
	case []any:
		for _, e := range v {
			s.recycle(e)
		}
		if v != nil && cap(v) <= scratchBigArray && len(s.arrs) < scratchKeep {
			clear(v)
			s.arrs = append(s.arrs, v[:0])
		}
	}
}

// scratchPool lends scratches to concurrent callers (a Registry's
// validations run on every API handler and sync session at once).
type scratchPool struct{ p sync.Pool }

func (p *scratchPool) get() *scratch {
	if s, ok := p.p.Get().(*scratch); ok {
		return s
	}
	return &scratch{}
}

// put takes s back with the tree parsed from it, which its caller drops.
func (p *scratchPool) put(s *scratch, tree any) {
	s.recycle(tree)
	if s.dec != nil {
		// The decoder must not keep the last input alive.
		s.dec.Reset(&s.idle)
	}
	p.p.Put(s)
}
