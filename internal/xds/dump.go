package xds

import (
	"bytes"
	"encoding/json"
	"fmt"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// ConfigDump renders a proxy's resources as Envoy's admin config dump
// (docs/api.md#xds): listeners, route configurations, clusters and
// endpoints as dynamic resources with their versions (by type URL; nil
// leaves them out).
func ConfigDump(res *Resources, versions map[string]string) (*adminv3.ConfigDump, error) {
	v := func(typeURL string) string { return versions[typeURL] }
	listeners := &adminv3.ListenersConfigDump{VersionInfo: v(resourcev3.ListenerType)}
	routes := &adminv3.RoutesConfigDump{}
	clusters := &adminv3.ClustersConfigDump{VersionInfo: v(resourcev3.ClusterType)}
	endpoints := &adminv3.EndpointsConfigDump{}
	var err error
	each := func(items []types.Resource, add func(name string, a *anypb.Any)) {
		for _, r := range items {
			if err != nil {
				return
			}
			var a *anypb.Any
			if a, err = anypb.New(r); err != nil {
				err = fmt.Errorf("config dump of %s: %w", cachev3.GetResourceName(r), err)
				return
			}
			add(cachev3.GetResourceName(r), a)
		}
	}
	each(res.Listeners, func(name string, a *anypb.Any) {
		listeners.DynamicListeners = append(listeners.DynamicListeners, &adminv3.ListenersConfigDump_DynamicListener{
			Name: name, ActiveState: &adminv3.ListenersConfigDump_DynamicListenerState{VersionInfo: v(resourcev3.ListenerType), Listener: a},
		})
	})
	each(res.Routes, func(_ string, a *anypb.Any) {
		routes.DynamicRouteConfigs = append(routes.DynamicRouteConfigs, &adminv3.RoutesConfigDump_DynamicRouteConfig{
			VersionInfo: v(resourcev3.RouteType), RouteConfig: a,
		})
	})
	each(res.Clusters, func(_ string, a *anypb.Any) {
		clusters.DynamicActiveClusters = append(clusters.DynamicActiveClusters, &adminv3.ClustersConfigDump_DynamicCluster{
			VersionInfo: v(resourcev3.ClusterType), Cluster: a,
		})
	})
	each(res.Endpoints, func(_ string, a *anypb.Any) {
		endpoints.DynamicEndpointConfigs = append(endpoints.DynamicEndpointConfigs, &adminv3.EndpointsConfigDump_DynamicEndpointConfig{
			VersionInfo: v(resourcev3.EndpointType), EndpointConfig: a,
		})
	})
	if err != nil {
		return nil, err
	}
	out := &adminv3.ConfigDump{}
	for _, m := range []proto.Message{listeners, routes, clusters, endpoints} {
		a, err := anypb.New(m)
		if err != nil {
			return nil, err
		}
		out.Configs = append(out.Configs, a)
	}
	return out, nil
}

// MarshalJSON encodes m as Envoy's admin does (proto field names), indented
// and stable from one run to the next (protojson's own spacing is not).
func MarshalJSON(m proto.Message) (json.RawMessage, error) {
	raw, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
	if err != nil {
		return nil, err
	}
	var compact, buf bytes.Buffer
	if err := json.Compact(&compact, raw); err != nil {
		return nil, err
	}
	if err := json.Indent(&buf, compact.Bytes(), "", "  "); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
