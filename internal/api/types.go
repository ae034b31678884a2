package api

import (
	"time"

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

// TokenResponse answers a token's issuance (zone, user and dataplane
// tokens): the token, its id (for revocation) and its expiry (RFC 3339).
type TokenResponse struct {
	Token     string `json:"token"`
	ID        string `json:"id"`
	ExpiresAt string `json:"expiresAt"`
}

func tokenResponse(token, id string, expiresAt int64) TokenResponse {
	return TokenResponse{Token: token, ID: id, ExpiresAt: time.Unix(expiresAt, 0).UTC().Format(time.RFC3339)}
}

// RevokedResponse answers a revocation.
type RevokedResponse struct {
	Revoked      string `json:"revoked"`
	StreamsEnded int    `json:"streamsEnded"`
}
