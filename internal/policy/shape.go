package policy

import (
	"strconv"
	"strings"
	"sync"
)

// Shapes let a fold skip contributions that provably fill nothing.
//
// A default block fills nothing when every position its patch reaches is
// already settled (a value, a deletion, a sealed object or list). Whether it
// is depends only on the fold's root and on the patch's shape: its keys,
// which positions are objects, and, because an append list takes a list and
// ignores an empty one, which values are lists and empty. Two blocks of the
// same shape fold into the same root the same way, so once one of them
// filled nothing (foldState.idle), the next of that shape is skipped with
// two comparisons. At 100,000 MeshTimeouts that matter to one proxy the
// fold walked every block's patch through the node maps: 70 ms of a
// `_rules` query, the largest part of it.

// shapeID names a patch shape within a shapeTable; 0 means "not known" and
// never matches.
type shapeID uint32

// shapeTable interns patch shapes. A snapshot passes its table to the
// snapshot built from it, so contributions reused from the previous
// snapshot and new ones number shapes alike. Safe for concurrent use.
type shapeTable struct {
	mu  sync.Mutex
	ids map[string]shapeID
}

func newShapeTable() *shapeTable { return &shapeTable{ids: map[string]shapeID{}} }

// id interns the shape of p.
func (t *shapeTable) id(p *patch) shapeID {
	var b strings.Builder
	writeShape(&b, p)
	key := b.String()
	t.mu.Lock()
	defer t.mu.Unlock()
	id, ok := t.ids[key]
	if !ok {
		id = shapeID(len(t.ids) + 1)
		t.ids[key] = id
	}
	return id
}

// writeShape writes p's shape: objects with their keys (length-prefixed,
// so no key can fake structure), and each value's class.
func writeShape(b *strings.Builder, p *patch) {
	if !p.isObj {
		switch v := p.value.(type) {
		case []any:
			if len(v) == 0 {
				b.WriteByte('e') // an empty list: an append list ignores it
			} else {
				b.WriteByte('l')
			}
		default:
			b.WriteByte('v')
		}
		return
	}
	b.WriteByte('{')
	for _, f := range p.fields {
		b.WriteString(strconv.Itoa(len(f.key)))
		b.WriteByte(':')
		b.WriteString(f.key)
		writeShape(b, f.patch)
	}
	b.WriteByte('}')
}
