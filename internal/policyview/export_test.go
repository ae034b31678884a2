package policyview

// BuildsFromChanges counts the snapshots built from the previous one and
// the changes since.
func (v *View) BuildsFromChanges() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.fromChanges
}
