package policy

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/meridian-mesh/meridian/internal/resource"
)

// dpSpec is the part of Kuma's Dataplane spec the engine reads.
type dpSpec struct {
	Networking struct {
		Inbound []struct {
			Port int               `json:"port"`
			Name string            `json:"name"`
			Tags map[string]string `json:"tags"`
		} `json:"inbound"`
		// Listeners are zone proxy listeners embedded in the Dataplane
		// (Kuma 2.13+): inbounds without tags, selected by Mesh and
		// Dataplane targetRefs only.
		Listeners []struct {
			Port int    `json:"port"`
			Name string `json:"name"`
		} `json:"listeners"`
		Outbound []struct {
			Port       int               `json:"port"`
			Address    string            `json:"address"`
			Tags       map[string]string `json:"tags"`
			Service    string            `json:"service"`
			BackendRef *struct {
				Kind   string            `json:"kind"`
				Name   string            `json:"name"`
				Labels map[string]string `json:"labels"`
				Port   int               `json:"port"`
			} `json:"backendRef"`
		} `json:"outbound"`
		Gateway *struct {
			Tags map[string]string `json:"tags"`
			Type string            `json:"type"`
		} `json:"gateway"`
		TransparentProxying *struct {
			ReachableServices []string `json:"reachableServices"`
		} `json:"transparentProxying"`
	} `json:"networking"`
}

type dataplane struct {
	res  *resource.Resource
	meta Meta
	ns   string // normalized namespace

	inbounds  []*inbound
	outbounds []*outbound
	// gateway holds a gateway's effective tags; nil for a sidecar.
	gateway map[string]string
	// delegated: a gateway run outside the mesh's builtin gateway (type
	// DELEGATED, Kuma's default); selected by Dataplane targetRefs, not
	// by MeshGateway ones.
	delegated bool
	// display is the Dataplane's display name and zone its zone (its
	// kuma.io/zone label, else this zone): what a targetRef naming it
	// is compared with.
	display, zone string
	// sets are the tag sets legacy selectors are matched against: one per
	// inbound (listeners aside), and a gateway's tags.
	sets []map[string]string
	// sections are what top-level targetRefs select: every inbound and
	// listener, and the gateway.
	sections []section
	kind     string // proxy type for targetRef.proxyTypes: Sidecar or Gateway

	byService map[string][]int // outbound indexes by service name
	byBackend map[string][]int // outbound indexes by "Kind/name" of the backendRef
	warnings  []string
	// reachable are transparentProxying.reachableServices (nil when
	// none are listed): with them, or without declared outbounds, the
	// Dataplane also calls services it does not declare (effective).
	reachable []string
}

type inbound struct {
	port int
	tags map[string]string // effective: with kuma.io/zone and k8s.kuma.io/namespace
	sec  section
}

// section is one part of a Dataplane a top-level targetRef can select: an
// inbound, an embedded listener, or the gateway.
type section struct {
	kind sectionKind
	tags map[string]string // effective tags (a listener has only the implied ones)
	// name is what a Dataplane targetRef's sectionName matches: the
	// inbound's or listener's name, else its port (Kuma's GetSectionName).
	name string
}

type sectionKind int

const (
	sectionInbound sectionKind = iota
	sectionListener
	sectionGateway
)

// sectionName is Kuma's GetSectionName: the name, else the port.
func sectionName(name string, port int) string {
	if name != "" {
		return name
	}
	return strconv.Itoa(port)
}

type outbound struct {
	port    int
	address string
	service string
	tags    map[string]string
	// destPort is the port of its destination service the outbound sends
	// to, what a to[].targetRef.sectionName names (docs/policy.md#selection):
	// its backendRef's port, else the port of a Kubernetes-style service
	// name (name_namespace_svc_port), else its own port.
	destPort int
}

func (o *outbound) ref() OutboundRef {
	return OutboundRef{Port: o.port, Address: o.address, Service: o.service, Tags: o.tags}
}

func (in *inbound) ref() InboundRef { return InboundRef{Port: in.port, Tags: in.tags} }

