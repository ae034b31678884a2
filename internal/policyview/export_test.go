package policyview

import "github.com/meridian-mesh/meridian/internal/resource"

// BuildsFromChanges counts the snapshots built from the previous one and
// the changes since.
func (v *View) BuildsFromChanges() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.fromChanges
}

// NoteForTest records r as a change of mesh as if the watch had delivered
// it there, whatever r's own mesh: a way to make the next build fail.
func (v *View) NoteForTest(mesh string, r *resource.Resource) {
	v.mu.Lock()
	defer v.mu.Unlock()
	m := meshOf(v.meshes, mesh)
	m.generation++
	m.note(r.Key(), r)
}

// PassCost is passCost.
var PassCost = passCost
