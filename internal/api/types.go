package api

import (
	"github.com/meridian-mesh/meridian/internal/kds"
)

// The response types of the REST API that are not resources or engine
// results (those are resource.Resource and package policy's result types).
// The server encodes them, and the console and meridianctl decode into
// them: one definition of each shape (docs/api.md).

// List is every list response: {"total", "items", "next"}.
type List[T any] struct {
	Total int     `json:"total"`
	Items []T     `json:"items"`
	Next  *string `json:"next"`
}

func newList[T any](items []T) List[T] {
	if items == nil {
		items = []T{}
	}
	return List[T]{Total: len(items), Items: items}
}

// ZoneItem is one zone in GET /zones (and GET /zones/{name}/_overview):
// Kuma's type and name plus the zone's sync status.
type ZoneItem struct {
	Type string `json:"type"`
	Name string `json:"name"`
	kds.ZoneStatus
	// Rejected (overview only) are the global's resources this zone
	// rejected and has not accepted since.
	Rejected []RejectedItem `json:"rejected,omitempty"`
}

// RejectedItem is a resource a peer rejected, with why.
type RejectedItem struct {
	Type      string `json:"type"`
	Mesh      string `json:"mesh,omitempty"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
	Message   string `json:"message"`
}
