package console

import "testing"

// TestFeedTouched: a waiter confined to some meshes is told only of
// changes in them; an unconfined one of every change; a waiter too far
// behind is told something changed.
func TestFeedTouched(t *testing.T) {
	f := NewFeed()
	ch, start := f.Wait()
	f.notify([]string{"payments"})
	select {
	case <-ch:
	default:
		t.Fatal("a change did not wake the waiter")
	}
	if f.Touched(start, []string{"default"}) {
		t.Error("a change in payments reached a user of default")
	}
	if !f.Touched(start, []string{"payments"}) || !f.Touched(start, nil) {
		t.Error("a change in payments missed its mesh's user or an unconfined one")
	}
	_, mid := f.Wait()
	f.Notify() // a zone connected: no mesh
	if f.Touched(mid, []string{"payments"}) {
		t.Error("a zone change reached a mesh-confined user")
	}
	if !f.Touched(mid, nil) {
		t.Error("a zone change missed an unconfined user")
	}
	for range feedMemory + 1 {
		f.notify([]string{"other"})
	}
	if !f.Touched(mid, []string{"payments"}) {
		t.Error("a waiter whose changes were forgotten was told nothing changed")
	}
}
