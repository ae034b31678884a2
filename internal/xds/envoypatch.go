package xds

import (
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	jsonpatch "github.com/evanphx/json-patch/v5"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"sigs.k8s.io/yaml"
)

// MeshProxyPatch for Envoy (docs/dataplane.md#envoy), as Kuma applies it:
// its appendModifications, in order, on the rendered resources: clusters
// and listeners (Add, Remove, Patch), network and HTTP filters of the
// matching listeners (AddFirst, AddLast, AddBefore, AddAfter, Remove,
// Patch) and the virtual hosts of their route configurations (Add,
// Remove, Patch). Patch merges value (Envoy YAML) into the resource, or
// applies jsonPatches to its JSON form. A modification whose value does
// not read, or whose result Envoy would reject (ValidateAll), is not
// applied and is named: the proxy never receives a patch it would NACK.
//
// Match fields: name; origin, Kuma's names for what generated a resource
// (inbound, outbound, prometheus, meshtrace, meshaccesslog); a listener's
// tags (an inbound's tags, an outbound's kuma.io/service); a filter's
// listenerName and listenerTags; a virtual host's routeConfigurationName.

type proxyPatchConf struct {
	AppendModifications []struct {
		Cluster       *patchMod `json:"cluster"`
		Listener      *patchMod `json:"listener"`
		NetworkFilter *patchMod `json:"networkFilter"`
		HTTPFilter    *patchMod `json:"httpFilter"`
		VirtualHost   *patchMod `json:"virtualHost"`
	} `json:"appendModifications"`
}

type patchMod struct {
	Operation string `json:"operation"`
	Match     *struct {
		Name                   string            `json:"name"`
		Origin                 string            `json:"origin"`
		Tags                   map[string]string `json:"tags"`
		ListenerName           string            `json:"listenerName"`
		ListenerTags           map[string]string `json:"listenerTags"`
		RouteConfigurationName string            `json:"routeConfigurationName"`
	} `json:"match"`
	Value       *string           `json:"value"`
	JSONPatches []json.RawMessage `json:"jsonPatches"`
}

func (m *patchMod) name() string {
	if m.Match == nil {
		return ""
	}
	return m.Match.Name
}

func (m *patchMod) origin() string {
	if m.Match == nil {
		return ""
	}
	return m.Match.Origin
}

// patch applies the proxy's MeshProxyPatch.
func (e *envoyGen) patch() error {
	ap, ok := e.in.Config.Proxy["MeshProxyPatch"]
	if !ok || ap.Conf == nil {
		return nil
	}
	var c proxyPatchConf
	e.about = ap.Origin
	defer func() { e.about = nil }()
	if err := json.Unmarshal(ap.Conf, &c); err != nil {
		e.drop("MeshProxyPatch (whole proxy): conf cannot be read: %v", err)
		return nil
	}
	applied := false
	for i, m := range c.AppendModifications {
		var err error
		where := fmt.Sprintf("MeshProxyPatch appendModifications[%d]", i)
		switch {
		case m.Cluster != nil:
			err = e.patchResources(resourcev3.ClusterType, &e.out.Clusters, m.Cluster, func() proto.Message { return &clusterv3.Cluster{} })
		case m.Listener != nil:
			err = e.patchResources(resourcev3.ListenerType, &e.out.Listeners, m.Listener, func() proto.Message { return &listenerv3.Listener{} })
		case m.NetworkFilter != nil:
			err = e.patchNetworkFilters(m.NetworkFilter)
		case m.HTTPFilter != nil:
			err = e.patchHTTPFilters(m.HTTPFilter)
		case m.VirtualHost != nil:
			err = e.patchVirtualHosts(m.VirtualHost)
		}
		if err != nil {
			e.drop("%s (whole proxy): not applied: %v", where, err)
			continue
		}
		applied = true
	}
	if applied {
		lists := e.carry(ap.Origin)
		for _, r := range e.patched {
			e.shape(r.typeURL, r.name, lists)
		}
	}
	return nil
}

// patchedResource is a resource a MeshProxyPatch modification changed.
type patchedResource struct{ typeURL, name string }

func (e *envoyGen) patchedOne(typeURL, name string) {
	e.patched = append(e.patched, patchedResource{typeURL, name})
}