// addDataplane parses a Dataplane. A spec that cannot be read leaves a
// Dataplane without inbounds and outbounds and a warning, so that queries
// say what is wrong instead of "not found".
func (b *builder) addDataplane(r *resource.Resource) {
	dp := &dataplane{res: r, meta: metaOf(r), ns: b.normNS(r.Namespace), display: r.DisplayName(), zone: b.zone,
		byService: map[string][]int{}, byBackend: map[string][]int{}}
	if z := r.Labels.Get(resource.LabelZone); z != "" {
		dp.zone = z
	}
	b.s.dataplanes[nsName{dp.ns, r.Name}] = dp
	b.s.dpList = append(b.s.dpList, dp)
	defer dp.finish()
	var spec dpSpec
	if err := json.Unmarshal(r.Spec, &spec); err != nil {
		dp.warnings = append(dp.warnings, fmt.Sprintf("Dataplane spec cannot be read: %v", err))
		return
	}
	n := &spec.Networking
	for _, in := range n.Inbound {
		tags := b.effectiveTags(in.Tags, dp.ns)
		dp.inbounds = append(dp.inbounds, &inbound{port: in.Port, tags: tags,
			sec: section{kind: sectionInbound, tags: tags, name: sectionName(in.Name, in.Port)}})
	}
	for _, l := range n.Listeners {
		tags := b.effectiveTags(nil, dp.ns)
		dp.inbounds = append(dp.inbounds, &inbound{port: l.Port, tags: tags,
			sec: section{kind: sectionListener, tags: tags, name: sectionName(l.Name, l.Port)}})
	}
	if n.Gateway != nil {
		dp.gateway = b.effectiveTags(n.Gateway.Tags, dp.ns)
		dp.delegated = n.Gateway.Type != "BUILTIN"
	}
	if tp := n.TransparentProxying; tp != nil && len(tp.ReachableServices) > 0 {
		dp.reachable = tp.ReachableServices
	}
	for _, out := range n.Outbound {
		o := &outbound{port: out.Port, address: out.Address, tags: copyTags(out.Tags), service: out.Tags[resource.ServiceTag]}
		if o.service == "" {
			o.service = out.Service
		}
		o.destPort = out.Port
		if _, _, p, ok := parseKubeService(o.service); ok && p != 0 {
			o.destPort = p
		}
		if br := out.BackendRef; br != nil && br.Port != 0 {
			o.destPort = br.Port
		}
		i := len(dp.outbounds)
		dp.outbounds = append(dp.outbounds, o)
		if br := out.BackendRef; br != nil {
			for _, name := range b.backendNames(br.Kind, br.Name, br.Labels, dp.ns) {
				dp.byBackend[br.Kind+"/"+name] = append(dp.byBackend[br.Kind+"/"+name], i)
			}
			if o.service == "" {
				o.service = b.backendService(br.Kind, br.Name, dp.ns)
			}
		}
		if _, ok := o.tags[resource.ServiceTag]; !ok && o.service != "" {
			o.tags[resource.ServiceTag] = o.service // destinations and outputs name the service by tag
		}
		dp.byService[o.service] = append(dp.byService[o.service], i)
	}
}

// effectiveTags adds the tags a zone implies (docs/policy.md#selection): kuma.io/zone and,
// in a namespace, k8s.kuma.io/namespace. Tags the Dataplane sets win.
func (b *builder) effectiveTags(tags map[string]string, ns string) map[string]string {
	out := copyTags(tags)
	if _, ok := out[resource.LabelZone]; !ok && b.zone != "" {
		out[resource.LabelZone] = b.zone
	}
	if _, ok := out[resource.LabelNamespace]; !ok && ns != "" {
		out[resource.LabelNamespace] = ns
	}
	return out
}

func copyTags(tags map[string]string) map[string]string {
	out := make(map[string]string, len(tags)+2)
	for k, v := range tags {
		out[k] = v
	}
	return out
}

