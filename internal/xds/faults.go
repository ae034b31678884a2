package xds

import (
	"encoding/json"
	"maps"
	"slices"
	"strconv"
	"sync"

	"github.com/meridian-mesh/meridian/internal/policy"
)

// Faults finds what a destination service's inbound MeshFaultInjection
// gives a client, as `_evaluate?inbound=PORT&client=...` computes it
// (docs/dataplane.md#policies). A gRPC server applies no fault filter, so
// a proxyless client injects the faults its destination's policy gives
// it. The destination is the service's first instance (by namespace and
// name); a service whose first instances give the client different
// faults is reported by the caller.
//
// Built for one snapshot; safe for concurrent use.
type Faults struct {
	snap *policy.MeshSnapshot

	once sync.Once
	dest map[string][]destination // by service

	mu   sync.Mutex
	memo map[string]faultResult
}

// maxCompared bounds the instances compared for disagreement: each is an
// evaluation per client tag set and snapshot.
const maxCompared = 8

type destination struct {
	name, namespace string
	port            int
}

type faultResult struct {
	conf   json.RawMessage
	origin []policy.Origin
	differ bool
}

// NewFaults serves the faults of snap's destinations.
func NewFaults(snap *policy.MeshSnapshot) *Faults {
	return &Faults{snap: snap, memo: map[string]faultResult{}}
}

func (f *Faults) index() {
	f.dest = map[string][]destination{}
	for _, r := range f.snap.DataplaneResources() {
		ns := f.snap.NormalizeNamespace(r.Namespace)
		dp, err := ParseDataplane(r, ns)
		if err != nil {
			continue
		}
		for _, in := range dp.Inbounds {
			if svc := in.Service(); svc != "" {
				f.dest[svc] = append(f.dest[svc], destination{name: r.Name, namespace: ns, port: in.Port})
			}
		}
	}
}

// ClientTags are a client's tags with their canonical key.
type ClientTags struct {
	Tags map[string]string
	key  string
}

// For returns the MeshFaultInjection conf service's destination gives a
// client with tags client (nil: none), its origin, and whether the
// service's instances disagree. A mesh without MeshFaultInjection
// answers at once: nothing is indexed or evaluated.
func (f *Faults) For(service string, client ClientTags) (json.RawMessage, []policy.Origin, bool) {
	if !f.snap.HasPolicies("MeshFaultInjection") {
		return nil, nil, false
	}
	f.once.Do(f.index)
	key := service + "\x00" + client.key
	f.mu.Lock()
	if r, ok := f.memo[key]; ok {
		f.mu.Unlock()
		return r.conf, r.origin, r.differ
	}
	f.mu.Unlock()
	var r faultResult
	for i, d := range f.dest[service][:min(len(f.dest[service]), maxCompared)] {
		ev, err := f.snap.EvaluateInbound(d.name, d.namespace, d.port, client.Tags)
		if err != nil {
			continue
		}
		var conf json.RawMessage
		var origin []policy.Origin
		if ap, ok := ev.Policies["MeshFaultInjection"]; ok {
			conf, origin = ap.Conf, ap.Origin
		}
		if i == 0 {
			r.conf, r.origin = conf, origin
		} else if string(conf) != string(r.conf) {
			r.differ = true
			break
		}
	}
	f.mu.Lock()
	f.memo[key] = r
	f.mu.Unlock()
	return r.conf, r.origin, r.differ
}

// tagKey is a canonical key of a tag set: its pairs in key order, each
// string prefixed by its length, so that no two sets share a key ("" for
// none). Fragment keys make one per cluster and rendering.
func tagKey(tags map[string]string) string {
	if len(tags) == 0 {
		return ""
	}
	keys := slices.Sorted(maps.Keys(tags))
	n := 0
	for _, k := range keys {
		n += len(k) + len(tags[k]) + 8
	}
	b := make([]byte, 0, n)
	for _, k := range keys {
		b = appendSized(b, k)
		b = appendSized(b, tags[k])
	}
	return string(b)
}

func appendSized(b []byte, s string) []byte {
	b = strconv.AppendInt(b, int64(len(s)), 10)
	b = append(b, ':')
	return append(b, s...)
}