// resourceOrigin is what Kuma calls the generator of a resource.
func resourceOrigin(name string) string {
	switch {
	case strings.HasPrefix(name, "inbound:"), strings.HasPrefix(name, "localhost:"):
		return "inbound"
	case strings.HasPrefix(name, "system_meshmetric_prometheus_"):
		return "prometheus"
	case strings.HasPrefix(name, "system_meshtrace_"):
		return "meshtrace"
	case strings.HasPrefix(name, "system_meshaccesslog_"):
		return "meshaccesslog"
	}
	return "outbound"
}

// listenerTags are a listener's tags for matching: an inbound's tags, an
// outbound's service.
func (e *envoyGen) listenerTags(l *listenerv3.Listener) map[string]string {
	for _, in := range e.in.Dataplane.Inbounds {
		if l.GetName() == "inbound:"+net.JoinHostPort(in.Address, strconv.Itoa(in.Port)) {
			return in.Tags
		}
	}
	for _, o := range e.in.Config.Outbounds {
		if l.GetName() == "outbound:"+net.JoinHostPort("127.0.0.1", strconv.Itoa(o.Port)) {
			return map[string]string{"kuma.io/service": o.Service}
		}
	}
	return nil
}

func tagsMatch(want, have map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

func (e *envoyGen) resourceMatches(typeURL string, r types.Resource, m *patchMod) bool {
	name := resourceName(r)
	if m.name() != "" && m.name() != name {
		return false
	}
	if m.origin() != "" && m.origin() != resourceOrigin(name) {
		return false
	}
	if l, ok := r.(*listenerv3.Listener); ok && typeURL == resourcev3.ListenerType && m.Match != nil && len(m.Match.Tags) > 0 {
		return tagsMatch(m.Match.Tags, e.listenerTags(l))
	}
	return true
}

func resourceName(r types.Resource) string {
	switch v := r.(type) {
	case *clusterv3.Cluster:
		return v.GetName()
	case *listenerv3.Listener:
		return v.GetName()
	}
	return ""
}

// patchResources applies one cluster or listener modification.
func (e *envoyGen) patchResources(typeURL string, list *[]types.Resource, m *patchMod, newMsg func() proto.Message) error {
	e.out.forgetSums(slices.Index(listTypes[:], typeURL))
	switch m.Operation {
	case "Add":
		v := newMsg()
		if err := readValue(m.Value, v); err != nil {
			return err
		}
		if err := validate(v); err != nil {
			return err
		}
		*list = append(*list, v)
		e.patchedOne(typeURL, resourceName(v))
		return nil
	case "Remove":
		kept := (*list)[:0]
		for _, r := range *list {
			if !e.resourceMatches(typeURL, r, m) {
				kept = append(kept, r)
				continue
			}
			e.removed(typeURL, resourceName(r))
		}
		*list = kept
		return nil
	case "Patch":
		for i, r := range *list {
			if !e.resourceMatches(typeURL, r, m) {
				continue
			}
			patched, err := patchMessage(r, m)
			if err != nil {
				return err
			}
			(*list)[i] = patched
			e.patchedOne(typeURL, resourceName(r))
		}
		return nil
	}
	return fmt.Errorf("operation %s does not apply to a %s", m.Operation, strings.TrimPrefix(typeURL, resourcev3.APITypePrefix))
}

// patchMessage returns a copy of r with m's value merged in or its JSON
// patches applied, checked as Envoy checks it.
func patchMessage(r proto.Message, m *patchMod) (proto.Message, error) {
	out := proto.Clone(r)
	if m.Value != nil {
		v := r.ProtoReflect().New().Interface()
		if err := readValue(m.Value, v); err != nil {
			return nil, err
		}
		proto.Merge(out, v)
	} else {
		raw, err := protojson.Marshal(out)
		if err != nil {
			return nil, err
		}
		ops, err := json.Marshal(m.JSONPatches)
		if err != nil {
			return nil, err
		}
		p, err := jsonpatch.DecodePatch(ops)
		if err != nil {
			return nil, fmt.Errorf("jsonPatches: %w", err)
		}
		patched, err := p.Apply(raw)
		if err != nil {
			return nil, fmt.Errorf("jsonPatches: %w", err)
		}
		out = r.ProtoReflect().New().Interface()
		if err := protojson.Unmarshal(patched, out); err != nil {
			return nil, fmt.Errorf("jsonPatches: the result does not read: %w", err)
		}
	}
	if err := validate(out); err != nil {
		return nil, err
	}
	return out, nil
}

// readValue reads an Envoy YAML (or JSON) value into m.
func readValue(value *string, m proto.Message) error {
	if value == nil {
		return fmt.Errorf("value is missing")
	}
	raw, err := yaml.YAMLToJSON([]byte(*value))
	if err != nil {
		return fmt.Errorf("value: %w", err)
	}
	if err := protojson.Unmarshal(raw, m); err != nil {
		return fmt.Errorf("value: %w", err)
	}
	return nil
}

func validate(m proto.Message) error {
	if v, ok := m.(interface{ ValidateAll() error }); ok {
		if err := v.ValidateAll(); err != nil {
			return fmt.Errorf("Envoy would reject the result: %w", err)
		}
	}
	return nil
}

// filterListeners are the listeners a filter modification names.
func (e *envoyGen) filterListeners(m *patchMod) []*listenerv3.Listener {
	var out []*listenerv3.Listener
	for _, r := range e.out.Listeners {
		l := r.(*listenerv3.Listener)
		if mm := m.Match; mm != nil {
			if mm.ListenerName != "" && mm.ListenerName != l.GetName() {
				continue
			}
			if mm.Origin != "" && mm.Origin != resourceOrigin(l.GetName()) {
				continue
			}
			if len(mm.ListenerTags) > 0 && !tagsMatch(mm.ListenerTags, e.listenerTags(l)) {
				continue
			}
		}
		out = append(out, l)
	}
	return out
}

// patchNetworkFilters applies one network filter modification to every
// filter chain of the listeners it names.
func (e *envoyGen) patchNetworkFilters(m *patchMod) error {
	return e.modifyListeners(m, func(l *listenerv3.Listener) error {
		for _, chain := range l.FilterChains {
			filters, err := modifyList(chain.Filters, m, func() *listenerv3.Filter { return &listenerv3.Filter{} },
				func(f *listenerv3.Filter) string { return f.GetName() })
			if err != nil {
				return err
			}
			chain.Filters = filters
		}
		return nil
	})
}

// modifyListeners calls fn with a copy of each listener m names, and
// keeps the copy when it stays valid: a listener a modification would make
// invalid is left as it was and the modification reported.
func (e *envoyGen) modifyListeners(m *patchMod, fn func(*listenerv3.Listener) error) error {
	e.out.forgetSums(listListeners)
	for _, l := range e.filterListeners(m) {
		next := proto.Clone(l).(*listenerv3.Listener)
		if err := fn(next); err != nil {
			return err
		}
		if proto.Equal(l, next) {
			continue
		}
		if err := validate(next); err != nil {
			return fmt.Errorf("listener %s: %w", l.GetName(), err)
		}
		proto.Reset(l)
		proto.Merge(l, next)
		e.patchedOne(resourcev3.ListenerType, l.GetName())
	}
	return nil
}

// patchHTTPFilters applies one HTTP filter modification to the HTTP
// connection managers of the listeners it names.
func (e *envoyGen) patchHTTPFilters(m *patchMod) error {
	return e.eachHCM(m, func(hcm *hcmv3.HttpConnectionManager) error {
		filters, err := modifyList(hcm.HttpFilters, m, func() *hcmv3.HttpFilter { return &hcmv3.HttpFilter{} },
			func(f *hcmv3.HttpFilter) string { return f.GetName() })
		hcm.HttpFilters = filters
		return err
	})
}

// patchVirtualHosts applies one virtual host modification to the route
// configurations of the listeners' connection managers.
func (e *envoyGen) patchVirtualHosts(m *patchMod) error {
	return e.eachHCM(&patchMod{}, func(hcm *hcmv3.HttpConnectionManager) error {
		rc := hcm.GetRouteConfig()
		if rc == nil {
			return nil
		}
		if m.Match != nil && m.Match.RouteConfigurationName != "" && m.Match.RouteConfigurationName != rc.GetName() {
			return nil
		}
		if m.Match != nil && m.Match.Origin != "" && m.Match.Origin != resourceOrigin(rc.GetName()) {
			return nil
		}
		if m.Operation == "Add" {
			v := &routev3.VirtualHost{}
			if err := readValue(m.Value, v); err != nil {
				return err
			}
			rc.VirtualHosts = append(rc.VirtualHosts, v)
			return nil
		}
		hosts, err := modifyList(rc.VirtualHosts, m, func() *routev3.VirtualHost { return &routev3.VirtualHost{} },
			func(v *routev3.VirtualHost) string { return v.GetName() })
		rc.VirtualHosts = hosts
		return err
	})
}

// eachHCM calls fn with the HTTP connection manager of every filter chain
// of the listeners m names.
func (e *envoyGen) eachHCM(m *patchMod, fn func(*hcmv3.HttpConnectionManager) error) error {
	return e.modifyListeners(m, func(l *listenerv3.Listener) error {
		for _, chain := range l.FilterChains {
			for _, f := range chain.Filters {
				if f.GetName() != "envoy.filters.network.http_connection_manager" {
					continue
				}
				hcm := &hcmv3.HttpConnectionManager{}
				if err := f.GetTypedConfig().UnmarshalTo(hcm); err != nil {
					continue
				}
				if err := fn(hcm); err != nil {
					return err
				}
				a, err := anyOf(hcm)
				if err != nil {
					return err
				}
				f.ConfigType = &listenerv3.Filter_TypedConfig{TypedConfig: a}
			}
		}
		return nil
	})
}

// modifyList applies a filter-style modification to list: AddFirst,
// AddLast, AddBefore and AddAfter the item named by match.name, Remove
// and Patch the items named so (every item when no name is given).
func modifyList[T proto.Message](list []T, m *patchMod, newItem func() T, nameOf func(T) string) ([]T, error) {
	name := m.name()
	matches := func(it T) bool { return name == "" || nameOf(it) == name }
	switch m.Operation {
	case "AddFirst", "AddLast", "AddBefore", "AddAfter":
		v := newItem()
		if err := readValue(m.Value, v); err != nil {
			return list, err
		}
		switch m.Operation {
		case "AddFirst":
			return append([]T{v}, list...), nil
		case "AddLast":
			return append(list, v), nil
		}
		for i, it := range list {
			if nameOf(it) != name {
				continue
			}
			at := i
			if m.Operation == "AddAfter" {
				at = i + 1
			}
			out := append([]T{}, list[:at]...)
			out = append(out, v)
			return append(out, list[at:]...), nil
		}
		return list, nil // as Kuma: nothing to add next to
	case "Remove":
		var out []T
		for _, it := range list {
			if !matches(it) {
				out = append(out, it)
			}
		}
		return out, nil
	case "Patch":
		for i, it := range list {
			if !matches(it) {
				continue
			}
			patched, err := patchTyped(it, m)
			if err != nil {
				return list, err
			}
			list[i] = patched.(T)
		}
		return list, nil
	}
	return list, fmt.Errorf("operation %s does not apply here", m.Operation)
}

// patchTyped patches a filter or a virtual host. A value merges into a
// filter's typed config message by message (merging the Any would
// replace its bytes whole), as Kuma merges it; JSON patches apply to the
// item's JSON.
func patchTyped(it proto.Message, m *patchMod) (proto.Message, error) {
	if m.Value == nil {
		return patchMessage(it, m)
	}
	have := typedConfigOf(it)
	if have == nil {
		return patchMessage(it, m)
	}
	v := it.ProtoReflect().New().Interface()
	if err := readValue(m.Value, v); err != nil {
		return nil, err
	}
	give := typedConfigOf(v)
	out := proto.Clone(it)
	if give == nil || give.GetTypeUrl() != have.GetTypeUrl() {
		proto.Merge(out, v)
		return out, validate(out)
	}
	inner, err := have.UnmarshalNew()
	if err != nil {
		return nil, err
	}
	add, err := give.UnmarshalNew()
	if err != nil {
		return nil, err
	}
	proto.Merge(inner, add)
	merged, err := anyOf(inner)
	if err != nil {
		return nil, err
	}
	setTypedConfig(out, merged)
	return out, validate(out)
}

func typedConfigOf(m proto.Message) *anypb.Any {
	switch f := m.(type) {
	case *listenerv3.Filter:
		return f.GetTypedConfig()
	case *hcmv3.HttpFilter:
		return f.GetTypedConfig()
	}
	return nil
}

func setTypedConfig(m proto.Message, a *anypb.Any) {
	switch f := m.(type) {
	case *listenerv3.Filter:
		f.ConfigType = &listenerv3.Filter_TypedConfig{TypedConfig: a}
	case *hcmv3.HttpFilter:
		f.ConfigType = &hcmv3.HttpFilter_TypedConfig{TypedConfig: a}
	}
}

// removed forgets the policies behind a resource a patch removed.
func (e *envoyGen) removed(typeURL, name string) {
	e.out.unshape(typeURL, name)
}