// backendNames lists the names of the resources an outbound's backendRef
// points at: the name itself, or every resource of that kind whose labels
// contain the reference's labels.
func (b *builder) backendNames(kind, name string, labels map[string]string, ns string) []string {
	if name != "" {
		return []string{name}
	}
	var names []string
	switch kind {
	case resource.KindMeshService:
		for _, ms := range b.s.services {
			if hasLabels(ms.res.Labels, labels) {
				names = append(names, ms.res.Name)
			}
		}
	case resource.KindMeshExternalService:
		for _, r := range b.s.externals {
			if hasLabels(r.Labels, labels) {
				names = append(names, r.Name)
			}
		}
	case resource.KindMeshMultiZoneService:
		for _, r := range b.s.multis {
			if hasLabels(r.Labels, labels) {
				names = append(names, r.Name)
			}
		}
	}
	return names
}

// backendService names the service of an outbound that only has a
// backendRef: the display name of the MeshService it points at.
func (b *builder) backendService(kind, name, ns string) string {
	if kind == resource.KindMeshService {
		for _, key := range []nsName{{ns, name}, {"", name}} {
			if ms := b.s.services[key]; ms != nil {
				return ms.display
			}
		}
	}
	if r := b.s.externals[nsName{"", name}]; r != nil && kind == resource.KindMeshExternalService {
		return r.DisplayName()
	}
	if r := b.s.multis[nsName{"", name}]; r != nil && kind == resource.KindMeshMultiZoneService {
		return r.DisplayName()
	}
	return name
}

// parseKubeService splits the kuma.io/service value Kuma derives for a
// Kubernetes Service port, name_namespace_svc_port (the port is absent for
// a headless service: 0).
func parseKubeService(s string) (name, namespace string, port int, ok bool) {
	parts := strings.Split(s, "_")
	switch {
	case len(parts) == 4 && parts[2] == "svc":
		p, err := strconv.Atoi(parts[3])
		if err != nil || p < 1 || p > 65535 {
			return "", "", 0, false
		}
		port = p
	case len(parts) == 3 && parts[2] == "svc":
	default:
		return "", "", 0, false
	}
	if parts[0] == "" || parts[1] == "" {
		return "", "", 0, false
	}
	return parts[0], parts[1], port, true
}

// servicePort is one port of a MeshService or MeshMultiZoneService: its
// number and its section name (the port's name, else its number).
type servicePort struct {
	name string
	port int
}

// portsOf reads spec.ports of a service resource; an unreadable spec has
// none.
func portsOf(r *resource.Resource) []servicePort {
	var spec struct {
		Ports []struct {
			Name string `json:"name"`
			Port int    `json:"port"`
		} `json:"ports"`
	}
	_ = json.Unmarshal(r.Spec, &spec)
	out := make([]servicePort, 0, len(spec.Ports))
	for _, p := range spec.Ports {
		out = append(out, servicePort{name: sectionName(p.Name, p.Port), port: p.Port})
	}
	return out
}

// portNamed is the number of the port whose section name is section.
func portNamed(ports []servicePort, section string) (int, bool) {
	for _, p := range ports {
		if p.name == section {
			return p.port, true
		}
	}
	return 0, false
}

func hasPort(ports []servicePort, port int) bool {
	for _, p := range ports {
		if p.port == port {
			return true
		}
	}
	return false
}

func hasLabels(have resource.Labels, want map[string]string) bool {
	if len(want) == 0 {
		return false
	}
	for k, v := range want {
		if have.Get(k) != v {
			return false
		}
	}
	return true
}

func (dp *dataplane) tagSets() []map[string]string { return dp.sets }

func (dp *dataplane) proxyType() string { return dp.kind }

// finish computes what queries read on every call.
func (dp *dataplane) finish() {
	dp.kind = "Sidecar"
	for _, in := range dp.inbounds {
		dp.sections = append(dp.sections, in.sec)
		if in.sec.kind == sectionInbound {
			dp.sets = append(dp.sets, in.tags)
		}
	}
	if dp.gateway != nil {
		dp.sets = append(dp.sets, dp.gateway)
		dp.sections = append(dp.sections, section{kind: sectionGateway, tags: dp.gateway})
		dp.kind = "Gateway"
	}
}

// Implicit outbounds (docs/policy.md#outbounds). A workload's Dataplane
// (one with an inbound) that declares no outbound calls every service of
// the mesh (a proxyless gRPC client dials any xds:///SERVICE, a transparent
// proxy reaches every service), and transparentProxying.reachableServices
// names services it calls: each such service it does not declare is an
// outbound without a port, so that its policies are computed, shown and
// sent like a declared outbound's. The mesh's services change with other
// Dataplanes, so they are added per snapshot (effective), never to the
// parsed Dataplane, which snapshots share.

