package kds

import (
	"slices"
	"strings"
	"sync"

	"github.com/meridian-mesh/meridian/internal/resource"
	syncv1 "github.com/meridian-mesh/meridian/proto/meridian/sync/v1"
)

// rejections records the sender's resources a peer rejected (NACKed), with
// the reason, until a later batch carrying them is accepted: the resource's
// status shows it where it was written. Keys are the sender's own
// store keys. Safe for concurrent use (the session loop writes, the API
// reads).
type rejections struct {
	mu    sync.Mutex
	byKey map[resource.Key]string
}

// answered records a peer's answer to a batch: nack nil is an Ack.
func (r *rejections) answered(entries []entry, nack *syncv1.Nack) {
	bad := map[resource.Key]string{}
	for _, re := range nack.GetErrors() {
		bad[keyFromWire(re.GetKey())] = re.GetMessage()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range entries {
		msg, rejected := bad[e.wireKey]
		switch {
		case rejected:
			if r.byKey == nil {
				r.byKey = map[resource.Key]string{}
			}
			r.byKey[e.local] = msg
		default:
			delete(r.byKey, e.local)
		}
	}
}

func (r *rejections) get(k resource.Key) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	msg, ok := r.byKey[k]
	return msg, ok
}

// Rejected says whether the global rejected this zone's resource (its
// store key), and why.
func (c *Client) Rejected(k resource.Key) (string, bool) { return c.rejected.get(k) }

// RejectedBy lists the zones that rejected the global's resource (its store
// key), with why, sorted by zone.
func (s *Server) RejectedBy(k resource.Key) []ZoneRejection {
	s.mu.Lock()
	zones := make([]string, 0, len(s.rejected))
	for z := range s.rejected {
		zones = append(zones, z)
	}
	s.mu.Unlock()
	slices.Sort(zones)
	var out []ZoneRejection
	for _, z := range zones {
		if msg, ok := s.rejectionsOf(z).get(k); ok {
			out = append(out, ZoneRejection{Zone: z, Message: msg})
		}
	}
	return out
}

// ZoneRejection is a zone's refusal of one of the global's resources.
type ZoneRejection struct {
	Zone, Message string
}

func (s *Server) rejectionsOf(zone string) *rejections {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.rejected == nil {
		s.rejected = map[string]*rejections{}
	}
	r := s.rejected[zone]
	if r == nil {
		r = &rejections{}
		s.rejected[zone] = r
	}
	return r
}

// RejectedResource is one of the sender's resources a peer rejected.
type RejectedResource struct {
	Key     resource.Key
	Message string
}

func (r *rejections) list() []RejectedResource {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]RejectedResource, 0, len(r.byKey))
	for k, msg := range r.byKey {
		out = append(out, RejectedResource{Key: k, Message: msg})
	}
	slices.SortFunc(out, func(a, b RejectedResource) int { return strings.Compare(a.Key.String(), b.Key.String()) })
	return out
}

// RejectedIn lists the global's resources that zone rejected (NACKed) and
// has not accepted since, sorted by key.
func (s *Server) RejectedIn(zone string) []RejectedResource { return s.rejectionsOf(zone).list() }