// effective is dp with its implicit outbounds in s, made once per
// snapshot; dp itself when it has none. Every query goes through it.
func (s *MeshSnapshot) effective(dp *dataplane) *dataplane {
	if dp.gateway != nil || len(dp.sets) == 0 || (len(dp.outbounds) > 0 && dp.reachable == nil) {
		// Gateways and zone proxies (listeners only) call what they
		// route to, not the mesh's services.
		return dp
	}
	if v, ok := s.effectiveDPs.Load(dp); ok {
		return v.(*dataplane)
	}
	eff := dp
	if len(dp.outbounds) == 0 && dp.reachable == nil {
		// Every service but its own: shared by the Dataplanes of the
		// same services (never written).
		set := s.implicitSet(dp)
		if len(set.outbounds) > 0 {
			c := *dp
			c.outbounds, c.byService = set.outbounds, set.byService
			eff = &c
		}
	} else {
		var add []string
		for _, svc := range dp.reachable {
			if _, declared := dp.byService[svc]; !declared && svc != "" && !slices.Contains(add, svc) {
				add = append(add, svc)
			}
		}
		if len(add) > 0 {
			c := *dp
			c.outbounds = slices.Clip(dp.outbounds)
			c.byService = maps.Clone(dp.byService)
			for _, svc := range add {
				c.byService[svc] = append(c.byService[svc], len(c.outbounds))
				c.outbounds = append(c.outbounds, implicitOutbound(svc))
			}
			eff = &c
		}
	}
	v, _ := s.effectiveDPs.LoadOrStore(dp, eff)
	return v.(*dataplane)
}

// implicitOutbounds are the outbounds of a Dataplane that declares none.
type implicitOutbounds struct {
	outbounds []*outbound
	byService map[string][]int
}

// implicitSet is the implicit outbounds of dp, which declares none: every
// service of the mesh but those of its inbounds; one per set of own
// services in a snapshot.
func (s *MeshSnapshot) implicitSet(dp *dataplane) *implicitOutbounds {
	var own []string
	for _, in := range dp.inbounds {
		if svc := in.tags[resource.ServiceTag]; svc != "" && !slices.Contains(own, svc) {
			own = append(own, svc)
		}
	}
	slices.Sort(own)
	key := strings.Join(own, "\x00")
	if v, ok := s.implicitSets.Load(key); ok {
		return v.(*implicitOutbounds)
	}
	set := &implicitOutbounds{byService: map[string][]int{}}
	for _, svc := range s.meshServiceNames() {
		if !slices.Contains(own, svc) {
			set.byService[svc] = []int{len(set.outbounds)}
			set.outbounds = append(set.outbounds, implicitOutbound(svc))
		}
	}
	v, _ := s.implicitSets.LoadOrStore(key, set)
	return v.(*implicitOutbounds)
}

func implicitOutbound(svc string) *outbound {
	return &outbound{service: svc, tags: map[string]string{resource.ServiceTag: svc}}
}

// meshServiceNames are the services of the mesh, sorted: those of the
// zone's Dataplanes' inbounds and those other zones summarize
// (ZoneEndpoints), the services a proxyless client may dial.
func (s *MeshSnapshot) meshServiceNames() []string {
	s.svcNamesOnce.Do(func() {
		set := map[string]bool{}
		for _, dp := range s.dpList {
			for _, in := range dp.inbounds {
				if svc := in.tags[resource.ServiceTag]; svc != "" && in.sec.kind == sectionInbound {
					set[svc] = true
				}
			}
		}
		for _, r := range s.infra {
			if r.Type != "ZoneEndpoints" {
				continue
			}
			var spec struct {
				Service string `json:"service"`
			}
			if json.Unmarshal(r.Spec, &spec) == nil && spec.Service != "" {
				set[spec.Service] = true
			}
		}
		s.svcNames = slices.Sorted(maps.Keys(set))
	})
	return s.svcNames
}
